@testable import AccessoryHost
@testable import AccessoryHostUSB
import AccessorySimulator
import CLibUSB
import Glibc
import Dispatch
import IAPTransport
import Synchronization
import Testing
import TestThreads
@testable import USBHost
import USBDescriptors
import USBTransport

/// An accessory with the iAP2 interface and two native-transport interfaces, named after the
/// protocols they carry: 1 ("com.example.native.echo", bulk 0x82/0x02) and 2
/// ("com.example.native.sink", bulk 0x83/0x03), each with an empty alternate setting 0.
let nativeConfiguration: [UInt8] = {
    var bytes: [UInt8] = [0x09, 0x02, 0, 0, 0x03, 0x01, 0x04, 0x80, 0x32]
    bytes += [0x09, 0x04, 0x00, 0x00, 0x02, 0xFF, 0xF0, 0x00, 0x05]
    bytes += [0x07, 0x05, 0x81, 0x02, 0x00, 0x02, 0x00, 0x07, 0x05, 0x01, 0x02, 0x00, 0x02, 0x00]
    for (number, string, endpoint) in [(UInt8(1), UInt8(6), UInt8(2)), (2, 7, 3)] {
        bytes += [0x09, 0x04, number, 0x00, 0x00, 0xFF, 0xF0, 0x01, string]
        bytes += [0x09, 0x04, number, 0x01, 0x02, 0xFF, 0xF0, 0x01, string]
        bytes += [0x07, 0x05, 0x80 | endpoint, 0x02, 0x00, 0x02, 0x00, 0x07, 0x05, endpoint, 0x02, 0x00, 0x02, 0x00]
    }
    bytes[2] = UInt8(bytes.count & 0xFF)
    bytes[3] = UInt8(bytes.count >> 8)
    return bytes
}()

extension FakeDevice {
    static var nativeStreamer: FakeDevice {
        var device = FakeDevice()
        device.descriptor = USBDeviceDescriptor(vendorID: 0x1209, productID: 0x0003, manufacturerIndex: 1, productIndex: 2, serialNumberIndex: 3)
        device.configurations = [try! USBConfigurationDescriptor(parsing: nativeConfiguration)]
        device.strings = [1: "AccessoryHost Simulator", 2: "Native Streamer", 3: "SIM-NS-0001",
                          6: "com.example.native.echo", 7: "com.example.native.sink"]
        return device
    }
}

/// Native-transport sessions through the USB layer's real code (interface claim, SET_INTERFACE on
/// the setup queue, the pipe's ring and transfers, teardown order), with the fake libusb joining
/// the bulk pipes to the simulated accessory.
/// The tests block on the manager's queue, in `manager.stop()` (up to 5 s for libusb's context)
/// and on the fake libusb's log: each on a thread of its own (`.ownThread`), where its awaits
/// resume too. No blocking wait there waits for one of the test's own child tasks.
@Suite("Native transport over USB", .timeLimit(.minutes(1)), .ownThread)
struct NativePipeTests {
    final class Rig: Sendable {
        let manager: AccessoryManager
        let fake: FakeBackend
        let runner: SimulatorRunner

        init(wireCapacity: Int = 256 * 1_024, configure: (inout FakeBackend.State) -> Void = { _ in }) throws {
            manager = AccessoryManager()
            fake = FakeBackend(queue: manager.queue)
            fake.state.withLock { state in
                state.devices = [.nativeStreamer]
                configure(&state)
            }
            let (hostSide, accessorySide) = MemoryTransport.pair(name: "usb wire")
            let profile = try #require(SimulatorProfile.builtIn(named: "native-streamer"))
            let runner = try SimulatorRunner(profile: profile, attachment: .transport(accessorySide))
            self.runner = runner
            let fake = self.fake
            manager.queue.sync {
                fake.nativeWireCapacity = wireCapacity
                fake.nativeOpener = { name, channel in runner.openNativeSession(for: name, over: channel) }
                fake.connect(wire: hostSide)
            }
            runner.start()
            manager.startUSB(context: USBContext(backend: fake, queue: manager.queue, function: .iAP2, options: USBContextOptions()))
        }

        /// Stops everything and waits until the USB layer shut libusb down: native pipes finish
        /// first (alternate setting 0 and release on the setup queue), then the iAP2 interface,
        /// then the context. Waits for the fake's log entry, not a clock.
        func stop() {
            manager.stop()
            runner.stop()
            #expect(fake.waitForLog { $0.last == "shutdown" }, "libusb was shut down")
        }

        var log: [String] { manager.queue.sync { fake.log } }
    }

