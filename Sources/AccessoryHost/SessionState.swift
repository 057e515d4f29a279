internal import Dispatch
internal import IAPLink
internal import IAPTransport
internal import Synchronization

// What a connection keeps of each session it handed out: the tasks waiting on it and its
// counters (``SessionState``), and the application's stream-event handler (``StreamEventHandler``).

extension Connection {
    struct Reader {
        /// 0: a wait for readable bytes that takes none (`read(into:)`), resumed with `[]`.
        var maxBytes: Int
        var continuation: CheckedContinuation<[UInt8]?, any Error>
        /// Finds it when its task is cancelled.
        var id: Int
    }
    struct Writer {
        var remaining: ArraySlice<UInt8>
        var continuation: CheckedContinuation<Void, any Error>
        var id: Int
    }
    struct Flusher {
        var continuation: CheckedContinuation<Void, any Error>
        var id: Int
    }
    /// How long a wait for the accessory's acknowledgements may last.
    enum WaitLimit {
        /// Until the acknowledged count stands still for this long.
        case progress(Duration)
        /// This long in all.
        case total(Duration)
    }
    /// Waiting for the accessory to acknowledge `target` bytes.
    struct Drainer {
        var target: Int
        var continuation: CheckedContinuation<Void, any Error>
        /// Nil: as long as the accessory takes.
        var limit: WaitLimit?
        /// What the error says the wait was for (e.g. "closing 'com.acme.echo'").
        var step: String
        var id: Int
        /// The acknowledged count last seen, and since when (link time) it stands.
        var acknowledged: Int
        var since: LinkTime
    }
}

/// One open session, whichever way its bytes travel: its stream, the tasks waiting on it and its
/// counters.
///
/// A reference, kept in ``Connection``'s table and touched on the connection's queue only:
/// serving a session per input, and reading or bumping a counter, change it in place. (As a
/// struct it was taken out of the table and put back per input, and copied by every counter.)
final class SessionState {
    /// The protocol (the session object itself is the application's: held here, it would keep
    /// the connection alive after the accessory went away if the application never closed it;
    /// its deinit closes it instead).
    let protocolString: String
    let stream: any SessionStream
    var readers: [Connection.Reader] = []
    var writers: [Connection.Writer] = []
    var flushers: [Connection.Flusher] = []
    /// Waiting for the accessory to acknowledge bytes.
    var drainers: [Connection.Drainer] = []
    /// Bytes the session took from the application so far.
    var written = 0
    var handler: StreamEventHandler?
    /// Bytes the accessory acknowledged (kept after the stream ended).
    var acknowledged = 0
    /// Moves the session's bytes to and from another process as they become movable (iapd).
    var relay: (any SessionRelay)?
    /// The acknowledged count the relay was last told (``acknowledged`` may grow outside a
    /// service, when someone asks for it).
    private var relayedAcknowledged = 0
    /// Set when the stream ended: nil reason = closed normally.
    var ended: AccessoryError?
    var isEnded = false

    /// Told after every service whether a read would find bytes (or the end) now.
    let readWait: ReadWait

    init(protocolString: String, stream: any SessionStream, readWait: ReadWait) {
        self.protocolString = protocolString
        self.stream = stream
        self.readWait = readWait
    }

    /// Serves the waiting readers, writers, flushers and drainers, and tells the handler what the
    /// application may do next.
    func serve(_ machine: inout IAPEndpoint, now: LinkTime) {
        acknowledged = max(acknowledged, stream.acknowledged(&machine))
        if let relay {
            serveRelay(relay, &machine, now: now)
            if acknowledged > relayedAcknowledged {
                relayedAcknowledged = acknowledged
                relay.acknowledged(acknowledged)
            }
        }
        var readable = stream.readable(&machine) > 0
        while readable, !readers.isEmpty {
            let reader = readers.removeFirst()
            reader.continuation.resume(returning: reader.maxBytes == 0 ? [] : stream.read(&machine, maxBytes: reader.maxBytes))
            readable = stream.readable(&machine) > 0
        }
        if isEnded, !readable {
            for reader in readers { reader.continuation.resume(returning: nil) }
            readers.removeAll()
        }
        readWait.setReadable(readable || isEnded)
        var wroteAll = true
        while let first = writers.first {
            guard !isEnded else {
                writers.removeFirst().continuation.resume(throwing: ended ?? AccessoryError.sessionClosed)
                continue
            }
            let taken = stream.write(&machine, first.remaining, now: now)
            written += taken
            writers[0].remaining = first.remaining.dropFirst(taken)
            if writers[0].remaining.isEmpty {
                writers.removeFirst().continuation.resume()
            } else {
                wroteAll = false
                break
            }
        }
        // Asked only for a flusher (a relayed stream asks its other side to wake it when asked).
        if writers.isEmpty, !flushers.isEmpty, case let unsent = stream.unsent(&machine), unsent == 0 || isEnded {
            for flusher in flushers {
                if isEnded, unsent > 0 {
                    flusher.continuation.resume(throwing: ended ?? AccessoryError.sessionClosed)
                } else {
                    flusher.continuation.resume()
                }
            }
            flushers.removeAll()
        }
        if !drainers.isEmpty {
            let acknowledged = self.acknowledged, isEnded = self.isEnded, ended = self.ended
            drainers.removeAll { drainer in
                if acknowledged >= drainer.target {
                    drainer.continuation.resume()
                } else if isEnded {
                    drainer.continuation.resume(throwing: ended ?? AccessoryError.sessionClosed)
                } else {
                    return false
                }
                return true
            }
        }
        if let handler {
            if readable { handler.post(.hasBytesAvailable) }
            if wroteAll, !isEnded, stream.hasSpace(&machine) { handler.post(.hasSpaceAvailable) }
        }
    }

