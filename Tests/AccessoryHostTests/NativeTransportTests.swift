@testable import AccessoryHost
import AccessorySimulator
import Dispatch
import IAPLink
import IAPTransport
import Synchronization
import Testing
import TestSupport

/// EA sessions on native transports (PROTOCOL.md §4.3) through the public API, against the
/// in-process simulator: its native protocols travel on channels of their own beside the link.
// Three minutes: the two data tests move 7 and 16 MiB and take about 7 s alone, but in the full
// parallel suite on two cores they wait for a starved pool and took 71–78 s (the 1-minute limit
// ran out in one full run of three).
@Suite("Native-transport sessions in process", .timeLimit(.minutes(3)))
struct NativeTransportTests {
    /// A manager with the "native-streamer" simulator attached in process; `events` sees what the
    /// simulator reports.
    static func connected(events: (@Sendable (SimulatorEvent) -> Void)? = nil) async throws
        -> (AccessoryManager, SimulatorRunner, Accessory)
    {
        let manager = AccessoryManager()
        let profile = try #require(SimulatorProfile.builtIn(named: "native-streamer"))
        let runner = try SimulatorRunner(profile: profile, attachment: .memory { manager.attach($0) })
        runner.start(events: events)
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(10)))
        return (manager, runner, accessory)
    }

    static func echo(_ session: AccessorySession, _ payload: [UInt8], chunk: Int = 48_000) async throws -> [UInt8] {
        async let sent: Void = {
            var offset = 0
            while offset < payload.count {
                let end = min(payload.count, offset + chunk)
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

    @Test("native and link sessions run at once, each byte-exact, and identification says which is which")
    func nativeAndLinkSessionsCoexist() async throws {
        let (manager, runner, accessory) = try await Self.connected()
        defer { manager.stop(); runner.stop() }
        let native = Dictionary(uniqueKeysWithValues: accessory.identity.protocols.map { ($0.name, $0.nativeTransportComponentIdentifier) })
        #expect(native["com.example.echo"] == .some(nil))
        #expect(native["com.example.native.echo"] == .some(1))

        let onLink = try await accessory.openSession(for: "com.example.echo")
        let onNative = try await accessory.openSession(for: "com.example.native.echo")
        #expect(!onLink.usesNativeTransport)
        #expect(onNative.usesNativeTransport)
        let big = testPattern(6 << 20, seed: 1), small = testPattern(1 << 20, seed: 2)
        async let nativeEcho = Self.echo(onNative, big)
        async let linkEcho = Self.echo(onLink, small)
        #expect(try await nativeEcho == big)
        #expect(try await linkEcho == small)
        #expect(onNative.bytesAcknowledged == big.count)
    }

    @Test("one native session per protocol; closing it lets it open again, and the accessory sees both ends")
    func openCloseReopen() async throws {
        let seen = Mutex<[SimulatorEvent]>([])
        let closed = AsyncStream<Void>.makeStream()
        let (manager, runner, accessory) = try await Self.connected { event in
            seen.withLock { $0.append(event) }
            if case .nativeSessionClosed = event { closed.continuation.yield() }
        }
        defer { manager.stop(); runner.stop() }
        let sink = try await accessory.openSession(for: "com.example.native.sink")
        await #expect(throws: AccessoryError.protocolInUse("com.example.native.sink")) {
            _ = try await accessory.openSession(for: "com.example.native.sink")
        }
        let payload = testPattern(3 << 20, seed: 5)
        try await sink.write(payload)
        try await sink.flush()
        sink.close()
        var closes = closed.stream.makeAsyncIterator()
        #expect(await closes.next() != nil) // awaited, not blocked on: the suite's time limit bounds it
        let statistics = seen.withLock { events in
            events.compactMap { event -> SessionStatistics? in
                if case let .nativeSessionClosed(_, _, statistics) = event { return statistics }
                return nil
            }
        }
        #expect(statistics.count == 1)
        #expect(statistics.first?.bytesIn == payload.count)
        var crc = CRC32()
        crc.update(payload)
        #expect(statistics.first?.crc32In == crc.value)

        let again = try await accessory.openSession(for: "com.example.native.sink")
        try await again.write([1, 2, 3])
        try await again.flush()
        #expect(again.bytesAcknowledged == 3)
    }

    @Test("a reader that stops reading holds the accessory off; reading later gets every byte")
    func backPressureWithoutLoss() async throws {
        let (manager, runner, accessory) = try await Self.connected()
        defer { manager.stop(); runner.stop() }
        let session = try await accessory.openSession(for: "com.example.native.echo")
        // Far more than every buffer on the way holds: the host channel (256 KiB), the
        // accessory's two session buffers (1 MiB each), the echo's 16 KiB, the return channel.
        let payload = testPattern(16 << 20, seed: 9)
        let bound = 256 * 1_024 * 2 + 2 * (1 << 20) + 16_384
        // Fill the pipeline without reading, with non-blocking writes from here (no task that
        // the pool must schedule): once a write takes nothing even after a round of barriers on
        // both queues (every hop of the pipeline runs on one of them), the writer is held off.
        var offered = 0
        while offered < payload.count {
            let taken = try session.writeAvailable(payload[offered..<min(payload.count, offered + 65_536)])
            offered += taken
            if taken == 0 {
                for _ in 0..<4 {
                    manager.queue.sync {}
                    runner.queue.sync {}
                }
                if try session.writeAvailable(payload[offered..<min(payload.count, offered + 1)]) == 0 { break }
                offered += 1
            }
        }
        let last = session.bytesAcknowledged
        #expect(offered < payload.count, "the accessory took everything without being read")
        #expect(last <= bound)
        #expect(last > 0)
        async let rest: Void = session.write(payload[offered...])
        var received: [UInt8] = []
        received.reserveCapacity(payload.count)
        while received.count < payload.count, let bytes = try await session.read(maxBytes: 1 << 16) { received += bytes }
        try await rest
        #expect(received == payload)
    }

    @Test("the accessory going away ends native sessions with an error after what was received")
    func disconnectEndsNativeSessions() async throws {
        let (manager, runner, accessory) = try await Self.connected()
        defer { manager.stop() }
        let session = try await accessory.openSession(for: "com.example.native.echo")
        try await session.write([10, 20, 30])
        var echoed: [UInt8] = []
        while echoed.count < 3, let bytes = try await session.read() { echoed += bytes }
        #expect(echoed == [10, 20, 30])
        let events = Mutex<[SessionStreamEvent]>([])
        let ended = AsyncStream<Void>.makeStream()
        session.setEventHandler(queue: DispatchQueue(label: "test.native-events")) { event in
            events.withLock { $0.append(event) }
            if event == .endEncountered { ended.continuation.yield() }
        }
        runner.stop()
        var ends = ended.stream.makeAsyncIterator()
        #expect(await ends.next() != nil)
        #expect(events.withLock { $0.contains { if case .errorOccurred(.disconnected(_)) = $0 { true } else { false } } },
                "the session ends with a disconnection, not a normal end")
        #expect(try await session.read() == nil)
        await #expect(throws: AccessoryError.self) { try await session.write([1]) }
    }

    @Test("a native protocol on a transport without native interfaces is refused with what to do")
    func nativeProtocolWithoutNativeTransport() async throws {
        let manager = AccessoryManager()
        defer { manager.stop() }
        let (host, device) = MemoryTransport.pair()
        var identity = AccessoryIdentity.echoBox
        identity.protocols.append(ExternalAccessoryProtocol(identifier: 3, name: "com.acme.native", nativeTransportComponentIdentifier: 1))
        let echo = EchoAccessory(transport: device, identity: identity)
        defer { echo.stop() }
        manager.attach(host)
        echo.start()
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(10)))
        do {
            _ = try await accessory.openSession(for: "com.acme.native")
            Issue.record("opened a native protocol without a native transport")
        } catch let AccessoryError.sessionRefused(reason) {
            #expect(reason.contains("native USB interface") && reason.contains("connect the accessory by USB"))
        }
    }
}
