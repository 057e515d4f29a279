import ByteRing
import Dispatch
import Glibc
import IAPTransport
import Synchronization
import SystemCalls
import Testing
import TestSupport
import TestThreads

/// iapd's session rings: one memory, the daemon's channel and the client's, checked without
/// their queues (the byte and index protocol) and with them (the wake-ups and the end).
@Suite("SharedRingChannel", .ownThread, .timeLimit(.minutes(1)))
struct SharedRingChannelTests {
    /// A session's memory and both ends, not activated; `hostile` is a third mapping of the same
    /// memory, through which a test scribbles as a faulty client would.
    struct Pair {
        let daemon: SharedRingChannel
        let client: SharedRingChannel
        let hostile: SharedRingMemory
        let capacity: Int

        init(capacity: Int = 4096) throws {
            let (memory, descriptor) = try SharedRingMemory.create(capacity: capacity, name: "test").get()
            defer { _ = close(descriptor) }
            let clientMemory = try SharedRingMemory.attach(descriptor: descriptor).get()
            hostile = try SharedRingMemory.attach(descriptor: descriptor).get()
            let (mine, theirs) = try UnixSocket.pair().get()
            daemon = SharedRingChannel(memory: memory, socket: mine, role: .daemon, description: "daemon")
            client = SharedRingChannel(memory: clientMemory, socket: theirs, role: .client, description: "client")
            self.capacity = memory.capacity
        }
    }

    /// Everything readable on `channel` now, taken.
    static func drain(_ channel: SharedRingChannel, into bytes: inout [UInt8]) {
        while let taken = channel.withReadableBytes({ span -> (consumed: Int, result: Int) in
            span.withUnsafeBytes { bytes.append(contentsOf: $0) }
            return (span.byteCount, span.byteCount)
        }), taken > 0 {}
    }

    @Test("bytes cross both rings in order across many wraps; a full ring takes nothing more until read")
    func bytesBothWays() throws {
        let pair = try Pair()
        var generator = SplitMix64(seed: 33)
        let payload = (0..<(40 * pair.capacity + 123)).map { _ in UInt8.random(in: 0...255, using: &generator) }
        for (writer, reader) in [(pair.client, pair.daemon), (pair.daemon, pair.client)] {
            var sent = 0
            var received: [UInt8] = []
            while received.count < payload.count {
                let size = Int.random(in: 1...(pair.capacity / 3), using: &generator)
                let taken = writer.write(payload[sent..<min(payload.count, sent + size)])
                sent += taken
                #expect(reader.readableByteCount <= pair.capacity)
                #expect(writer.unsentByteCount == sent - received.count)
                if sent - received.count == pair.capacity {
                    // Full: back-pressure, not loss.
                    #expect(writer.write(payload[sent..<min(payload.count, sent + 1)]) == 0 || sent == payload.count)
                    #expect(!writer.isWritable || sent == payload.count)
                }
                if Bool.random(using: &generator) || taken == 0 { Self.drain(reader, into: &received) }
            }
            #expect(received == payload)
        }
    }

    @Test("the client's delivered count is the accessory's acknowledgements the daemon published, never more than it wrote")
    func acknowledgements() throws {
        let pair = try Pair()
        #expect(pair.client.write([UInt8](repeating: 7, count: 1000)[...]) == 1000)
        #expect(pair.client.bytesDelivered == 0)
        pair.daemon.publishAcknowledged(400)
        #expect(pair.client.bytesDelivered == 400)
        pair.daemon.publishAcknowledged(300) // counts only grow
        #expect(pair.client.bytesDelivered == 400)
        // A count past what the client wrote is not believed.
        pair.hostile.store(.acknowledged, 5000)
        #expect(pair.client.bytesDelivered == 400)
        pair.daemon.publishAcknowledged(1000)
        #expect(pair.client.bytesDelivered == 1000)
    }

    @Test("a client that scribbles on its ring's indices ends its channel with an error; iapd reads and writes nothing outside the ring")
    func hostileIndices() throws {
        // Each: a word the client owns, set to a lie.
        let lies: [(String, SharedRingMemory.Word, (Int) -> UInt64)] = [
            ("a tail past the ring's capacity", .tail(0), { UInt64(3 + $0 + 1) }),
            ("a tail far in the future", .tail(0), { _ in UInt64.max }),
            ("a head past what iapd wrote", .head(1), { _ in 1 }),
            ("a head far past what iapd wrote", .head(1), { _ in 1 << 40 }),
        ]
        for (what, word, value) in lies {
            let pair = try Pair()
            #expect(pair.client.write([1, 2, 3][...]) == 3, "\(what)")
            var got: [UInt8] = []
            Self.drain(pair.daemon, into: &got)
            #expect(got == [1, 2, 3], "\(what)")
            pair.hostile.store(word, value(pair.capacity))
            // The daemon looks at the index it reads from the client: both directions refuse.
            _ = pair.daemon.readableByteCount
            _ = pair.daemon.write([9][...])
            #expect(pair.daemon.readableByteCount == 0, "\(what)")
            #expect(pair.daemon.withReadableBytes { span in (span.byteCount, span.byteCount) } == nil, "\(what)")
            #expect(pair.daemon.write([9][...]) == 0, "\(what)")
            #expect(!pair.daemon.isWritable, "\(what)")
        }
        // A tail that moves back.
        let pair = try Pair()
        #expect(pair.client.write([UInt8](repeating: 1, count: 100)[...]) == 100)
        #expect(pair.daemon.readableByteCount == 100)
        pair.hostile.store(.tail(0), 50)
        #expect(pair.daemon.readableByteCount == 0)
    }

