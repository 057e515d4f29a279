internal import Synchronization
public import Dispatch
internal import IAPLink

/// The stream events of a session, as NSStream reports them for an EASession.
public enum SessionStreamEvent: Hashable, Sendable {
    /// The session is open: the first event a handler gets.
    case openCompleted
    /// Bytes are readable now (``AccessorySession/readAvailable(maxBytes:)`` returns some).
    /// Checked just before delivery: a handler is never told of bytes that are not there. The
    /// next one comes when more arrive, or when bytes remain after the handler returned.
    case hasBytesAvailable
    /// A write would take bytes now (``AccessorySession/writeAvailable(_:)`` takes some).
    /// Checked just before delivery, like ``hasBytesAvailable``.
    case hasSpaceAvailable
    /// The session ended with an error (for example the accessory went away); followed by
    /// ``endEncountered``. Bytes already received stay readable.
    case errorOccurred(AccessoryError)
    /// The stream ended: no bytes will arrive after those already readable, and writes fail.
    case endEncountered
}

/// One bidirectional byte stream to an accessory for one protocol string: an EASession.
///
/// Use it with async/await (``write(_:)`` suspends under back-pressure, ``read(maxBytes:)``
/// suspends until bytes arrive and returns nil at the end), or with stream events delivered on a
/// queue you choose (``setEventHandler(queue:_:)``) and the non-blocking ``readAvailable(maxBytes:)``
/// / ``writeAvailable(_:)``. When the accessory goes away, bytes already received stay
/// readable, then the stream ends; writes fail with ``AccessoryError/disconnected(_:)``.
///
/// The session is also an `AsyncSequence` of the byte chunks received, in order
/// (`for try await chunk in session { … }`), which ends when the stream ends and throws nothing
/// for a normal end; see ``chunks(maxBytes:)`` to bound the chunks.
///
/// Thread safety: every method may be called from any thread or task, concurrently; each call
/// hops to the manager's queue (or runs there at once when called on it). Reads are served in
/// the order they were called, and so are writes; two tasks writing at once interleave whole
/// writes, never bytes of them. Do not call a session from inside ``withNextChunk(_:)``'s body.
///
/// Cancellation: a task cancelled while it waits in ``read(maxBytes:)``, ``write(_:)``,
/// ``flush()`` or a drain stops waiting and throws `CancellationError`; the session stays open
/// and the bytes a cancelled write had already handed over are sent (``bytesWritten`` counts
/// them), so a caller that goes on knows where the stream stands.
///
/// A session that is dropped without ``close()`` is closed when its last reference goes.
public final class AccessorySession: Sendable {
    /// The protocol string.
    public let protocolString: String
    /// The accessory.
    public let accessory: Accessory
    /// The connection's key for the session.
    let key: Int
    let connection: Connection
    /// What the accessory had acknowledged when the session was closed (the count outlives it).
    let acknowledgedAtClose = Mutex<Int?>(nil)
    /// ``bytesWritten`` when the session was closed.
    let writtenAtClose = Mutex<Int?>(nil)
    /// What a reader off the manager's queue looks at while it busy-polls (`ReadWait`).
    let readWait = ReadWait()
    /// Whether the session's bytes travel on a native transport (the accessory's USB interface
    /// for this protocol, FF/F0/01, raw) rather than multiplexed on the iAP2 link. The API is the
    /// same either way; only throughput and ``bytesAcknowledged``'s source differ.
    public let usesNativeTransport: Bool

    init(protocolString: String, accessory: Accessory, key: Int, usesNativeTransport: Bool, connection: Connection) {
        self.protocolString = protocolString
        self.accessory = accessory
        self.key = key
        self.usesNativeTransport = usesNativeTransport
        self.connection = connection
    }

    deinit {
        let connection = connection, key = key
        connection.queue.async { connection.close(key: key) }
    }

    /// Writes all of `bytes`, suspending while the accessory (or the link) cannot take more.
    public func write(_ bytes: some Collection<UInt8>) async throws {
        try await connection.write(self, Array(bytes))
    }

    /// The next received bytes (at most `maxBytes`), waiting for some; nil at the end of the stream.
    public func read(maxBytes: Int = 1 << 20) async throws -> [UInt8]? {
        try await connection.read(self, maxBytes: maxBytes)
    }

