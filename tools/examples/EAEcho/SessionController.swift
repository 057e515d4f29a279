// The session controller of a typical ExternalAccessory app, written as it is on iOS: it opens
// an EASession for one protocol, schedules both streams on the main run loop, writes from a
// queue whenever the output stream has space, and collects what the input stream delivers.
// Nothing in this file is Linux-specific: it compiles unchanged against Apple's framework.

import ExternalAccessory
import Foundation

@MainActor
final class SessionController: NSObject, EAAccessoryDelegate, StreamDelegate {
    /// Posted when bytes arrived; read them with `readData(_:)`.
    static let didReceiveData = Notification.Name("SessionControllerDidReceiveData")
    /// Posted when the accessory went away or a stream failed.
    static let didEnd = Notification.Name("SessionControllerDidEnd")

    private(set) var accessory: EAAccessory?
    private(set) var protocolString: String?
    private var session: EASession?
    private var writeQueue = Data()
    private var readBuffer = Data()

    /// Bytes received and not yet taken.
    var bytesAvailable: Int { readBuffer.count }
    /// Bytes queued and not yet taken by the output stream.
    var bytesQueued: Int { writeQueue.count }

    func setup(accessory: EAAccessory, protocolString: String) {
        self.accessory = accessory
        self.protocolString = protocolString
    }

    /// Opens the session and its streams; false when the accessory refused.
    func openSession() -> Bool {
        guard let accessory, let protocolString else { return false }
        accessory.delegate = self
        guard let session = EASession(accessory: accessory, forProtocol: protocolString),
              let input = session.inputStream, let output = session.outputStream else {
            print("could not open a session for \(protocolString)")
            return false
        }
        self.session = session
        for stream in [input, output] as [Stream] {
            stream.delegate = self
            stream.schedule(in: .current, forMode: .default)
            stream.open()
        }
        return true
    }

    func closeSession() {
        guard let session else { return }
        for stream in [session.inputStream, session.outputStream].compactMap({ $0 }) as [Stream] {
            stream.close()
            stream.remove(from: .current, forMode: .default)
            stream.delegate = nil
        }
        self.session = nil
        writeQueue.removeAll()
    }

    /// Queues `data` for the accessory.
    func write(_ data: Data) {
        writeQueue.append(data)
        writeQueued()
    }

    /// Takes up to `count` received bytes.
    func readData(_ count: Int) -> Data {
        let taken = readBuffer.prefix(count)
        readBuffer.removeFirst(taken.count)
        return Data(taken)
    }

    private func writeQueued() {
        guard let output = session?.outputStream else { return }
        while output.hasSpaceAvailable, !writeQueue.isEmpty {
            let written = writeQueue.withUnsafeBytes { bytes in
                output.write(bytes.bindMemory(to: UInt8.self).baseAddress!, maxLength: bytes.count)
            }
            guard written > 0 else {
                if written < 0 { print("write error: \(output.streamError.map { "\($0)" } ?? "unknown")") }
                break
            }
            writeQueue.removeFirst(written)
        }
    }

    private func readAvailable() {
        guard let input = session?.inputStream else { return }
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while input.hasBytesAvailable {
            let count = chunk.withUnsafeMutableBufferPointer { input.read($0.baseAddress!, maxLength: $0.count) }
            guard count > 0 else { break }
            readBuffer.append(contentsOf: chunk[0..<count])
        }
        NotificationCenter.default.post(name: Self.didReceiveData, object: self)
    }

    // MARK: EAAccessoryDelegate

    nonisolated func accessoryDidDisconnect(_ accessory: EAAccessory) {
        MainActor.assumeIsolated {
            closeSession()
            NotificationCenter.default.post(name: Self.didEnd, object: self)
        }
    }

    // MARK: StreamDelegate

    nonisolated func stream(_ aStream: Stream, handle eventCode: Stream.Event) {
        MainActor.assumeIsolated {
            switch eventCode {
            case .hasBytesAvailable:
                readAvailable()
            case .hasSpaceAvailable:
                writeQueued()
            case .errorOccurred, .endEncountered:
                NotificationCenter.default.post(name: Self.didEnd, object: self)
            default:
                break
            }
        }
    }
}
