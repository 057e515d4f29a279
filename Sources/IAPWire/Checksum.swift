/// The one-byte checksums of iAP1 and iAP2: two's complement of the byte sum.
///
/// Every checksum in both protocols has the same shape: the sender picks the byte that makes the
/// covered bytes plus the checksum sum to zero modulo 256. iAP1 covers the length field through
/// the last payload byte; an iAP2 link header covers its first eight bytes; an iAP2 payload
/// checksum covers the payload alone.
///
/// This is the hot loop of the receive path (every payload byte goes through it once), so it
/// reads the bytes through `withUnsafeBytes` and lets the compiler vectorise the sum. On the
/// send path, ``append(_:to:)`` copies a payload into its packet and sums it in the same pass.
public enum Checksum {
    /// The sum of the bytes of `bytes`, modulo 256.
    @inlinable
    public static func sum(_ bytes: RawSpan) -> UInt8 {
        bytes.withUnsafeBytes { buffer -> UInt8 in
            var total: UInt8 = 0
            var offset = 0
            if buffer.count >= 64, let base = buffer.baseAddress {
                // 64 lanes of wrapping byte sums (the sum is modulo 256, so lanes may wrap), then
                // the lanes summed: one vector add per 64 bytes.
                var lanes = SIMD64<UInt8>(repeating: 0)
                while offset + 64 <= buffer.count {
                    lanes &+= base.loadUnaligned(fromByteOffset: offset, as: SIMD64<UInt8>.self)
                    offset += 64
                }
                total = lanes.wrappedSum()
            }
            while offset < buffer.count {
                total &+= buffer[offset]
                offset += 1
            }
            return total
        }
    }

    /// Copies `source` to the end of `output` and returns the sum of its bytes modulo 256: the
    /// copy and the sum in one pass, each byte read once (a sender lays a payload out and then
    /// needs its checksum).
    ///
    /// Precondition: `source` fits in `output.freeCapacity`.
    @inlinable
    public static func append(_ source: RawSpan, to output: inout OutputSpan<UInt8>) -> UInt8 {
        let length = source.byteCount
        precondition(length <= output.freeCapacity, "\(length) bytes do not fit in \(output.freeCapacity) free")
        guard length > 0 else { return 0 }
        return source.withUnsafeBytes { from -> UInt8 in
            output.withUnsafeMutableBufferPointer { to, initialized -> UInt8 in
                guard let source = from.baseAddress, let base = to.baseAddress else { return 0 }
                let target = UnsafeMutableRawPointer(base + initialized)
                // 64 bytes a step, then 16, then one: each loaded once, stored, and added into
                // wrapping lanes. (Written out for each width: a generic helper over `SIMD` was
                // not specialised across the module boundary and cost 23 instructions a byte.)
                var total: UInt8 = 0
                var offset = 0
                if length >= 64 {
                    var lanes = SIMD64<UInt8>(repeating: 0)
                    while offset + 64 <= length {
                        let chunk = source.loadUnaligned(fromByteOffset: offset, as: SIMD64<UInt8>.self)
                        target.storeBytes(of: chunk, toByteOffset: offset, as: SIMD64<UInt8>.self)
                        lanes &+= chunk
                        offset += 64
                    }
                    total = lanes.wrappedSum()
                }
                if offset + 16 <= length {
                    var lanes = SIMD16<UInt8>(repeating: 0)
                    while offset + 16 <= length {
                        let chunk = source.loadUnaligned(fromByteOffset: offset, as: SIMD16<UInt8>.self)
                        target.storeBytes(of: chunk, toByteOffset: offset, as: SIMD16<UInt8>.self)
                        lanes &+= chunk
                        offset += 16
                    }
                    total &+= lanes.wrappedSum()
                }
                while offset < length {
                    let byte = source.load(fromByteOffset: offset, as: UInt8.self)
                    target.storeBytes(of: byte, toByteOffset: offset, as: UInt8.self)
                    total &+= byte
                    offset += 1
                }
                initialized += length
                return total
            }
        }
    }

    /// The checksum byte for `bytes`: `(0x100 - sum) & 0xFF`.
    @inlinable
    public static func of(_ bytes: RawSpan) -> UInt8 {
        0 &- sum(bytes)
    }

    /// The checksum byte for `bytes`.
    @inlinable
    public static func of(_ bytes: [UInt8]) -> UInt8 {
        of(bytes.span.bytes)
    }

    /// Whether `bytes`, which end with their checksum byte, sum to zero modulo 256.
    @inlinable
    public static func verifies(_ bytes: RawSpan) -> Bool {
        sum(bytes) == 0
    }
}
