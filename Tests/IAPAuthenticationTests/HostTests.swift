import AccessoryHost
import AccessorySimulator
import IAPAuthentication
import IAPLink
import Testing

/// What an application sees through AccessoryManager: under record both accessories are listed
/// and the forged one says it failed; under require the forged one is not listed and its failure
/// names the reason.
@Suite(.timeLimit(.minutes(2))) struct HostTests {
    enum Seen: Sendable {
        case connected(Accessory)
        case failed(String)
    }

    /// A good and a forged accessory (in memory) on a manager with `policy`, and what became of
    /// each: connected accessories and failures, once both have come to one.
    static func run(_ policy: any AuthenticationPolicy, iap1: Bool) async throws -> (AccessoryManager, [SimulatorRunner], [Seen]) {
        let manager = AccessoryManager(configuration: .init(authentication: policy))
        let events = manager.events
        let runners = try [Fixtures.profile("accessory-rsa", iap1: iap1, serial: "GOOD-0001"),
                           Fixtures.profile("accessory-p256", iap1: iap1, forged: true, serial: "FORGED-0001")].map { profile in
            try SimulatorRunner(profile: profile, attachment: .memory { manager.attach($0) })
        }
        for runner in runners { runner.start() }
        var seen: [Seen] = []
        for await event in events {
            switch event {
            case let .connected(accessory): seen.append(.connected(accessory))
            case let .failed(_, reason): seen.append(.failed(reason))
            case .disconnected, .appLaunchRequested: break
            }
            if seen.count == 2 { break }
        }
        return (manager, runners, seen)
    }

    @Test("record lists both and says which failed", arguments: [false, true])
    func recordListsBoth(iap1: Bool) async throws {
        let trust = try TrustAnchors(path: Fixtures.path("test-ca.pem"))
        let (manager, runners, seen) = try await Self.run(VerifyingAuthentication(mode: .record, trust: trust), iap1: iap1)
        defer { manager.stop(); runners.forEach { $0.stop() } }
        let accessories = seen.compactMap { if case let .connected(accessory) = $0 { accessory } else { nil } }
        #expect(accessories.count == 2)
        let good = try #require(accessories.first { $0.serialNumber == "GOOD-0001" })
        let forged = try #require(accessories.first { $0.serialNumber == "FORGED-0001" })
        #expect(good.authentication.status == .verified)
        #expect(good.authentication.certificate?.subject.hasSuffix("CN=IPA_TEST_RSA_0001") == true)
        #expect(forged.authentication.failure?.kind == "bad signature")
        #expect(forged.authentication.accepted)
        #expect(forged.authentication.certificate?.key == "EC P-256")
        #expect(Set(manager.connectedAccessories.map(\.serialNumber)) == ["GOOD-0001", "FORGED-0001"])
    }

    @Test("require lists only the good one; the refusal names the reason", arguments: [false, true])
    func requireRefusesForged(iap1: Bool) async throws {
        let trust = try TrustAnchors(path: Fixtures.path("test-ca.pem"))
        let (manager, runners, seen) = try await Self.run(VerifyingAuthentication(mode: .require, trust: trust), iap1: iap1)
        defer { manager.stop(); runners.forEach { $0.stop() } }
        let accessories = seen.compactMap { if case let .connected(accessory) = $0 { accessory } else { nil } }
        let failures = seen.compactMap { if case let .failed(reason) = $0 { reason } else { nil } }
        #expect(accessories.map(\.serialNumber) == ["GOOD-0001"])
        #expect(accessories.first?.authentication.isVerified == true)
        #expect(failures.count == 1)
        #expect(failures.first?.contains("authentication failed: bad signature: ") == true)
        #expect(manager.connectedAccessories.map(\.serialNumber) == ["GOOD-0001"])
    }

    /// The core's default checks nothing (so that it links no libcrypto) and lets the accessory
    /// in; the record mode verifies, reports and lets it in too.
    @Test(arguments: [false, true])
    func theDefaultAcceptsAndRecordModeRecords(verifying: Bool) async throws {
        let manager = verifying ? AccessoryManager(configuration: .init(authentication: VerifyingAuthentication(mode: .record))) : AccessoryManager()
        defer { manager.stop() }
        let runner = try SimulatorRunner(profile: Fixtures.profile("accessory-rsa"), attachment: .memory { manager.attach($0) })
        defer { runner.stop() }
        runner.start()
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)))
        #expect(accessory.authentication.accepted)
        if verifying {
            // Signature verified; no trust anchors were given, so the issuer is unknown: recorded, accepted.
            #expect(accessory.authentication.signatureVerified)
            #expect(accessory.authentication.failure?.kind == "unknown issuer")
        } else {
            #expect(accessory.authentication.status == .notChecked)
            #expect(!accessory.authentication.signatureVerified)
        }
    }
}