    /// Appends the next received bytes (at most `maxBytes`) to `buffer`, waiting for some, and
    /// returns how many it appended: 0 only at the end of the stream. The copying read that
    /// allocates nothing when `buffer` has the room (keep one buffer and empty it with
    /// `removeAll(keepingCapacity: true)` between reads); ``read(maxBytes:)`` returns a new array
    /// each time instead.
    public func read(into buffer: inout [UInt8], maxBytes: Int = 1 << 20) async throws -> Int {
        let limit = Swift.max(1, maxBytes)
        while true {
            let taken = connection.onQueue { connection.readNow(self, into: &buffer, maxBytes: limit) }
            if taken > 0 { return taken }
            guard try await connection.waitUntilReadable(self) else { return 0 }
        }
    }

    /// Takes what is readable now without waiting (empty when nothing is).
    public func readAvailable(maxBytes: Int = 1 << 20) -> [UInt8] {
        connection.onQueue { connection.readNow(self, maxBytes: maxBytes) }
    }

    /// Writes what fits now without waiting; returns how many bytes were taken (0 when full).
    public func writeAvailable(_ bytes: some Collection<UInt8>) throws -> Int {
        let array = Array(bytes)
        return try connection.onQueue { try connection.writeNow(self, array) }
    }

    /// Writes what fits now of `bytes`, from where they lie (no copy before the link's own
    /// into its packet); returns how many were taken (0 when full). What a relay (the daemon
    /// forwarding a client's socket) uses.
    public func writeAvailable(span bytes: RawSpan) throws -> Int {
        try connection.onQueue { try connection.writeNow(self, span: bytes) }
    }

    /// Lends the next received bytes in place, without copying them, and returns what `body`
    /// returns; nil when nothing is readable now. `body` gets a view of the bytes (valid only
    /// inside it) and says how many it consumed; the rest stays readable.
    ///
    /// - Note: `body` runs on the manager's queue, which owns every connection: keep it short,
    ///   and do not call the session (or another one) from inside it: that stops the process with
    ///   a message saying so.
    public func withNextChunk<Result>(_ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        try connection.onQueue { try connection.borrow(self, body) }
    }

    /// Bytes written on this session that the accessory acknowledged receiving (its iAP2 link
    /// acknowledged the packets that carried them, in order; on a native transport, the USB OUT
    /// transfers that carried them completed). When a transfer breaks, this is how much is known
    /// to have arrived; the rest may or may not have. It stays readable after the accessory went
    /// away and after ``close()`` (the count at the close).
    public var bytesAcknowledged: Int { connection.onQueue { connection.acknowledged(self) } }

    /// Bytes the session took from the application so far, whole writes and parts of writes
    /// (a write cancelled while it waited, ``writeAvailable(_:)``), in order: what will be sent
    /// unless the session ends first. It stays readable after ``close()`` (the count at the close).
    public var bytesWritten: Int { connection.onQueue { connection.written(self) } }

    /// Whether bytes are readable now.
    public var hasBytesAvailable: Bool { connection.onQueue { connection.bytesAvailable(self) > 0 } }
    /// Whether a write would take bytes now.
    public var hasSpaceAvailable: Bool { connection.onQueue { connection.spaceAvailable(self) > 0 } }

    /// Delivers the stream events to `handler` on `queue`. `openCompleted` comes first (at
    /// once, since the session is open when you get it).
    public func setEventHandler(queue: DispatchQueue, _ handler: @escaping @Sendable (SessionStreamEvent) -> Void) {
        connection.queue.async { self.connection.setEventHandler(self, queue: queue, handler: handler) }
    }

    /// Closes the session: the accessory is told; pending reads end and pending writes fail.
    public func close() {
        connection.onQueue { connection.close(self) }
    }

    /// For iapd: from now on the connection moves this session's bytes to and from `relay`
    /// itself, each time it serves the link (``SessionRelay``), and tells it the accessory's
    /// acknowledgements and the end. The session's own readers, writers and event handler are
    /// not for use alongside.
    package func relay(to relay: any SessionRelay) {
        connection.onQueue {
            guard let state = connection.sessions[key] else { return connection.queue.async { relay.ended() } }
            state.relay = relay
            if state.isEnded { connection.queue.async { relay.ended() } }
            connection.withSession(key) { _, _ in }
        }
    }

    /// For iapd: serves the session now (its relay has bytes for the accessory, or room for
    /// the accessory's).
    package func serveRelay() {
        connection.onQueue { if connection.sessions[key] != nil { connection.withSession(key) { _, _ in } } }
    }

