internal import Dispatch
internal import IAPLink
internal import IAPTransport
internal import QueueConfinement
internal import Synchronization

// What a session's calls do on its connection: the waits (read, write, flush, drain), the
// immediate calls, the counters and the close.

extension Connection {
    /// Runs `body` with the endpoint, then serves the session: what a call changed (a partial
    /// read or write, a new reader) shows in the next events at once.
    @discardableResult
    func withSession<Result>(_ key: Int, _ body: (inout IAPEndpoint, LinkTime) throws -> Result) rethrows -> Result {
        try driver.perform { machine, now in
            let result = try body(&machine, now)
            service(key, &machine, now: now)
            return result
        }
    }

    /// Queues a waiter on a session and serves it, or resumes it with `gone` when the session
    /// is closed.
    private func enqueue(_ session: AccessorySession, gone: () -> Void, _ add: (SessionState) -> Void) {
        guard let state = sessions[session.key] else { return gone() }
        add(state)
        withSession(session.key) { _, _ in }
    }

    // The async calls queue their waiter and serve it on the caller's thread (`onQueue`): a write
    // whose bytes all fit, a read of bytes already there, a flush with nothing pending resume
    // their continuation before the task suspends, so it goes on without a hop to another
    // thread. Only a wait for the accessory costs a hop back.

    func write(_ session: AccessorySession, _ bytes: [UInt8]) async throws {
        try await wait(on: session) { (id, continuation: CheckedContinuation<Void, any Error>) in
            self.enqueue(session, gone: { continuation.resume(throwing: AccessoryError.sessionClosed) }) {
                $0.writers.append(Writer(remaining: bytes[...], continuation: continuation, id: id))
            }
        }
    }

    func read(_ session: AccessorySession, maxBytes: Int) async throws -> [UInt8]? {
        // Off the manager's queue, a read that answers a write looks for the answer a moment
        // before it waits (`ReadWait`).
        let look = QueueMark.isCurrent(queue) ? nil : session.readWait.lookBeforeWaiting()
        defer { session.readWait.readEnded(since: look) }
        return try await wait(on: session) { id, continuation in
            self.enqueue(session, gone: { continuation.resume(returning: nil) }) {
                $0.readers.append(Reader(maxBytes: max(1, maxBytes), continuation: continuation, id: id))
            }
        }
    }

    /// Waits until bytes are readable (true) or the stream ended with none (false), taking none.
    func waitUntilReadable(_ session: AccessorySession) async throws -> Bool {
        let look = QueueMark.isCurrent(queue) ? nil : session.readWait.lookBeforeWaiting()
        defer { session.readWait.readEnded(since: look) }
        return try await wait(on: session) { id, continuation in
            self.enqueue(session, gone: { continuation.resume(returning: nil) }) {
                $0.readers.append(Reader(maxBytes: 0, continuation: continuation, id: id))
            }
        } != nil
    }

