package import ByteRing
public import Dispatch
internal import Glibc
internal import SystemCalls

/// A ``ByteChannel`` over a session's shared memory (two rings in a memfd): how `iapd` and a
/// client move one session's bytes, each side with its own channel on the same memory.
///
/// - Bytes: ring 0 carries client → daemon, ring 1 daemon → client. A write copies into the
///   ring (for a client, the one copy before the daemon's link lays the bytes out in packets);
///   ``withReadableBytes(_:)`` lends them in place (the daemon's link copies them into its
///   packet from there).
/// - Indices: each side keeps its own tail and head privately and publishes them; the other
///   side's are read from the memory and **checked as input from a hostile process**: a tail
///   that moves back or claims more than a ring's capacity, a head that moves back or past what
///   was written, ends the channel with an error (the daemon closes that session) and nothing
///   is read or written outside the ring.
/// - Wake-ups: the session's Unix socket carries one byte per wake-up and nothing else. A side
///   that finds its ring empty (or full) sets the ring's waiting word and looks again; the other
///   side wakes it only if the word is set, and only when the ring turns non-empty (or has a
///   quarter of its room free again), so a busy stream costs no system call per write. The
///   process's one `RingWakePoller` thread waits on every channel's socket and runs the wake-up
///   on the channel's queue with `sync`: one thread hand-off per wake byte (a Dispatch read
///   source, the fallback, costs two).
/// - The end: the socket stays the session's lifetime: either side closing it (or its process
///   dying) is the end of the stream; bytes already in the ring stay readable.
/// - Acknowledgements: the daemon publishes how many of the client's bytes the accessory
///   acknowledged (``publishAcknowledged(_:)``); on the client that count is
///   ``bytesDelivered``, so a drain waits for the accessory, not for the daemon.
///
/// Confined to the queue given to ``activate(queue:handler:)``, like every ``ByteChannel``.
public final class SharedRingChannel: ByteChannel, @unchecked Sendable {
    // Sendability: every stored var is touched on `queue` only (before activation, only by the
    // creator, which hands the channel over to that queue).

    /// Which end of the session this channel is.
    public enum Role: Sendable, Hashable {
        /// iapd's end: reads ring 0, writes ring 1, publishes acknowledgements.
        case daemon
        /// The client's end: writes ring 0, reads ring 1.
        case client
    }

    /// What a person reads, e.g. `iapd session 'com.example.echo'`.
    public let description: String
    /// Which end this is.
    public let role: Role
    private let memory: SharedRingMemory
    private let capacity: UInt64
    private let descriptor: Int32
    private let outbound: Int
    private let inbound: Int
    /// Room that must be free before a waiting producer is woken.
    private let wakeRoom: UInt64
    /// Ours: bytes written to the outbound ring and taken from the inbound ring, ever.
    private var produced: UInt64 = 0
    private var consumed: UInt64 = 0
    /// The other side's, as last read and checked.
    private var peerTail: UInt64 = 0
    private var peerHead: UInt64 = 0
    /// Daemon: the count last published; client: the count last read.
    private var acknowledged: UInt64 = 0
    /// Daemon: the count at the last acknowledgement wake-up.
    private var acknowledgedAtWake: UInt64 = 0
    private var queue: DispatchQueue?
    private var handler: (@Sendable (ByteChannelEvent) -> Void)?
    private var source: (any DispatchSourceRead)?
    /// Activated on the process's `RingWakePoller`, which closes the descriptor once it ends.
    private var polled = false
    private var wantsWritable = false
    /// The other side's head when the handler last heard of it.
    private var headAtAnnouncement: UInt64 = 0
    private var peerClosed = false
    private var ended = false
    private var broken = false
    private var descriptorClosed = false
    private var scratch = [UInt8](repeating: 0, count: 64)

    /// A channel on `memory` for `role`, woken through `socket` (a connected stream socket, made
    /// non-blocking here, which the channel now owns).
    package init(memory: SharedRingMemory, socket: Int32, role: Role, description: String) {
        self.memory = memory
        self.descriptor = socket
        self.role = role
        self.description = description
        self.capacity = UInt64(memory.capacity)
        self.wakeRoom = max(1, UInt64(memory.capacity) / 4)
        outbound = role == .client ? 0 : 1
        inbound = role == .client ? 1 : 0
        UnixSocket.setNonBlocking(socket)
    }

