import AccessorySimulator
import Glibc
import IAPLink
import Testing
import TestSupport

/// The fixtures: PEM files made by Fixtures/generate.sh (a test CA, RSA-1024 and P-256
/// accessories it signed, an unrelated CA, a certificate with an 8192-bit key).
enum Fixtures {
    static let directory: String = {
        let file = #filePath
        return String(file[...file.lastIndex(of: "/")!]) + "Fixtures/"
    }()

    static func path(_ name: String) -> String { directory + name }

    static func bytes(_ name: String) -> [UInt8] {
        guard let file = fopen(path(name), "rb") else { return [] }
        defer { fclose(file) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = fread(&buffer, 1, buffer.count, file)
            if count <= 0 { break }
            bytes += buffer[0..<count]
        }
        return bytes
    }

    /// The simulator's credentials section for the accessory `name` (`accessory-rsa`, `accessory-p256`).
    static func authentication(_ name: String) -> SimulatorProfile.Authentication {
        SimulatorProfile.Authentication(certificate: path(name + ".pem"), key: path(name + ".key"))
    }

    /// A profile with one echo protocol, signing with `credentials`, over iAP1 or iAP2.
    static func profile(_ credentials: String, iap1: Bool = false, forged: Bool = false, serial: String = "AUTH-0001") -> SimulatorProfile {
        SimulatorProfile(
            accessory: .init(name: forged ? "Forged Sensor" : "Signed Sensor", model: "SIM-AUTH", manufacturer: "AccessoryHost Tests",
                             serialNumber: serial, firmwareVersion: "1.0.0", hardwareVersion: "A"),
            protocols: [.init(name: "com.example.echo", behaviour: .echo)],
            faults: .init(forged: forged), iap1: iap1 ? .init() : nil,
            authentication: authentication(credentials))
    }
}

/// The CA of the simulator's built-in test credentials, as `iapctl --trust` takes it:
/// tools/data/profiles/test-ca.pem, made by tools/data/profiles/generate-test-credentials.sh.
enum SimulatorTestCA {
    static let path = Fixtures.directory + "../../../tools/data/profiles/test-ca.pem"
}

/// The real accessory's authentication captured by libiap (a Pioneer AV receiver, iAP1
/// authentication 2.0; the shared vectors' pioneer-auth.json): a PKCS#7 certificate, the
/// challenge the iPod drew and the signature the coprocessor made.
enum PioneerVector {
    static let certificate = bytes(fromHex: """
        3082038806092a864886f70d010702a0820379308203750201013100300b06092a864886f70d010701a082035d3082035930820241a003020102020f1212aa12\
        0926aa06aa4779aa809013300d06092a864886f70d0101050500308183310b300906035504061302555331133011060355040a130a4170706c6520496e632e31\
        263024060355040b131d4170706c652043657274696669636174696f6e20417574686f72697479313730350603550403132e4170706c652069506f6420416363\
        6573736f726965732043657274696669636174696f6e20417574686f72697479301e170d3132303932373030343033355a170d3230303932373030343033355a\
        3070310b300906035504061302555331133011060355040a0c0a4170706c6520496e632e311f301d060355040b0c164170706c652069506f6420416363657373\
        6f72696573312b302906035504030c224950415f31323132414131323039323641413036414134373739414138303930313330819f300d06092a864886f70d01\
        0101050003818d0030818902818100816b09329a95efeeae9ac6ac8993c633e0647a5acbf5682e14d4a76b1a5f25804ae4236b2a3d1bb98617614f3551c3e27a\
        47403adba6b56fe23d37d8097caeb3e44b1d1d054027200723e98ad06e62faa7d109cfe371713ebdfcfafe7ab00e728b3d98e3123eaa1cc9713ef9f401030ace\
        de1891eb94bb02d721bb48b451d9830203010001a360305e301d0603551d0e041604145e6076c8bebfca437bb541731f5cee1ac03404d1300c0603551d130101\
        ff04023000301f0603551d23041830168014ff4b1a439af51996ab18002b61c9ee409d8ec704300e0603551d0f0101ff0404030203b8300d06092a864886f70d\
        01010505000382010100178a0e34f697b1ecef39a4f6599a152ded54fb6a64a6382dabafccefb02fc5c150deaaeb2be0f82a48923a6e5823d9e7ed4bc378a466\
        37be3159b1575db54e7db0244d75eea1e1009342518fb45597d3880a4c9342d76b025892223e792d028b1514faddb8a3c7e0a8473d028e2bada4ce1d96b460b5\
        0fd92525f15065853913e0f7087cf73e38e32a401e4414e530948f835ae63bddde21f660dfe5abf5d91665d715eca876c7b99203073e825694e1148d7d60535d\
        31d25015ea5805723bf054905789a923d256cc6d69f7389f7c693e367ee1aba43ec0079aa1f8f11b031ede721929284c6e25f968897c659ea2b97944159d42c7\
        f8c67c7ca14be7af841b3100
        """)
    static let challenge = bytes(fromHex: "00e4e20000030001000400020001040002000404")
    static let signature = bytes(fromHex: """
        0675af67cf6875da929722e34b612b36486dd96941537312dc8fc97dff27a3ff1777ebf5a8d7e08b648a624ccee3fb4d9904267697e01a6b5f7c2c71acc49245\
        aead3719e3d93e46b09140548d88b89cb1188db5239b29961ee2035dc7c0d7b3a1e559aabe6a3b0b8667f78dbc58de90713d89f6b2792209214b5d884f759086
        """)

