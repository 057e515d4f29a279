// Tests against a real kernel USB stack: the simulator as a FunctionFS gadget on dummy_hcd, the
// host on the real libusb and usbfs, through AccessoryManager. They run inside the qemu guest of
// tools/usb-rig (which sets ACCESSORYHOST_USB_RIG=1 and loads dummy_hcd with four controllers);
// elsewhere they are skipped.

import TestSupport
import AccessoryHost
import AccessoryHostUSB
import USBDescriptors
import AccessoryGadget
import AccessorySimulator
import Dispatch
import Glibc
import IAPLink
import IAPTransport
import Synchronization
import Testing
@testable import USBHost

let rigEnabled = getenv("ACCESSORYHOST_USB_RIG") != nil

/// A simulated accessory behind a gadget bound to one controller.
final class GadgetAccessory: Sendable {
    let gadget: USBGadget
    let runner: SimulatorRunner
    let profile: SimulatorProfile

    init(_ profile: SimulatorProfile, name: String, udc: String, productID: UInt16 = 0x0001, serial: String? = nil,
         offerNativeInterfaces: Bool = false, layout: USBDescriptorLayout = .standard,
         wire: (GadgetTransport) -> any Transport = { $0 }, bind: Bool = true,
         events: (@Sendable (SimulatorEvent) -> Void)? = nil) throws {
        var profile = profile
        if let serial { profile.accessory.serialNumber = serial }
        self.profile = profile
        var configuration = USBGadgetConfiguration(profile: profile)
        configuration.name = name
        configuration.functionInstance = name
        configuration.productID = productID
        if offerNativeInterfaces { configuration.nativeTransportProtocols = profile.nativeProtocolNames }
        configuration.layout = layout
        gadget = try USBGadget(configuration: configuration)
        runner = try SimulatorRunner(profile: profile, attachment: .transport(wire(gadget.transport)))
        runner.start(events: events)
        if bind { try gadget.bind(udc: udc) }
    }

    func remove() {
        try? gadget.unbind()
        runner.stop()
        try? gadget.remove()
    }
}

func echoProfile(sessions: Int, serial: String = "RIG-0001") -> SimulatorProfile {
    SimulatorProfile(
        accessory: .init(name: "Rig Echo", model: "RIG-E", manufacturer: "AccessoryHost", serialNumber: serial,
                         firmwareVersion: "3.2.1", hardwareVersion: "R1"),
        protocols: (1...sessions).map { SimulatorProfile.ProtocolSpec(name: "rig.echo.\($0)", behaviour: .echo) },
        link: .init(maxPacketLength: 65_535, maxOutstandingPackets: 16))
}

func pattern(_ count: Int, seed: Int) -> [UInt8] {
    bytes(count) { UInt8(truncatingIfNeeded: ($0 &* 131) ^ ($0 >> 9) &+ seed) }
}

/// Writes `payload` and reads it back through an echo session; true when byte-exact.
func echo(_ session: AccessorySession, _ payload: [UInt8], chunk: Int = 60_000) async throws -> Bool {
    async let sent: Void = {
        var offset = 0
        while offset < payload.count {
            let end = min(payload.count, offset + chunk)
            try await session.write(Array(payload[offset..<end]))
            offset = end
        }
    }()
    var received: [UInt8] = []
    received.reserveCapacity(payload.count)
    while received.count < payload.count, let bytes = try await session.read(maxBytes: 1 << 20) { received += bytes }
    try await sent
    return received == payload
}

func udcs() -> [String] { USBGadget.availableUDCs() }

