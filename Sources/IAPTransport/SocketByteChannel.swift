public import Dispatch
internal import Glibc
internal import SystemCalls

/// A ``ByteChannel`` over a connected Unix stream socket: a session's bytes between a process
/// and `iapd` (the daemon hands each opened session over as such a socket).
///
/// Reading: the socket is read into one buffer of ``bufferCapacity`` bytes, lent in place by
/// ``withReadableBytes(_:)``; while it is full the socket is not read, so the kernel's socket
/// buffer fills and the writer at the other end is held off (back-pressure instead of memory).
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
    private var buffer: [UInt8]
    private var head = 0
    private var tail = 0
    private var queue: DispatchQueue?
    private var handler: (@Sendable (ByteChannelEvent) -> Void)?
    private var readSource: (any DispatchSourceRead)?
    private var writeSource: (any DispatchSourceWrite)?
    private var readSuspended = true
    private var writeSuspended = true
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
        // Never activated: the descriptor is closed here. Activated and not ended: the sources
        // are cancelled (their cancel handlers close it).
        guard !ended else { return }
        guard let readSource, let writeSource else { return _ = Glibc.close(descriptor) }
        if readSuspended { readSource.resume() }
        readSource.cancel()
        if writeSuspended { writeSource.resume() }
        writeSource.cancel()
    }

    public func activate(queue: DispatchQueue, handler: @escaping @Sendable (ByteChannelEvent) -> Void) {
        self.queue = queue
        self.handler = handler
        let read = DispatchSource.makeReadSource(fileDescriptor: descriptor, queue: queue)
        let write = DispatchSource.makeWriteSource(fileDescriptor: descriptor, queue: queue)
        read.setEventHandler { [weak self] in self?.fill() }
        write.setEventHandler { [weak self] in self?.canWrite() }
        // The descriptor is closed once both sources are done with it.
        let descriptor = self.descriptor
        let pending = DispatchGroup()
        pending.enter()
        pending.enter()
        read.setCancelHandler { pending.leave() }
        write.setCancelHandler { pending.leave() }
        pending.notify(queue: queue) { _ = Glibc.close(descriptor) }
        readSource = read
        writeSource = write
        resumeReading()
    }

    public func withReadableBytes<Result>(_ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        guard tail > head else { return nil }
        let (consumed, result) = try buffer.withUnsafeBytes { raw in
            try body(RawSpan(_unsafeBytes: UnsafeRawBufferPointer(rebasing: raw[head..<tail])))
        }
        consume(min(max(0, consumed), tail - head))
        return result
    }

    public var readableByteCount: Int { tail - head }

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
        if writeSuspended, let writeSource {
            writeSuspended = false
            writeSource.resume()
        }
    }

    private func canWrite() {
        if !writeSuspended {
            writeSuspended = true
            writeSource?.suspend()
        }
        guard wantsWritable, !ended else { return }
        wantsWritable = false
        handler?(.writable)
    }

    private func fill() {
        guard !ended else { return }
        if head == tail {
            head = 0
            tail = 0
        } else if bufferCapacity - tail < bufferCapacity / 4, head > 0 {
            buffer.withUnsafeMutableBytes { raw in
                raw.baseAddress!.copyMemory(from: raw.baseAddress!.advanced(by: head), byteCount: tail - head)
            }
            tail -= head
            head = 0
        }
        guard tail < bufferCapacity else { return pauseReading() }
        let result = buffer.withUnsafeMutableBytes { raw in
            SystemCall.read(descriptor, into: UnsafeMutableRawBufferPointer(rebasing: raw[tail...]))
        }
        switch result {
        case .success(0):
            finish(nil)
        case .success(let count):
            tail += count
            if tail == bufferCapacity, head == 0 { pauseReading() }
            handler?(.readable)
        case .failure(let error) where error.kind == .wouldBlock:
            break
        case .failure(let error):
            fail(error)
        }
    }

    private func consume(_ count: Int) {
        head += count
        if head == tail {
            head = 0
            tail = 0
        }
        if readSuspended, !ended, tail < bufferCapacity { resumeReading() }
    }

    private func pauseReading() {
        guard !readSuspended else { return }
        readSuspended = true
        readSource?.suspend()
    }

    private func resumeReading() {
        guard readSuspended, let readSource else { return }
        readSuspended = false
        readSource.resume()
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
        if let readSource {
            if readSuspended { readSource.resume() }
            readSource.cancel()
        } else if !descriptorClosed {
            _ = Glibc.close(descriptor)
        }
        if let writeSource {
            if writeSuspended { writeSource.resume() }
            writeSource.cancel()
        }
        readSuspended = false
        writeSuspended = false
        descriptorClosed = true
        let handler = self.handler
        self.handler = nil
        if let handler, let queue { queue.async { handler(.closed(error)) } }
    }
}