    @Test("a native session claims its interface, selects alternate setting 1, echoes byte-exact beside a link session, and closes with 0")
    func openEchoClose() async throws {
        let rig = try Rig()
        let accessory = try #require(await rig.manager.waitForAccessory(timeout: .seconds(20)))
        #expect(accessory.usbDevice?.nativeInterfaceNames == [1: "com.example.native.echo", 2: "com.example.native.sink"])

        let echo = try await accessory.openSession(for: "com.example.native.echo")
        let sink = try await accessory.openSession(for: "com.example.native.sink")
        let onLink = try await accessory.openSession(for: "com.example.echo")
        #expect(echo.usesNativeTransport && sink.usesNativeTransport && !onLink.usesNativeTransport)
        #expect(rig.log.contains("set interface 1 alt 1") && rig.log.contains("set interface 2 alt 1"))
        await #expect(throws: AccessoryError.protocolInUse("com.example.native.echo")) {
            _ = try await accessory.openSession(for: "com.example.native.echo")
        }

        let payload = (0..<(5 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 11 &+ $0 >> 13) }
        async let echoed = NativeTransportEcho.run(echo, payload)
        async let linked = NativeTransportEcho.run(onLink, Array(payload.prefix(300_000)))
        async let sunk: Void = {
            try await sink.write(payload.prefix(1 << 20))
            try await sink.flush()
        }()
        #expect(try await echoed == payload)
        #expect(try await linked == Array(payload.prefix(300_000)))
        try await sunk
        #expect(sink.bytesAcknowledged == 1 << 20)
        #expect(echo.bytesAcknowledged == payload.count)
        let pipe = try #require(rig.manager.queue.sync { usbTransport(rig, accessory)?.openNativePipes.first })
        #expect(rig.manager.queue.sync { pipe.statistics.bytesIn } == payload.count)