    deinit {
        // Never activated: the descriptor is closed here; activated, the poller (or the
        // source's cancel) closes it. One dropped while active (never closed) ends the stream
        // for the other side now; the shut-down socket reads as ready, so the poller finds the
        // channel gone at once and closes the descriptor. (No call into the poller here: this
        // deinit may run on the poller's thread under its lock, where it last let go.)
        if polled {
            if !descriptorClosed { _ = Glibc.shutdown(descriptor, Int32(SHUT_RDWR)) }
        } else if source == nil, !descriptorClosed {
            _ = Glibc.close(descriptor)
        }
    }

    public func activate(queue: DispatchQueue, handler: @escaping @Sendable (ByteChannelEvent) -> Void) {
        // Closed before it was activated: its descriptor is gone (its number may be another's
        // now), so there is nothing to watch; the handler hears the end.
        guard !descriptorClosed else {
            queue.async { handler(.closed(nil)) }
            return
        }
        self.queue = queue
        self.handler = handler
        if RingWakePoller.shared.isAvailable {
            polled = true
            RingWakePoller.shared.add(self, descriptor: descriptor, queue: queue)
        } else {
            let source = DispatchSource.makeReadSource(fileDescriptor: descriptor, queue: queue)
            let descriptor = self.descriptor
            source.setEventHandler { [weak self] in self?.woken() }
            source.setCancelHandler { _ = Glibc.close(descriptor) }
            self.source = source
            source.resume()
        }
        // Whatever the other side published before the handler was set is announced now.
        queue.async { [weak self] in self?.announce() }
    }

    // MARK: Reading

    public var readableByteCount: Int {
        let count = inboundCount()
        return count > 0 ? count : armConsumer()
    }

    /// Lends the readable bytes up to the ring's end (the rest, after the wrap, on the next call).
    ///
    /// Inlined into the caller's module around `lend`, which is not generic: iapd's relay
    /// calls it from another module at every service, where a generic call would look up the
    /// metadata of its result types at run time each time.
    @inlinable
    public func withReadableBytes<Result>(_ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        var result: Result?
        _ = try lend { span in
            let (consumed, value) = try body(span)
            result = value
            return consumed
        }
        return result
    }

    /// Lends the readable bytes up to the ring's end to `body`, which returns how many it
    /// consumed; false when nothing is readable (and `body` was not called).
    @usableFromInline
    func lend(_ body: (RawSpan) throws -> Int) rethrows -> Bool {
        let count = readableByteCount
        guard count > 0 else { return false }
        let offset = Int(consumed % capacity)
        let length = min(count, Int(capacity) - offset)
        let taken = try memory.withBytes(ring: inbound, offset: offset, count: length, body)
        consume(min(max(0, taken), length))
        return true
    }

    /// The inbound ring's readable bytes, from its tail as the other side published it (checked).
    private func inboundCount() -> Int {
        guard !broken else { return 0 }
        // Once the other side's end was seen, what it wrote before is all there is: a process
        // that closed its socket and goes on writing does not hold the session open.
        if peerClosed { return Int(peerTail - consumed) }
        let tail = memory.load(.tail(inbound))
        guard tail >= peerTail, tail >= consumed, tail - consumed <= capacity else {
            corrupted("its ring's tail moved from \(peerTail) to \(tail) with \(consumed) bytes taken and \(capacity) in the ring")
            return 0
        }
        peerTail = tail
        return Int(tail - consumed)
    }

    /// Found empty: asks to be woken, then looks once more (the producer may have written before
    /// it could see the request).
    private func armConsumer() -> Int {
        guard !broken else { return 0 }
        memory.store(.consumerWaiting(inbound), 1)
        let count = inboundCount()
        if count > 0 { memory.store(.consumerWaiting(inbound), 0) }
        return count
    }

    private func consume(_ count: Int) {
        guard count > 0 else { return }
        consumed += UInt64(count)
        memory.store(.head(inbound), consumed)
        guard memory.load(.producerWaiting(inbound)) != 0 else { return }
        let free = capacity - (peerTail - consumed)
        if free >= wakeRoom || peerTail == consumed, memory.exchange(.producerWaiting(inbound), 0) != 0 { wake() }
    }

