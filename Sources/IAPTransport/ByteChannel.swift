public import Dispatch
internal import IAPLink
internal import Synchronization

/// Something that happened on a ``ByteChannel``.
public enum ByteChannelEvent: Sendable, Hashable {
    /// Bytes became readable (read them with ``ByteChannel/withReadableBytes(_:)``).
    case readable
    /// The channel takes bytes again after a ``ByteChannel/write(_:)`` took fewer than offered,
    /// or everything written so far reached the peer (``ByteChannel/unsentByteCount`` is 0).
    case writable
    /// The stream ended: `nil` when either side closed it, otherwise why (the device vanished, a
    /// transfer failed…). Bytes already readable stay readable; no event follows.
    case closed(TransportError?)
}

/// A raw byte stream to an accessory with flow control both ways: the data plane of an External
/// Accessory session on a *native transport* (a USB interface of its own, FF/F0/01, with no iAP2
/// framing; PROTOCOL.md §4.3).
///
/// Reading is in place: ``withReadableBytes(_:)`` lends the oldest received bytes where the
/// channel holds them (for USB, the ring slot the IN transfer wrote), and the bytes a reader
/// consumes make room for more. A reader that stops reading stops the channel from receiving:
/// the device is held off (its writes wait) instead of memory growing. Writing takes what fits
/// now (``write(_:)`` returns the count) and ``ByteChannelEvent/writable`` says when to offer
/// the rest.
///
/// Every method is called on the queue given to ``activate(queue:handler:)``, where the handler
/// runs too.
public protocol ByteChannel: AnyObject, Sendable {
    /// What a person reads, e.g. `usb 1-1 interface 1 (com.example.native)`.
    var description: String { get }
    /// Starts delivering events to `handler` on `queue`.
    func activate(queue: DispatchQueue, handler: @escaping @Sendable (ByteChannelEvent) -> Void)
    /// Lends the oldest readable bytes in place to `body`, which says how many it consumed (the
    /// rest stays readable); nil when nothing is readable. The view is valid only inside `body`.
    func withReadableBytes<Result>(_ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result?
    /// Takes up to `maxBytes` of the oldest readable bytes as an array slice the caller keeps
    /// (empty when nothing is readable). The default copies them out of
    /// ``withReadableBytes(_:)``; a channel that holds its bytes in arrays hands out a view of
    /// them instead.
    func readChunk(maxBytes: Int) -> ArraySlice<UInt8>
    /// Bytes readable now.
    var readableByteCount: Int { get }
    /// Takes as many of `bytes` as fit now and returns how many (0 when full, or closed).
    func write(_ bytes: ArraySlice<UInt8>) -> Int
    /// ``write(_:)`` from bytes where they lie. A channel that can send from borrowed memory (a
    /// socket) implements it without a copy; the default copies what fits into an array.
    func write(span bytes: RawSpan) -> Int
    /// Whether ``write(_:)`` would take at least one byte now.
    var isWritable: Bool { get }
    /// Bytes ``write(_:)`` took that the peer has not received yet.
    var unsentByteCount: Int { get }
    /// Bytes the peer has received so far (for USB: OUT transfers the device completed).
    var bytesDelivered: Int { get }
    /// Ends the stream. The handler then gets `.closed(nil)` unless it already got a close.
    func close()
}

extension ByteChannel {
    public func write(span bytes: RawSpan) -> Int {
        bytes.withUnsafeBytes { write(Array($0)[...]) }
    }

    public func readChunk(maxBytes: Int) -> ArraySlice<UInt8> {
        withReadableBytes { span in
            let count = min(max(0, maxBytes), span.byteCount)
            return (count, span.extracting(0..<count).withUnsafeBytes { Array($0) }[...])
        } ?? []
    }
}

/// A transport whose accessory also has native-transport interfaces (USB): opens the one that
/// carries an External Accessory protocol.
public protocol NativeTransportProvider: Sendable {
    /// The protocol names this transport has a native interface for, as far as it can tell
    /// before opening one (for USB: the interface strings).
    var nativeProtocolNames: [String] { get }
    /// Opens the native channel for `protocolName` (for USB: claims its interface and selects
    /// alternate setting 1). `completion` runs on `queue` with a channel not yet activated, or
    /// with why it cannot be opened.
    func openNativeChannel(for protocolName: String, queue: DispatchQueue,
                           completion: @escaping @Sendable (Result<any ByteChannel, TransportError>) -> Void)
}

/// Two ``ByteChannel``s joined back to back in one process, each holding at most `capacity`
/// received bytes: what the in-process simulator's native transport uses, and the tests.
///
/// A write takes what fits in the peer's buffer; the peer's reads make room again and the writer
/// hears ``ByteChannelEvent/writable``. Either side's ``close()`` ends the stream for both: the
/// closer hears `.closed(nil)` and the other side `.closed(nil)` too (the peer ended the
/// session), or the error given to ``close(error:)`` (the peer went away), with what it had
/// received still readable.
public final class MemoryByteChannel: ByteChannel, @unchecked Sendable {
    // Sendability: all mutable state is in the pair's Mutex.
    public let description: String
    private let side: Int
    private let shared: Shared

    final class Shared: Sendable {
        let state: Mutex<PairState>
        init(capacity: Int) { state = Mutex(PairState(capacity: capacity)) }
    }

