/// Bytes waiting to be written, taken from the front.
struct PendingBytes: Sendable {
    private var storage: [UInt8] = []
    private var head = 0

    var count: Int { storage.count - head }
    var isEmpty: Bool { head == storage.count }
    var bytes: ArraySlice<UInt8> { storage[head...] }

    mutating func append(_ bytes: [UInt8]) { storage.append(contentsOf: bytes) }

    mutating func removeFirst(_ count: Int) {
        head += min(count, self.count)
        if head == storage.count {
            storage.removeAll(keepingCapacity: true)
            head = 0
        } else if head >= 4_096, head * 2 >= storage.count {
            storage.removeFirst(head)
            head = 0
        }
    }
}

/// The deterministic generator of the fault injection (xorshift64*).
struct FaultRandom: Sendable {
    private var state: UInt64

    init(seed: UInt64) {
        let mixed = (seed ^ 0x5DEE_CE66_D1CE_4E5B) &* 0x9E37_79B9_7F4A_7C15
        state = mixed == 0 ? 0x1234_5678_9ABC_DEF1 : mixed
    }

    mutating func next() -> UInt64 {
        state ^= state >> 12
        state ^= state << 25
        state ^= state >> 27
        return state &* 0x2545_F491_4F6C_DD1D
    }

    /// A value in 0..<1.
    mutating func unit() -> Double { Double(next() >> 11) * 0x1p-53 }

    /// A value in 0..<bound (bound > 0).
    mutating func below(_ bound: Int) -> Int { Int(next() % UInt64(bound)) }
}
