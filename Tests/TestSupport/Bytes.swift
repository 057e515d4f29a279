/// `count` bytes, byte `i` being `byte(start + i)`: test data built in one pass over new storage.
///
/// Test targets build without optimisation, where `(0..<n).map { … }` costs about 175 ns a byte
/// (generic calls and metadata lookups per element): megabytes of test data then take seconds
/// of a cooperative thread, which stalls every other test's awaits in a parallel run. This loop
/// costs a few nanoseconds a byte.
public func bytes(_ count: Int, from start: Int = 0, _ byte: (Int) -> UInt8) -> [UInt8] {
    // No storage for nothing: with a capacity of 0 the initializer writes the count into the
    // stdlib's shared empty-array singleton, which ThreadSanitizer reports as a race between
    // two threads doing so at once.
    guard count > 0 else { return [] }
    return [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
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
    guard count > 0 else { return [] } // as in bytes(_:from:_:)
    return [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
        var index = 0
        while index < count {
            buffer[index] = UInt8(truncatingIfNeeded: (index &* 7) ^ (index >> 9) &+ seed)
            index &+= 1
        }
        initialized = count
    }
}
