/// Received bytes queued where they arrived, with a running count: the received bytes of one
/// session, kept in the arrays or lent USB slots they arrived in (``ReceivedBytes``), or the one
/// copy the endpoint made of bytes it could not keep. Lending them (``borrowFirst(_:)``) copies
/// nothing; taking them as views of arrays (``takeChunk(_:)``) copies only what lies in a lent
/// slot; taking them as an array (``take(_:)``) copies once, into that array, unless a whole
/// array of the queue's own can be handed over as it is.
public struct ChunkQueue: Sendable {
    private struct Chunk: Sendable {
        var bytes: ReceivedBytes
        /// The slice is a whole array nobody else holds: it can be returned as it is.
        var owned: Bool
    }
    private var chunks = FIFO<Chunk>()
    /// The bytes queued.
    public private(set) var byteCount = 0

    /// An empty queue.
    public init() {}

    /// Whether nothing is queued.
    public var isEmpty: Bool { byteCount == 0 }

    /// The oldest queued bytes: a view of the first chunk (nil when empty).
    public var first: ReceivedBytes? { chunks.first?.bytes }

    /// Queues a view of bytes. `owned` says the slice is a whole array nobody else holds (a copy
    /// the caller made), which ``take(_:)`` may then hand over without copying.
    public mutating func append(_ bytes: ArraySlice<UInt8>, owned: Bool) {
        guard !bytes.isEmpty else { return }
        chunks.append(Chunk(bytes: ReceivedBytes(bytes), owned: owned))
        byteCount += bytes.count
    }

    /// Queues received bytes kept where they arrived (an array or a lent slot).
    public mutating func append(_ bytes: ReceivedBytes) {
        guard !bytes.isEmpty else { return }
        chunks.append(Chunk(bytes: bytes, owned: false))
        byteCount += bytes.count
    }

    /// Takes up to `maxBytes` as one array; `copied` counts the bytes copied to make it.
    public mutating func take(_ maxBytes: Int) -> (bytes: [UInt8], copied: Int) {
        guard maxBytes > 0, let first = chunks.first else { return ([], 0) }
        // A whole array of our own that fits, with nothing after it that would also fit: hand it
        // over as it is.
        if first.owned, first.bytes.count <= maxBytes,
           chunks.count == 1 || first.bytes.count == maxBytes {
            _ = chunks.popFirst()
            byteCount -= first.bytes.count
            return (Array(first.bytes.arraySlice().bytes), 0)
        }
        var result: [UInt8] = []
        result.reserveCapacity(min(maxBytes, byteCount))
        while result.count < maxBytes, let chunk = chunks.first {
            let take = min(maxBytes - result.count, chunk.bytes.count)
            chunk.bytes.prefix(take).append(to: &result)
            removeFirst(take)
        }
        return (result, result.count)
    }

    /// Takes up to `maxBytes` of the first chunk as a view of the array it lies in (no copy), or
    /// a copy when it lies in a lent slot (`copied` counts the bytes copied).
    public mutating func takeChunk(_ maxBytes: Int) -> (bytes: ArraySlice<UInt8>, copied: Int) {
        guard maxBytes > 0, let chunk = chunks.first else { return ([], 0) }
        let taken = chunk.bytes.prefix(maxBytes).arraySlice()
        removeFirst(taken.bytes.count)
        return taken
    }

    /// Drops `count` bytes from the front of the first chunk (at most its length).
    public mutating func removeFirst(_ count: Int) {
        guard count > 0, let chunk = chunks.first else { return }
        let dropped = min(count, chunk.bytes.count)
        if dropped == chunk.bytes.count {
            _ = chunks.popFirst()
        } else {
            chunks.withFirst { $0.bytes = $0.bytes.dropFirst(dropped); $0.owned = false }
        }
        byteCount -= dropped
    }

    /// Empties the queue.
    public mutating func removeAll() {
        chunks.removeAll()
        byteCount = 0
    }

    /// Lends the bytes of the first chunk in place; `body` says how many it consumed.
    public mutating func borrowFirst<Result>(_ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        guard let chunk = chunks.first else { return nil }
        let (consumed, result) = try chunk.bytes.withSpan(body)
        removeFirst(max(0, consumed))
        return result
    }
}
