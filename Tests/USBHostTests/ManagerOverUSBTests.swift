@testable import AccessoryHost
@testable import AccessoryHostUSB
import AccessorySimulator
import Dispatch
import IAPTransport
import Synchronization
import Testing
import TestSupport
import TestThreads
@testable import USBHost
import USBDescriptors
import USBTransport

/// The whole host stack over the USB layer's real code (pipes, ring, open, teardown), with the
/// fake libusb wired to the simulated accessory: what `iapctl` does with a real accessory.
/// The tests block on the manager's queue and in `manager.stop()` (up to 5 s for libusb's
/// context): each on a thread of its own (`.ownThread`), where its awaits resume too.
@Suite(.ownThread) struct ManagerOverUSBTests {
    @Test func anAccessoryOnUSBIsIdentifiedAndASessionEchoesMegabytes() async throws {
        let manager = AccessoryManager(configuration: .init(supportedProtocols: ["com.example.echo"]))
        let fake = FakeBackend(queue: manager.queue)
        let (hostSide, accessorySide) = MemoryTransport.pair(name: "usb wire")
        let profile = try #require(SimulatorProfile.builtIn(named: "multi-sensor"))
        let runner = try SimulatorRunner(profile: profile, attachment: .transport(accessorySide))
        manager.queue.sync { fake.connect(wire: hostSide) }
        runner.start()
        manager.startUSB(context: USBContext(backend: fake, queue: manager.queue, function: .iAP2, options: USBContextOptions()))

        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(20)))
        #expect(accessory.name == "Multi Sensor")
        #expect(accessory.transportKind == .usb)
        #expect(accessory.location == "usb 1-1.2 2ca3:1002 Goggles 3 (serial GG3-0042)")
        #expect(accessory.usbDevice?.usbID == USBID(vendorID: 0x2CA3, productID: 0x1002))
        #expect(AccessoryFilter(usbIDs: [USBID(vendorID: 0x2CA3, productID: 0x1002)]).matches(accessory))
        #expect(!AccessoryFilter(usbIDs: [USBID(vendorID: 0x2CA3, productID: 0x1001)]).matches(accessory))

        let session = try await accessory.openSession(for: "com.example.echo")
        let payload = (0..<(2 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ $0 >> 11) }
        async let sent: Void = {
            var offset = 0
            while offset < payload.count {
                let end = min(payload.count, offset + 50_000)
                try await session.write(Array(payload[offset..<end]))
                offset = end
            }
        }()
        var received: [UInt8] = []
        received.reserveCapacity(payload.count)
        while received.count < payload.count {
            guard let chunk = try await session.read(maxBytes: 1 << 16) else { break }
            received += chunk
        }
        try await sent
        #expect(received == payload)

        // Unplugged with the session open: the accessory disconnects, the session ends with an
        // error, and the USB layer gives everything back.
        let gone = Mutex<String?>(nil)
        let disconnected = AsyncStream<Void>.makeStream()
        let subscription = manager.onEvent(queue: DispatchQueue(label: "test.events")) { event in
            if case let .disconnected(_, reason) = event {
                gone.withLock { $0 = reason }
                disconnected.continuation.yield()
            }
        }
        manager.queue.sync { fake.unplug(FakeDevice()) }
        var disconnections = disconnected.stream.makeAsyncIterator()
        #expect(await disconnections.next() != nil)
        subscription.cancel()
        #expect(gone.withLock { $0 }?.contains("left the bus") == true)
        #expect(!accessory.isConnected)
        await #expect(throws: AccessoryError.self) { try await session.write([1]) }
        manager.stop()
        runner.stop()
        manager.queue.sync {}
        fake.state.withLock { state in
            #expect(state.openHandles == 0 && state.deviceMemoryLive == 0 && state.transfersLive == 0)
        }
        #expect(manager.queue.sync { fake.log.last } == "shutdown")
    }

    /// PROTOCOL.md §1.10 has no source showing iAP1 on the vendor bulk interface; a device that
    /// answers that way is handled all the same: the bulk pipes carry bytes, the endpoint above
    /// switches.
    @Test func anAccessoryAnsweringInIAP1OnTheBulkInterfaceIsIdentifiedAndEchoes() async throws {
        let manager = AccessoryManager()
        let fake = FakeBackend(queue: manager.queue)
        let (hostSide, accessorySide) = MemoryTransport.pair(name: "usb wire")
        var profile = try #require(SimulatorProfile.builtIn(named: "legacy-sensor"))
        profile.iap1?.waitsForDevice = true // identifies only when asked, after the detect
        let runner = try SimulatorRunner(profile: profile, attachment: .transport(accessorySide))
        manager.queue.sync { fake.connect(wire: hostSide) }
        runner.start()
        manager.startUSB(context: USBContext(backend: fake, queue: manager.queue, function: .iAP2, options: USBContextOptions()))
        defer {
            manager.stop()
            runner.stop()
        }
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(20)))
        #expect(accessory.protocolVersion == .iap1)
        #expect(accessory.transportKind == .usb)
        #expect(accessory.name == "Legacy Sensor")
        let session = try await accessory.openSession(for: "com.example.echo")
        let payload = bytes(300_000) { UInt8(truncatingIfNeeded: $0 &* 13 &+ $0 >> 9) }
        async let sent: Void = session.write(payload)
        var received: [UInt8] = []
        while received.count < payload.count, let chunk = try await session.read() { received += chunk }
        try await sent
        #expect(received == payload)
    }
}
