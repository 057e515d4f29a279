package import ByteRing

/// Received bytes kept where they arrived, without a copy: a view of the array a transport
/// delivered, or of a USB IN slot lent by the transport (``LentBytes``). What a session queues
/// (``ChunkQueue``) and what the link parks are these.
///
/// Holding one keeps its storage alive: the array's buffer, or the lease (and so the slot, until
/// the transport moves the bytes out). Read a lent view on the queue the transport delivers on.
public struct ReceivedBytes: Sendable {
    private enum Storage: Sendable {
        case array(ArraySlice<UInt8>)
        case lease(SlotLease, Range<Int>)
    }
    private var storage: Storage

    /// A view of bytes in an array.
    public init(_ bytes: ArraySlice<UInt8>) { storage = .array(bytes) }

    /// A view of `range` of the bytes `lease` lends.
    package init(_ lease: SlotLease, range: Range<Int>) {
        precondition(range.lowerBound >= 0 && range.upperBound <= lease.count, "a view beyond the lent bytes")
        storage = .lease(lease, range)
    }

    /// The number of bytes.
    public var count: Int {
        switch storage {
        case let .array(bytes): bytes.count
        case let .lease(_, range): range.count
        }
    }

    /// Whether there are none.
    public var isEmpty: Bool { count == 0 }

    /// Whether the bytes lie in a lent transport buffer rather than an array.
    public var isLent: Bool {
        if case .lease = storage { return true }
        return false
    }

    /// Runs `body` with the bytes in place.
    public func withSpan<Result>(_ body: (RawSpan) throws -> Result) rethrows -> Result {
        switch storage {
        case let .array(bytes):
            return try body(bytes.span.bytes)
        case let .lease(lease, range):
            return try lease.withSpan { try body($0.extracting(range)) }
        }
    }

    /// The bytes at `offsets` (0 is the first byte of this view), still without a copy.
    public func extracting(_ offsets: Range<Int>) -> ReceivedBytes {
        precondition(offsets.lowerBound >= 0 && offsets.upperBound <= count, "a range beyond the bytes")
        switch storage {
        case let .array(bytes):
            let base = bytes.startIndex
            return ReceivedBytes(bytes[(base + offsets.lowerBound)..<(base + offsets.upperBound)])
        case let .lease(lease, range):
            return ReceivedBytes(lease, range: (range.lowerBound + offsets.lowerBound)..<(range.lowerBound + offsets.upperBound))
        }
    }

    /// All but the first `count` bytes.
    public func dropFirst(_ count: Int) -> ReceivedBytes { extracting(min(count, self.count)..<self.count) }

    /// The first `count` bytes at most.
    public func prefix(_ count: Int) -> ReceivedBytes { extracting(0..<min(count, self.count)) }

    /// The bytes as an array slice: the view itself when they lie in an array, else a copy
    /// (`copied` says how many bytes were copied).
    public func arraySlice() -> (bytes: ArraySlice<UInt8>, copied: Int) {
        switch storage {
        case let .array(bytes):
            return (bytes, 0)
        case let .lease(lease, range):
            return (lease.withSpan { $0.extracting(range).withUnsafeBytes { Array($0) } }[...], range.count)
        }
    }

    /// Appends the bytes to `array` (a copy).
    public func append(to array: inout [UInt8]) {
        switch storage {
        case let .array(bytes): array.append(contentsOf: bytes)
        case let .lease(lease, range): lease.withSpan { $0.extracting(range).withUnsafeBytes { array.append(contentsOf: $0) } }
        }
    }
}
