public import Dispatch
internal import Glibc
internal import SystemCalls

/// A ``ByteChannel`` over a connected Unix stream socket: a session's bytes between a process
/// and `iapd` (the daemon hands each opened session over as such a socket).
///
/// Reading: the socket is read into a ring of ``bufferCapacity`` bytes, lent in place by
/// ``withReadableBytes(_:)`` (the bytes up to the ring's end first, then those after the wrap);
/// while it is full the socket is not read, so the kernel's socket buffer fills and the writer at
/// the other end is held off (back-pressure instead of memory). Reading starts again as soon as
/// ``resumeRoom`` bytes are free, not once the ring is empty: a consumer slower than the writer
/// (a Bluetooth link under a daemon's client) takes bytes all the time, and the writer sees them
/// taken all the time, instead of nothing for as long as a whole ring takes to drain (which a
/// stall watchdog took for a dead transfer). Bytes are never moved inside the ring.
/// Writing: ``write(_:)`` sends straight from the caller's bytes (no copy in user space) what
/// the kernel takes now, and ``ByteChannelEvent/writable`` says when it takes more.
///
/// The end of the stream (the peer closed) is `.closed(nil)`; a reset or failed send is
/// `.closed(error)`. The descriptor is the channel's: ``close()`` (or the channel going away)
/// closes it. Confined to the queue given to ``activate(queue:handler:)``, like every
/// ``ByteChannel``; Dispatch read and write sources watch the socket there.
public final class SocketByteChannel: ByteChannel, @unchecked Sendable {
    // Sendability: every stored var is touched on `queue` only (before activation, only by the
    // creator, which hands the channel over to that queue).
    /// What a person reads, e.g. `iapd session 'com.example.echo'`.
    public let description: String
    /// The most received bytes held before the socket is left unread.
    public let bufferCapacity: Int
    private let descriptor: Int32
    /// The free bytes at which a paused channel reads again: a sixteenth of the ring (at least
    /// 4 KiB), so a resumed read is worth its system call.
    public var resumeRoom: Int { max(4096, bufferCapacity / 16) }
    private var buffer: [UInt8]
    /// Where the readable bytes start in the ring, and how many there are.
    private var start = 0
    private var count = 0
    private var queue: DispatchQueue?
    private var handler: (@Sendable (ByteChannelEvent) -> Void)?
    private var watch: DescriptorWatch?
    private var readPaused = false
    private var wantsWritable = false
    private var ended = false
    private var descriptorClosed = false
    private var written = 0

    /// A channel over `descriptor` (a connected stream socket; made non-blocking here), which it
    /// now owns.
    public init(descriptor: Int32, description: String, bufferCapacity: Int = 1 << 20) {
        self.descriptor = descriptor
        self.description = description
        self.bufferCapacity = max(4096, bufferCapacity)
        self.buffer = [UInt8](repeating: 0, count: self.bufferCapacity)
        UnixSocket.setNonBlocking(descriptor)
    }

    deinit {
        // Never activated: the descriptor is closed here; activated, the watch closes it.
        if watch == nil, !descriptorClosed { _ = Glibc.close(descriptor) }
    }

    public func activate(queue: DispatchQueue, handler: @escaping @Sendable (ByteChannelEvent) -> Void) {
        self.queue = queue
        self.handler = handler
        watch = DescriptorWatch(descriptor: descriptor, queue: queue,
                                readable: { [weak self] in self?.fill() }, writable: { [weak self] in self?.canWrite() })
    }

    /// Lends the readable bytes up to the ring's end (the rest, after the wrap, on the next call).
    public func withReadableBytes<Result>(_ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        guard count > 0 else { return nil }
        let length = min(count, bufferCapacity - start)
        let (consumed, result) = try buffer.withUnsafeBytes { raw in
            try body(RawSpan(_unsafeBytes: UnsafeRawBufferPointer(rebasing: raw[start..<(start + length)])))
        }
        consume(min(max(0, consumed), length))
        return result
    }

    public var readableByteCount: Int { count }

    public func write(_ bytes: ArraySlice<UInt8>) -> Int {
        bytes.withUnsafeBytes { send($0) }
    }

    /// Sends what the socket takes now of `bytes`, from where they lie; returns the count.
    public func write(span bytes: RawSpan) -> Int {
        bytes.withUnsafeBytes { send($0) }
    }

