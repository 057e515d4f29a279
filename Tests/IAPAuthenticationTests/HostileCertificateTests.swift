import Foundation
@testable import IAPAuthentication
import IAPLink
import TestSupport
import TestThreads
import Testing

/// Certificates made to hurt: each gets a clear failure, never a crash, a hang or a refusal to
/// answer. (tools/checks/fuzz's `certificate` target runs the same path under libFuzzer and ASan.)
@Suite struct HostileCertificateTests {
    let require = VerifyingAuthentication(mode: .require, trust: try! TrustAnchors(path: Fixtures.path("test-ca.pem")))

    func failure(_ certificate: [UInt8]) -> AuthenticationFailure? {
        let refusal = require.examine(certificate: certificate).refusal
        let outcome = require.outcome(certificate: certificate, challenge: PioneerVector.challenge, response: PioneerVector.signature)
        #expect(!outcome.accepted)
        #expect(refusal == outcome.failure)
        return refusal
    }

    @Test func truncatedDER() {
        for length in [0, 1, 2, 4, 16, 100, 500, 907] {
            let failure = failure(Array(PioneerVector.certificate.prefix(length)))
            #expect(failure?.kind == "malformed certificate", "\(length) bytes")
        }
    }

    @Test func lyingLengths() {
        var longer = PioneerVector.certificate
        longer[2] = 0xFF // the outer SEQUENCE claims more than there is
        #expect(failure(longer)?.kind == "malformed certificate")
        var inner = PioneerVector.certificate
        inner[inner.count - 300] = 0x84 // a length field deep inside claims four length bytes
        #expect(failure(inner) != nil)
        var huge = PioneerVector.certificate
        huge.replaceSubrange(1...3, with: [0x84, 0x7F, 0xFF, 0xFF, 0xFF]) // 2 GiB
        #expect(failure(huge)?.kind == "malformed certificate")
    }

    @Test func garbage() {
        var random = SplitMix64(seed: 19)
        let garbage = (0..<(64 * 1024)).map { _ in UInt8.random(in: 0...255, using: &random) }
        #expect(failure(garbage)?.kind == "malformed certificate")
        #expect(failure([UInt8](repeating: 0x30, count: 64 * 1024))?.kind == "malformed certificate")
        #expect(failure([UInt8](repeating: 0, count: 2 << 20))?.detail.contains("more than any certificate") == true)
    }

    @Test func hugeKey() throws {
        let pem = Fixtures.bytes("huge-key.pem")
        let der = try #require(Self.der(fromPEM: pem))
        let refusal = failure(der)
        #expect(refusal == .unsupportedKey("an RSA 8192-bit key; coprocessors use 1024-bit keys and keys of 1024–4096 bits are taken"))
        // Reading it for a person still works.
        #expect(try CertificateReader.summary(of: der).get().key == "RSA 8192-bit")
    }

    @Test func pkcs7WithoutCertificates() {
        // SignedData with empty certificate and signer sets: version 1, no digests, data content.
        let empty: [UInt8] = [0x30, 0x1A, 0x06, 0x09, 0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x07, 0x02, 0xA0, 0x0D, 0x30, 0x0B,
                              0x02, 0x01, 0x01, 0x31, 0x00, 0x30, 0x02, 0x06, 0x00, 0x31, 0x00]
        #expect(failure(empty)?.kind == "malformed certificate")
    }

    @Test func wrongResponses() throws {
        let record = VerifyingAuthentication(mode: .record)
        for response in [[], [0], PioneerVector.signature + [0], Array(PioneerVector.signature.dropLast()), [UInt8](repeating: 0xFF, count: 4096)] {
            let outcome = record.outcome(certificate: PioneerVector.certificate, challenge: PioneerVector.challenge, response: response)
            #expect(outcome.failure?.kind == "bad signature", "\(response.count) bytes")
        }
        // A challenge of the wrong length for the scheme.
        let outcome = record.outcome(certificate: PioneerVector.certificate, challenge: [1, 2, 3], response: PioneerVector.signature)
        #expect(outcome.failure == .badSignature("the challenge has 3 bytes; \(AuthenticationScheme.rsaPKCS1SHA1) signs 20"))
    }

    @Test func badTrustFiles() {
        #expect(throws: AuthenticationSetupError.self) { try TrustAnchors(path: Fixtures.path("no-such.pem")) }
        #expect(throws: AuthenticationSetupError.self) { try TrustAnchors(path: Fixtures.path("accessory-rsa.key")) }
        #expect(throws: AuthenticationSetupError.self) { try TrustAnchors(pem: Array("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".utf8)) }
    }

    /// Seeded mutations of real certificates (bytes flipped, cut, repeated, lengths changed)
    /// through the whole path: the fuzzer's job in miniature, on every test run.
    @Test(.ownThread) func seededMutations() throws {
        let seeds = [PioneerVector.certificate] + ["accessory-rsa.pem", "accessory-p256.pem"].compactMap { Self.der(fromPEM: Fixtures.bytes($0)) }
        var random = SplitMix64(seed: 1_919)
        let record = VerifyingAuthentication(mode: .record, trust: try TrustAnchors(path: Fixtures.path("test-ca.pem")))
        var failures = 0
        for round in 0..<1_500 {
            var bytes = seeds[round % seeds.count]
            for _ in 0..<Int.random(in: 1...4, using: &random) {
                let index = Int.random(in: 0..<max(1, bytes.count), using: &random)
                switch Int.random(in: 0..<4, using: &random) {
                case 0: if !bytes.isEmpty { bytes[index] ^= UInt8.random(in: 1...255, using: &random) }
                case 1: bytes = Array(bytes.prefix(index))
                case 2: bytes.insert(contentsOf: bytes[index...].prefix(Int.random(in: 1...64, using: &random)), at: index)
                default: if !bytes.isEmpty { bytes[index] = [0x00, 0x7F, 0x80, 0x81, 0x82, 0x84, 0xFF].randomElement(using: &random)! }
                }
            }
            let challenge = (0..<20).map { _ in UInt8.random(in: 0...255, using: &random) }
            let outcome = record.outcome(certificate: bytes, challenge: challenge, response: PioneerVector.signature)
            #expect(outcome.accepted) // record lets everything in, whatever it found
            if outcome.failure != nil { failures += 1 }
            _ = CertificateReader.summary(of: bytes)
        }
        #expect(failures > 1_400) // random challenges never verify
    }

    /// The DER of the first PEM block of `pem`.
    static func der(fromPEM pem: [UInt8]) -> [UInt8]? {
        let text = String(decoding: pem, as: UTF8.self)
        guard let start = text.range(of: "-----BEGIN CERTIFICATE-----\n"), let end = text.range(of: "-----END CERTIFICATE-----") else { return nil }
        return Data(base64Encoded: String(text[start.upperBound..<end.lowerBound]), options: .ignoreUnknownCharacters).map { [UInt8]($0) }
    }
}
