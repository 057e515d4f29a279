// Real accessories as they are (PROTOCOL.md §7) on the rig's real kernel: the descriptor layouts
// of the field, an accessory that sticks after a failed handshake until the host resets it, and
// how fast a freshly bound gadget is answered and identified. Part of the serialized
// USBRigTests suite: every test here binds the rig's controllers.

import AccessoryHost
import AccessoryHostUSB
import AccessoryGadget
import AccessoryLogging
import AccessorySimulator
import Dispatch
import Glibc
import IAPLink
import IAPTransport
import Synchronization
import Testing
@testable import USBHost
import USBDescriptors

/// A profile with one EA echo protocol on the link and `natives` echo protocols on native
/// transports.
func fieldProfile(natives: [String], serial: String) -> SimulatorProfile {
    SimulatorProfile(
        accessory: .init(name: "Field Layout", model: "RIG-F", manufacturer: "AccessoryHost", serialNumber: serial,
                         firmwareVersion: "1.0.0", hardwareVersion: "R1"),
        protocols: [SimulatorProfile.ProtocolSpec(name: "rig.echo.1", behaviour: .echo)]
            + natives.map { SimulatorProfile.ProtocolSpec(name: $0, behaviour: .echo, native: true) })
}

/// A gadget's wire that notes when the host first answered (its reply to the detect) and passes
/// everything through, host connection changes included.
final class TimingWire: HostReconnectingWire, Sendable {
    let inner: any HostReconnectingWire
    private let firstReceived = Mutex<ContinuousClock.Instant?>(nil)
    private let handler = Mutex<(@Sendable (HostConnectionState) -> Void)?>(nil)

    init(_ inner: any HostReconnectingWire) {
        self.inner = inner
        inner.onHostConnectionChange { [weak self] connection in self?.handler.withLock { $0 }?(connection) }
    }

    /// When the first bytes from the host arrived: its answer to the accessory's detect.
    var hostAnswered: ContinuousClock.Instant? { firstReceived.withLock { $0 } }
    var description: String { inner.description }
    var kind: TransportKind { inner.kind }
    var hostConnection: HostConnectionState { inner.hostConnection }
    func onHostConnectionChange(_ handler: @escaping @Sendable (HostConnectionState) -> Void) { self.handler.withLock { $0 = handler } }
    func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) {
        inner.activate(queue: queue) { [weak self] event in
            switch event {
            case .received, .borrowed, .lent: self?.firstReceived.withLock { $0 = $0 ?? .now }
            case .closed: break
            }
            handler(event)
        }
    }
    func send(_ frame: [UInt8]) { inner.send(frame) }
    func cancel() { inner.cancel() }
}

/// Notes when the manager heard of each USB accessory (its "USB: accessory … at …" line; its
/// strings are not read yet then, so arrivals are told apart by time).
final class ArrivalLog: LogHandler {
    let arrivals = Mutex<[(String, ContinuousClock.Instant)]>([])
    func log(_ record: LogRecord) {
        guard record.message.hasPrefix("USB: accessory ") else { return }
        let now = ContinuousClock.now
        arrivals.withLock { $0.append((record.message, now)) }
    }
    /// The first arrival at or after `instant`.
    func arrival(after instant: ContinuousClock.Instant) -> ContinuousClock.Instant? {
        arrivals.withLock { $0.first { $0.1 >= instant }?.1 }
    }
}

/// The value at fraction `p` (0…1) of `values` sorted (nearest rank).
func percentile(_ values: [Duration], _ p: Double) -> Duration {
    let sorted = values.sorted()
    guard !sorted.isEmpty else { return .zero }
    let rank = Int((p * Double(sorted.count)).rounded(.up)) - 1
    return sorted[min(max(rank, 0), sorted.count - 1)]
}

func milliseconds(_ duration: Duration) -> Int {
    Int(duration.components.seconds) * 1_000 + Int(duration.components.attoseconds / 1_000_000_000_000_000)
}

