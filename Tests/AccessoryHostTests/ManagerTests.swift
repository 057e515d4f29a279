@testable import AccessoryHost
import Dispatch
import IAPLink
import IAPTransport
import Synchronization
import Testing
import TestSupport
import USBHost

@Suite("AccessoryManager over the in-memory transport and a pseudo-terminal", .timeLimit(.minutes(1)))
struct ManagerTests {
    /// A manager with one echo accessory attached.
    static func connected(supported: [String] = ["com.acme.echo"], wire: Wire = .memory) async throws -> (AccessoryManager, EchoAccessory, Accessory) {
        let manager = AccessoryManager(configuration: .init(supportedProtocols: supported))
        let (host, device, _) = try wire.make()
        let accessory = EchoAccessory(transport: device)
        manager.attach(host)
        accessory.start()
        let found = try #require(await manager.waitForAccessory(timeout: .seconds(10)))
        return (manager, accessory, found)
    }

    @Test(arguments: Wire.allCases)
    func anAccessoryIsAnnouncedWithItsIdentity(wire: Wire) async throws {
        let (manager, echo, accessory) = try await Self.connected(wire: wire)
        defer { manager.stop(); echo.stop() }
        #expect(accessory.connectionID != 0)
        #expect(accessory.isConnected)
        #expect(accessory.name == "Echo Box")
        #expect(accessory.manufacturer == "Acme")
        #expect(accessory.modelNumber == "EB-2")
        #expect(accessory.serialNumber == "EB000042")
        #expect(accessory.firmwareRevision == "2.0.1")
        #expect(accessory.hardwareRevision == "B")
        #expect(accessory.protocolStrings == ["com.acme.echo", "com.acme.other"])
        #expect(accessory.transportKind == (wire == .memory ? .memory : .serial))
        #expect(accessory.supportsConfiguredProtocols)
        #expect(manager.connectedAccessories.map(\.connectionID) == [accessory.connectionID])
    }

    @Test("a session loop on the manager's task executor echoes, and the synchronous calls work there too")
    func aLoopOnTheManagersExecutor() async throws {
        let (manager, echo, accessory) = try await Self.connected()
        defer { echo.stop() }
        let session = try await accessory.openSession(for: "com.acme.echo")
        let received = try await withTaskExecutorPreference(manager.taskExecutor) {
            // Whatever runs here runs on the manager's queue: calls that take the queue run
            // inline there, stop() included, instead of waiting for themselves.
            defer { manager.stop() }
            var received: [UInt8] = []
            for round in 0..<50 {
                let message = [UInt8](repeating: UInt8(round), count: 100)
                try await session.write(message)
                var got: [UInt8] = []
                while got.count < message.count, let chunk = try await session.read() { got += chunk }
                received += got
                // Synchronous calls from the manager's queue run inline instead of deadlocking.
                _ = session.hasBytesAvailable
                _ = session.readAvailable()
                _ = accessory.dataPlaneStatistics
            }
            return received
        }
        #expect(received == (0..<50).flatMap { [UInt8](repeating: UInt8($0), count: 100) })
        #expect(!accessory.isConnected)
    }

