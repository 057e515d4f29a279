/// Authentication challenges: each one a fresh draw of the system's cryptographically secure
/// generator (`SystemRandomNumberGenerator`: `getrandom(2)` on Linux), every byte of it, so that
/// an accessory can neither predict a challenge nor learn one connection's from another's.
enum Challenge {
    /// A new challenge of `length` bytes.
    static func draw(length: Int) -> [UInt8] {
        var generator = SystemRandomNumberGenerator()
        var challenge: [UInt8] = []
        challenge.reserveCapacity(max(0, length))
        while challenge.count < length {
            // Every byte of each 64-bit draw is used.
            var word = generator.next()
            for _ in 0..<min(8, length - challenge.count) {
                challenge.append(UInt8(truncatingIfNeeded: word))
                word >>= 8
            }
        }
        return challenge
    }
}
