@testable import AccessoryHost
import Dispatch
import IAPLink
import IAPTransport
import Synchronization
import Testing
import TestSupport

/// Issue 17: the async API used from any thread or task, sessions as async sequences, and
/// stream events that never announce bytes that are not there.
@Suite("The async API: stop with live waiters, sessions as sequences, honest events", .timeLimit(.minutes(1)))
struct AsyncAPITests {
    @Test("stop while one task iterates the events and another waits in a read: both finish, nothing crashes")
    func stopWithLiveWaiters() async throws {
        let (manager, echo, accessory) = try await ManagerTests.connected()
        defer { echo.stop() }
        let session = try await accessory.openSession(for: "com.acme.echo")
        let events = manager.events
        let iterating = Task { () -> [String] in
            var seen: [String] = []
            for await event in events {
                if case .disconnected = event { seen.append("disconnected") } else { seen.append("other") }
            }
            return seen
        }
        let reading = Task { try await session.read() }
        await manager.shutdown()
        #expect(await iterating.value == ["disconnected"])
        #expect(try await reading.value == nil)
        // After the stop: a new event sequence is finished at once, and calls fail cleanly.
        var after = 0
        for await _ in manager.events { after += 1 }
        #expect(after == 0)
        await #expect(throws: AccessoryError.self) { try await accessory.openSession(for: "com.acme.echo") }
        await #expect(throws: AccessoryError.self) { try await session.write([1]) }
    }