    // MARK: Writing

    public func write(_ bytes: ArraySlice<UInt8>) -> Int {
        bytes.withUnsafeBytes { produce($0) }
    }

    /// Copies what fits of `bytes` into the outbound ring (both runs when it wraps).
    public func write(span bytes: RawSpan) -> Int {
        bytes.withUnsafeBytes { produce($0) }
    }

    public var isWritable: Bool {
        guard !ended, !peerClosed else { return false }
        if room() > 0 { return true }
        waitForRoom()
        return false
    }

    /// Bytes written that the other side has not taken yet. When some are left, the other side
    /// is asked to wake this one once it took a quarter of the ring or all of them (a flush
    /// waits for that).
    public var unsentByteCount: Int {
        _ = room()
        guard produced > peerHead, !broken, !ended else { return Int(produced - peerHead) }
        memory.store(.producerWaiting(outbound), 1)
        _ = room()
        return Int(produced - peerHead)
    }

    /// Client: the bytes the accessory acknowledged, as the daemon published them. Daemon: the
    /// bytes the client took.
    public var bytesDelivered: Int {
        switch role {
        case .daemon:
            _ = room()
            return Int(peerHead)
        case .client:
            readAcknowledged()
            if acknowledged < produced, !broken {
                memory.store(.acknowledgementWaiting, 1)
                readAcknowledged()
            }
            return Int(acknowledged)
        }
    }

    /// Whether the other side closed its end, whether or not this side has seen it yet.
    public var peerHasClosed: Bool {
        guard !peerClosed, !ended else { return true }
        var probe = pollfd(fd: descriptor, events: Int16(POLLIN) | 0x2000 /* POLLRDHUP */, revents: 0)
        return Glibc.poll(&probe, 1, 0) == 1 && probe.revents & (0x2000 | Int16(POLLHUP)) != 0
    }

    /// Daemon: tells the client that the accessory acknowledged `count` of the client's bytes
    /// (counts only grow). The client is woken when it waits for them and every byte it wrote
    /// is acknowledged (the end of a transfer), or every quarter ring of progress: not at every
    /// acknowledgement of a stream that goes on.
    public func publishAcknowledged(_ count: Int) {
        precondition(role == .daemon, "only the daemon publishes acknowledgements")
        let value = UInt64(max(0, count))
        guard value > acknowledged, !broken, !ended else { return }
        acknowledged = value
        memory.store(.acknowledged, value)
        guard memory.load(.acknowledgementWaiting) != 0 else { return }
        let everything = value == consumed && inboundCount() == 0
        if everything || value - acknowledgedAtWake >= wakeRoom, memory.exchange(.acknowledgementWaiting, 0) != 0 {
            acknowledgedAtWake = value
            wake()
        }
    }

    public func close() {
        finish(nil)
    }

    /// The outbound ring's free bytes, from its head as the other side published it (checked).
    private func room() -> UInt64 {
        guard !broken else { return 0 }
        let head = memory.load(.head(outbound))
        guard head >= peerHead, head <= produced else {
            corrupted("its ring's head moved from \(peerHead) to \(head) with \(produced) bytes written")
            return 0
        }
        peerHead = head
        return capacity - (produced - head)
    }

    private func produce(_ bytes: UnsafeRawBufferPointer) -> Int {
        guard !ended, !peerClosed, bytes.count > 0 else { return 0 }
        let count = Int(min(room(), UInt64(bytes.count)))
        if count > 0 {
            let offset = Int(produced % capacity)
            let first = min(count, Int(capacity) - offset)
            memory.copy(UnsafeRawBufferPointer(rebasing: bytes[0..<first]), ring: outbound, offset: offset)
            if count > first { memory.copy(UnsafeRawBufferPointer(rebasing: bytes[first..<count]), ring: outbound, offset: 0) }
            produced += UInt64(count)
            memory.store(.tail(outbound), produced)
            if memory.load(.consumerWaiting(outbound)) != 0, memory.exchange(.consumerWaiting(outbound), 0) != 0 { wake() }
        }
        if count < bytes.count { waitForRoom() }
        return count
    }

