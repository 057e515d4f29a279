public import Dispatch
internal import Glibc

/// A Dispatch read source and write source on one socket descriptor, with their suspension
/// kept count of: what a socket's owner on a queue needs (the session sockets, iapd's control
/// connections on both sides). The descriptor is closed once both sources are cancelled.
///
/// Reading starts watched; writability is watched only when asked (``watchWritable()``), so an
/// idle socket costs no wake-ups. Confined to the queue it was made for; not for ttys (see
/// ``SerialTransport`` on why).
public final class DescriptorWatch: @unchecked Sendable {
    // Sendability: every stored var is touched on the queue only.
    private let read: any DispatchSourceRead
    private let write: any DispatchSourceWrite
    private var readSuspended = true
    private var writeSuspended = true
    private var cancelled = false

    /// Watches `descriptor` (which it now closes) on `queue`: `readable` runs while there is
    /// something to read (or the end), `writable` when the socket takes bytes again after
    /// ``watchWritable()``.
    public init(descriptor: Int32, queue: DispatchQueue, readable: @escaping @Sendable () -> Void,
                writable: @escaping @Sendable () -> Void) {
        read = DispatchSource.makeReadSource(fileDescriptor: descriptor, queue: queue)
        write = DispatchSource.makeWriteSource(fileDescriptor: descriptor, queue: queue)
        read.setEventHandler(handler: readable)
        write.setEventHandler(handler: writable)
        let both = DispatchGroup()
        both.enter()
        both.enter()
        read.setCancelHandler { both.leave() }
        write.setCancelHandler { both.leave() }
        both.notify(queue: queue) { _ = close(descriptor) }
        resumeReading()
    }

    deinit { cancel() }

    /// Stops reading (back-pressure: the kernel's buffer fills, the peer is held off).
    public func pauseReading() {
        guard !readSuspended, !cancelled else { return }
        readSuspended = true
        read.suspend()
    }

    /// Reads again.
    public func resumeReading() {
        guard readSuspended, !cancelled else { return }
        readSuspended = false
        read.resume()
    }

    /// Calls `writable` once the socket takes bytes (until ``stopWatchingWritable()``).
    public func watchWritable() {
        guard writeSuspended, !cancelled else { return }
        writeSuspended = false
        write.resume()
    }

    /// No more `writable` calls.
    public func stopWatchingWritable() {
        guard !writeSuspended, !cancelled else { return }
        writeSuspended = true
        write.suspend()
    }

    /// Ends both sources; the descriptor is closed once Dispatch let go of it. Idempotent.
    public func cancel() {
        guard !cancelled else { return }
        cancelled = true
        if readSuspended { read.resume() }
        if writeSuspended { write.resume() }
        read.cancel()
        write.cancel()
    }
}