    @Test("stop from many threads and tasks at once, with the events being read")
    func concurrentStops() async throws {
        let (manager, echo, _) = try await ManagerTests.connected()
        defer { echo.stop() }
        let events = manager.events
        let iterating = Task { for await _ in events {} }
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<4 { group.addTask { await manager.shutdown() } }
            for _ in 0..<4 { group.addTask { _ = manager.connectedAccessories; _ = manager.events } }
        }
        await iterating.value
        #expect(manager.connectedAccessories.isEmpty)
    }

    @Test("a session is an async sequence of chunks: byte-exact, bounded by chunks(maxBytes:), ending with the stream")
    func sessionsAreAsyncSequences() async throws {
        let (manager, echo, accessory) = try await ManagerTests.connected()
        defer { manager.stop(); echo.stop() }
        let session = try await accessory.openSession(for: "com.acme.echo")
        let payload = testPattern(100_000, seed: 5)
        let writer = Task { try await session.write(payload) }
        var received: [UInt8] = []
        var largest = 0
        for try await chunk in session.chunks(maxBytes: 1_000) {
            #expect(!chunk.isEmpty)
            largest = max(largest, chunk.count)
            received += chunk
            if received.count >= payload.count { break }
        }
        try await writer.value
        #expect(received == payload)
        #expect(largest <= 1_000)
        // The plain sequence ends when the stream does (here: the accessory goes away).
        try await session.write([1, 2, 3])
        var tail: [UInt8] = []
        for try await chunk in session {
            tail += chunk
            if tail.count == 3 { echo.stop() }
        }
        #expect(tail == [1, 2, 3])
    }

    @Test("read(into:) appends into the caller's buffer, at most maxBytes, waits for bytes, returns 0 at the end and can be cancelled")
    func readIntoABuffer() async throws {
        let (manager, echo, accessory) = try await ManagerTests.connected()
        defer { manager.stop() }
        let session = try await accessory.openSession(for: "com.acme.echo")
        // Waiting with nothing there, then cancelled: the bytes that come later are not lost.
        var unused: [UInt8] = []
        let cancelled = Task {
            var buffer: [UInt8] = []
            return try await session.read(into: &buffer)
        }
        cancelled.cancel()
        await #expect(throws: CancellationError.self) { try await cancelled.value }
        let payload = testPattern(200_000, seed: 17)
        let writer = Task { try await session.write(payload) }
        var buffer: [UInt8] = [0xEE]
        buffer.reserveCapacity(10_000)
        var received: [UInt8] = []
        while received.count < payload.count {
            buffer.removeAll(keepingCapacity: true)
            let count = try await session.read(into: &buffer, maxBytes: 4_096)
            #expect(count > 0 && count <= 4_096 && count == buffer.count)
            received += buffer
        }
        try await writer.value
        #expect(received == payload)
        // It appends to what the buffer holds.
        try await session.write([7, 8])
        unused = [1]
        var total = 0
        while total < 2 { total += try await session.read(into: &unused) }
        #expect(unused == [1, 7, 8])
        // The end of the stream: 0, and the buffer untouched.
        echo.stop()
        #expect(try await session.read(into: &unused) == 0)
        #expect(unused == [1, 7, 8])
    }

    @Test("a hasBytesAvailable whose bytes were taken before it reached the handler is not delivered")
    func staleByteEventsAreDropped() async throws {
        let (manager, echo, accessory) = try await ManagerTests.connected()
        defer { manager.stop(); echo.stop() }
        let session = try await accessory.openSession(for: "com.acme.echo")
        let handlerQueue = DispatchQueue(label: "test.held-up-handler")
        let seen = Mutex<[SessionStreamEvent]>([])
        handlerQueue.suspend()
        session.setEventHandler(queue: handlerQueue) { event in seen.withLock { $0.append(event) } }
        try await session.write([1, 2, 3])
        // The echo is announced to the held-up queue; an async read takes the bytes first.
        var got: [UInt8] = []
        while got.count < 3, let chunk = try await session.read() { got += chunk }
        #expect(got == [1, 2, 3])
        let delivered = await withCheckedContinuation { (continuation: CheckedContinuation<[SessionStreamEvent], Never>) in
            handlerQueue.async { continuation.resume(returning: seen.withLock { $0 }) }
            handlerQueue.resume()
        }
        #expect(delivered.first == .openCompleted)
        #expect(!delivered.contains(.hasBytesAvailable), "announced bytes that were already read: \(delivered)")
        session.close()
    }

    @Test("an idle session's handler hears hasSpaceAvailable once, not again at every turn of its queue")
    func idleHandlerIsQuiet() async throws {
        let (manager, echo, accessory) = try await ManagerTests.connected()
        defer { manager.stop(); echo.stop() }
        let session = try await accessory.openSession(for: "com.acme.echo")
        let handlerQueue = DispatchQueue(label: "test.idle-handler")
        let spaces = Mutex(0)
        session.setEventHandler(queue: handlerQueue) { event in
            if event == .hasSpaceAvailable { spaces.withLock { $0 += 1 } }
        }
        func turn() async { await withCheckedContinuation { continuation in handlerQueue.async { continuation.resume() } } }
        var turns = 0
        while spaces.withLock({ $0 }) == 0, turns < 100_000 {
            await turn()
            turns += 1
        }
        let first = spaces.withLock { $0 }
        // The check of a posted event looked at the link and served it, and the service posted
        // the event again: one more per turn (50 or so here), a queue busy for as long as the
        // session was open. The link's own last words after the open (an acknowledgement) may
        // still bring one or two.
        for _ in 0..<50 { await turn() }
        let more = spaces.withLock { $0 } - first
        #expect(more < 10, "hasSpaceAvailable kept coming to an idle session: \(more) more in 50 turns of its queue")
        session.close()
    }

    @Test("a handler that reads on every hasBytesAvailable never finds nothing to read")
    func everyByteEventFindsBytes() async throws {
        let (manager, echo, accessory) = try await ManagerTests.connected()
        defer { manager.stop(); echo.stop() }
        let session = try await accessory.openSession(for: "com.acme.echo")
        struct Tally { var events = 0, empty = 0, bytes: [UInt8] = [] }
        let tally = Mutex(Tally())
        let payload = testPattern(300_000, seed: 9)
        let done = AsyncStream<Void>.makeStream()
        session.setEventHandler(queue: DispatchQueue(label: "test.reader")) { event in
            guard event == .hasBytesAvailable else { return }
            let chunk = session.readAvailable(maxBytes: 4_096) // less than is there, often: more events follow
            let finished = tally.withLock { tally -> Bool in
                tally.events += 1
                if chunk.isEmpty { tally.empty += 1 }
                tally.bytes += chunk
                return tally.bytes.count == payload.count
            }
            if finished { done.continuation.yield() }
        }
        for start in stride(from: 0, to: payload.count, by: 10_000) {
            try await session.write(payload[start..<min(start + 10_000, payload.count)])
        }
        var iterator = done.stream.makeAsyncIterator()
        _ = await iterator.next()
        let result = tally.withLock { $0 }
        #expect(result.bytes == payload)
        #expect(result.empty == 0, "\(result.empty) of \(result.events) hasBytesAvailable events found nothing to read")
        session.close()
    }

    @Test("a session dropped without close() is closed: the protocol opens again")
    func aDroppedSessionCloses() async throws {
        let (manager, echo, accessory) = try await ManagerTests.connected()
        defer { manager.stop(); echo.stop() }
        do {
            let session = try await accessory.openSession(for: "com.acme.echo")
            try await session.write([1])
            #expect(try await session.read() == [1])
        }
        let again = try await accessory.openSession(for: "com.acme.echo")
        try await again.write([2])
        #expect(try await again.read() == [2])
        again.close()
    }

    @Test("the callback open for code that is not async: a session, or the reason on the queue given")
    func callbackOpen() async throws {
        let (manager, echo, accessory) = try await ManagerTests.connected()
        defer { manager.stop(); echo.stop() }
        let queue = DispatchQueue(label: "test.open-completion")
        let opened = await withCheckedContinuation { (continuation: CheckedContinuation<Result<AccessorySession, AccessoryError>, Never>) in
            accessory.openSession(for: "com.acme.echo", queue: queue) { result in
                dispatchPrecondition(condition: .onQueue(queue))
                continuation.resume(returning: result)
            }
        }
        let session = try opened.get()
        #expect(session.protocolString == "com.acme.echo")
        let refused = await withCheckedContinuation { (continuation: CheckedContinuation<Result<AccessorySession, AccessoryError>, Never>) in
            accessory.openSession(for: "com.acme.nope", queue: queue) { continuation.resume(returning: $0) }
        }
        guard case .failure(.unsupportedProtocol) = refused else {
            Issue.record("expected unsupportedProtocol, got \(refused)")
            return
        }
        session.close()
    }

    @Test("a task cancelled in a read, a write held by back-pressure or a drain stops waiting with CancellationError; the session goes on")
    func cancelledWaits() async throws {
        let (manager, echo, accessory) = try await ManagerTests.connected()
        defer { manager.stop(); echo.stop() }
        let session = try await accessory.openSession(for: "com.acme.echo")
        // A read with nothing to read.
        let reading = Task { try await session.read() }
        reading.cancel()
        await #expect(throws: CancellationError.self) { try await reading.value }
        // A write the accessory does not take (it stopped reading): more than the session holds.
        echo.reading.store(false, ordering: .relaxed)
        let big = testPattern(4 << 20, seed: 11)
        let writing = Task { try await session.write(big) }
        let draining = Task { try await session.drain() }
        writing.cancel()
        draining.cancel()
        await #expect(throws: CancellationError.self) { try await writing.value }
        await #expect(throws: CancellationError.self) { try await draining.value }
        #expect(session.bytesWritten < big.count)
        // Already cancelled before it waits.
        let early = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return try await session.read()
        }
        await #expect(throws: CancellationError.self) { try await early.value }
        // The session goes on: what the cancelled write handed over comes back, then more.
        echo.resumeReading()
        let handed = session.bytesWritten
        let tail = Array("after".utf8)
        try await session.write(tail)
        var received: [UInt8] = []
        while received.count < handed + tail.count, let bytes = try await session.read() { received += bytes }
        #expect(received == Array(big.prefix(handed)) + tail)
        session.close()
    }
}