    /// Waits until every written byte was handed to the link (for example before closing).
    /// Handed is not arrived: ``drain()`` waits for the accessory's acknowledgement.
    public func flush() async throws {
        try await connection.flush(self)
    }

    /// Waits until the accessory acknowledged every byte written so far (by writes that have
    /// returned), as ``bytesAcknowledged`` counts it: what a transfer that must be sure of
    /// delivery waits for before it reports success.
    ///
    /// It waits as long as the accessory takes; bound it (for example with a task that closes
    /// the session when ``bytesAcknowledged`` stops moving, as `iapctl send` does).
    ///
    /// - Throws: the session's end (``AccessoryError``) when it ends before the bytes were
    ///   acknowledged.
    public func drain() async throws {
        try await connection.drain(self)
    }

    /// Like ``drain()``, but gives up when the accessory's acknowledged count stands still for
    /// `progressTimeout`: an accessory that keeps its link alive (bare acknowledgements) without
    /// acknowledging the data would otherwise hold the wait for ever. A slow accessory that
    /// keeps acknowledging is waited for. The session stays open either way.
    ///
    /// - Throws: ``AccessoryError/timedOut(_:)`` saying how much was acknowledged of what was
    ///   written; the session's end when it ends first.
    public func drain(progressTimeout: Duration) async throws {
        try await connection.drain(self, limit: .progress(progressTimeout),
                                   step: "waiting for the accessory to acknowledge '\(protocolString)'")
    }

    /// Closes the session once the accessory acknowledged every byte written, and waits for it
    /// to acknowledge the stop: ``drain()``, ``close()``, then the accessory's link acknowledgement
    /// of StopExternalAccessoryProtocolSession, all within `timeout`. The session is closed when
    /// this returns or throws, whatever the accessory does; an accessory that never answers (or
    /// never acknowledges) costs `timeout`, not a hang. (iAP1 and native-transport sessions
    /// have no stop to wait for: their close is done once the bytes are acknowledged.)
    ///
    /// - Throws: ``AccessoryError/timedOut(_:)`` naming the step ("closing '…'": the bytes, with
    ///   how many were acknowledged, or the stop) when `timeout` passed first, or the stop went
    ///   unacknowledged for the connection's `answerTimeout`; the session's end (for example
    ///   ``AccessoryError/disconnected(_:)``) when it ended with bytes unacknowledged. Either way
    ///   ``bytesAcknowledged`` tells what is known to have arrived.
    public func close(timeout: Duration) async throws {
        let clock = connection.driver.clock
        let start = clock.now
        do {
            try await connection.drain(self, limit: .total(timeout), step: "closing '\(protocolString)'")
        } catch {
            close()
            throw error
        }
        try await connection.closeAwaitingStop(self, timeout: timeout - (clock.now - start))
    }
}

extension AccessorySession: AsyncSequence {
    /// A chunk of received bytes, as ``read(maxBytes:)`` returns it (never empty).
    public typealias Element = [UInt8]

    /// Iterates the session's received bytes chunk by chunk (each ``read(maxBytes:)``).
    public struct AsyncIterator: AsyncIteratorProtocol {
        let session: AccessorySession
        let maxBytes: Int

        /// The next chunk; nil once the stream ended and every byte was read.
        ///
        /// - Throws: nothing for a normal end; an error only where ``read(maxBytes:)`` throws.
        public mutating func next() async throws -> [UInt8]? {
            try await session.read(maxBytes: maxBytes)
        }
    }

    /// An iterator over chunks of at most 1 MiB.
    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(session: self, maxBytes: 1 << 20)
    }

    /// The received bytes as an async sequence of chunks of at most `maxBytes` each: a reader
    /// that handles records of a known size asks for no more than it can take at once.
    public func chunks(maxBytes: Int) -> Chunks { Chunks(session: self, maxBytes: Swift.max(1, maxBytes)) }

    /// The session's received bytes in chunks of a bounded size (``chunks(maxBytes:)``).
    public struct Chunks: AsyncSequence, Sendable {
        /// A chunk of received bytes (never empty, at most the bound).
        public typealias Element = [UInt8]
        let session: AccessorySession
        let maxBytes: Int

        /// An iterator over the bounded chunks.
        public func makeAsyncIterator() -> AsyncIterator {
            AsyncIterator(session: session, maxBytes: maxBytes)
        }
    }
}
