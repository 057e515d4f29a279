import Foundation
import IAPAuthentication
import IAPInspect
import IAPLink
import Testing

/// `iapctl decode`'s offline check of a captured authentication: the real Pioneer exchange, and
/// the simulator's signed with the test CA, with one byte changed anywhere.
@Suite struct CapturedAuthenticationTests {
    static let trust: TrustAnchors? = try? TrustAnchors(path: Fixtures.path("test-ca.pem"))

    /// The DER certificate inside a PEM file.
    static func der(ofPEM name: String) -> [UInt8] {
        let text = String(decoding: Fixtures.bytes(name), as: UTF8.self)
        let body = text.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
        return Data(base64Encoded: body).map { Array($0) } ?? []
    }

    /// Where `part` starts in `whole`.
    static func offset(of part: [UInt8], in whole: [UInt8]) -> Int? {
        guard !part.isEmpty, part.count <= whole.count else { return nil }
        return (0...(whole.count - part.count)).first { whole[$0..<($0 + part.count)].elementsEqual(part) }
    }

    @Test func theRealCapturedSignatureIsValid() {
        let check = CapturedAuthentication(certificate: PioneerVector.certificate, challenge: PioneerVector.challenge,
                                           response: PioneerVector.signature, at: 1_400_000_000)
        #expect(check.signatureIsValid)
        #expect(check.firstFailure == nil)
        #expect(check.verdict == "valid (chain not checked)")
        #expect(check.lines.map(\.step) == CapturedAuthentication.Step.allCases)
        #expect(check.lines.map(\.result) == [.holds, .holds, .holds, .holds, .notChecked, .information])
        #expect(check.lines.first { $0.step == .chain }?.detail.hasPrefix("no trust anchors were given: the issuer (Apple iPod Accessories Certification Authority) ") == true)
        // Its certificate expired in 2020: information, unless asked to count.
        let now = CapturedAuthentication(certificate: PioneerVector.certificate, challenge: PioneerVector.challenge,
                                         response: PioneerVector.signature, checkValidity: true)
        #expect(now.signatureIsValid)
        #expect(now.firstFailure?.step == .validity)
        #expect(now.verdict.hasPrefix("validity fails: 2012-09-27T00:40:35Z to 2020-09-27T00:40:35Z, expired"))
    }

    @Test("a changed byte of the real challenge: a signature by the key, of other bytes", arguments: 0..<20)
    func changedChallenge(index: Int) {
        var challenge = PioneerVector.challenge
        challenge[index] ^= 0x01
        let check = CapturedAuthentication(certificate: PioneerVector.certificate, challenge: challenge, response: PioneerVector.signature)
        #expect(check.firstFailure?.step == .signature)
        #expect(check.verdict.contains("a signature by the certificate's key, but of other bytes than this challenge (they differ at byte \(index))"))
    }

    @Test("a changed byte of the real response: no signature by the key")
    func changedResponse() {
        for index in PioneerVector.signature.indices {
            var response = PioneerVector.signature
            response[index] ^= 0x80
            let check = CapturedAuthentication(certificate: PioneerVector.certificate, challenge: PioneerVector.challenge, response: response)
            #expect(check.firstFailure?.step == .signature, "byte \(index)")
            #expect(check.verdict.contains("is no signature by the certificate's RSA 1024-bit key"), "byte \(index)")
        }
        let short = CapturedAuthentication(certificate: PioneerVector.certificate, challenge: PioneerVector.challenge,
                                           response: Array(PioneerVector.signature.dropLast()))
        #expect(short.verdict == "signature fails: the response has 127 bytes; signatures by the certificate's RSA 1024-bit key have 128")
    }

    @Test("a changed byte of the real certificate's structure or key names its step")
    func changedRealCertificate() throws {
        let certificate = PioneerVector.certificate
        // The modulus: 0x02 0x81 0x81 0x00, then 128 bytes.
        let modulus = try #require(Self.offset(of: [0x02, 0x81, 0x81, 0x00], in: certificate)) + 4
        for index in Array(0..<16) + Array(modulus..<(modulus + 128)) {
            var changed = certificate
            changed[index] ^= 0x01
            let check = CapturedAuthentication(certificate: changed, challenge: PioneerVector.challenge, response: PioneerVector.signature)
            let step = try #require(check.firstFailure?.step, "byte \(index) went unnoticed")
            #expect([.certificate, .key, .signature].contains(step), "byte \(index): \(check.verdict)")
        }
        // All zeros: what a report without --full embeds.
        let zeroed = CapturedAuthentication(certificate: [UInt8](repeating: 0, count: certificate.count), challenge: PioneerVector.challenge,
                                            response: PioneerVector.signature)
        #expect(zeroed.verdict.hasPrefix("certificate fails: its 908 bytes are all zero: a report made without --full leaves the certificate out"))
    }

