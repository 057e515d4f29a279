// What the app does with its accessory, written as it is on iOS: it watches for an accessory
// that speaks its protocol (already connected, or announced later), opens a session through the
// SessionController, sends a test pattern in blocks and checks that the echo comes back byte for
// byte. Nothing in this file is Linux-specific.

import ExternalAccessory
import Foundation

@MainActor
final class EchoTester {
    let protocolString: String
    let totalBytes: Int
    /// Called once with the outcome (true: the echo was exact).
    var finished: ((Bool) -> Void)?

    private let controller = SessionController()
    private var observers: [any NSObjectProtocol] = []
    private var sent = 0
    private var checked = 0
    private var started = Date()
    private var running = false

    init(protocolString: String, totalBytes: Int) {
        self.protocolString = protocolString
        self.totalBytes = totalBytes
    }

    func start() {
        let manager = EAAccessoryManager.shared()
        let center = NotificationCenter.default
        observers.append(center.addObserver(forName: .EAAccessoryDidConnect, object: nil, queue: nil) { [weak self] note in
            let accessory = note.userInfo?[EAAccessoryKey] as? EAAccessory
            MainActor.assumeIsolated { if let accessory { self?.consider(accessory) } }
        })
        observers.append(center.addObserver(forName: .EAAccessoryDidDisconnect, object: nil, queue: nil) { note in
            let accessory = note.userInfo?[EAAccessoryKey] as? EAAccessory
            print("disconnected: \(accessory?.name ?? "an accessory")")
        })
        observers.append(center.addObserver(forName: SessionController.didReceiveData, object: controller, queue: nil) { [weak self] _ in
            MainActor.assumeIsolated { self?.received() }
        })
        observers.append(center.addObserver(forName: SessionController.didEnd, object: controller, queue: nil) { [weak self] _ in
            MainActor.assumeIsolated { self?.ended() }
        })
        manager.registerForLocalNotifications()
        print("waiting for an accessory that speaks \(protocolString)…")
        for accessory in manager.connectedAccessories { consider(accessory) }
    }

    private func consider(_ accessory: EAAccessory) {
        guard !running, accessory.protocolStrings.contains(protocolString) else { return }
        print("connected: \(accessory.name) by \(accessory.manufacturer), model \(accessory.modelNumber), serial \(accessory.serialNumber), firmware \(accessory.firmwareRevision)")
        controller.setup(accessory: accessory, protocolString: protocolString)
        guard controller.openSession() else { return finish(false) }
        running = true
        started = Date()
        sendMore()
    }

    /// Keeps at most 1 MiB queued in the controller: the app's own back-pressure.
    private func sendMore() {
        while sent < totalBytes, controller.bytesQueued < 1 << 20 {
            let block = min(64 * 1024, totalBytes - sent)
            controller.write(Data((sent..<sent + block).map(Self.patternByte)))
            sent += block
        }
    }

    private func received() {
        let data = controller.readData(controller.bytesAvailable)
        for (offset, byte) in data.enumerated() where byte != Self.patternByte(checked + offset) {
            print("echo differs at byte \(checked + offset)")
            return finish(false)
        }
        checked += data.count
        sendMore()
        if checked == totalBytes {
            let seconds = Date().timeIntervalSince(started)
            print("echoed \(totalBytes) bytes byte-exact in \(String(format: "%.3f", seconds)) s (\(String(format: "%.1f", Double(totalBytes) / seconds / 1_048_576)) MiB/s)")
            finish(true)
        }
    }

    private func ended() {
        if running, checked < totalBytes {
            print("the session ended after \(checked) of \(totalBytes) bytes")
            finish(false)
        }
    }

    private func finish(_ success: Bool) {
        running = false
        controller.closeSession()
        let finished = self.finished
        self.finished = nil
        finished?(success)
    }

    static func patternByte(_ index: Int) -> UInt8 { UInt8(truncatingIfNeeded: index &* 31 &+ index >> 11) }
}