    /// Whether a write would take bytes: true until a write found the socket full, then again
    /// once it drained (no system call).
    public var isWritable: Bool { !ended && !wantsWritable }

    /// Whether the peer closed its end (or shut down its writing), whether or not the channel
    /// has read to that point yet.
    public var peerHasClosed: Bool {
        guard !ended else { return true }
        var probe = pollfd(fd: descriptor, events: Int16(POLLIN) | 0x2000 /* POLLRDHUP */, revents: 0)
        return Glibc.poll(&probe, 1, 0) == 1 && probe.revents & (0x2000 | Int16(POLLHUP)) != 0
    }

    /// Zero: a byte the socket took is on its way (the kernel holds it for the peer).
    public var unsentByteCount: Int { 0 }

    /// Bytes written that the peer has read (written less what waits in the socket).
    public var bytesDelivered: Int {
        guard !descriptorClosed, !ended, let unread = UnixSocket.unreadByPeer(descriptor) else { return written }
        return max(0, written - unread)
    }

    public func close() {
        finish(nil)
    }

    // MARK: On the queue

    private func send(_ bytes: UnsafeRawBufferPointer) -> Int {
        guard !ended, bytes.count > 0 else { return 0 }
        switch UnixSocket.send(descriptor, bytes) {
        case .success(let count):
            written += count
            if count < bytes.count { waitForWritable() }
            return count
        case .failure(let error) where error.kind == .wouldBlock:
            waitForWritable()
            return 0
        case .failure(let error):
            fail(error)
            return 0
        }
    }

    private func waitForWritable() {
        wantsWritable = true
        watch?.watchWritable()
    }

    private func canWrite() {
        watch?.stopWatchingWritable()
        guard wantsWritable, !ended else { return }
        wantsWritable = false
        handler?(.writable)
    }

    /// Reads what the socket has into the ring's free bytes (both runs of them when they wrap),
    /// until the socket has nothing more or the ring is full.
    private func fill() {
        var took = false
        while !ended {
            if count == 0 { start = 0 } // one contiguous run of free bytes, the whole ring
            guard count < bufferCapacity else {
                pauseReading()
                break
            }
            // The free bytes after the readable ones, up to the ring's end or to `start`.
            let free = (start + count) % bufferCapacity
            let end = free >= start ? bufferCapacity : start
            let result = buffer.withUnsafeMutableBytes { raw in
                SystemCall.read(descriptor, into: UnsafeMutableRawBufferPointer(rebasing: raw[free..<end]))
            }
            switch result {
            case .success(0):
                deliver(took) // the bytes read before the end are announced first
                took = false
                finish(nil)
            case .success(let read):
                count += read
                took = true
                if read < end - free { return deliver(took) } // the socket had no more
                continue
            case .failure(let error) where error.kind == .wouldBlock:
                return deliver(took)
            case .failure(let error):
                deliver(took)
                took = false
                fail(error)
            }
        }
        deliver(took)
    }

    private func deliver(_ took: Bool) {
        if took { handler?(.readable) }
    }

    private func consume(_ taken: Int) {
        start = (start + taken) % bufferCapacity
        count -= taken
        if count == 0 { start = 0 }
        if readPaused, !ended, bufferCapacity - count >= resumeRoom {
            readPaused = false
            watch?.resumeReading()
            // A read source resumed while the socket already holds bytes does not always fire
            // again on Linux (the peer, held off, sends nothing new to wake it): read now, from a
            // turn of the queue of its own, since this runs inside the consumer's call.
            queue?.async { [weak self] in self?.fill() }
        }
    }

    private func pauseReading() {
        readPaused = true
        watch?.pauseReading()
    }

    private func fail(_ error: SystemError) {
        finish(TransportError("the session's socket failed: \(error)", errno: error.code,
                              advice: "the daemon (iapd) may have stopped; check `systemctl status iapd` or its log"))
    }

    /// Ends the stream once: the sources are cancelled (they close the descriptor), the handler
    /// hears why; bytes already received stay readable.
    private func finish(_ error: TransportError?) {
        guard !ended else { return }
        ended = true
        if let watch { watch.cancel() } else if !descriptorClosed { _ = Glibc.close(descriptor) }
        descriptorClosed = true
        let handler = self.handler
        self.handler = nil
        if let handler, let queue { queue.async { handler(.closed(error)) } }
    }
}