    @Test func filtersMatchWhatTheAccessoryDeclared() async throws {
        let (manager, echo, accessory) = try await Self.connected()
        defer { manager.stop(); echo.stop() }
        #expect(accessory.usbDevice == nil)
        #expect(AccessoryFilter().matches(accessory))
        #expect(AccessoryFilter(names: ["Other", "Echo Box"], firmwareRevisions: ["2.0.1"]).matches(accessory))
        #expect(AccessoryFilter(serialNumbers: ["EB000042"], protocols: ["com.x", "com.acme.other"]).matches(accessory))
        #expect(!AccessoryFilter(names: ["Echo Box"], firmwareRevisions: ["2.0.2"]).matches(accessory), "every kind must hold")
        #expect(!AccessoryFilter(names: ["echo box"]).matches(accessory), "names compare exactly")
        #expect(!AccessoryFilter(protocols: ["com.acme"]).matches(accessory))
        #expect(!AccessoryFilter(usbIDs: [USBID(vendorID: 0x1209, productID: 1)]).matches(accessory), "not on USB")
        #expect(AccessoryFilter(names: ["A", "B"], usbIDs: [USBID(vendorID: 0x1209, productID: 0xA1)]).description
                == "name \"A\" or \"B\", USB 1209:00a1")
        #expect(AccessoryFilter().description == "any accessory")
    }

    @Test func waitingUntilNoAccessoryMatches() async throws {
        let (manager, echo, accessory) = try await Self.connected()
        defer { manager.stop() }
        let baseline = manager.callbackCount
        #expect(await manager.waitUntilNoAccessory(timeout: .seconds(3_600)) { $0.name == "Someone Else" }, "none matches: at once")
        #expect(manager.callbackCount == baseline, "a finished wait stops watching (its timeout is an hour away)")
        #expect(await manager.waitUntilNoAccessory(timeout: .milliseconds(200)) { $0.name == "Echo Box" } == false, "still there")
        // The predicate is first asked after the wait watches events: only then is the accessory
        // stopped, so the disconnection event (not the first look) must end the wait.
        let asked = AsyncStream<Void>.makeStream()
        let once = Mutex(false)
        async let gone = manager.waitUntilNoAccessory(timeout: .seconds(10)) { candidate in
            let first = once.withLock { seen -> Bool in
                defer { seen = true }
                return !seen
            }
            if first { asked.continuation.yield() }
            return candidate.name == "Echo Box"
        }
        for await _ in asked.stream { break }
        echo.stop()
        #expect(await gone, "it went away")
        #expect(!accessory.isConnected)
        #expect(manager.callbackCount == baseline)
    }

    @Test("stopping a manager ends the event sequences of subscribers still holding them")
    func stopEndsLiveEventSequences() async throws {
        let manager = AccessoryManager()
        let events = manager.events
        manager.stop() // it crashed here: the sequence's termination handler took the manager's lock again
        var count = 0
        for await _ in events { count += 1 }
        #expect(count == 0)
    }

    @Test func aFinishedWaitForAnAccessoryStopsWatching() async throws {
        let (manager, echo, accessory) = try await Self.connected()
        defer { manager.stop(); echo.stop() }
        let baseline = manager.callbackCount
        #expect(await manager.waitForAccessory(timeout: .seconds(3_600)) { $0 === accessory } === accessory)
        #expect(manager.callbackCount == baseline)
        #expect(await manager.waitUntilSettled(timeout: .seconds(3_600)))
        #expect(manager.callbackCount == baseline)
    }

    @Test func accessoriesWithoutOurProtocolsAreListedButMarked() async throws {
        let (manager, echo, accessory) = try await Self.connected(supported: ["com.somebody.else"])
        defer { manager.stop(); echo.stop() }
        #expect(!accessory.supportsConfiguredProtocols)
        #expect(manager.connectedAccessories.count == 1)
    }

    @Test(arguments: Wire.allCases)
    func aSessionEchoesBytesExactly(wire: Wire) async throws {
        let (manager, echo, accessory) = try await Self.connected(wire: wire)
        defer { manager.stop(); echo.stop() }
        let session = try await accessory.openSession(for: "com.acme.echo")
        let payload = testPattern(300_000)
        async let sent: Void = session.write(payload)
        var received: [UInt8] = []
        while received.count < payload.count, let chunk = try await session.read() { received += chunk }
        try await sent
        #expect(received == payload)
    }

    @Test func whatTheAccessoryAcknowledgedIsCountedAndOutlivesIt() async throws {
        let (manager, echo, accessory) = try await Self.connected()
        defer { manager.stop() }
        let session = try await accessory.openSession(for: "com.acme.echo")
        #expect(session.bytesAcknowledged == 0)
        let payload = testPattern(300_000)
        async let sent: Void = session.write(payload)
        var received = 0
        while received < payload.count, let chunk = try await session.read() { received += chunk.count }
        try await sent
        // The echo of the last byte came in a packet that acknowledged it.
        #expect(session.bytesAcknowledged == payload.count)
        echo.stop()
        while try await session.read() != nil {}
        #expect(!accessory.isConnected)
        #expect(session.bytesAcknowledged == payload.count, "still known after the accessory went away")
        session.close()
        #expect(session.bytesAcknowledged == payload.count, "still known after the session was closed")
    }

    @Test func drainWaitsForTheAccessorysAcknowledgementAndFailsWhenTheSessionEndsFirst() async throws {
        let (manager, echo, accessory) = try await Self.connected()
        defer { manager.stop() }
        let session = try await accessory.openSession(for: "com.acme.echo")
        let payload = testPattern(200_000)
        let reader = Task {
            var received = 0
            while received < payload.count, let chunk = try await session.read() { received += chunk.count }
        }
        try await session.write(payload)
        try await session.drain()
        #expect(session.bytesAcknowledged == payload.count)
        try await reader.value
        // Nothing outstanding: returns at once.
        try await session.drain()
        // The accessory vanishes with bytes unacknowledged: drain throws instead of waiting.
        echo.stop()
        let wroteLate = (try? await session.write([1, 2, 3])) != nil
        if wroteLate {
            await #expect(throws: (any Error).self) { try await session.drain() }
        }
        #expect(session.bytesAcknowledged == payload.count)
    }

    @Test("a handler queue that is held up collects one hasBytesAvailable and one hasSpaceAvailable, not one per packet")
    func streamEventsAreCoalescedForAHeldUpQueue() async throws {
        let (manager, echo, accessory) = try await Self.connected()
        defer { manager.stop(); echo.stop() }
        let session = try await accessory.openSession(for: "com.acme.echo")
        let handlerQueue = DispatchQueue(label: "test.held-up-handler")
        let seen = Mutex<[SessionStreamEvent]>([])
        handlerQueue.suspend()
        session.setEventHandler(queue: handlerQueue) { event in seen.withLock { $0.append(event) } }
        // 5,000 writes and their echoes: each one served the session and used to post an event.
        var written = 0
        for _ in 0..<5_000 { written += try session.writeAvailable([0x42]) }
        #expect(written > 0)
        try await session.flush()
        // The marker goes behind whatever waits on the held-up queue now.
        let backlog = await withCheckedContinuation { (continuation: CheckedContinuation<[SessionStreamEvent], Never>) in
            handlerQueue.async { continuation.resume(returning: seen.withLock { $0 }) }
            handlerQueue.resume()
        }
        #expect(backlog.first == .openCompleted)
        #expect(backlog.filter { $0 == .hasSpaceAvailable }.count <= 1, "\(backlog.count) events were waiting")
        #expect(backlog.filter { $0 == .hasBytesAvailable }.count <= 1, "\(backlog.count) events were waiting")
        #expect(backlog.count <= 3)
        // Still delivered once the queue runs: the echo is readable and announced.
        _ = try await session.read()
        session.close()
    }

    @Test(arguments: Wire.allCases)
    func oneSessionPerProtocolAndOnlyDeclaredProtocols(wire: Wire) async throws {
        let (manager, echo, accessory) = try await Self.connected(wire: wire)
        defer { manager.stop(); echo.stop() }
        let session = try await accessory.openSession(for: "com.acme.echo")
        await #expect(throws: AccessoryError.protocolInUse("com.acme.echo")) { _ = try await accessory.openSession(for: "com.acme.echo") }
        await #expect(throws: AccessoryError.unsupportedProtocol("com.nope", available: ["com.acme.echo", "com.acme.other"])) {
            _ = try await accessory.openSession(for: "com.nope")
        }
        let other = try await accessory.openSession(for: "com.acme.other")
        session.close()
        other.close()
        // Closed: the protocol can be opened again.
        let again = try await accessory.openSession(for: "com.acme.echo")
        try await again.write([1, 2, 3])
        #expect(try await again.read() == [1, 2, 3])
    }

    @Test(arguments: Wire.allCases)
    func disconnectWhileAReaderWaits(wire: Wire) async throws {
        let (host, device, _) = try wire.make()
        let manager = AccessoryManager()
        let echo = EchoAccessory(transport: device)
        defer { manager.stop(); echo.stop() }
        let events = manager.events
        manager.attach(host)
        echo.start()
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(10)))
        let session = try await accessory.openSession(for: "com.acme.echo")
        try await session.write([9, 9, 9])
        var echoed: [UInt8] = []
        while echoed.count < 3, let chunk = try await session.read() { echoed += chunk }
        #expect(echoed == [9, 9, 9])
        let waiting = Task { try await session.read() }
        echo.stop() // the accessory goes away
        #expect(try await waiting.value == nil) // the stream ends
        await #expect(throws: AccessoryError.self) { try await session.write([1]) }
        #expect(!accessory.isConnected)
        var sequence: [String] = []
        for await event in events {
            switch event {
            case .connected: sequence.append("connected")
            case .disconnected: sequence.append("disconnected")
            case .failed: sequence.append("failed")
            case .appLaunchRequested: sequence.append("appLaunchRequested")
            }
            if sequence.count == 2 { break }
        }
        #expect(sequence == ["connected", "disconnected"])
    }

    @Test(arguments: Wire.allCases)
    func bytesReceivedBeforeADisconnectStayReadable(wire: Wire) async throws {
        let (host, device, _) = try wire.make()
        let manager = AccessoryManager()
        let echo = EchoAccessory(transport: device)
        defer { manager.stop(); echo.stop() }
        manager.attach(host)
        echo.start()
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(10)))
        let session = try await accessory.openSession(for: "com.acme.echo")
        // Wait for the first echoed bytes without reading them.
        let available = AsyncStream<Void>.makeStream()
        session.setEventHandler(queue: .global()) { event in
            if event == .hasBytesAvailable { available.continuation.yield() }
        }
        try await session.write(testPattern(10_000))
        var iterator = available.stream.makeAsyncIterator()
        _ = await iterator.next()
        echo.stop() // the accessory goes away
        var received: [UInt8] = []
        while let chunk = try await session.read() { received += chunk }
        #expect(received == Array(testPattern(10_000).prefix(received.count)))
        #expect(!received.isEmpty)
    }

    @Test(arguments: Wire.allCases)
    func zeroCopyReadsLendTheBytesInPlace(wire: Wire) async throws {
        let (manager, echo, accessory) = try await Self.connected(wire: wire)
        defer { manager.stop(); echo.stop() }
        let session = try await accessory.openSession(for: "com.acme.echo")
        let payload = testPattern(200_000, seed: 5)
        let writer = Task { try await session.write(payload) }
        var received: [UInt8] = []
        var borrowed = 0
        while received.count < payload.count {
            // Consume at most 1000 bytes per borrow: the rest must stay readable.
            let taken = session.withNextChunk { bytes -> (consumed: Int, result: Int) in
                let count = min(bytes.byteCount, 1_000)
                bytes.extracting(0..<count).withUnsafeBytes { received.append(contentsOf: $0) }
                return (count, count)
            }
            if let taken {
                borrowed += taken
            } else if let chunk = try await session.read(maxBytes: 1) {
                received += chunk // nothing to borrow yet: wait for bytes
            }
        }
        try await writer.value
        #expect(received == payload)
        #expect(borrowed > payload.count / 2)
    }

    /// An accessory that stops answering (but does not go away): the link gives up after the
    /// negotiated retransmissions and the accessory is reported gone, with the reason.
    @Test func anAccessoryThatStopsAnsweringIsDisconnected() async throws {
        var quick = LinkConfiguration.accessory
        quick.parameters.retransmissionTimeout = 50
        quick.parameters.maxRetransmissions = 3
        let (host, device) = MemoryTransport.pair()
        let muted = MuteableTransport(device)
        let echo = EchoAccessory(transport: muted, configuration: quick)
        let manager = AccessoryManager()
        defer { manager.stop(); echo.stop() }
        let events = manager.events
        manager.attach(host)
        echo.start()
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(10)))
        let session = try await accessory.openSession(for: "com.acme.echo")
        muted.muted.store(true, ordering: .relaxed)
        try? await session.write(testPattern(10_000))
        var reason: String?
        for await event in events {
            if case let .disconnected(_, why) = event { reason = why; break }
        }
        #expect(reason?.contains("stopped answering") == true)
        #expect(!accessory.isConnected)
        #expect(try await session.read() == nil)
    }
}

