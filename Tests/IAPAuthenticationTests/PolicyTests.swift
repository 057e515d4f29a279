import AccessorySimulator
import IAPAuthentication
import IAPLink
import Testing

/// The policies over both protocols, with the simulator signing real challenges (RSA-1024 as a
/// coprocessor 2.0 does, P-256 as 3.0 does): deterministic exchanges in memory.
@Suite struct PolicyTests {
    static let trust = try! TrustAnchors(path: Fixtures.path("test-ca.pem"))
    /// Each accessory key over each protocol.
    static let accessories: [(credentials: String, iap1: Bool)] = [
        ("accessory-rsa", false), ("accessory-p256", false), ("accessory-rsa", true), ("accessory-p256", true),
    ]

    @Test("require accepts a good accessory", arguments: accessories)
    func requireAcceptsGood(credentials: String, iap1: Bool) throws {
        var exchange = try Exchange(profile: Fixtures.profile(credentials, iap1: iap1),
                                    policy: VerifyingAuthentication(mode: .require, trust: Self.trust))
        exchange.run()
        let identity = try #require(exchange.identity)
        #expect(identity.protocolVersion == (iap1 ? .iap1 : .iap2))
        let outcome = identity.authentication
        #expect(outcome.status == .verified)
        #expect(outcome.accepted && outcome.signatureVerified && outcome.chainVerified)
        let certificate = try #require(outcome.certificate)
        #expect(certificate.subject.hasSuffix(credentials == "accessory-rsa" ? "CN=IPA_TEST_RSA_0001" : "CN=IPA_TEST_P256_0001"))
        #expect(certificate.issuer.hasSuffix("CN=AccessoryHost Test CA"))
        #expect(certificate.scheme == (credentials == "accessory-rsa" ? .rsaPKCS1SHA1 : .ecdsaP256))
        #expect(!exchange.accessoryRefused)
    }

    @Test("require refuses a forged accessory, naming the reason", arguments: accessories)
    func requireRefusesForged(credentials: String, iap1: Bool) throws {
        var exchange = try Exchange(profile: Fixtures.profile(credentials, iap1: iap1, forged: true),
                                    policy: VerifyingAuthentication(mode: .require, trust: Self.trust))
        exchange.run()
        #expect(exchange.identity == nil)
        let failure = try #require(exchange.failure)
        #expect(failure.hasPrefix("bad signature: "))
        // iAP2: AuthenticationFailed; iAP1: AckAccessoryAuthenticationStatus with a failure status.
        #expect(exchange.accessoryRefused)
        #expect(!exchange.accessoryEvents.contains { if case .identified = $0 { true } else { false } })
    }

    @Test("record accepts a forged accessory and says it failed", arguments: accessories)
    func recordSaysWhichFailed(credentials: String, iap1: Bool) throws {
        var forged = try Exchange(profile: Fixtures.profile(credentials, iap1: iap1, forged: true),
                                  policy: VerifyingAuthentication(mode: .record, trust: Self.trust))
        forged.run()
        let outcome = try #require(forged.identity?.authentication)
        #expect(outcome.accepted)
        #expect(!outcome.signatureVerified && outcome.chainVerified)
        #expect(outcome.failure?.kind == "bad signature")
        #expect(outcome.description.hasPrefix("not verified (bad signature: ") && outcome.description.hasSuffix("accepted anyway"))

        var good = try Exchange(profile: Fixtures.profile(credentials, iap1: iap1), policy: VerifyingAuthentication(mode: .record, trust: Self.trust))
        good.run()
        #expect(good.identity?.authentication.status == .verified)
    }

    @Test("a chain to the test CA: accepted with it as trust anchor, refused without or with another CA", arguments: accessories)
    func chainNeedsTrust(credentials: String, iap1: Bool) throws {
        let other = try TrustAnchors(path: Fixtures.path("other-ca.pem"))
        for trust in [nil, other] {
            var exchange = try Exchange(profile: Fixtures.profile(credentials, iap1: iap1),
                                        policy: VerifyingAuthentication(mode: .require, trust: trust))
            exchange.run()
            #expect(exchange.identity == nil)
            #expect(exchange.failure?.hasPrefix("unknown issuer: ") == true)
            #expect(exchange.accessoryRefused)
        }
        // The directory form finds the CA among the fixtures.
        var exchange = try Exchange(profile: Fixtures.profile(credentials, iap1: iap1),
                                    policy: VerifyingAuthentication(mode: .require, trust: try TrustAnchors(path: Fixtures.directory)))
        exchange.run()
        #expect(exchange.identity?.authentication.isVerified == true)
    }

    @Test("the unverifiable-certificate deviation's stand-in is malformed: refused under require, listed under record, not read under accept",
          arguments: [false, true])
    func standIn(iap1: Bool) throws {
        // Its own credentials or the built-in test ones: the deviation sends neither.
        var profile = Fixtures.profile("accessory-rsa", iap1: iap1)
        profile.deviations = [.unverifiableCertificate]
        #expect(try profile.signer() == nil)
        var required = try Exchange(profile: profile, policy: VerifyingAuthentication(mode: .require, trust: Self.trust))
        required.run()
        #expect(required.identity == nil)
        #expect(required.failure?.hasPrefix("malformed certificate: ") == true)

        var recorded = try Exchange(profile: profile, policy: VerifyingAuthentication(mode: .record))
        recorded.run()
        #expect(recorded.identity?.authentication.failure?.kind == "malformed certificate")
        #expect(recorded.identity?.authentication.accepted == true)

        var accepted = try Exchange(profile: profile, policy: AuthenticationMode.accept.policy())
        accepted.run()
        #expect(accepted.identity?.authentication == .notChecked)
    }

    @Test func profileFilesAreCheckedWhenTheSimulatorIsMade() throws {
        var profile = Fixtures.profile("accessory-rsa")
        profile.authentication?.key = Fixtures.path("accessory-p256.key")
        #expect(throws: SimulatorProfileError.self) { try SimulatedAccessory(profile: profile) }
        profile.authentication?.key = Fixtures.path("no-such.key")
        #expect(throws: SimulatorProfileError.self) { try SimulatorRunner(profile: profile, attachment: .memory { _ in }) }
        // Without files the built-in test credentials are forged (SimulatorCredentialsTests).
        var forgedWithoutKey = Fixtures.profile("accessory-rsa", forged: true)
        forgedWithoutKey.authentication = nil
        try forgedWithoutKey.validate()
        #expect(try forgedWithoutKey.signer() != nil)
    }

    @Test func profileLoadsItsFilesRelativeToItself() throws {
        let profile = try SimulatorProfile.load(path: Fixtures.path("rsa-sensor.json"))
        #expect(profile.authentication?.certificate == Fixtures.path("accessory-rsa.pem"))
        var exchange = try Exchange(profile: profile, policy: VerifyingAuthentication(mode: .require, trust: Self.trust))
        exchange.run()
        #expect(exchange.identity?.authentication.isVerified == true)
    }
}