    /// Runs `enqueue` on the queue (on the caller's thread when it can, ``onQueue(_:)``) with a
    /// new waiter id and the continuation it queues; the task waits until the waiter is served.
    /// A task cancelled while it waits takes its waiter off the session, which throws
    /// `CancellationError` (what the session took of a write stays taken: ``AccessorySession/bytesWritten``
    /// counts it); one cancelled before it waits throws it at once.
    private func wait<Value>(on session: AccessorySession,
                             _ enqueue: @escaping (Int, CheckedContinuation<Value, any Error>) -> Void) async throws -> Value {
        let id = waiterIDs.wrappingAdd(1, ordering: .relaxed).newValue
        let key = session.key
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Value, any Error>) in
                onQueue {
                    if Task.isCancelled { return continuation.resume(throwing: CancellationError()) }
                    enqueue(id, continuation)
                }
            }
        } onCancel: {
            self.queue.async { self.cancelWaiter(id, key: key) }
        }
    }

    /// Resumes waiter `id` of session `key` with `CancellationError`, if it still waits. On the queue.
    private func cancelWaiter(_ id: Int, key: Int) {
        _ = sessions[key]?.cancelWaiter(id, with: CancellationError())
    }

    func flush(_ session: AccessorySession) async throws {
        try await wait(on: session) { (id, continuation: CheckedContinuation<Void, any Error>) in
            self.enqueue(session, gone: { continuation.resume(throwing: AccessoryError.sessionClosed) }) {
                $0.flushers.append(Flusher(continuation: continuation, id: id))
            }
        }
    }

    /// Waits until the accessory acknowledged every byte written so far, within `limit` (nil:
    /// as long as it takes); past the limit, fails with ``AccessoryError/timedOut(_:)`` naming
    /// `step`.
    func drain(_ session: AccessorySession, limit: WaitLimit? = nil, step: String? = nil) async throws {
        try await wait(on: session) { (id, continuation: CheckedContinuation<Void, any Error>) in
            let now = self.driver.now
            let acknowledged = self.sessions[session.key].map { _ in self.acknowledged(session) } ?? 0
            self.enqueue(session, gone: { continuation.resume(throwing: AccessoryError.sessionClosed) }) {
                $0.drainers.append(Drainer(target: $0.written, continuation: continuation, limit: limit,
                                           step: step ?? "waiting for '\(session.protocolString)' to be acknowledged",
                                           id: id, acknowledged: acknowledged, since: now))
            }
            if let limit { self.scheduleCheck(of: id, session: session, limit: limit, since: now) }
        }
    }

    /// Looks at a bounded drainer again when its limit would be reached. On the queue.
    private func scheduleCheck(of id: Int, session: AccessorySession, limit: WaitLimit, since: LinkTime) {
        let wait: Duration
        switch limit {
        case let .progress(duration), let .total(duration): wait = duration
        }
        driver.clock.after(since + wait - driver.now, on: queue) { [weak self] in
            self?.checkDrainer(id, session: session)
        }
    }

    /// Fails a bounded drainer whose limit has passed; otherwise looks again later. On the queue.
    private func checkDrainer(_ id: Int, session: AccessorySession) {
        guard let state = sessions[session.key], state.drainers.contains(where: { $0.id == id }) else { return }
        let acknowledged = acknowledged(session) // also serves the session: a drainer now done resumes
        guard let index = state.drainers.firstIndex(where: { $0.id == id }), let limit = state.drainers[index].limit else { return }
        let now = driver.now
        let wait: Duration
        switch limit {
        case let .progress(duration):
            wait = duration
            if acknowledged != state.drainers[index].acknowledged {
                state.drainers[index].acknowledged = acknowledged
                state.drainers[index].since = now
            }
        case let .total(duration):
            wait = duration
        }
        let drainer = state.drainers[index]
        guard now - drainer.since >= wait else {
            return scheduleCheck(of: id, session: session, limit: limit, since: drainer.since)
        }
        state.drainers.remove(at: index)
        let what: String
        switch limit {
        case .progress: what = "the accessory acknowledged nothing for \(wait) (the link is alive, the data does not move)"
        case .total: what = "the accessory did not acknowledge them within \(wait)"
        }
        logger.warning("\(drainer.step): \(what)")
        drainer.continuation.resume(throwing: AccessoryError.timedOut(
            "\(drainer.step): \(acknowledged) of the \(drainer.target) bytes written were acknowledged; \(what)"))
    }

    func readNow(_ session: AccessorySession, maxBytes: Int) -> [UInt8] {
        guard let stream = sessions[session.key]?.stream else { return [] }
        return withSession(session.key) { machine, _ in stream.read(&machine, maxBytes: max(0, maxBytes)) }
    }

    /// Appends up to `maxBytes` readable bytes to `buffer` (the one copy of the way in); returns
    /// how many.
    func readNow(_ session: AccessorySession, into buffer: inout [UInt8], maxBytes: Int) -> Int {
        guard let stream = sessions[session.key]?.stream else { return 0 }
        return withSession(session.key) { machine, _ in
            var taken = 0
            while taken < maxBytes {
                let room = maxBytes - taken
                let count = stream.borrow(&machine) { span in
                    let count = min(room, span.byteCount)
                    span.extracting(0..<count).withUnsafeBytes { buffer.append(contentsOf: $0) }
                    return (count, count)
                }
                guard let count, count > 0 else { break }
                taken += count
            }
            return taken
        }
    }

    func borrow<Result>(_ session: AccessorySession, _ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        guard let stream = sessions[session.key]?.stream else { return nil }
        return try withSession(session.key) { machine, _ in try stream.borrow(&machine, body) }
    }

    func writeNow(_ session: AccessorySession, _ bytes: [UInt8]) throws -> Int {
        guard let state = sessions[session.key], !state.isEnded else {
            throw sessions[session.key]?.ended ?? AccessoryError.sessionClosed
        }
        guard state.writers.isEmpty else { return 0 } // earlier writes go first
        return withSession(session.key) { machine, now in
            let taken = state.stream.write(&machine, bytes[...], now: now)
            state.written += taken
            return taken
        }
    }

    func writeNow(_ session: AccessorySession, span bytes: RawSpan) throws -> Int {
        guard let state = sessions[session.key], !state.isEnded else {
            throw sessions[session.key]?.ended ?? AccessoryError.sessionClosed
        }
        guard state.writers.isEmpty else { return 0 } // earlier writes go first
        return withSession(session.key) { machine, now in
            let taken = state.stream.write(&machine, span: bytes, now: now)
            state.written += taken
            return taken
        }
    }

    func acknowledged(_ session: AccessorySession) -> Int {
        guard let state = sessions[session.key] else { return session.acknowledgedAtClose.withLock { $0 } ?? 0 }
        let now = driver.perform { machine, _ in state.stream.acknowledged(&machine) }
        state.acknowledged = max(state.acknowledged, now)
        return state.acknowledged
    }

    /// Bytes the session took from the application (the count at the close once closed).
    func written(_ session: AccessorySession) -> Int {
        sessions[session.key]?.written ?? session.writtenAtClose.withLock { $0 } ?? 0
    }

    func bytesAvailable(_ session: AccessorySession) -> Int {
        guard let stream = sessions[session.key]?.stream else { return 0 }
        return driver.perform { machine, _ in stream.readable(&machine) }
    }

    func spaceAvailable(_ session: AccessorySession) -> Int {
        guard let state = sessions[session.key], !state.isEnded else { return 0 }
        return driver.perform { machine, _ in state.stream.hasSpace(&machine) } ? 1 : 0
    }

    func setEventHandler(_ session: AccessorySession, queue handlerQueue: DispatchQueue,
                         handler: @escaping @Sendable (SessionStreamEvent) -> Void) {
        guard let state = sessions[session.key] else {
            handlerQueue.async { handler(.endEncountered) }
            return
        }
        let key = session.key
        state.handler = StreamEventHandler(queue: handlerQueue, handler: handler) { [weak self] event in
            guard let self else { return false }
            return self.onQueue {
                guard let state = self.sessions[key] else { return false }
                return self.driver.inspect { machine in
                    event == .hasBytesAvailable ? state.stream.readable(&machine) > 0 : !state.isEnded && state.stream.hasSpace(&machine)
                }
            }
        }
        handlerQueue.async { handler(.openCompleted) }
        withSession(session.key) { _, _ in }
    }

    /// Closes the session and waits, at most `timeout`, for the accessory's link to acknowledge
    /// its stop (iAP2 link sessions; others return at once). Off the queue.
    func closeAwaitingStop(_ session: AccessorySession, timeout: Duration) async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            queue.async {
                let id = self.sessions[session.key]?.stream.linkSessionID
                self.close(session)
                guard let id, self.downReason == nil, self.driver.perform({ machine, _ in machine.isStopPending(id) }) else {
                    return continuation.resume()
                }
                self.pendingStops[id] = (session.protocolString, continuation)
                self.driver.clock.after(timeout, on: self.queue) { [weak self] in
                    guard let pending = self?.pendingStops.removeValue(forKey: id) else { return }
                    pending.continuation.resume(throwing: AccessoryError.timedOut(
                        "closing '\(pending.name)': the accessory did not acknowledge StopExternalAccessoryProtocolSession within the close's \(timeout); the session is closed on this side"))
                }
            }
        }
    }

    func close(_ session: AccessorySession) {
        guard sessions[session.key] != nil else { return }
        let acknowledged = acknowledged(session)
        session.acknowledgedAtClose.withLock { $0 = acknowledged }
        session.writtenAtClose.withLock { $0 = written(session) }
        close(key: session.key)
    }

    /// Closes the session under `key` if it is still open (also what a session object that
    /// goes away without ``AccessorySession/close()`` comes to). On the queue.
    func close(key: Int) {
        guard let state = sessions.removeValue(forKey: key) else { return }
        sessionKeys.removeAll { $0 == key }
        state.closeWaiters()
        if let id = state.stream.linkSessionID { linkKeys[id] = nil }
        let linkUp = downReason == nil
        driver.perform { machine, now in state.stream.close(&machine, now: now, linkUp: linkUp) }
        if state.stream.isNative { logger.debug("session '\(state.protocolString)' closed") }
    }
}
