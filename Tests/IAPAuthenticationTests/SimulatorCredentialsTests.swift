import AccessorySimulator
import IAPAuthentication
import IAPLink
import Testing

/// The simulator's built-in test credentials (tools/data/profiles/generate-test-credentials.sh): a
/// real chain to "AccessoryHost Test CA" that a profile without `authentication` presents, over
/// iAP2 and iAP1, and that verifies against tools/data/profiles/test-ca.pem and nothing else.
@Suite struct SimulatorCredentialsTests {
    static let testCA = try! TrustAnchors(path: SimulatorTestCA.path)
    /// A challenge of the length coprocessor 2.0 signs, not all one byte.
    static let challenge: [UInt8] = (0..<20).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }

    /// The built-in profiles of both protocols (iAP2 with the most ordinary link, iAP1).
    static let profiles = ["multi-sensor", "legacy-sensor"]

    @Test("the certificate is a PKCS#7 SignedData with an RSA-1024 leaf issued by the test CA, valid for decades")
    func certificateForm() throws {
        let signer = try SimulatorProfile.testCredentials()
        let certificate = signer.certificate
        // ContentInfo's content type: pkcs7-signedData (1.2.840.113549.1.7.2), as coprocessors send.
        #expect(Array(certificate.prefix(2)) == [0x30, 0x82])
        #expect(Array(certificate[4..<15]) == [0x06, 0x09, 0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x07, 0x02])
        let summary = try CertificateReader.summary(of: certificate).get()
        #expect(summary.subject == "O=AccessoryHost, OU=Simulator (test only), CN=IPA_SIMULATOR_TEST_0001")
        #expect(summary.issuer == "O=AccessoryHost, OU=Test only (proves nothing), CN=AccessoryHost Test CA")
        #expect(summary.key == "RSA 1024-bit")
        #expect(summary.scheme == .rsaPKCS1SHA1)
        #expect(summary.validity == .current)
        // Long enough that no test run meets its end (ISO 8601 compares as text).
        #expect(summary.notAfter >= "2100-01-01T00:00:00Z", "\(summary.notAfter)")
        // Regenerating it keeps it within one link packet of every built-in profile (and the
        // default 4,096 bytes), with room to spare.
        #expect(certificate.count < 1_000, "\(certificate.count) bytes")
    }

    @Test("its chain verifies against the test CA, and its response to a challenge verifies")
    func verifiesWithTheTestCA() throws {
        let signer = try SimulatorProfile.testCredentials()
        let require = VerifyingAuthentication(mode: .require, trust: Self.testCA)
        let examination = require.examine(certificate: signer.certificate)
        #expect(examination.refusal == nil)
        #expect(examination.scheme == .rsaPKCS1SHA1)
        let response = signer.sign(challenge: Self.challenge)
        #expect(response.count == 128)
        let outcome = require.outcome(certificate: signer.certificate, challenge: Self.challenge, response: response)
        #expect(outcome.status == .verified)
        #expect(outcome.accepted && outcome.signatureVerified && outcome.chainVerified)
        // A signature of this challenge only: another challenge's response does not answer it.
        var other = Self.challenge
        other[0] ^= 0xFF
        #expect(signer.sign(challenge: other) != response)
        #expect(!require.verifies(certificate: signer.certificate, challenge: other, response: response))
    }

    @Test("without the test CA the verdict is unknown issuer, naming the CA and --trust")
    func unknownIssuerNamesTheCA() throws {
        let signer = try SimulatorProfile.testCredentials()
        let response = signer.sign(challenge: Self.challenge)
        let none = VerifyingAuthentication(mode: .record).outcome(certificate: signer.certificate, challenge: Self.challenge, response: response)
        #expect(none.signatureVerified && !none.chainVerified && none.accepted)
        #expect(none.failure?.kind == "unknown issuer")
        #expect(none.failure?.detail == "AccessoryHost Test CA; no trust anchors were given: give that CA's certificate with --trust FILE|DIR")
        #expect(none.description.hasPrefix("not verified (unknown issuer: AccessoryHost Test CA; "))
        #expect(none.description.hasSuffix("), accepted anyway"))
        // Another CA, and the fixtures' CA of the same common name but another key: neither is it.
        for path in [Fixtures.path("other-ca.pem"), Fixtures.path("test-ca.pem")] {
            let trust = try TrustAnchors(path: path)
            let outcome = VerifyingAuthentication(mode: .require, trust: trust)
                .outcome(certificate: signer.certificate, challenge: Self.challenge, response: response)
            #expect(!outcome.accepted && !outcome.chainVerified, "\(path)")
            #expect(outcome.failure?.kind == "unknown issuer", "\(path)")
            #expect(outcome.failure?.detail.hasPrefix("AccessoryHost Test CA; the chain to the trust anchors given fails: ") == true, "\(path)")
            #expect(outcome.failure?.detail.contains("(issuer O=AccessoryHost, OU=Test only (proves nothing), CN=AccessoryHost Test CA)") == true)
        }
    }

    @Test("a tampered response fails as a bad signature, whichever byte changed")
    func tamperedSignatureFails() throws {
        let signer = try SimulatorProfile.testCredentials()
        let require = VerifyingAuthentication(mode: .require, trust: Self.testCA)
        let response = signer.sign(challenge: Self.challenge)
        for index in [0, 1, 63, 64, 126, 127] {
            var tampered = response
            tampered[index] ^= 0x01
            let outcome = require.outcome(certificate: signer.certificate, challenge: Self.challenge, response: tampered)
            #expect(outcome.failure?.kind == "bad signature", "byte \(index)")
            #expect(!outcome.signatureVerified && !outcome.accepted, "byte \(index)")
            // The chain is still the test CA's: only the signature is wrong.
            #expect(outcome.chainVerified, "byte \(index)")
        }
        // The offline check of a capture says which side changed.
        var tampered = response
        tampered[5] ^= 0x80
        let captured = CapturedAuthentication(certificate: signer.certificate, challenge: Self.challenge, response: tampered, trust: Self.testCA)
        #expect(captured.firstFailure?.step == .signature)
        #expect(captured.verdict.contains("is no signature by the certificate's RSA 1024-bit key"))
        let intact = CapturedAuthentication(certificate: signer.certificate, challenge: Self.challenge, response: response, trust: Self.testCA)
        #expect(intact.firstFailure == nil && intact.signatureIsValid)
    }

    @Test("a built-in profile presents the test certificate and verifies under require with the test CA", arguments: profiles)
    func builtInProfileVerifies(name: String) throws {
        let profile = try #require(SimulatorProfile.builtIn(named: name))
        #expect(profile.authentication == nil)
        var exchange = try Exchange(profile: profile, policy: VerifyingAuthentication(mode: .require, trust: Self.testCA))
        exchange.run()
        let identity = try #require(exchange.identity, "\(exchange.failure ?? "no failure")")
        #expect(identity.protocolVersion == (name == "legacy-sensor" ? .iap1 : .iap2))
        #expect(identity.authentication.status == .verified)
        #expect(identity.authentication.certificate?.subject.hasSuffix("CN=IPA_SIMULATOR_TEST_0001") == true)
        #expect(!exchange.accessoryRefused)
    }

    @Test("without --trust a built-in profile is recorded as unknown issuer naming the CA, and refused under require", arguments: profiles)
    func builtInProfileWithoutTrust(name: String) throws {
        let profile = try #require(SimulatorProfile.builtIn(named: name))
        var recorded = try Exchange(profile: profile, policy: VerifyingAuthentication(mode: .record))
        recorded.run()
        let outcome = try #require(recorded.identity?.authentication)
        #expect(outcome.accepted && outcome.signatureVerified && !outcome.chainVerified)
        #expect(outcome.failure?.detail.hasPrefix("AccessoryHost Test CA; ") == true)

        var required = try Exchange(profile: profile, policy: VerifyingAuthentication(mode: .require))
        required.run()
        #expect(required.identity == nil)
        #expect(required.failure?.hasPrefix("unknown issuer: AccessoryHost Test CA; ") == true)
        #expect(required.accessoryRefused)
    }

    @Test("the forged fault without an authentication section forges the test certificate's signatures", arguments: [false, true])
    func forgedTestCertificate(iap1: Bool) throws {
        var profile = Fixtures.profile("accessory-rsa", iap1: iap1, forged: true)
        profile.authentication = nil
        try profile.validate()
        var exchange = try Exchange(profile: profile, policy: VerifyingAuthentication(mode: .require, trust: Self.testCA))
        exchange.run()
        #expect(exchange.identity == nil)
        #expect(exchange.failure?.hasPrefix("bad signature: ") == true)
        #expect(exchange.accessoryRefused)
    }
}