extension USBRigTests {
    /// The two field layouts with native interfaces, served by GadgetFS with every descriptor
    /// exact: the host finds the iAP2 interface on the layout's endpoints and configuration, names
    /// the native interfaces, identifies the accessory, and echoes on a link session and on
    /// every native protocol.
    @Test(.timeLimit(.minutes(3)), arguments: [USBDescriptorLayout.supercamera, .flirOne])
    func aFieldLayoutOverGadgetFSIsFoundAndServesLinkAndNativeSessions(_ layout: USBDescriptorLayout) async throws {
        let natives = layout == .supercamera ? ["com.useeplus.protocol"] : ["com.flir.rosebud.frame", "com.flir.rosebud.fileio"]
        let productID: UInt16 = layout == .supercamera ? 0x00C1 : 0x00C2
        let profile = fieldProfile(natives: natives, serial: "FIELD-\(layout.rawValue)")
        let gadgetLayout = try GadgetFSLayout(vendorID: 0x1209, productID: productID, manufacturer: "AccessoryHost Simulator",
                                              product: profile.accessory.name, serialNumber: profile.accessory.serialNumber,
                                              nativeProtocols: natives, descriptorLayout: layout)
        let device = try GadgetFSDevice(layout: gadgetLayout)
        defer { device.stop() }
        let runner = try SimulatorRunner(profile: profile, attachment: .transport(device.transport))
        device.onNativeOpen { name, channel in runner.openNativeSession(for: name, over: channel) }
        runner.start()
        defer { runner.stop() }
        let manager = AccessoryManager()
        defer { manager.stop() }
        try manager.startUSB()
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)) { $0.usbDevice?.productID == productID },
                                     "\(layout) identified over GadgetFS; ep0: \(device.log)")
        let info = try #require(accessory.usbDevice?.info)
        #expect(info.descriptor.deviceClass == layout.deviceClass[0])
        #expect(info.activeConfiguration == layout.configurationValue)
        let function = try #require(info.function)
        #expect(function.configurationValue == layout.configurationValue)
        #expect(function.interface.number == 0)
        #expect(function.bulkIn.address == layout.iAP2Endpoints.in && function.bulkOut.address == layout.iAP2Endpoints.out)
        let expected = natives.indices.compactMap { layout.nativeEndpoints($0) }
        #expect(function.nativeInterfaces.map(\.bulkIn.address) == expected.map(\.in))
        #expect(function.nativeInterfaces.map(\.bulkOut.address) == expected.map(\.out))
        #expect(info.nativeInterfaceNames == Dictionary(uniqueKeysWithValues: natives.enumerated().map { (UInt8($0.offset + 1), $0.element) }))

        let onLink = try await accessory.openSession(for: "rig.echo.1")
        #expect(!onLink.usesNativeTransport)
        #expect(try await echo(onLink, pattern(256 << 10, seed: 21)), "\(layout): echo on the link")
        onLink.close()
        for (index, name) in natives.enumerated() {
            let native = try await accessory.openSession(for: name)
            #expect(native.usesNativeTransport)
            #expect(try await echo(native, pattern(256 << 10, seed: 22 + index)), "\(layout): echo on native '\(name)'")
            native.close()
        }
        print("USB rig: layout \(layout.rawValue) over GadgetFS: class \(info.descriptor.deviceClass), configuration \(layout.configurationValue), "
            + "iAP2 IN 0x\(String(function.bulkIn.address, radix: 16)) OUT 0x\(String(function.bulkOut.address, radix: 16)), "
            + "native \(function.nativeInterfaces.map { "\($0.number): IN 0x\(String($0.bulkIn.address, radix: 16)) OUT 0x\(String($0.bulkOut.address, radix: 16))" }.joined(separator: ", ")); "
            + "link and native echoes byte-exact")
    }

    /// Every field layout on the configfs/FunctionFS gadget (the simulator's own): the device
    /// class and the configuration value are the layout's, the endpoint numbers the kernel's
    /// (autoconfiguration); the host finds, claims and identifies it, and echoes on a link
    /// session. The §7.9 layouts: the iAP2 interface at the layout's number (5 after audio, HID
    /// and DFU), its interrupt IN endpoint beside the bulk pair and never used, 64-byte bulk
    /// packets at full speed, and the generic ids 0525:a4a0 (found by serial number, not id).
    @Test(.timeLimit(.minutes(4)), arguments: USBDescriptorLayout.allCases)
    func aFieldLayoutOverFunctionFSIsFoundIdentifiedAndEchoes(_ layout: USBDescriptorLayout) async throws {
        let productID = 0x00D0 + UInt16(USBDescriptorLayout.allCases.firstIndex(of: layout) ?? 0)
        let serial = "FFS-\(layout.rawValue)"
        let device = try GadgetAccessory(fieldProfile(natives: [], serial: serial), name: "rigfield",
                                         udc: try #require(udcs().first), productID: productID, layout: layout)
        defer { device.remove() }
        let manager = AccessoryManager()
        defer { manager.stop() }
        try manager.startUSB()
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)) { $0.serialNumber == serial },
                                     "\(layout) identified over FunctionFS")
        let info = try #require(accessory.usbDevice?.info)
        #expect(info.descriptor.deviceClass == layout.deviceClass[0])
        #expect(info.activeConfiguration == layout.configurationValue)
        #expect(info.function?.configurationValue == layout.configurationValue)
        if let release = layout.deviceRelease { #expect(info.descriptor.release == release) }
        let ids = layout.usbID ?? (0x1209, productID)
        #expect(info.descriptor.vendorID == ids.vendorID && info.descriptor.productID == ids.productID)
        let function = try #require(info.function)
        #expect(function.interface.number == layout.iAP2InterfaceNumber)
        let interrupts = function.interface.endpoints.filter { $0.attributes & 3 == 3 }
        #expect(interrupts.count == (layout.hasInterruptEndpoint ? 1 : 0), "\(layout): \(function.interface.endpoints)")
        #expect(interrupts.allSatisfy { $0.isIn && $0.packetSize == 64 })
        if layout == .interruptFirst { #expect(function.interface.endpoints.first?.attributes == 3) }
        if layout == .interruptAfter || layout == .sixthInterface { #expect(function.interface.endpoints.last?.attributes == 3) }
        if layout == .fullSpeed { #expect(function.bulkIn.packetSize == 64 && function.bulkOut.packetSize == 64) }
        let session = try await accessory.openSession(for: "rig.echo.1")
        defer { session.close() }
        #expect(try await echo(session, pattern(64 << 10, seed: 31)))
        print("USB rig: layout \(layout.rawValue) over FunctionFS: \(info.descriptor.idString), class \(info.descriptor.deviceClass), configuration "
            + "\(info.activeConfiguration.map(String.init) ?? "none"), iAP2 interface \(function.interface.number): "
            + "\(function.interface.endpoints.map(\.description).joined(separator: ", ")) (the kernel's numbers); echo byte-exact")
    }

    /// An accessory that sticks after its first handshake (TD300, PROTOCOL.md §7.2): it sends its
    /// SYN, then ignores the host until the gadget sees the bus reset. The host resets the
    /// device once (no re-plug), says so as an event, and the accessory is identified and echoes;
    /// measured over several binds, from the moment it stuck to a finished echo.
    @Test(.timeLimit(.minutes(4))) func aStickingAccessoryIsResetOnceAndServesAgainWithinFiveSeconds() async throws {
        let udc = try #require(udcs().first)
        let manager = AccessoryManager()
        defer { manager.stop() }
        let failures = Mutex<[String]>([])
        let subscription = manager.onEvent(queue: manager.queue) { event in
            if case let .failed(_, reason) = event { failures.withLock { $0.append(reason) } }
        }
        defer { subscription.cancel() }
        try manager.startUSB()
        var recoveries: [Duration] = [], stuckFor: [Duration] = []
        for round in 1...4 {
            let serial = "STICK-\(round)"
            let stuckAt = Mutex<ContinuousClock.Instant?>(nil)
            let wire = Mutex<StickingWire?>(nil)
            let device = try GadgetAccessory(fieldProfile(natives: [], serial: serial), name: "rigstick", udc: udc, productID: 0x00E0,
                                             wire: { gadget in
                                                 let sticking = StickingWire(gadget)
                                                 sticking.onStickingChange(stuck: { stuckAt.withLock { $0 = .now } }, unstuck: {})
                                                 wire.withLock { $0 = sticking }
                                                 return sticking
                                             })
            defer { device.remove() }
            let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)) { $0.serialNumber == serial },
                                         "round \(round): identified after the reset; failures: \(failures.withLock { $0 })")
            let session = try await accessory.openSession(for: "rig.echo.1")
            #expect(try await echo(session, pattern(64 << 10, seed: 40 + round)))
            session.close()
            let served = ContinuousClock.now
            let stuck = try #require(stuckAt.withLock { $0 }, "round \(round): the accessory stuck")
            let episodes = wire.withLock { $0 }?.stuckEpisodes ?? []
            #expect(episodes.count == 1, "round \(round): stuck once, unstuck by the host's reset: \(episodes)")
            recoveries.append(served - stuck)
            stuckFor += episodes
            #expect(served - stuck <= .seconds(5), "round \(round): serving again \(served - stuck) after it stuck")
            #expect(manager.usbStatistics(of: accessory)?.deviceResets == 1, "round \(round): one reset, no loop")
        }
        let said = failures.withLock { $0 }
        #expect(said.filter { $0.contains("resetting the USB device once") }.count == recoveries.count,
                "an event per reset, which iapctl watch shows: \(said)")
        print("USB rig: a sticking accessory served again (identified, 64 KiB echoed) after \(recoveries.map { "\(milliseconds($0)) ms" }.joined(separator: ", ")) "
            + "from the moment it stuck (host bound \(milliseconds(.seconds(2))) ms, then one USB reset): "
            + "median \(milliseconds(percentile(recoveries, 0.5))) ms, max \(milliseconds(recoveries.max() ?? .zero)) ms; of which stuck "
            + "(its SYN → the gadget sees the bus reset): \(stuckFor.map { "\(milliseconds($0)) ms" }.joined(separator: ", "))")
    }

    /// How fast a freshly bound gadget is answered and identified, over 20 binds: from the bind
    /// (the UDC written: enumeration starts) to the host's reply to the accessory's detect (the
    /// first bytes the gadget receives), and from that reply to the accessory's
    /// IdentificationAccepted (its `identified` event). The accessory answers at once.
    @Test(.timeLimit(.minutes(6))) func bindToDetectReplyAndIdentificationOverTwentyBinds() async throws {
        let udc = try #require(udcs().first)
        let arrivals = ArrivalLog()
        let manager = AccessoryManager(configuration: .init(logger: Logger(label: "rig", logLevel: .info, handler: arrivals)))
        defer { manager.stop() }
        try manager.startUSB()
        var toReply: [Duration] = [], toAccepted: [Duration] = [], toArrival: [Duration] = [], arrivalToReply: [Duration] = []
        for round in 1...20 {
            let serial = "TIME-\(round)"
            let timing = Mutex<TimingWire?>(nil)
            let accepted = AsyncStream<ContinuousClock.Instant>.makeStream()
            let device = try GadgetAccessory(fieldProfile(natives: [], serial: serial), name: "rigtime", udc: udc, productID: 0x00E1,
                                             wire: { gadget in
                                                 let wire = TimingWire(gadget)
                                                 timing.withLock { $0 = wire }
                                                 return wire
                                             }, bind: false,
                                             events: { event in if case .identified = event { accepted.continuation.yield(.now) } })
            defer { device.remove() }
            let bound = ContinuousClock.now
            try device.gadget.bind(udc: udc)
            var acceptedAt = accepted.stream.makeAsyncIterator()
            let identified = try #require(await acceptedAt.next(), "round \(round): identification accepted")
            let reply = try #require(timing.withLock { $0 }?.hostAnswered, "round \(round): the host answered the detect")
            toReply.append(reply - bound)
            toAccepted.append(identified - reply)
            if let arrived = arrivals.arrival(after: bound) {
                toArrival.append(arrived - bound)
                arrivalToReply.append(reply - arrived)
            }
            _ = await manager.waitForAccessory(timeout: .seconds(10)) { $0.serialNumber == serial }
        }
        let p95Reply = percentile(toReply, 0.95), p95Accepted = percentile(toAccepted, 0.95)
        print("USB rig: over 20 binds, bind → the host's reply to the detect: median \(milliseconds(percentile(toReply, 0.5))) ms, "
            + "p95 \(milliseconds(p95Reply)) ms, max \(milliseconds(toReply.max() ?? .zero)) ms (goal p95 ≤ 500 ms); "
            + "detect reply → IdentificationAccepted: median \(milliseconds(percentile(toAccepted, 0.5))) ms, p95 \(milliseconds(p95Accepted)) ms, "
            + "max \(milliseconds(toAccepted.max() ?? .zero)) ms (goal ≤ 1500 ms)")
        print("USB rig: of which bind → the manager hears of the device (kernel enumeration, udev, libusb hotplug): median "
            + "\(milliseconds(percentile(toArrival, 0.5))) ms, p95 \(milliseconds(percentile(toArrival, 0.95))) ms; the host's own part, "
            + "heard of → detect reply (open, strings, claim, first IN): median \(milliseconds(percentile(arrivalToReply, 0.5))) ms, "
            + "p95 \(milliseconds(percentile(arrivalToReply, 0.95))) ms (\(toArrival.count) of 20 binds)")
        print("USB rig: bind → detect reply (ms): \(toReply.map(milliseconds)); detect reply → accepted (ms): \(toAccepted.map(milliseconds))")
        // Goals, not asserted beyond a generous bound: TCG speed swings 2–4× between runs.
        #expect(p95Reply < .seconds(5) && p95Accepted < .seconds(10))
    }

    /// An accessory that leaves the bus right after a session starts and enumerates again, as
    /// the FLIR ONE does 1.9–2.6 ms after StartExternalAccessoryProtocolSession for two of its
    /// protocols and about 0.9 s later (PROTOCOL.md §7.1): the session (or its opening) ends with
    /// the reason that the accessory left the bus, the manager says the same, and the accessory
    /// is found again as a new connection whose sessions work.
    @Test(.timeLimit(.minutes(3))) func anAccessoryThatLeavesTheBusAsASessionStartsIsFoundAgain() async throws {
        let udc = try #require(udcs().first)
        let gadgetBox = Mutex<USBGadget?>(nil)
        let leftOnce = Mutex(false)
        let leftAt = Mutex<ContinuousClock.Instant?>(nil)
        let leaving = DispatchQueue(label: "rig.leave")
        let device = try GadgetAccessory(fieldProfile(natives: [], serial: "LEAVER-1"), name: "rigleave", udc: udc, productID: 0x00E2,
                                         events: { event in
                                             guard case .sessionOpened = event,
                                                   leftOnce.withLock({ done in defer { done = true }; return !done }) else { return }
                                             // At once, off the runner's queue; back 0.9 s later, as the camera does.
                                             leaving.async {
                                                 guard let gadget = gadgetBox.withLock({ $0 }) else { return }
                                                 try? gadget.unbind()
                                                 leftAt.withLock { $0 = .now }
                                                 leaving.asyncAfter(deadline: .now() + .milliseconds(900)) { try? gadget.bind(udc: udc) }
                                             }
                                         })
        gadgetBox.withLock { $0 = device.gadget }
        defer { device.remove() }
        let manager = AccessoryManager()
        defer { manager.stop() }
        let reasons = AsyncStream<String>.makeStream()
        let subscription = manager.onEvent(queue: DispatchQueue(label: "rig.leave.events")) { event in
            if case let .disconnected(_, reason) = event { reasons.continuation.yield(reason) }
        }
        defer { subscription.cancel() }
        try manager.startUSB()
        let first = try #require(await manager.waitForAccessory(timeout: .seconds(30)) { $0.serialNumber == "LEAVER-1" })
        var sessionError: (any Error)?
        do {
            let session = try await first.openSession(for: "rig.echo.1")
            defer { session.close() }
            // Opened before the accessory left: what was written fails, or the echo stops short.
            do {
                let complete = try await echo(session, pattern(64 << 10, seed: 50))
                #expect(!complete, "the accessory left: the echo cannot complete")
            } catch { sessionError = error }
        } catch { sessionError = error }
        var said = reasons.stream.makeAsyncIterator()
        let reason = try #require(await said.next())
        #expect(reason.contains("left the bus"), "the manager says the accessory left the bus: \(reason)")
        if let sessionError {
            #expect("\(sessionError)".contains("left the bus"), "the session says why it ended: \(sessionError)")
        }
        #expect(!first.isConnected)
        let second = try #require(await manager.waitForAccessory(timeout: .seconds(30)) {
            $0.serialNumber == "LEAVER-1" && $0.connectionID != first.connectionID
        }, "found again as a new connection")
        let back = ContinuousClock.now
        let session = try await second.openSession(for: "rig.echo.1")
        defer { session.close() }
        #expect(try await echo(session, pattern(64 << 10, seed: 51)), "the new connection's session echoes")
        let away = leftAt.withLock { $0 }.map { back - $0 } ?? .zero
        print("USB rig: an accessory that left the bus as its session started: \(sessionError.map { "the session ended: \($0)" } ?? "the echo stopped short"); "
            + "the manager said: \(reason); identified again as connection \(second.connectionID) (was \(first.connectionID)) "
            + "\(milliseconds(away)) ms after it left (0.9 s of that away, as the FLIR ONE)")
    }
}
