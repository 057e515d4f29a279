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

    @Test("the copy-and-sum pass copies the bytes exactly and returns their sum, at every length and alignment, after bytes already there")
    func appendCopiesAndSums() {
        var random = SplitMix64(seed: 50)
        let bytes = random.bytes(1_200)
        for start in 0..<3 {
            for length in [0, 1, 15, 16, 17, 63, 64, 65, 79, 80, 127, 128, 129, 200, 1_000, 1_097] {
                for already in [0, 3] {
                    let slice = bytes[start..<(start + length)]
                    var sum: UInt8 = 0
                    var target = [UInt8](repeating: 0xEE, count: already)
                    target.append(addingCapacity: length + 4) { output in sum = Checksum.append(slice.span.bytes, to: &output) }
                    #expect(sum == Self.reference(slice), "start \(start), length \(length)")
                    #expect(target == [UInt8](repeating: 0xEE, count: already) + Array(slice), "start \(start), length \(length)")
                }
            }
        }
        // Two appends into one output span: the second lands after the first.
        var target: [UInt8] = []
        var sums: (UInt8, UInt8) = (0, 0)
        target.append(addingCapacity: 300) { output in
            sums.0 = Checksum.append(bytes[0..<100].span.bytes, to: &output)
            sums.1 = Checksum.append(bytes[100..<300].span.bytes, to: &output)
        }
        #expect(target == Array(bytes[0..<300]))
        #expect(sums.0 &+ sums.1 == Self.reference(bytes[0..<300]))
    }
}
