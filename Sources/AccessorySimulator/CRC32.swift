/// CRC-32 as IEEE 802.3, zlib and PNG define it: reflected polynomial 0xEDB88320, initial value
/// 0xFFFFFFFF, final XOR 0xFFFFFFFF. The check value of the ASCII bytes "123456789" is 0xCBF43926.
///
/// Feed bytes in any number of pieces with ``update(_:)``; ``value`` is the checksum of every
/// byte fed so far. Contiguous bytes go eight at a time through eight tables ("slicing by 8"):
/// the simulator checksums every byte it receives, so this is on its hot path.
public struct CRC32: Hashable, Sendable {
    private var register: UInt32 = 0xFFFF_FFFF

    /// A checksum over no bytes yet (its ``value`` is 0).
    public init() {}

    /// The checksum of every byte fed so far.
    public var value: UInt32 { register ^ 0xFFFF_FFFF }

    /// Feeds more bytes.
    public mutating func update(_ bytes: some Sequence<UInt8>) {
        let done: Void? = bytes.withContiguousStorageIfAvailable { buffer in
            register = Self.update(register, UnsafeRawBufferPointer(buffer))
        }
        guard done == nil else { return }
        var crc = register
        Self.tables.withUnsafeBufferPointer { table in
            for byte in bytes { crc = table[Int((crc ^ UInt32(byte)) & 0xFF)] ^ (crc >> 8) }
        }
        register = crc
    }

    /// The checksum of `bytes` in one go.
    public static func checksum(_ bytes: some Sequence<UInt8>) -> UInt32 {
        var crc = CRC32()
        crc.update(bytes)
        return crc.value
    }

    private static func update(_ start: UInt32, _ bytes: UnsafeRawBufferPointer) -> UInt32 {
        tables.withUnsafeBufferPointer { table -> UInt32 in
            var crc = start
            var index = 0
            let count = bytes.count
            // Table k holds the remainder of a byte followed by k zero bytes, so one lookup per
            // byte of an 8-byte group, all independent of each other.
            while count - index >= 8 {
                let low = bytes.loadUnaligned(fromByteOffset: index, as: UInt32.self).littleEndian ^ crc
                let high = bytes.loadUnaligned(fromByteOffset: index + 4, as: UInt32.self).littleEndian
                crc = table[7 * 256 + Int(low & 0xFF)] ^ table[6 * 256 + Int((low >> 8) & 0xFF)]
                    ^ table[5 * 256 + Int((low >> 16) & 0xFF)] ^ table[4 * 256 + Int(low >> 24)]
                    ^ table[3 * 256 + Int(high & 0xFF)] ^ table[2 * 256 + Int((high >> 8) & 0xFF)]
                    ^ table[1 * 256 + Int((high >> 16) & 0xFF)] ^ table[Int(high >> 24)]
                index += 8
            }
            while index < count {
                crc = table[Int((crc ^ UInt32(bytes[index])) & 0xFF)] ^ (crc >> 8)
                index += 1
            }
            return crc
        }
    }

    /// Eight tables of 256: table 0 is the remainder of each byte value, computed one bit at a
    /// time; table k is table k-1 shifted through one more zero byte. Computed once.
    private static let tables: [UInt32] = {
        var tables = [UInt32](repeating: 0, count: 8 * 256)
        for index in 0..<256 {
            var remainder = UInt32(index)
            for _ in 0..<8 {
                remainder = remainder & 1 == 1 ? (remainder >> 1) ^ 0xEDB8_8320 : remainder >> 1
            }
            tables[index] = remainder
        }
        for k in 1..<8 {
            for index in 0..<256 {
                let previous = tables[(k - 1) * 256 + index]
                tables[k * 256 + index] = tables[Int(previous & 0xFF)] ^ (previous >> 8)
            }
        }
        return tables
    }()
}