    /// Hands received bytes to the relay as far as it takes them, and writes what it has for
    /// the accessory as far as the link takes it.
    private func serveRelay(_ relay: any SessionRelay, _ machine: inout IAPEndpoint, now: LinkTime) {
        while let whole = stream.borrow(&machine, { span -> (consumed: Int, result: Bool) in
            let taken = min(max(0, relay.deliver(span)), span.byteCount)
            return (taken, taken > 0 && taken == span.byteCount)
        }), whole {}
        guard !isEnded else { return }
        var taken = 0
        relay.withOutgoing { span in
            let count = stream.write(&machine, span: span, now: now)
            taken += count
            return count
        }
        written += taken
    }

    /// Resumes waiter `id`, if it still waits, with `error`; false when it waits no more.
    func cancelWaiter(_ id: Int, with error: any Error) -> Bool {
        if let index = readers.firstIndex(where: { $0.id == id }) {
            readers.remove(at: index).continuation.resume(throwing: error)
        } else if let index = writers.firstIndex(where: { $0.id == id }) {
            writers.remove(at: index).continuation.resume(throwing: error)
        } else if let index = flushers.firstIndex(where: { $0.id == id }) {
            flushers.remove(at: index).continuation.resume(throwing: error)
        } else if let index = drainers.firstIndex(where: { $0.id == id }) {
            drainers.remove(at: index).continuation.resume(throwing: error)
        } else {
            return false
        }
        return true
    }

    /// The session was closed: readers see the end, every other waiter fails.
    func closeWaiters() {
        for reader in readers { reader.continuation.resume(returning: nil) }
        for writer in writers { writer.continuation.resume(throwing: AccessoryError.sessionClosed) }
        for flusher in flushers { flusher.continuation.resume(throwing: AccessoryError.sessionClosed) }
        for drainer in drainers { drainer.continuation.resume(throwing: AccessoryError.sessionClosed) }
        readers.removeAll()
        writers.removeAll()
        flushers.removeAll()
        drainers.removeAll()
    }
}

/// A session's stream-event handler and its queue. `hasBytesAvailable` and `hasSpaceAvailable`
/// are coalesced: at most one of each waits on the handler's queue (the next is posted once it
/// ran), so a handler queue that is slow or held up while the accessory keeps the connection
/// busy does not collect a block per packet. They are levels, checked again when they reach the
/// handler's queue: one whose bytes (or space) were taken meanwhile (by an earlier handler call,
/// or by an async read) is not delivered, so a handler never hears of bytes that are not there.
/// The others are posted as they happen.
final class StreamEventHandler: Sendable {
    let queue: DispatchQueue
    let handler: @Sendable (SessionStreamEvent) -> Void
    /// Whether a level event still holds (asked on the handler's queue, just before delivery).
    private let stillHolds: @Sendable (SessionStreamEvent) -> Bool
    /// Which level events wait on the queue now (``bytesBit``, ``spaceBit``).
    private let posted = Atomic<UInt8>(0)
    private static let bytesBit: UInt8 = 1
    private static let spaceBit: UInt8 = 2

    init(queue: DispatchQueue, handler: @escaping @Sendable (SessionStreamEvent) -> Void,
         stillHolds: @escaping @Sendable (SessionStreamEvent) -> Bool) {
        self.queue = queue
        self.handler = handler
        self.stillHolds = stillHolds
    }

    /// Posts `event` to the handler's queue, unless the same level event is already waiting there.
    func post(_ event: SessionStreamEvent) {
        let bit: UInt8
        switch event {
        case .hasBytesAvailable: bit = Self.bytesBit
        case .hasSpaceAvailable: bit = Self.spaceBit
        default:
            queue.async { self.handler(event) }
            return
        }
        guard posted.bitwiseOr(bit, ordering: .acquiringAndReleasing).oldValue & bit == 0 else { return }
        queue.async {
            // Cleared first: what happens while the handler runs posts the event again.
            self.posted.bitwiseAnd(~bit, ordering: .acquiringAndReleasing)
            if self.stillHolds(event) { self.handler(event) }
        }
    }
}
