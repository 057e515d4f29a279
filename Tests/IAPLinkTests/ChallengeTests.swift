import IAPLink
import IAPWire
import Synchronization
import Testing

/// An accessory's coprocessor that keeps every challenge it is asked to sign.
private final class RecordingSigner: AuthenticationSigner {
    let challenges = Mutex<[[UInt8]]>([])
    var certificate: [UInt8] { [UInt8](repeating: 0x30, count: 608) }

    func sign(challenge: [UInt8]) -> [UInt8] {
        challenges.withLock { $0.append(challenge) }
        return [UInt8](repeating: 0, count: 64)
    }
}

@Suite("Authentication challenges")
struct ChallengeTests {
    static let connections = 64

    /// Every challenge is new, and no bit position holds the same value in all of them (one
    /// fixed in 64 independent draws happens with probability 2^-63 per bit).
    static func expectUnpredictable(_ challenges: [[UInt8]], length: Int) {
        #expect(challenges.count == connections)
        #expect(challenges.allSatisfy { $0.count == length })
        #expect(Set(challenges).count == challenges.count)
        guard let first = challenges.first else { return }
        var anySet = [UInt8](repeating: 0, count: first.count)
        var allSet = [UInt8](repeating: 0xFF, count: first.count)
        for challenge in challenges {
            for (index, byte) in challenge.enumerated() where index < first.count {
                anySet[index] |= byte
                allSet[index] &= byte
            }
        }
        for index in first.indices {
            #expect(anySet[index] == 0xFF, "a bit of byte \(index) is 0 in every challenge")
            #expect(allSet[index] == 0x00, "a bit of byte \(index) is 1 in every challenge")
        }
    }

    @Test("iAP2: each connection's challenge is a fresh draw; no bit is fixed across 64 of them")
    func iap2Challenges() {
        let signer = RecordingSigner()
        for _ in 0..<Self.connections {
            // The same seeds each time: challenges must not depend on them.
            var pair = Pair(seed: 1)
            pair.accessory = IAP2Endpoint(accessory: .sample, signer: signer, initialSequence: 0x01, randomSeed: 2)
            pair.start()
            #expect(pair.run { $0.identified })
        }
        let challenges = signer.challenges.withLock { $0 }
        Self.expectUnpredictable(challenges, length: challenges.first?.count ?? 0)
        #expect((challenges.first?.count ?? 0) >= 20)
    }

    @Test("iAP1: each connection's challenge is a fresh draw; no bit is fixed across 64 of them")
    func iap1Challenges() throws {
        var challenges: [[UInt8]] = []
        for _ in 0..<Self.connections {
            var pair = IAP1Pair()
            pair.start()
            #expect(pair.run { $0.identified })
            let requests = pair.deviceSent.compactMap { try? IAP1Packet.decode($0, transactionIDs: true) }.filter { $0.command == 0x17 }
            // GetAccessoryAuthenticationSignature: the challenge, then the retry count.
            challenges.append(Array(try #require(requests.last).payload.dropLast()))
        }
        Self.expectUnpredictable(challenges, length: 20)
    }
}