    /// The simulator's credentials: its certificate as sent (PKCS#7), a challenge, its response.
    static func signed(_ name: String) throws -> (certificate: [UInt8], challenge: [UInt8], response: [UInt8], leaf: [UInt8]) {
        let credentials = try AccessoryCredentials.load(certificatePath: Fixtures.path(name + ".pem"), keyPath: Fixtures.path(name + ".key"))
        let challenge = (0..<credentials.scheme.challengeLength).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }
        return (credentials.certificate, challenge, credentials.sign(challenge: challenge), Self.der(ofPEM: name + ".pem"))
    }

    @Test("with the CA given, a changed byte anywhere in the certificate, the challenge or the response names the failing step",
          arguments: ["accessory-rsa", "accessory-p256"])
    func everyByteOfASignedExchange(name: String) throws {
        let trust = try #require(Self.trust)
        let exchange = try Self.signed(name)
        let valid = CapturedAuthentication(certificate: exchange.certificate, challenge: exchange.challenge, response: exchange.response, trust: trust)
        #expect(valid.verdict == "valid")
        #expect(valid.lines.allSatisfy { $0.result == .holds || $0.result == .information })
        let leafStart = try #require(Self.offset(of: exchange.leaf, in: exchange.certificate))
        for index in leafStart..<(leafStart + exchange.leaf.count) {
            var certificate = exchange.certificate
            certificate[index] ^= 0x01
            let check = CapturedAuthentication(certificate: certificate, challenge: exchange.challenge, response: exchange.response, trust: trust)
            #expect(check.firstFailure != nil, "certificate byte \(index - leafStart) went unnoticed")
        }
        for index in exchange.challenge.indices {
            var challenge = exchange.challenge
            challenge[index] ^= 0x01
            let check = CapturedAuthentication(certificate: exchange.certificate, challenge: challenge, response: exchange.response, trust: trust)
            #expect(check.firstFailure?.step == .signature, "challenge byte \(index)")
        }
        for index in exchange.response.indices {
            var response = exchange.response
            response[index] ^= 0x01
            let check = CapturedAuthentication(certificate: exchange.certificate, challenge: exchange.challenge, response: response, trust: trust)
            #expect(check.firstFailure?.step == .signature, "response byte \(index)")
        }
    }

    @Test func aCertificateOfAnotherCAFailsAtTheChain() throws {
        let other = try TrustAnchors(path: Fixtures.path("other-ca.pem"))
        let exchange = try Self.signed("accessory-rsa")
        let check = CapturedAuthentication(certificate: exchange.certificate, challenge: exchange.challenge, response: exchange.response, trust: other)
        #expect(check.signatureIsValid)
        #expect(check.firstFailure?.step == .chain)
    }

    static func checker(trust: TrustAnchors?) -> @Sendable (AuthenticationEvidence) -> AuthenticationChecking {
        { evidence in
            let check = CapturedAuthentication(certificate: evidence.certificate, challenge: evidence.challenge, response: evidence.response, trust: trust)
            return AuthenticationChecking(verdict: evidence.protocolName + " " + check.verdict, isValid: check.firstFailure == nil,
                                          steps: check.lines.map { .init(name: $0.step.rawValue, result: $0.result.rawValue, detail: $0.detail) })
        }
    }

    @Test("a trace of both sides: the response checked against the challenge and the certificate before it",
          arguments: [(false, false), (true, false), (false, true), (true, true)])
    func trace(iap1: Bool, forged: Bool) throws {
        var exchange = try Exchange(profile: Fixtures.profile("accessory-rsa", iap1: iap1, forged: forged),
                                    policy: VerifyingAuthentication(mode: .record))
        exchange.run()
        #expect(exchange.identity != nil)
        var decoder = CaptureDecoder()
        decoder.authenticationChecker = Self.checker(trust: Self.trust)
        var text: [String] = []
        var json: [String] = []
        decoder.feed(exchange.wireBytes.span.bytes) { report in
            text.append(report.text())
            json.append(report.json.serialized())
        }
        decoder.finish { text.append($0.text()) }
        let checked = text.filter { $0.contains("authentication: ") }
        #expect(checked.count == 1)
        let name = iap1 ? "iAP1" : "iAP2"
        if forged {
            #expect(checked.first?.contains("authentication: \(name) signature fails: the 128-byte response is no signature by the certificate's RSA 1024-bit key") == true)
            #expect(json.contains { $0.contains("\"authenticationCheck\":{") && $0.contains("\"valid\":false") })
        } else {
            #expect(checked.first?.contains("authentication: \(name) valid (the 128-byte response") == true)
            #expect(checked.first?.contains("  chain: holds: chains to a trust anchor") == true)
            #expect(json.contains { $0.contains("\"authenticationCheck\":{\"verdict\":\"\(name) valid\",\"valid\":true") })
        }
    }

    @Test func aResponseWithoutItsChallengeIsNotChecked() throws {
        var exchange = try Exchange(profile: Fixtures.profile("accessory-rsa"), policy: VerifyingAuthentication(mode: .record))
        exchange.run()
        var decoder = CaptureDecoder()
        decoder.authenticationChecker = Self.checker(trust: nil)
        var text: [String] = []
        // The accessory's side alone: the certificate and the response, no challenge.
        decoder.feed(exchange.accessoryBytes.span.bytes) { text.append($0.text()) }
        decoder.finish { text.append($0.text()) }
        #expect(text.contains { $0.contains("authentication: not checked: no challenge came before this response in the trace") })
    }
}
