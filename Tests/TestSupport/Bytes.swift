/// `count` bytes, byte `i` being `byte(start + i)`: test data built in one pass over new storage.
///
/// Test targets build without optimisation, where `(0..<n).map { … }` costs about 175 ns a byte
/// (generic calls and metadata lookups per element): megabytes of test data then take seconds
/// of a cooperative thread, which stalls every other test's awaits in a parallel run. This loop
/// costs a few nanoseconds a byte.
public func bytes(_ count: Int, from start: Int = 0, _ byte: (Int) -> UInt8) -> [UInt8] {
    [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
        var index = 0
        while index < count {
            buffer[index] = byte(start &+ index)
            index &+= 1
        }
        initialized = count
    }
}

/// A position-dependent pattern (a dropped, duplicated or reordered byte shows), different for
/// each `seed`.
public func testPattern(_ count: Int, seed: Int = 0) -> [UInt8] {
    [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
        var index = 0
        while index < count {
            buffer[index] = UInt8(truncatingIfNeeded: (index &* 7) ^ (index >> 9) &+ seed)
            index &+= 1
        }
        initialized = count
    }
}