        echo.close()
        // Closing selects alternate setting 0, then releases the interface; the other session stays.
        #expect(rig.fake.waitForLog { $0.contains("release 1") })
        let log = rig.log
        let reset = try #require(log.firstIndex(of: "set interface 1 alt 0"))
        #expect(reset < log.firstIndex(of: "release 1")!)
        let again = try await accessory.openSession(for: "com.example.native.echo")
        #expect(try await NativeTransportEcho.run(again, [1, 2, 3]) == [1, 2, 3])
        // Closed and opened again at once: the open waits for the close to finish.
        again.close()
        let third = try await accessory.openSession(for: "com.example.native.echo")
        #expect(try await NativeTransportEcho.run(third, [4, 5]) == [4, 5])
        rig.stop()
        rig.fake.state.withLock { state in
            #expect(state.openHandles == 0 && state.deviceMemoryLive == 0 && state.transfersLive == 0)
            #expect(state.claimed.isEmpty)
        }
    }

    @Test("an accessory that refuses alternate setting 1 gets a refusal that says why, and the interface back")
    func refusedAlternateSetting() async throws {
        let rig = try Rig { $0.altSettingStatuses = [LIBUSB_ERROR_PIPE.rawValue] }
        defer { rig.stop() }
        let accessory = try #require(await rig.manager.waitForAccessory(timeout: .seconds(20)))
        do {
            _ = try await accessory.openSession(for: "com.example.native.echo")
            Issue.record("the session opened although SET_INTERFACE stalled")
        } catch let AccessoryError.sessionRefused(reason) {
            #expect(reason.contains("alternate setting 1 of native-transport interface 1"))
            #expect(reason.contains("refused (stalled) SET_INTERFACE"))
        }
        #expect(rig.fake.state.withLock { $0.claimed } == [0])
        // The next try works.
        let session = try await accessory.openSession(for: "com.example.native.echo")
        #expect(try await NativeTransportEcho.run(session, [9, 8, 7]) == [9, 8, 7])
    }

    @Test("a reader that stops reading stops the IN transfers; reading later gets every byte")
    func inTransfersPauseForASlowReader() async throws {
        let rig = try Rig(wireCapacity: 64 * 1_024)
        defer { rig.stop() }
        let accessory = try #require(await rig.manager.waitForAccessory(timeout: .seconds(20)))
        let session = try await accessory.openSession(for: "com.example.native.echo")
        let payload = (0..<(8 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 5 &+ $0 >> 17) }
        // Fill without reading, with non-blocking writes from here; held off once a write takes
        // nothing even after a round of barriers on both queues (every hop runs on one).
        var offered = 0
        while offered < payload.count {
            let taken = try session.writeAvailable(payload[offered..<min(payload.count, offered + 65_536)])
            offered += taken
            if taken == 0 {
                for _ in 0..<4 {
                    rig.manager.queue.sync {}
                    rig.runner.queue.sync {}
                }
                if try session.writeAvailable(payload[offered..<min(payload.count, offered + 1)]) == 0 { break }
                offered += 1
            }
        }
        let last = session.bytesAcknowledged
        let (inFlight, readable) = rig.manager.queue.sync { () -> (Int, Int) in
            let pipe = usbTransport(rig, accessory)?.openNativePipes.first
            return (rig.fake.pending.filter { $0.pointee.endpoint == 0x82 }.count, pipe?.readableByteCount ?? -1)
        }
        #expect(inFlight == 0, "IN transfers stay queued although the reader holds every slot")
        #expect(readable > 0 && readable <= USBNativePipe.inTransferCount(USBContextOptions()) * USBContextOptions.splitInTransferSize, "the reader holds what the slots hold, no more")
        #expect(last < 8 << 20)
        async let rest: Void = session.write(payload[offered...])
        var received: [UInt8] = []
        received.reserveCapacity(payload.count)
        while received.count < payload.count, let bytes = try await session.read(maxBytes: 1 << 16) { received += bytes }
        try await rest
        #expect(received == payload)
    }

    @Test("unplugged with a native session open: it ends with an error, and everything is given back")
    func unplugEndsTheNativeSession() async throws {
        let rig = try Rig()
        let accessory = try #require(await rig.manager.waitForAccessory(timeout: .seconds(20)))
        let session = try await accessory.openSession(for: "com.example.native.echo")
        #expect(try await NativeTransportEcho.run(session, [4, 5, 6]) == [4, 5, 6])
        let ended = DispatchSemaphore(value: 0)
        let events = Mutex<[SessionStreamEvent]>([])
        session.setEventHandler(queue: DispatchQueue(label: "test.session-events")) { event in
            events.withLock { $0.append(event) }
            if event == .endEncountered { ended.signal() }
        }
        rig.manager.queue.sync {
            rig.fake.state.withLock { $0.vanished = true }
            rig.fake.unplug(.nativeStreamer)
        }
        #expect(ended.wait(timeout: .now() + 10) == .success)
        #expect(events.withLock { $0.contains { if case .errorOccurred = $0 { true } else { false } } })
        #expect(try await session.read() == nil)
        await #expect(throws: AccessoryError.self) { try await session.write([1]) }
        rig.stop()
        rig.fake.state.withLock { state in
            #expect(state.openHandles == 0 && state.deviceMemoryLive == 0 && state.transfersLive == 0)
        }
        // A vanished device is not sent SET_INTERFACE(0).
        #expect(!rig.log.contains("set interface 1 alt 0"))
    }

    @Test("which native interface carries a protocol: by name, else the only one; otherwise a clear error")
    func interfaceChoice() throws {
        let configuration = try USBConfigurationDescriptor(parsing: nativeConfiguration)
        let location = try #require(USBFunctionLocation.find(.iAP2, in: [configuration], activeConfiguration: 1))
        let interfaces = location.nativeInterfaces
        #expect(interfaces.map(\.number) == [1, 2])
        #expect(interfaces.map(\.alternateSetting) == [1, 1])
        #expect(interfaces.map(\.bulkIn.address) == [0x82, 0x83])
        let names: [UInt8: String] = [1: "com.a", 2: "com.b"]
        #expect(try USBAccessoryTransport.nativeInterface(for: "com.b", among: interfaces, names: names, device: "d").get().number == 2)
        #expect(try USBAccessoryTransport.nativeInterface(for: "com.x", among: [interfaces[0]], names: names, device: "d").get().number == 1)
        guard case let .failure(ambiguous) = USBAccessoryTransport.nativeInterface(for: "com.x", among: interfaces, names: names, device: "d") else {
            Issue.record("an unnamed protocol matched one of two interfaces")
            return
        }
        #expect(ambiguous.message.contains("1 ('com.a'), 2 ('com.b')"))
        guard case let .failure(none) = USBAccessoryTransport.nativeInterface(for: "com.x", among: [], names: [:], device: "d") else {
            Issue.record("a native protocol matched no interface")
            return
        }
        #expect(none.message.contains("no native-transport interface"))
    }
}

/// The USB transport under an accessory (event queue).
func usbTransport(_ rig: NativePipeTests.Rig, _ accessory: Accessory) -> USBAccessoryTransport? {
    accessory.connection.transport.capability(USBAccessoryTransport.self)
}

enum NativeTransportEcho {
    /// Writes `payload` in chunks while reading the echo back; returns what came back.
    static func run(_ session: AccessorySession, _ payload: [UInt8]) async throws -> [UInt8] {
        async let sent: Void = {
            var offset = 0
            while offset < payload.count {
                let end = min(payload.count, offset + 40_000)
                try await session.write(payload[offset..<end])
                offset = end
            }
        }()
        var received: [UInt8] = []
        received.reserveCapacity(payload.count)
        while received.count < payload.count, let bytes = try await session.read(maxBytes: 1 << 16) { received += bytes }
        try await sent
        return received
    }
}
