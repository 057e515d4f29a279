/// SplitMix64: a small deterministic pseudo-random generator for the tests, so that a failing
/// run repeats exactly from its seed. One copy for every test target.
public struct SplitMix64: RandomNumberGenerator, Sendable {
    private var state: UInt64

    /// A generator whose sequence is fixed by `seed`.
    public init(seed: UInt64) { state = seed }

    /// The next 64 random bits.
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A number in `0..<bound`.
    public mutating func next(below bound: Int) -> Int {
        precondition(bound > 0, "a bound of at least 1")
        return Int(next() % UInt64(bound))
    }

    /// `count` random bytes.
    public mutating func bytes(_ count: Int) -> [UInt8] {
        var generator = self
        defer { self = generator }
        return TestSupport.bytes(count) { _ in UInt8(truncatingIfNeeded: generator.next()) }
    }
}
