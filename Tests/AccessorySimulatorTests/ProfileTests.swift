import AccessorySimulator
import Foundation
import IAPLink
import Testing

/// The package root, from this file's path (Tests/AccessorySimulatorTests/ProfileTests.swift).
private func packageRoot() -> String {
    var parts = #filePath.split(separator: "/", omittingEmptySubsequences: false)
    parts.removeLast(3)
    return parts.joined(separator: "/")
}

/// Writes `text` to a fresh temporary file and returns its path.
private func temporaryFile(_ text: String, name: String) throws -> String {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("simprofile-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    let url = directory.appendingPathComponent(name)
    try Data(text.utf8).write(to: url)
    return url.path
}

private let validJSON = """
{
  "identity": { "name": "N", "model": "M", "manufacturer": "Acme", "serialNumber": "S1",
                "firmwareVersion": "1.0", "hardwareVersion": "A" },
  "protocols": [ { "name": "com.acme.echo", "behaviour": "echo" } ]
}
"""

@Suite("Simulator profiles")
struct ProfileTests {
    @Test("the shipped JSON profiles decode to the built-ins")
    func shippedProfilesMatchBuiltIns() throws {
        #expect(SimulatorProfile.builtInNames == ["borescope", "firmware-updater", "keyboard-case", "legacy-sensor", "multi-sensor", "native-streamer",
                                                  "photo-printer", "telepresence-robot", "thermal-camera"])
        for name in SimulatorProfile.builtInNames {
            let loaded = try SimulatorProfile.load(path: packageRoot() + "/tools/data/profiles/\(name).json")
            #expect(loaded == (try SimulatorProfile.named(name)), "tools/data/profiles/\(name).json differs from the built-in")
        }
        #expect(SimulatorProfile.builtIn(named: "toaster") == nil)
    }

    @Test("the fault profiles (tools/data/profiles/faults) load, each with its fault, message ids as hex or numbers")
    func faultProfiles() throws {
        let directory = packageRoot() + "/tools/data/profiles/faults/"
        let gap = try SimulatorProfile.load(path: directory + "sequence-gap.json")
        #expect(gap.faults.losesFrames == [5])
        #expect(gap.deviations == [.splitControlMessages, .neverRetransmits])
        #expect(try SimulatorProfile.load(path: directory + "certificate-never-sent.json").faults.ignoresMessages == [0xAA00])
        #expect(try SimulatorProfile.load(path: directory + "session-never-answered.json").faults.ignoresMessages == [0xEA00])
        #expect(try SimulatorProfile.load(path: directory + "identification-refused.json").deviations == [.missingRequiredParameter])
        #expect(try SimulatorProfile.load(path: directory + "leaves-the-bus.json").faults.vanishAfterBytes == 1)
        let numbers = validJSON.replacingOccurrences(of: "\"protocols\": [", with: "\"faults\": { \"ignoresMessages\": [43520] }, \"protocols\": [")
        #expect(try SimulatorProfile.decode(Array(numbers.utf8)).faults.ignoresMessages == [0xAA00])
        var legacy = try SimulatorProfile.named("legacy-sensor")
        legacy.faults.ignoresMessages = [0xAA00]
        #expect(throws: SimulatorProfileError.self) { try legacy.validate() }
    }

    @Test("an iAP1 profile refuses what iAP1 cannot do: native protocols, dropped or corrupted packets")
    func iap1ProfileLimits() throws {
        var profile = try SimulatorProfile.named("legacy-sensor")
        #expect(profile.iap1 == .init(identification: .idps, waitsForDevice: false))
        profile.faults.dropRate = 0.1
        #expect(throws: SimulatorProfileError.self) { try profile.validate() }
        profile.faults.dropRate = 0
        profile.protocols[0].native = true
        #expect { try profile.validate() } throws: { error in
            (error as? SimulatorProfileError)?.field == "protocols[0].native"
        }
        let bad = Array(#"{"identity":{"name":"a","model":"b","manufacturer":"c","serialNumber":"d","firmwareVersion":"1","hardwareVersion":"1"},"protocols":[{"name":"x","behaviour":"echo"}],"iap1":{"identification":"smoke-signals"}}"#.utf8)
        #expect { try SimulatorProfile.decode(bad) } throws: { error in
            (error as? SimulatorProfileError)?.description.contains("idps, device-lingoes") == true
        }
    }

    @Test("the built-ins have the documented protocols")
    func builtInContents() throws {
        let updater = try SimulatorProfile.named("firmware-updater")
        #expect(updater.protocols == [.init(name: "com.example.firmware", behaviour: .firmwareUpdate)])
        #expect(updater.rebootDelayMs == 200)
        #expect(updater.link == .init(maxPacketLength: 65_535, maxOutstandingPackets: 16, cumulativeAckTimeoutMs: 10))
        let sensor = try SimulatorProfile.named("multi-sensor")
        #expect(sensor.protocols.map(\.name) == ["com.example.echo", "com.example.sink", "com.example.source", "com.example.telemetry"])
        #expect(sensor.protocols.map(\.behaviour) == [.echo, .sink, .source, .echo])
        #expect(sensor.protocols[2].sourceBytes == 1 << 20)
    }

    @Test("identity() declares the profile's strings, the message lists and protocols 1…n")
    func identityMapping() throws {
        let profile = try SimulatorProfile.named("multi-sensor")
        let identity = profile.identity()
        #expect(identity.name == "Multi Sensor")
        #expect(identity.modelIdentifier == "SIM-MS1")
        #expect(identity.manufacturer == "AccessoryHost Simulator")
        #expect(identity.serialNumber == "SIM-MS-0001")
        #expect(identity.firmwareVersion == "2.1.0")
        #expect(identity.hardwareVersion == "B")
        #expect(identity.protocols.map(\.identifier) == [1, 2, 3, 4])
        #expect(identity.protocols.map(\.name) == profile.protocols.map(\.name))
        for id: UInt16 in [0xAE00, 0xEA03] { #expect(identity.messagesSent.contains(id)) }
        for id: UInt16 in [0xAE01, 0xEA00, 0xEA01] { #expect(identity.messagesReceived.contains(id)) }
        #expect(throws: Never.self) { try AccessoryIdentity.validate(identity.message).get() }
    }

    @Test("link overrides replace the accessory defaults, the rest stays")
    func linkOverrides() throws {
        var profile = try SimulatorProfile.named("multi-sensor")
        #expect(profile.linkConfiguration().parameters == LinkConfiguration.accessory.parameters)
        #expect(profile.linkConfiguration().interByteGap == LinkConfiguration.defaultInterByteGap)
        profile.link = .init(maxPacketLength: 2_048, maxOutstandingPackets: 4, retransmissionTimeoutMs: 250, cumulativeAckTimeoutMs: 15,
                             interByteGapMs: 2_000)
        #expect(profile.linkConfiguration().interByteGap == .seconds(2))
        let parameters = profile.linkConfiguration().parameters
        #expect(parameters.maxPacketLength == 2_048)
        #expect(parameters.maxOutstandingPackets == 4)
        #expect(parameters.retransmissionTimeout == 250)
        #expect(parameters.cumulativeAckTimeout == 15)
        #expect(parameters.maxRetransmissions == LinkConfiguration.accessory.parameters.maxRetransmissions)
        #expect(parameters.sessions == LinkConfiguration.accessory.parameters.sessions)
    }

    @Test("optional parts decode to their defaults, and a full profile survives encoding")
    func defaultsAndRoundTrip() throws {
        let minimal = try SimulatorProfile.decode(Array(validJSON.utf8))
        #expect(minimal.rebootDelayMs == 200)
        #expect(minimal.faults == .init())
        #expect(!minimal.faults.isActive)
        #expect(minimal.link == .init())

        var full = try SimulatorProfile.named("multi-sensor")
        full.link = .init(maxPacketLength: 1_024, retransmissionTimeoutMs: 100)
        full.rebootDelayMs = 50
        full.faults = .init(dropRate: 0.25, corruptRate: 0.125, delayMs: 3, stopReadingAfterBytes: 10, vanishAfterBytes: 20, seed: 99)
        let encoded = try JSONEncoder().encode(full)
        #expect(try SimulatorProfile.decode(Array(encoded)) == full)
        #expect(full.withFirmwareVersion("9.9").accessory.firmwareVersion == "9.9")
        #expect(full.withFirmwareVersion("9.9").protocols == full.protocols)
    }

    @Test("a bad file is rejected with the file and the field named")
    func loaderNamesFileAndField() throws {
        let path = try temporaryFile(validJSON.replacingOccurrences(of: "\"echo\" }", with: "\"mirror\" }"), name: "bad.json")
        do {
            _ = try SimulatorProfile.load(path: path)
            Issue.record("a profile with behaviour 'mirror' was accepted")
        } catch {
            #expect(error.file == path)
            #expect(error.field == "protocols[0].behaviour")
            #expect(error.description.contains(path))
            #expect(error.description.contains("protocols[0].behaviour"))
            #expect(error.description.contains("echo, sink, source, firmware-update"))
        }
    }

    @Test("every kind of mistake names its field", arguments: [
        ("\"serialNumber\": \"S1\",", "", "identity.serialNumber", "missing"),
        ("\"protocols\": [", "\"faults\": { \"dropRat\": 0.1 }, \"protocols\": [", "faults.dropRat", "dropRate"),
        ("\"protocols\": [", "\"faults\": { \"delayMs\": \"5\" }, \"protocols\": [", "faults.delayMs", "whole number"),
        ("\"protocols\": [", "\"faults\": { \"dropRate\": 1.5 }, \"protocols\": [", "faults.dropRate", "0.0"),
        ("\"behaviour\": \"echo\" }", "\"behaviour\": \"echo\" }, { \"name\": \"s\", \"behaviour\": \"source\" }", "protocols[1].sourceBytes", "1048576"),
        ("\"behaviour\": \"echo\" }", "\"behaviour\": \"echo\", \"sourceBytes\": 5 }", "protocols[0].sourceBytes", "remove"),
        ("\"behaviour\": \"echo\" }", "\"behaviour\": \"echo\" }, { \"name\": \"com.acme.echo\", \"behaviour\": \"sink\" }", "protocols[1].name", "twice"),
        ("\"protocols\": [", "\"link\": { \"maxOutstandingPackets\": 0 }, \"protocols\": [", "link.maxOutstandingPackets", "1…127"),
        ("\"protocols\": [", "\"link\": { \"maxPacketLength\": 100 }, \"protocols\": [", "link.maxPacketLength", "at least"),
        ("\"protocols\": [", "\"rebootDelayMs\": -1, \"protocols\": [", "rebootDelayMs", "milliseconds"),
        ("\"name\": \"N\"", "\"name\": \"\"", "identity.name", "empty"),
        ("[ { \"name\": \"com.acme.echo\", \"behaviour\": \"echo\" } ]", "[]", "protocols", "at least one"),
        ("\"model\": \"M\"", "\"model\": 7", "identity.model", "text"),
        ("\"protocols\": [", "\"faults\": { \"losesFrames\": [0] }, \"protocols\": [", "faults.losesFrames[0]", "numbered from 1"),
        ("\"protocols\": [", "\"faults\": { \"ignoresMessages\": [\"0xZZ\"] }, \"protocols\": [", "faults.ignoresMessages[0]", "write it as hex"),
    ])
    func mistakesNameTheirField(replace: String, with replacement: String, field: String, hint: String) throws {
        let text = validJSON.replacingOccurrences(of: replace, with: replacement)
        #expect(text != validJSON, "the test's replacement did not apply")
        do {
            _ = try SimulatorProfile.decode(Array(text.utf8))
            Issue.record("accepted a profile with a bad \(field)")
        } catch {
            #expect(error.field == field, "\(error)")
            #expect(error.description.contains(hint), "\(error)")
        }
    }

    @Test("not JSON, and a missing file, are explained")
    func wholeFileProblems() throws {
        do {
            _ = try SimulatorProfile.decode(Array("{ \"identity\": ".utf8))
            Issue.record("accepted broken JSON")
        } catch {
            #expect(error.field == nil)
            #expect(error.description.contains("not valid JSON"))
        }
        let path = packageRoot() + "/tools/data/profiles/no-such-profile.json"
        do {
            _ = try SimulatorProfile.load(path: path)
            Issue.record("loaded a file that does not exist")
        } catch {
            #expect(error.file == path)
            #expect(error.description.contains("no such file"))
        }
    }

    @Test("a simulator refuses an invalid programmatic profile")
    func simulatorValidates() throws {
        var profile = try SimulatorProfile.named("multi-sensor")
        profile.faults.corruptRate = -0.5
        #expect(throws: SimulatorProfileError.self) { try SimulatedAccessory(profile: profile) }
    }
}

@Suite("CRC-32")
struct CRC32Tests {
    @Test("the IEEE 802.3 check value")
    func checkValue() {
        #expect(CRC32.checksum(Array("123456789".utf8)) == 0xCBF4_3926)
        #expect(CRC32.checksum([UInt8]()) == 0)
        #expect(CRC32.checksum([0]) == 0xD202_EF8D)
    }

    @Test("pieces give the same checksum as the whole")
    func incremental() {
        let data = testBytes(10_000, seed: 11)
        var crc = CRC32()
        var offset = 0
        for size in [1, 7, 100, 3_000, 5_000] where offset < data.count {
            crc.update(data[offset..<min(offset + size, data.count)])
            offset += size
        }
        crc.update(data[min(offset, data.count)...])
        #expect(crc.value == CRC32.checksum(data))
    }

    @Test("eight bytes at a time agree with one bit at a time, at every length and offset")
    func slicedMatchesBitwise() {
        func bitwise(_ bytes: some Sequence<UInt8>) -> UInt32 {
            var crc: UInt32 = 0xFFFF_FFFF
            for byte in bytes {
                crc ^= UInt32(byte)
                for _ in 0..<8 { crc = crc & 1 == 1 ? (crc >> 1) ^ 0xEDB8_8320 : crc >> 1 }
            }
            return crc ^ 0xFFFF_FFFF
        }
        let data = testBytes(300, seed: 12)
        for start in 0..<9 {
            for end in stride(from: start, through: data.count, by: 7) {
                let slice = data[start..<end] // contiguous: the eight-byte path, unaligned starts
                #expect(CRC32.checksum(slice) == bitwise(slice), "\(start)..<\(end)")
                // Not contiguous: the byte-at-a-time path.
                #expect(CRC32.checksum(slice.lazy.map { $0 }) == bitwise(slice), "lazy \(start)..<\(end)")
            }
        }
    }
}