    @Test("random scribbles on every word, between honest traffic: no crash, no read outside the ring, and a lie is caught or harmless")
    func scribbles() throws {
        var generator = SplitMix64(seed: 34)
        let words: [SharedRingMemory.Word] = [.tail(0), .head(0), .tail(1), .head(1), .consumerWaiting(0), .producerWaiting(0),
                                              .consumerWaiting(1), .producerWaiting(1), .acknowledged, .acknowledgementWaiting]
        for _ in 0..<200 {
            let pair = try Pair()
            for _ in 0..<50 {
                switch Int.random(in: 0..<6, using: &generator) {
                case 0:
                    let word = words.randomElement(using: &generator)!
                    let old = pair.hostile.load(word)
                    let value: UInt64 = Bool.random(using: &generator) ? UInt64.random(in: 0...UInt64.max, using: &generator)
                        : old &+ UInt64.random(in: 0...UInt64(2 * pair.capacity), using: &generator) &- UInt64(pair.capacity)
                    pair.hostile.store(word, value)
                case 1:
                    _ = pair.client.write([UInt8](repeating: 0xAA, count: Int.random(in: 1...pair.capacity, using: &generator))[...])
                case 2:
                    _ = pair.daemon.write([UInt8](repeating: 0x55, count: Int.random(in: 1...pair.capacity, using: &generator))[...])
                case 3:
                    _ = pair.daemon.withReadableBytes { span -> (consumed: Int, result: Int) in
                        #expect(span.byteCount <= pair.capacity)
                        return (span.byteCount, 0)
                    }
                case 4:
                    var sink: [UInt8] = []
                    Self.drain(pair.client, into: &sink)
                default:
                    pair.daemon.publishAcknowledged(Int.random(in: 0...(4 * pair.capacity), using: &generator))
                }
                #expect((0...pair.capacity).contains(pair.daemon.readableByteCount))
                #expect((0...pair.capacity).contains(pair.daemon.unsentByteCount))
            }
        }
    }