    /// Found full: asks to be woken once a quarter of the ring is free, then looks once more.
    private func waitForRoom() {
        guard !broken, !ended else { return }
        wantsWritable = true
        memory.store(.producerWaiting(outbound), 1)
        if room() >= wakeRoom {
            memory.store(.producerWaiting(outbound), 0)
            queue?.async { [weak self] in self?.announce() }
        }
    }

    private func readAcknowledged() {
        guard role == .client, !broken else { return }
        let value = memory.load(.acknowledged)
        // The daemon is trusted, but a count past what was written or going back is ignored.
        if value > acknowledged, value <= produced { acknowledged = value }
    }

    // MARK: Wake-ups and the end

    /// One byte to the other side; a full socket already holds a wake-up it has not read.
    private func wake() {
        guard !descriptorClosed else { return }
        var byte: UInt8 = 1
        _ = withUnsafeBytes(of: &byte) { UnixSocket.send(descriptor, $0) }
    }

    /// The socket is readable: wake-ups to swallow, or the other side's end. On the queue.
    func woken() {
        guard !ended else { return }
        // Read until the socket would block: a short read does not mean the end is not behind
        // the bytes, and a source does not fire again for an end that was already there. At
        // most 64 reads a turn: a peer that floods its socket gets the rest read on later turns
        // of the queue, which serves everything else in between (the poller sees the socket
        // readable again; a source is asked to look again).
        var reads = 0
        reading: while !peerClosed {
            guard reads < 64 else {
                if !polled { queue?.async { [weak self] in self?.woken() } }
                break reading
            }
            reads += 1
            switch scratch.withUnsafeMutableBytes({ SystemCall.read(descriptor, into: $0) }) {
            case .success(0):
                _ = inboundCount() // the tail as the other side left it, then no more
                peerClosed = true
            case .success:
                continue reading
            case .failure(let error) where error.kind != .wouldBlock:
                _ = inboundCount()
                peerClosed = true // a reset socket: the other side is gone
            case .failure:
                break reading // all read
            }
        }
        announce()
    }

    /// Tells the handler what it may do now.
    private func announce() {
        guard !ended, let handler else { return }
        // Found empty, the consumer asks to be woken (from the first announcement on).
        if readableByteCount > 0 { handler(.readable) }
        guard !ended else { return }
        var writable = false
        if role == .client {
            let before = acknowledged
            readAcknowledged()
            writable = acknowledged != before // a drain may be done
        }
        if wantsWritable, !peerClosed, room() > 0 {
            wantsWritable = false
            writable = true
        }
        // The other side took bytes since the last announcement: a flush may be done.
        _ = room()
        if peerHead != headAtAnnouncement {
            headAtAnnouncement = peerHead
            writable = true
        }
        if writable, !ended { handler(.writable) }
        if peerClosed { finish(nil) }
    }

    private func corrupted(_ what: String) {
        guard !broken else { return }
        broken = true
        let side = role == .daemon ? "the client" : "iapd"
        finish(TransportError("\(description): \(side) broke the session's shared ring (\(what)); the session is closed",
                              advice: role == .daemon ? "the client process is faulty or hostile; it can open the session again" :
                                "report this with iapd's log: iapd is faulty"))
    }

    /// Ends the channel once: the socket is closed (the other side sees the end), the handler
    /// hears why; bytes already in the inbound ring stay readable unless the ring broke.
    private func finish(_ error: TransportError?) {
        guard !ended else { return }
        ended = true
        // The other side sees the end now, not once the source's cancellation closed the
        // descriptor (a turn of the queue later): iapd hands a closed protocol to its next
        // opener only once it sees its holder's end.
        if !descriptorClosed { _ = Glibc.shutdown(descriptor, Int32(SHUT_RDWR)) }
        if polled {
            if !descriptorClosed { RingWakePoller.shared.remove(descriptor: descriptor) }
        } else if let source { source.cancel() } else if !descriptorClosed { _ = Glibc.close(descriptor) }
        descriptorClosed = true
        let handler = self.handler
        self.handler = nil
        if let handler, let queue { queue.async { handler(.closed(error)) } }
    }
}
