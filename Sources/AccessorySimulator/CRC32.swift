/// CRC-32 as IEEE 802.3, zlib and PNG define it: reflected polynomial 0xEDB88320, initial value
/// 0xFFFFFFFF, final XOR 0xFFFFFFFF. The check value of the ASCII bytes "123456789" is 0xCBF43926.
///
/// Feed bytes in any number of pieces with ``update(_:)``; ``value`` is the checksum of every
/// byte fed so far.
public struct CRC32: Hashable, Sendable {
    private var register: UInt32 = 0xFFFF_FFFF

    /// A checksum over no bytes yet (its ``value`` is 0).
    public init() {}

    /// The checksum of every byte fed so far.
    public var value: UInt32 { register ^ 0xFFFF_FFFF }

    /// Feeds more bytes.
    public mutating func update(_ bytes: some Sequence<UInt8>) {
        let table = Self.table
        var crc = register
        for byte in bytes {
            crc = table[Int((crc ^ UInt32(byte)) & 0xFF)] ^ (crc >> 8)
        }
        register = crc
    }

    /// The checksum of `bytes` in one go.
    public static func checksum(_ bytes: some Sequence<UInt8>) -> UInt32 {
        var crc = CRC32()
        crc.update(bytes)
        return crc.value
    }

    /// The remainder of each byte value, one bit at a time, computed once.
    private static let table: [UInt32] = (0..<256).map { index -> UInt32 in
        var remainder = UInt32(index)
        for _ in 0..<8 {
            remainder = remainder & 1 == 1 ? (remainder >> 1) ^ 0xEDB8_8320 : remainder >> 1
        }
        return remainder
    }
}
