// Small helpers for reading and writing big-endian integers. Reads go through `RawSpan`, which
// is bounds-checked; nothing here hands out pointers.

extension RawSpan {
    /// The byte at `offset` (bounds-checked).
    @inlinable @inline(__always)
    func byte(at offset: Int) -> UInt8 {
        unsafeLoad(fromByteOffset: offset, as: UInt8.self)
    }

    /// A big-endian `UInt16` starting at `offset` (bounds-checked).
    @inlinable @inline(__always)
    func uint16BE(at offset: Int) -> UInt16 {
        UInt16(byte(at: offset)) << 8 | UInt16(byte(at: offset + 1))
    }

    /// A big-endian `UInt32` starting at `offset` (bounds-checked).
    @inlinable
    func uint32BE(at offset: Int) -> UInt32 {
        UInt32(uint16BE(at: offset)) << 16 | UInt32(uint16BE(at: offset + 2))
    }

    /// A big-endian `UInt64` starting at `offset` (bounds-checked).
    @inlinable
    func uint64BE(at offset: Int) -> UInt64 {
        UInt64(uint32BE(at: offset)) << 32 | UInt64(uint32BE(at: offset + 4))
    }

    /// The bytes in `range` as a new array (a copy; used off the hot path only).
    @inlinable
    func copyBytes(_ range: Range<Int>) -> [UInt8] {
        extracting(range).withUnsafeBytes { Array($0) }
    }
}

extension Array where Element == UInt8 {
    @inlinable @inline(__always)
    package mutating func appendUInt16BE(_ value: UInt16) {
        append(UInt8(truncatingIfNeeded: value >> 8))
        append(UInt8(truncatingIfNeeded: value))
    }

    @inlinable
    package mutating func appendUInt32BE(_ value: UInt32) {
        appendUInt16BE(UInt16(truncatingIfNeeded: value >> 16))
        appendUInt16BE(UInt16(truncatingIfNeeded: value))
    }

    @inlinable
    package mutating func appendUInt64BE(_ value: UInt64) {
        appendUInt32BE(UInt32(truncatingIfNeeded: value >> 32))
        appendUInt32BE(UInt32(truncatingIfNeeded: value))
    }

    @inlinable
    mutating func append(_ span: RawSpan) {
        span.withUnsafeBytes { append(contentsOf: $0) }
    }

    @inlinable
    mutating func setUInt16BE(_ value: UInt16, at offset: Int) {
        self[offset] = UInt8(truncatingIfNeeded: value >> 8)
        self[offset + 1] = UInt8(truncatingIfNeeded: value)
    }
}

extension MutableRawSpan {
    @inlinable @inline(__always)
    mutating func setByte(_ value: UInt8, at offset: Int) {
        storeBytes(of: value, toByteOffset: offset, as: UInt8.self)
    }

    @inlinable @inline(__always)
    mutating func setUInt16BE(_ value: UInt16, at offset: Int) {
        setByte(UInt8(truncatingIfNeeded: value >> 8), at: offset)
        setByte(UInt8(truncatingIfNeeded: value), at: offset + 1)
    }
}
