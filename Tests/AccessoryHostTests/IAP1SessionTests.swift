@testable import AccessoryHost
import AccessorySimulator
import Dispatch
import IAPLink
import IAPTransport
import Synchronization
import Testing
import TestSupport

/// Legacy iAP1 accessories through the public API: the simulator's "legacy-sensor" profile on
/// the in-memory transport and on a real pseudo-terminal (the UART path, with the 0xFF sync
/// byte), found by the same detect the host sends every accessory.
@Suite("iAP1 accessories through the session API", .timeLimit(.minutes(2)))
struct IAP1SessionTests {
    /// A manager with the legacy-sensor simulator attached over `wire`.
    static func connected(_ wire: Wire, profile: SimulatorProfile? = nil, events: (@Sendable (SimulatorEvent) -> Void)? = nil)
        async throws -> (AccessoryManager, SimulatorRunner, Accessory, (any Sendable)?)
    {
        // Over the pty, both ends wait 2 s of silence before giving a partial frame up, not the
        // line's 50 ms: iAP1 has no retransmission, so a frame given up on while its writer was
        // held off (a loaded machine running the suite in parallel) left the session waiting for
        // ever, and the suite's time limit ended it. What is tested here is the session API.
        var configuration = AccessoryManager.Configuration()
        var profile = try profile ?? #require(SimulatorProfile.builtIn(named: "legacy-sensor"))
        if wire == .pty {
            configuration.link.interByteGap = .seconds(2)
            profile.link.interByteGapMs = 2_000
        }
        let manager = AccessoryManager(configuration: configuration)
        let runner: SimulatorRunner
        var keepAlive: (any Sendable)?
        switch wire {
        case .memory:
            runner = try SimulatorRunner(profile: profile, attachment: .memory { manager.attach($0) })
        case .pty:
            let (host, device, alive) = try wire.make()
            keepAlive = alive
            runner = try SimulatorRunner(profile: profile, attachment: .transport(device))
            manager.attach(host)
        }
        runner.start(events: events)
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(10)))
        return (manager, runner, accessory, keepAlive)
    }

    @Test("the accessory is listed with its identity and protocols, as iAP1", arguments: Wire.allCases)
    func listedWithItsIdentity(wire: Wire) async throws {
        let (manager, runner, accessory, alive) = try await Self.connected(wire)
        defer { manager.stop(); runner.stop(); _ = alive }
        #expect(accessory.protocolVersion == .iap1)
        #expect(accessory.name == "Legacy Sensor")
        #expect(accessory.manufacturer == "AccessoryHost Simulator")
        #expect(accessory.modelNumber == "SIM-LS1")
        #expect(accessory.serialNumber == "SIM-LS-0001")
        #expect(accessory.firmwareRevision == "1.4.2")
        #expect(accessory.hardwareRevision == "2.0.0")
        #expect(accessory.protocolStrings == ["com.example.echo", "com.example.sink"])
    }

    @Test("two sessions at once: the echo comes back byte for byte, the sink's CRC matches, close and reopen",
          arguments: Wire.allCases)
    func twoSessionsAtOnce(wire: Wire) async throws {
        let seen = Mutex<[SimulatorEvent]>([])
        let sinkClosed = AsyncStream<Void>.makeStream()
        let (manager, runner, accessory, alive) = try await Self.connected(wire) { event in
            seen.withLock { $0.append(event) }
            if case let .sessionClosed(_, name, _, _) = event, name == "com.example.sink" { sinkClosed.continuation.yield() }
        }
        defer { manager.stop(); runner.stop(); _ = alive }
        let echo = try await accessory.openSession(for: "com.example.echo")
        let sink = try await accessory.openSession(for: "com.example.sink")
        #expect(!echo.usesNativeTransport)
        await #expect(throws: AccessoryError.protocolInUse("com.example.echo")) {
            _ = try await accessory.openSession(for: "com.example.echo")
        }
        await #expect(throws: AccessoryError.self) { _ = try await accessory.openSession(for: "com.example.missing") }
        // Less over the pty: iAP1 has no retransmission, and a frame the host gives up on (a
        // writer held off mid-frame for longer than the line's inter-byte gap, which a loaded
        // machine does) leaves a session waiting for ever (README: Legacy iAP1 accessories).
        let scale = wire == .pty ? 8 : 1
        let big = testPattern((2 << 20) / scale, seed: 3), other = testPattern((1 << 20) / scale, seed: 4)
        async let echoed = NativeTransportTests.echo(echo, big)
        async let sunk: Void = {
            try await sink.write(other)
            try await sink.flush()
        }()
        #expect(try await echoed == big)
        try await sunk
        #expect(sink.bytesAcknowledged == other.count)
        sink.close()
        var closedEvents = sinkClosed.stream.makeAsyncIterator()
        #expect(await closedEvents.next() != nil) // the suite's time limit bounds the wait
        let statistics = seen.withLock { events in
            events.compactMap { event -> SessionStatistics? in
                if case let .sessionClosed(_, name, _, statistics) = event, name == "com.example.sink" { return statistics }
                return nil
            }
        }
        var crc = CRC32()
        crc.update(other)
        #expect(statistics.first?.bytesIn == other.count)
        #expect(statistics.first?.crc32In == crc.value)
        let again = try await accessory.openSession(for: "com.example.sink")
        try await again.write([1, 2, 3])
        try await again.flush()
        #expect(again.bytesAcknowledged == 3)
    }

    @Test("a disconnect ends the sessions with an error; bytes received before it stay readable", arguments: Wire.allCases)
    func disconnect(wire: Wire) async throws {
        let (manager, runner, accessory, alive) = try await Self.connected(wire)
        defer { manager.stop(); _ = alive }
        let events = manager.events
        let session = try await accessory.openSession(for: "com.example.echo")
        let ended = AsyncStream<SessionStreamEvent>.makeStream()
        let available = AsyncStream<Void>.makeStream()
        session.setEventHandler(queue: .global()) { event in
            switch event {
            case .hasBytesAvailable: available.continuation.yield()
            case .errorOccurred, .endEncountered: ended.continuation.yield(event)
            default: break
            }
        }
        try await session.write(testPattern(10_000))
        var iterator = available.stream.makeAsyncIterator()
        _ = await iterator.next()
        runner.stop() // the accessory goes away
        var endings = ended.stream.makeAsyncIterator()
        let first = await endings.next()
        guard case .errorOccurred(.disconnected) = first else {
            Issue.record("the session ended with \(String(describing: first)), not a disconnection error")
            return
        }
        var received: [UInt8] = []
        while let chunk = try await session.read() { received += chunk }
        #expect(!received.isEmpty)
        #expect(received == Array(testPattern(10_000).prefix(received.count)))
        await #expect(throws: AccessoryError.self) { try await session.write([1]) }
        for await event in events {
            if case .disconnected = event { break }
        }
        #expect(!accessory.isConnected)
    }
}