@Suite(.serialized, .enabled(if: rigEnabled, "runs in the USB rig (tools/usb-rig)"))
struct USBRigTests {
    @Test func anAccessoryIsEnumeratedAuthenticatedAndIdentifiedWithEveryField() async throws {
        let profile = try #require(SimulatorProfile.builtIn(named: "multi-sensor"))
        let device = try GadgetAccessory(profile, name: "rigid", udc: try #require(udcs().first))
        defer { device.remove() }
        let manager = AccessoryManager()
        defer { manager.stop() }
        try manager.startUSB()
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)))
        let identity = profile.identity()
        #expect(accessory.transportKind == .usb)
        #expect(accessory.name == identity.name)
        #expect(accessory.manufacturer == identity.manufacturer)
        #expect(accessory.modelNumber == identity.modelIdentifier)
        #expect(accessory.serialNumber == identity.serialNumber)
        #expect(accessory.firmwareRevision == identity.firmwareVersion)
        #expect(accessory.hardwareRevision == identity.hardwareVersion)
        #expect(accessory.protocolStrings == identity.protocols.map(\.name))
        #expect(accessory.location.contains("1209:0001"))
        #expect(accessory.location.contains(identity.serialNumber), "the USB serial string was read")

        // Zero copy: every ring slot is usbfs memory, mapped from the device node.
        let statistics = try #require(manager.usbStatistics(of: accessory))
        #expect(statistics.deviceMemorySlots == 12 && statistics.heapSlots == 0)
        // dummy_hcd does scatter-gather, which usbfs reports: the IN transfers are 64 KiB.
        #expect(statistics.inTransferSize == USBContextOptions.largeInTransferSize)
        let maps = try String(contentsOfProcFile: "/proc/self/maps")
        #expect(maps.contains("/dev/bus/usb/"), "libusb_dev_mem_alloc mapped the usbfs node")

        // An idle open accessory costs the event loop no wake-ups.
        let context = try #require(manager.usbContext)
        let before = context.eventLoopWakeups
        let idle = DispatchSemaphore(value: 0)
        _ = idle.wait(timeout: .now() + 2) // a measurement window, not a synchronisation
        let wakeups = context.eventLoopWakeups - before
        print("USB rig: event-loop wake-ups in 2 s with an idle open accessory: \(wakeups)")
        #expect(wakeups <= 2)
    }

    @Test func threeSessionsAtOnceMoveSixtyFourMebibytesByteExact() async throws {
        let device = try GadgetAccessory(echoProfile(sessions: 3), name: "rigthree", udc: try #require(udcs().first))
        defer { device.remove() }
        let manager = AccessoryManager(configuration: .init(sessionBufferLimit: 4 << 20))
        defer { manager.stop() }
        try manager.startUSB()
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)))
        let perSession = 22 << 20 // 66 MiB in all, each way
        let start = ContinuousClock.now
        let results = try await withThrowingTaskGroup(of: Bool.self) { group in
            for index in 1...3 {
                group.addTask {
                    let session = try await accessory.openSession(for: "rig.echo.\(index)")
                    defer { session.close() }
                    return try await echo(session, pattern(perSession, seed: index))
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        let elapsed = ContinuousClock.now - start
        #expect(results == [true, true, true])
        print("USB rig: 3 sessions echoed \(3 * perSession >> 20) MiB in \(elapsed)")
    }

    @Test func fourGadgetsAreFourAccessoriesEachWithASession() async throws {
        let controllers = udcs()
        try #require(controllers.count >= 4, "dummy_hcd num=4 gives four controllers")
        var devices: [GadgetAccessory] = []
        defer { for device in devices { device.remove() } }
        for index in 0..<4 {
            devices.append(try GadgetAccessory(echoProfile(sessions: 1), name: "rigfour\(index)", udc: controllers[index],
                                               productID: UInt16(0x0010 + index), serial: "RIG-FOUR-\(index)"))
        }
        let manager = AccessoryManager()
        defer { manager.stop() }
        try manager.startUSB()
        for index in 0..<4 {
            let found = await manager.waitForAccessory(timeout: .seconds(40)) { $0.serialNumber == "RIG-FOUR-\(index)" }
            #expect(found != nil, "accessory \(index) identified")
        }
        let accessories = manager.connectedAccessories
        #expect(Set(accessories.map(\.connectionID)).count == 4)
        try await withThrowingTaskGroup(of: Bool.self) { group in
            for accessory in accessories {
                group.addTask {
                    let session = try await accessory.openSession(for: "rig.echo.1")
                    defer { session.close() }
                    return try await echo(session, pattern(256 << 10, seed: accessory.connectionID))
                }
            }
            for try await ok in group { #expect(ok) }
        }
    }

    @Test func aStallOnTheInEndpointIsClearedAndNoByteIsLost() async throws {
        let device = try GadgetAccessory(echoProfile(sessions: 1), name: "rigstall", udc: try #require(udcs().first))
        defer { device.remove() }
        let manager = AccessoryManager()
        defer { manager.stop() }
        try manager.startUSB()
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)))
        let session = try await accessory.openSession(for: "rig.echo.1")
        defer { session.close() }
        #expect(try await echo(session, pattern(1 << 20, seed: 1)))
        device.gadget.transport.stallIn()
        #expect(try await echo(session, pattern(4 << 20, seed: 2)), "the stream survives the stall byte-exact")
        let statistics = try #require(manager.usbStatistics(of: accessory))
        #expect(statistics.stalls >= 1, "the host saw the stall and cleared it")
        #expect(accessory.isConnected)
    }

    @Test func unbindingMidTransferDisconnectsAndRebindingReconnectsWithANewConnectionID() async throws {
        let udc = try #require(udcs().first)
        let device = try GadgetAccessory(echoProfile(sessions: 1), name: "rigunbind", udc: udc)
        defer { device.remove() }
        let manager = AccessoryManager()
        defer { manager.stop() }
        try manager.startUSB()
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)))
        let session = try await accessory.openSession(for: "rig.echo.1")
        let disconnected = DispatchSemaphore(value: 0)
        let subscription = manager.onEvent(queue: DispatchQueue(label: "rig.events")) { event in
            if case let .disconnected(gone, _) = event, gone === accessory { disconnected.signal() }
        }
        defer { subscription.cancel() }

        // A transfer in flight when the controller goes away.
        let transfer = Task { try await echo(session, pattern(64 << 20, seed: 3)) }
        while manager.usbStatistics(of: accessory).map({ $0.bytesIn < 1 << 20 }) ?? false { await Task.yield() }
        try device.gadget.unbind()
        #expect(disconnected.wait(timeout: .now() + 10) == .success, "a disconnected event")
        await #expect(throws: (any Error).self, "the session ends with an error") { _ = try await transfer.value }
        #expect(!accessory.isConnected)
        #expect(manager.connectedAccessories.isEmpty)

        let rebound = ContinuousClock.now
        try device.gadget.bind(udc: udc)
        let again = await manager.waitForAccessory(timeout: .seconds(5)) { $0.connectionID != accessory.connectionID }
        let back = try #require(again, "identified again within 5 s")
        print("USB rig: identified again \(ContinuousClock.now - rebound) after the rebind")
        #expect(back.serialNumber == accessory.serialNumber)
        let session2 = try await back.openSession(for: "rig.echo.1")
        defer { session2.close() }
        #expect(try await echo(session2, pattern(1 << 20, seed: 4)))
    }

    /// The host side of the native transport on the real kernel: the interfaces' names come from
    /// the real descriptors, the interface is claimed and SET_INTERFACE goes to the device. A
    /// FunctionFS gadget on a kernel without FunctionFS's get_alt (Debian 12's 6.1) has the
    /// request stalled by the composite layer: the host must say so, give the interface back and
    /// keep the accessory working.
    @Test func aNativeTransportInterfaceIsNamedAndItsAlternateSettingRequested() async throws {
        let profile = try #require(SimulatorProfile.builtIn(named: "native-streamer"))
        let device = try GadgetAccessory(profile, name: "rignative", udc: try #require(udcs().first), offerNativeInterfaces: true)
        defer { device.remove() }
        let manager = AccessoryManager()
        defer { manager.stop() }
        try manager.startUSB()
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)))
        #expect(accessory.usbDevice?.nativeInterfaceNames == [1: "com.example.native.echo", 2: "com.example.native.sink"])
        for attempt in 1...2 {
            do {
                let session = try await accessory.openSession(for: "com.example.native.echo")
                // A kernel whose FunctionFS accepts alternate setting 1: the host side works; the
                // simulated gadget does not serve native endpoints yet (see tools/usb-rig/README.md).
                print("USB rig: SET_INTERFACE(1, alt 1) accepted by this kernel's FunctionFS")
                session.close()
            } catch let AccessoryError.sessionRefused(reason) {
                print("USB rig: native open \(attempt) refused: \(reason)")
                #expect(reason.contains("SET_INTERFACE"), "the refusal names the request")
                #expect(!reason.contains("already carries"), "the interface was given back after the first refusal")
            }
        }
        let onLink = try await accessory.openSession(for: "com.example.echo")
        defer { onLink.close() }
        #expect(try await echo(onLink, pattern(1 << 20, seed: 6)), "the accessory still works on the iAP2 link")
    }

    /// The native transport end to end on the real kernel, with the simulator as a GadgetFS
    /// gadget (which hands SET_INTERFACE to user space): the host claims the interface and selects
    /// alternate setting 1, the bytes flow raw and byte-exact beside a session on the iAP2 link,
    /// closing selects 0 and the protocol opens again; the accessory's CRC of a sink session
    /// matches what was sent.
    @Test(.timeLimit(.minutes(3))) func aNativeSessionEchoesOverGadgetFSBesideALinkSession() async throws {
        let profile = try #require(SimulatorProfile.builtIn(named: "native-streamer"))
        let layout = try GadgetFSLayout(vendorID: 0x1209, productID: 0x00BD, manufacturer: "AccessoryHost Simulator",
                                        product: profile.accessory.name, serialNumber: profile.accessory.serialNumber,
                                        nativeProtocols: profile.nativeProtocolNames)
        let device = try GadgetFSDevice(layout: layout)
        defer { device.stop() }
        let closed = AsyncStream<SessionStatistics>.makeStream()
        let runner = try SimulatorRunner(profile: profile, attachment: .transport(device.transport))
        device.onNativeOpen { name, channel in runner.openNativeSession(for: name, over: channel) }
        runner.start { event in
            if case let .nativeSessionClosed(_, _, statistics) = event { closed.continuation.yield(statistics) }
        }
        defer { runner.stop() }
        var closedSessions = closed.stream.makeAsyncIterator()
        let manager = AccessoryManager()
        defer { manager.stop() }
        try manager.startUSB()
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)) { $0.usbDevice?.productID == 0x00BD },
                                     "identified over GadgetFS; ep0: \(device.log)")
        #expect(accessory.usbDevice?.nativeInterfaceNames == [1: "com.example.native.echo", 2: "com.example.native.sink"])

        let native = try await accessory.openSession(for: "com.example.native.echo")
        #expect(native.usesNativeTransport)
        let onLink = try await accessory.openSession(for: "com.example.echo")
        defer { onLink.close() }
        async let nativeEcho = echo(native, pattern(8 << 20, seed: 7))
        async let linkEcho = echo(onLink, pattern(1 << 20, seed: 8))
        #expect(try await nativeEcho, "8 MiB echoed byte-exact on the native transport")
        #expect(try await linkEcho, "1 MiB echoed on the link at the same time")
        native.close()
        #expect(await closedSessions.next() != nil, "the accessory saw the native session end (alternate setting 0)")

        let again = try await accessory.openSession(for: "com.example.native.echo")
        #expect(try await echo(again, pattern(64 << 10, seed: 9)), "the protocol opens again after alternate setting 0")
        again.close()
        _ = await closedSessions.next()

        let sink = try await accessory.openSession(for: "com.example.native.sink")
        let payload = pattern(2 << 20, seed: 10)
        try await sink.write(payload)
        try await sink.flush()
        #expect(sink.bytesAcknowledged == payload.count)
        sink.close()
        var crc = CRC32()
        crc.update(payload)
        let statistics = await closedSessions.next()
        #expect(statistics?.bytesIn == payload.count)
        #expect(statistics?.crc32In == crc.value)
        print("USB rig: native sessions over GadgetFS: 8 MiB echo, reopen, 2 MiB sink with matching CRC; ep0: \(device.log.joined(separator: "; "))")
    }

    /// A GadgetFS gadget whose controller is soft-disconnected with a native session open: the
    /// session ends with an error after what it had received, the accessory disconnects, and the
    /// gadget hears DISCONNECT and closes its endpoints (the native channel first), after which
    /// it stops cleanly. (Reconnecting through `soft_connect` is not tested: on this kernel
    /// dummy_hcd then answers every control request with a protocol error, before any gadget
    /// driver is called.)
    @Test(.timeLimit(.minutes(3))) func aGadgetFSGadgetDisconnectedWithANativeSessionOpenEndsItCleanly() async throws {
        let profile = try #require(SimulatorProfile.builtIn(named: "native-streamer"))
        let layout = try GadgetFSLayout(vendorID: 0x1209, productID: 0x00BC, manufacturer: "AccessoryHost Simulator",
                                        product: profile.accessory.name, serialNumber: profile.accessory.serialNumber,
                                        nativeProtocols: profile.nativeProtocolNames)
        let device = try GadgetFSDevice(layout: layout)
        let runner = try SimulatorRunner(profile: profile, attachment: .transport(device.transport))
        device.onNativeOpen { name, channel in runner.openNativeSession(for: name, over: channel) }
        runner.start()
        defer { runner.stop() }
        let manager = AccessoryManager()
        defer { manager.stop() }
        let events = manager.events
        try manager.startUSB()
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)) { $0.usbDevice?.productID == 0x00BC },
                                     "ep0: \(device.log)")
        let session = try await accessory.openSession(for: "com.example.native.echo")
        #expect(try await echo(session, pattern(256 << 10, seed: 11)))

        // The controller GadgetFS bound is the one whose function is set.
        let controller = try #require(udcs().first { udc in
            let function = (try? String(contentsOfProcFile: "/sys/class/udc/\(udc)/function")) ?? ""
            return function.contains { !$0.isWhitespace }
        }, "a controller carries the GadgetFS function")
        let path = "/sys/class/udc/\(controller)/soft_connect"
        let file = try #require(fopen(path, "w"), "cannot open \(path)")
        fputs("disconnect", file)
        #expect(fclose(file) == 0, "soft_connect took the disconnect")
        for await event in events {
            if case let .disconnected(gone, _) = event, gone.connectionID == accessory.connectionID { break }
        }
        #expect(!accessory.isConnected)
        while let chunk = try? await session.read(), !chunk.isEmpty {} // what was received, then the end
        await #expect(throws: AccessoryError.self) { try await session.write([1]) }
        device.stop() // returns: no thread of the gadget is stuck on the dead endpoints
        let log = device.log
        let disconnect = try #require(log.lastIndex(of: "disconnect"), "the gadget heard DISCONNECT: \(log)")
        #expect(log[disconnect...].contains("closing 1 native channel"))
        #expect(log[disconnect...].contains("endpoints closed"))
        #expect(log.last == "stopped")
        print("USB rig: GadgetFS disconnect: \(log.joined(separator: "; "))")
    }

    /// libusb 1.0.26 unlocks a device handle's mutex without having locked it when SET_INTERFACE
    /// is asked of a device it has already marked detached (libusb #1199), and the
    /// `libusb_close` after that aborts the process (`usbi_mutex_destroy: Assertion
    /// pthread_mutex_destroy(mutex) == 0 failed`): what a native session closing as its
    /// accessory is unplugged did once in this suite. The backend's handles wrap a usbfs
    /// descriptor of its own, whose device libusb never marks detached: SET_INTERFACE after the
    /// unplug reaches the kernel, which answers NO_DEVICE, and the close is clean. (With
    /// `libusb_open`'s handles this test aborts the bundle at the close.)
    @Test func setInterfaceOnAnUnpluggedDeviceThenCloseDoesNotAbort() throws {
        let device = try GadgetAccessory(echoProfile(sessions: 1), name: "rigdetach", udc: try #require(udcs().first),
                                         productID: 0x00BE)
        defer { device.remove() }
        let queue = DispatchQueue(label: "rig.detach")
        let context = try USBContext(queue: queue, function: .iAP2)
        let seen = Mutex<(arrived: USBDeviceInfo?, left: Bool)>((nil, false))
        let arrived = DispatchSemaphore(value: 0)
        let left = DispatchSemaphore(value: 0)
        try queue.sync {
            try context.startMonitoring { event in
                switch event {
                case let .arrived(info) where info.descriptor.productID == 0x00BE:
                    seen.withLock { $0.arrived = info }
                    arrived.signal()
                case let .left(info) where info.descriptor.productID == 0x00BE:
                    seen.withLock { $0.left = true }
                    left.signal()
                default: break
                }
            }
        }
        #expect(arrived.wait(timeout: .now() + 30) == .success, "the gadget enumerated")
        let info = try #require(seen.withLock { $0.arrived })
        let interface = try #require(info.function).interface.number
        let backend = context.backend
        // Off the event queue, as the layer opens and selects alternate settings (setup queue).
        let handle = try backend.open(bus: info.bus, address: info.address).get()
        #expect(backend.claimInterface(handle, interface) == 0)

        try device.gadget.unbind()
        // libusb reports the departure after it marked the device detached.
        #expect(left.wait(timeout: .now() + 30) == .success, "the unplug reached libusb")
        let status = backend.setInterfaceAltSetting(handle, interface: interface, alternateSetting: 0)
        #expect(status == -4, "LIBUSB_ERROR_NO_DEVICE for the vanished device, got \(status)")
        _ = backend.releaseInterface(handle, interface)
        queue.sync { backend.close(handle) } // aborted here with libusb_open's handle
        queue.sync { context.shutdown() }
        #expect(context.waitUntilExited(timeout: .now() + 10))
    }

    @Test func withoutDeviceMemoryTheSlotsComeFromTheHeapAndDataStillFlows() async throws {
        let device = try GadgetAccessory(echoProfile(sessions: 1), name: "righeap", udc: try #require(udcs().first))
        defer { device.remove() }
        let manager = AccessoryManager()
        defer { manager.stop() }
        var options = USBOptions()
        options.useDeviceMemory = false
        try manager.startUSB(options: options)
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)))
        let statistics = try #require(manager.usbStatistics(of: accessory))
        #expect(statistics.deviceMemorySlots == 0 && statistics.heapSlots == 12)
        let session = try await accessory.openSession(for: "rig.echo.1")
        defer { session.close() }
        #expect(try await echo(session, pattern(4 << 20, seed: 5)))
    }
}

extension String {
    /// Reads a /proc file (their size is 0 to stat, so read until end of file).
    init(contentsOfProcFile path: String) throws {
        guard let file = fopen(path, "r") else { throw USBHostError(.io, "cannot read \(path)") }
        defer { fclose(file) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let count = fread(&buffer, 1, buffer.count, file)
            if count <= 0 { break }
            bytes += buffer.prefix(count)
        }
        self = String(decoding: bytes, as: UTF8.self)
    }
}