    static func bytes(fromHex text: String) -> [UInt8] {
        let digits = Array(text.utf8.filter { !$0.isWhitespace })
        return stride(from: 0, to: digits.count - 1, by: 2).map { UInt8(String(decoding: digits[$0...$0 + 1], as: UTF8.self), radix: 16)! }
    }
}

extension UInt8 {
    fileprivate var isWhitespace: Bool { self == 0x20 || self == 0x0A || self == 0x0D || self == 0x09 }
}

/// A device endpoint and a simulated accessory wired back to back in memory, stepped by hand on
/// a clock of their own: deterministic, no threads.
struct Exchange {
    var host: IAPEndpoint
    var accessory: SimulatedAccessory
    var hostEvents: [EndpointEvent] = []
    var accessoryEvents: [SimulatorEvent] = []
    /// Every byte the accessory sent (for the decoder's tests).
    var accessoryBytes: [UInt8] = []
    /// Every frame of both sides, in the order they were sent (one stream, as a trace reads).
    var wireBytes: [UInt8] = []
    var now: LinkTime = .zero

    init(profile: SimulatorProfile, policy: any AuthenticationPolicy) throws {
        host = IAPEndpoint(device: .device, policy: policy, initialSequence: 0x40, randomSeed: 11)
        accessory = try SimulatedAccessory(profile: profile)
        host.start(now: now)
        accessory.start(now: now)
    }

    var identity: AccessoryIdentity? { host.identity }

    var failure: String? {
        for case let .controlFailed(.authenticationFailed(why)) in hostEvents { return why }
        return nil
    }

    /// Whether the accessory heard the device refuse it.
    var accessoryRefused: Bool {
        accessoryEvents.contains { if case .endpoint(.controlFailed(.authenticationRefusedByDevice)) = $0 { true } else { false } }
    }

    /// Steps until the host identified the accessory or failed (or nothing moves for 30 s of
    /// the exchange's clock).
    mutating func run() {
        for _ in 0..<10_000 {
            if identity != nil || hostEvents.contains(where: { if case .controlFailed = $0 { true } else { false } }) {
                settle()
                return
            }
            if !step() {
                let next = [host.nextDeadline, accessory.nextDeadline].compactMap { $0 }.min() ?? now + .milliseconds(10)
                now = max(now + .milliseconds(1), next)
                if now > .seconds(30) { return }
                host.advance(to: now)
                accessory.advance(to: now)
            }
        }
    }

    /// A few more steps so that the last answers arrive.
    private mutating func settle() {
        for _ in 0..<8 { _ = step() }
    }

    /// Moves what is waiting each way; false when nothing was.
    private mutating func step() -> Bool {
        var moved = false
        for frame in host.takeOutput() {
            wireBytes += frame
            accessory.receive(frame, now: now)
            moved = true
        }
        for frame in accessory.takeOutput() {
            accessoryBytes += frame
            wireBytes += frame
            host.receive(frame, now: now)
            moved = true
        }
        hostEvents += host.takeEvents()
        accessoryEvents += accessory.takeEvents()
        return moved
    }
}
