import Foundation
@testable import IAPAuthentication
import IAPLink
import Testing

/// The captured authentication of a real accessory (CP 2.0, RSA-1024): the scheme of
/// ``SigningRule`` is confirmed by it.
@Suite struct VectorTests {
    let record = VerifyingAuthentication(mode: .record)

    @Test func capturedSignatureVerifies() {
        let outcome = record.outcome(certificate: PioneerVector.certificate, challenge: PioneerVector.challenge, response: PioneerVector.signature)
        #expect(outcome.signatureVerified)
        // No trust anchors given: the chain cannot be checked, and record lets it in anyway.
        #expect(outcome.failure?.kind == "unknown issuer")
        // The issuer by its common name, for the person who has to find its certificate.
        #expect(outcome.failure?.detail.hasPrefix("Apple iPod Accessories Certification Authority; no trust anchors were given: ") == true)
        #expect(outcome.accepted)
    }

    @Test(arguments: 0..<(20 * 8)) func oneFlippedChallengeBitFails(bit: Int) {
        var challenge = PioneerVector.challenge
        challenge[bit / 8] ^= 1 << UInt8(bit % 8)
        let outcome = record.outcome(certificate: PioneerVector.certificate, challenge: challenge, response: PioneerVector.signature)
        #expect(!outcome.signatureVerified)
        #expect(outcome.failure?.kind == "bad signature")
    }

    @Test(arguments: [0, 1, 7, 64, 500, 1023]) func oneFlippedSignatureBitFails(bit: Int) {
        var signature = PioneerVector.signature
        signature[bit / 8] ^= 1 << UInt8(bit % 8)
        let outcome = record.outcome(certificate: PioneerVector.certificate, challenge: PioneerVector.challenge, response: signature)
        #expect(!outcome.signatureVerified)
        #expect(outcome.failure?.kind == "bad signature")
    }

    @Test func certificateSummary() throws {
        let summary = try CertificateReader.summary(of: PioneerVector.certificate).get()
        #expect(summary.subject == "C=US, O=Apple Inc., OU=Apple iPod Accessories, CN=IPA_1212AA120926AA06AA4779AA809013")
        #expect(summary.issuer == "C=US, O=Apple Inc., OU=Apple Certification Authority, CN=Apple iPod Accessories Certification Authority")
        #expect(summary.serialNumber == "1212AA120926AA06AA4779AA809013")
        #expect(summary.notBefore == "2012-09-27T00:40:35Z")
        #expect(summary.notAfter == "2020-09-27T00:40:35Z")
        #expect(summary.key == "RSA 1024-bit")
        #expect(summary.scheme == .rsaPKCS1SHA1)
        #expect(summary.signatureAlgorithm == "sha1WithRSAEncryption")
        #expect(summary.validity == .expired) // the machine's clock is past 2020
        #expect(try CertificateReader.summary(of: PioneerVector.certificate, at: 1_500_000_000).get().validity == .current) // 2017
        // The certificate travels as 8 iAP1 sections: 7 of 128 bytes and one of 12.
        #expect(PioneerVector.certificate.count == 908)
    }

    /// Trusting the accessory's own certificate (any certificate given is an anchor) completes
    /// the check: verified, with the expiry reported; it fails only when validity is checked.
    @Test func expiryFailsOnlyWhenChecked() throws {
        let pem = "-----BEGIN PKCS7-----\n" + Data(PioneerVector.certificate).base64EncodedString(options: .lineLength64Characters)
            + "\n-----END PKCS7-----\n"
        let trust = try TrustAnchors(pem: Array(pem.utf8))
        #expect(trust.count == 1)
        let lenient = VerifyingAuthentication(mode: .require, trust: trust)
        let outcome = lenient.outcome(certificate: PioneerVector.certificate, challenge: PioneerVector.challenge, response: PioneerVector.signature)
        #expect(outcome.status == .verified)
        #expect(outcome.accepted && outcome.chainVerified && outcome.signatureVerified)
        #expect(outcome.description.contains("certificate expired 2020-09-27T00:40:35Z"))

        let strict = VerifyingAuthentication(mode: .require, trust: trust, checkValidity: true)
        #expect(strict.examine(certificate: PioneerVector.certificate).refusal?.kind == "outside its validity period")
        let refused = strict.outcome(certificate: PioneerVector.certificate, challenge: PioneerVector.challenge, response: PioneerVector.signature)
        #expect(!refused.accepted)
        #expect(refused.failure == .outsideValidity("the certificate expired 2020-09-27T00:40:35Z"))
        // At a time inside the period it passes even then.
        var then = strict
        then.validityTime = 1_500_000_000
        #expect(then.outcome(certificate: PioneerVector.certificate, challenge: PioneerVector.challenge, response: PioneerVector.signature).status == .verified)
    }

    /// The digest rule in one place: the challenge is the digest, not hashed again.
    @Test func signingRuleTakesTheChallengeAsDigest() {
        let rule = SigningRule(.rsaPKCS1SHA1)
        #expect(rule.digest(of: PioneerVector.challenge) == PioneerVector.challenge)
        #expect(rule.digest(of: Array(PioneerVector.challenge.prefix(16))) == nil)
        #expect(SigningRule(.ecdsaP256).digestLength == 32)
        #expect(AuthenticationScheme.rsaPKCS1SHA1.challengeLength == 20 && AuthenticationScheme.ecdsaP256.challengeLength == 32)
    }
}