    @Test("wake-ups: each side hears the other's bytes and room; a closed socket is the end, and bytes before it stay readable")
    func wakeUpsAndTheEnd() async throws {
        let pair = try Pair()
        let daemonQueue = DispatchQueue(label: "test.daemon"), clientQueue = DispatchQueue(label: "test.client")
        let daemonEvents = EventLog(), clientEvents = EventLog()
        pair.daemon.activate(queue: daemonQueue) { daemonEvents.append($0) }
        pair.client.activate(queue: clientQueue) { clientEvents.append($0) }
        // The client writes: the daemon is woken.
        clientQueue.sync { #expect(pair.client.write([1, 2, 3, 4][...]) == 4) }
        try await daemonEvents.wait { $0.contains { if case .readable = $0 { true } else { false } } }
        var got: [UInt8] = []
        daemonQueue.sync { Self.drain(pair.daemon, into: &got) }
        #expect(got == [1, 2, 3, 4])
        // The daemon fills the client's ring; the client reading a quarter of it wakes the daemon.
        let filled = daemonQueue.sync { pair.daemon.write([UInt8](repeating: 5, count: 2 * pair.capacity)[...]) }
        #expect(filled == pair.capacity)
        try await clientEvents.wait { $0.contains { if case .readable = $0 { true } else { false } } }
        clientQueue.sync {
            _ = pair.client.withReadableBytes { span in (pair.capacity / 2, 0) }
        }
        try await daemonEvents.wait { $0.contains { if case .writable = $0 { true } else { false } } }
        // The daemon writes its last bytes and closes: the client reads them, then the end.
        daemonQueue.sync {
            _ = pair.daemon.write([6][...])
            pair.daemon.close()
        }
        try await clientEvents.wait { $0.contains { if case .closed(nil) = $0 { true } else { false } } }
        var rest: [UInt8] = []
        clientQueue.sync { Self.drain(pair.client, into: &rest) }
        #expect(rest.count == pair.capacity / 2 + 1)
        #expect(rest.last == 6)
    }
}

extension SharedRingChannelTests {
    @Test("a flush hears the daemon take its bytes; after the client's end, what it wrote before is all there is")
    func flushesAndTheClientsEnd() async throws {
        let pair = try Pair()
        let daemonQueue = DispatchQueue(label: "test.daemon"), clientQueue = DispatchQueue(label: "test.client")
        let daemonEvents = EventLog(), clientEvents = EventLog()
        pair.daemon.activate(queue: daemonQueue) { daemonEvents.append($0) }
        pair.client.activate(queue: clientQueue) { clientEvents.append($0) }
        // Bytes the daemon has not taken: asking for them asks to be woken when it has.
        let unsent = clientQueue.sync { () -> Int in
            _ = pair.client.write([1, 2, 3][...])
            return pair.client.unsentByteCount
        }
        #expect(unsent == 3)
        try await daemonEvents.wait { $0.contains { if case .readable = $0 { true } else { false } } }
        var got: [UInt8] = []
        daemonQueue.sync { Self.drain(pair.daemon, into: &got) }
        #expect(got == [1, 2, 3])
        try await clientEvents.wait { $0.contains { if case .writable = $0 { true } else { false } } }
        #expect(clientQueue.sync { pair.client.unsentByteCount } == 0)
        // The client writes two more bytes and closes; then, through its mapping, claims more.
        clientQueue.sync {
            _ = pair.client.write([4, 5][...])
            pair.client.close()
        }
        try await daemonEvents.wait { $0.contains { if case .closed(nil) = $0 { true } else { false } } }
        pair.hostile.store(.tail(0), 5 + 100)
        var rest: [UInt8] = []
        daemonQueue.sync { Self.drain(pair.daemon, into: &rest) }
        #expect(rest == [4, 5])
    }
}

extension SharedRingChannelTests {
    @Test("a channel dropped while active, never closed, is the end of the stream for the other side")
    func droppedWhileActive() async throws {
        let (memory, descriptor) = try SharedRingMemory.create(capacity: 4096, name: "test").get()
        defer { _ = close(descriptor) }
        let clientMemory = try SharedRingMemory.attach(descriptor: descriptor).get()
        let (mine, theirs) = try UnixSocket.pair().get()
        let client = SharedRingChannel(memory: clientMemory, socket: theirs, role: .client, description: "client")
        let daemonQueue = DispatchQueue(label: "test.daemon"), clientQueue = DispatchQueue(label: "test.client")
        let clientEvents = EventLog()
        client.activate(queue: clientQueue) { clientEvents.append($0) }
        do {
            let daemon = SharedRingChannel(memory: memory, socket: mine, role: .daemon, description: "daemon")
            daemon.activate(queue: daemonQueue) { _ in }
            daemonQueue.sync { _ = daemon.write([7][...]) }
        } // the daemon's channel is gone here, without close()
        try await clientEvents.wait { $0.contains { if case .closed(nil) = $0 { true } else { false } } }
        var rest: [UInt8] = []
        clientQueue.sync { Self.drain(client, into: &rest) }
        #expect(rest == [7])
    }
}

/// A channel's events, and a wait for one that does not block a cooperative thread. A wait
/// ends when its task is cancelled (the suite's time limit), failing the test.
final class EventLog: Sendable {
    private struct Waiter {
        var token: Int
        var check: @Sendable ([ByteChannelEvent]) -> Bool
        var continuation: CheckedContinuation<Void, Never>
    }
    private struct State {
        var events: [ByteChannelEvent] = []
        var waiters: [Waiter] = []
        var nextToken = 0
        var cancelled: Set<Int> = []
    }
    private let state = Mutex(State())

    func append(_ event: ByteChannelEvent) {
        let ready = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.events.append(event)
            let events = state.events
            let ready = state.waiters.filter { $0.check(events) }.map(\.continuation)
            state.waiters.removeAll { $0.check(events) }
            return ready
        }
        for continuation in ready { continuation.resume() }
    }

    /// Waits until `check` holds for the events so far.
    func wait(_ check: @escaping @Sendable ([ByteChannelEvent]) -> Bool) async throws {
        let token = state.withLock { state -> Int in
            state.nextToken += 1
            return state.nextToken
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let now = state.withLock { state -> Bool in
                    if check(state.events) || state.cancelled.contains(token) { return true }
                    state.waiters.append(Waiter(token: token, check: check, continuation: continuation))
                    return false
                }
                if now { continuation.resume() }
            }
        } onCancel: {
            let waiting = state.withLock { state -> CheckedContinuation<Void, Never>? in
                state.cancelled.insert(token)
                guard let index = state.waiters.firstIndex(where: { $0.token == token }) else { return nil }
                return state.waiters.remove(at: index).continuation
            }
            waiting?.resume()
        }
        #expect(check(state.withLock { $0.events }), "the event did not come")
    }
}