@Suite("The host's receive limits per transport")
struct LinkLimitTests {
    @Test("a serial line advertises packets that cross it in about a quarter of a second")
    func serialLinesGetShorterPackets() throws {
        // Two lines: a port has one owner at a time (a second open is refused as busy).
        let pty = try PseudoTerminal(), other = try PseudoTerminal()
        let slow = try SerialTransport(spec: try SerialPortSpec(parsing: pty.slavePath + ":115200"))
        let fast = try SerialTransport(spec: try SerialPortSpec(parsing: other.slavePath + ":3000000"))
        defer {
            slow.cancel()
            fast.cancel()
        }
        #expect(AccessoryManager.link(.device, over: slow).parameters.maxPacketLength == 2_880)
        #expect(AccessoryManager.link(.device, over: fast).parameters.maxPacketLength == 65_535)
        withExtendedLifetime(other) {}
        let (memory, _) = MemoryTransport.pair()
        #expect(AccessoryManager.link(.device, over: memory).parameters == LinkConfiguration.device.parameters)
    }

    @Test("a serial line gives up on a partial frame after a silence suited to its baud rate")
    func serialLinesGetTheirInterByteGap() throws {
        let pty = try PseudoTerminal()
        let slow = try SerialTransport(spec: try SerialPortSpec(parsing: pty.slavePath + ":9600"))
        defer { slow.cancel() }
        // 32 characters take 33 ms at 9600 baud, the slowest rate a port takes: every supported
        // rate gets the floor, and a configuration that asks for longer keeps it.
        #expect(AccessoryManager.link(.device, over: slow).interByteGap == LinkConfiguration.defaultInterByteGap)
        var patient = LinkConfiguration.device
        patient.interByteGap = .milliseconds(400)
        #expect(AccessoryManager.link(patient, over: slow).interByteGap == .milliseconds(400))
        let (memory, _) = MemoryTransport.pair()
        #expect(AccessoryManager.link(.device, over: memory).interByteGap == LinkConfiguration.defaultInterByteGap)
    }
}