    struct SideState {
        var queue: DispatchQueue?
        var handler: (@Sendable (ByteChannelEvent) -> Void)?
        /// Received and not consumed, oldest first, each the one copy a write made.
        var chunks = ChunkQueue()
        var delivered = 0
        var wantsWritable = false
        var readablePending = false
        var closeDelivered = false
    }

    struct PairState {
        let capacity: Int
        var sides = [SideState(), SideState()]
        var closed = false
        /// Which side hears an error with the close, and the error.
        var peerError: (side: Int, error: TransportError?)?
        init(capacity: Int) { self.capacity = capacity }
    }

    private init(side: Int, shared: Shared, description: String) {
        self.side = side
        self.shared = shared
        self.description = description
    }

    /// A connected pair `(host side, accessory side)`, each buffering at most `capacity` bytes.
    public static func pair(name: String = "native", capacity: Int = 256 * 1024) -> (MemoryByteChannel, MemoryByteChannel) {
        let shared = Shared(capacity: max(1, capacity))
        return (MemoryByteChannel(side: 0, shared: shared, description: "\(name) (host side)"),
                MemoryByteChannel(side: 1, shared: shared, description: "\(name) (accessory side)"))
    }

    private var peer: Int { 1 - side }

    public func activate(queue: DispatchQueue, handler: @escaping @Sendable (ByteChannelEvent) -> Void) {
        shared.state.withLock { state in
            state.sides[side].queue = queue
            state.sides[side].handler = handler
            if state.sides[side].chunks.byteCount > 0 { queue.async { handler(.readable) } }
            if state.closed, !state.sides[side].closeDelivered {
                state.sides[side].closeDelivered = true
                state.sides[side].handler = nil
                let error = state.peerError.flatMap { $0.side == side ? $0.error : nil }
                queue.async { handler(.closed(error)) }
            }
        }
    }

    public func withReadableBytes<Result>(_ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        // The chunk is taken out under the lock and lent outside it (body may call back in).
        let chunk = shared.state.withLock { state -> ArraySlice<UInt8>? in state.sides[side].chunks.first?.arraySlice().bytes } // arrays only: no copy
        guard let chunk else { return nil }
        let (consumed, result) = try chunk.withUnsafeBytes { try body(RawSpan(_unsafeBytes: $0)) }
        consume(min(max(0, consumed), chunk.count))
        return result
    }

    /// Hands out a view of the bytes the peer's write copied (no copy here).
    public func readChunk(maxBytes: Int) -> ArraySlice<UInt8> {
        let chunk = shared.state.withLock { state -> ArraySlice<UInt8> in
            state.sides[side].chunks.first.map { $0.prefix(max(0, maxBytes)).arraySlice().bytes } ?? []
        }
        consume(chunk.count)
        return chunk
    }

    private func consume(_ count: Int) {
        guard count > 0 else { return }
        shared.state.withLock { state in
            state.sides[side].chunks.removeFirst(count) // in place: no copy of the queue
            guard state.sides[peer].wantsWritable, !state.closed, let queue = state.sides[peer].queue,
                  let handler = state.sides[peer].handler else { return }
            state.sides[peer].wantsWritable = false
            // Queued under the lock, so a close on another thread cannot be queued before it.
            queue.async { handler(.writable) }
        }
    }

    public var readableByteCount: Int { shared.state.withLock { $0.sides[side].chunks.byteCount } }

    public func write(_ bytes: ArraySlice<UInt8>) -> Int {
        guard !bytes.isEmpty else { return 0 }
        let shared = self.shared, peer = self.peer
        return shared.state.withLock { state -> Int in
            guard !state.closed else { return 0 }
            let room = state.capacity - state.sides[peer].chunks.byteCount
            let taken = min(room, bytes.count)
            if taken < bytes.count { state.sides[side].wantsWritable = true }
            guard taken > 0 else { return 0 }
            let copy = Array(bytes.prefix(taken))
            state.sides[peer].chunks.append(copy[...], owned: true)
            state.sides[side].delivered += taken
            if !state.sides[peer].readablePending, let queue = state.sides[peer].queue, let handler = state.sides[peer].handler {
                state.sides[peer].readablePending = true
                // Queued under the lock, so a close on another thread cannot be queued before it.
                queue.async {
                    shared.state.withLock { $0.sides[peer].readablePending = false }
                    handler(.readable)
                }
            }
            return taken
        }
    }

    public var isWritable: Bool { shared.state.withLock { !$0.closed && $0.sides[peer].chunks.byteCount < $0.capacity } }

    public var unsentByteCount: Int { 0 }

    public var bytesDelivered: Int { shared.state.withLock { $0.sides[side].delivered } }

    public func close() { close(error: nil) }

    /// Ends the stream for both sides: this side hears `.closed(nil)`, the other side
    /// `.closed(error)` (why the stream broke under it, or nil for a normal end).
    public func close(error: TransportError?) {
        shared.state.withLock { state in
            guard !state.closed else { return }
            state.closed = true
            state.peerError = (side: peer, error: error)
            for index in 0..<2 {
                guard let queue = state.sides[index].queue, let handler = state.sides[index].handler else { continue }
                state.sides[index].closeDelivered = true
                state.sides[index].handler = nil // nothing follows a close; drop what it holds
                let reason = index == side ? nil : error
                queue.async { handler(.closed(reason)) }
            }
        }
    }
}
