import IAPWire
import TestSupport
import Testing

@Suite("Checksums")
struct ChecksumTests {
    /// The plain definition: the byte sum modulo 256, one byte at a time.
    static func reference(_ bytes: ArraySlice<UInt8>) -> UInt8 { bytes.reduce(0, &+) }

    @Test("the vector sum equals the byte-by-byte sum at every length and alignment around its 64-byte steps")
    func vectorSumMatchesTheDefinition() {
        var random = SplitMix64(seed: 15)
        let bytes = random.bytes(1_100)
        for start in 0..<3 {
            for length in [0, 1, 63, 64, 65, 127, 128, 129, 200, 1_000, 1_097] {
                let slice = bytes[start..<(start + length)]
                #expect(Checksum.sum(slice.span.bytes) == Self.reference(slice), "start \(start), length \(length)")
            }
        }
        // Lanes that wrap many times (all 0xFF) still sum modulo 256.
        let ones = [UInt8](repeating: 0xFF, count: 64 * 300 + 5)
        #expect(Checksum.sum(ones.span.bytes) == Self.reference(ones[...]))
        let checked = ones + [Checksum.of(ones)]
        let verifies = Checksum.verifies(checked.span.bytes)
        #expect(verifies)
    }
}
