import IAPInspect
import IAPWire
import Testing
import TestSupport

/// The repository root, found from this file's path, for the shipped samples.
let repositoryRoot: String = {
    var parts = #filePath.split(separator: "/", omittingEmptySubsequences: false)
    parts.removeLast(3) // Tests/IAPInspectTests/IAPInspectTests.swift
    return parts.joined(separator: "/")
}()

func readSample(_ name: String) throws -> [UInt8] {
    let text = try #require(readText(repositoryRoot + "/tools/data/samples/" + name), "sample \(name) is missing")
    return try HexInput.parse(text)
}

func readText(_ path: String) -> String? {
    guard let file = fopen(path, "r") else { return nil }
    defer { fclose(file) }
    var bytes: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 4_096)
    while true {
        let count = buffer.withUnsafeMutableBytes { fread($0.baseAddress, 1, $0.count, file) }
        if count == 0 { break }
        bytes += buffer[0..<count]
    }
    return String(decoding: bytes, as: UTF8.self)
}

#if canImport(Glibc)
import Glibc
#endif

@Suite("Hex input")
struct HexInputTests {
    @Test func acceptsTheUsualSpellings() throws {
        #expect(try HexInput.parse("FF 5A 00 09") == [0xFF, 0x5A, 0x00, 0x09])
        #expect(try HexInput.parse("ff5a\n0009") == [0xFF, 0x5A, 0x00, 0x09])
        #expect(try HexInput.parse("0xFF, 0x5A,0x00 0X09") == [0xFF, 0x5A, 0x00, 0x09])
        #expect(try HexInput.parse("ff:5a-00\t09\r\n") == [0xFF, 0x5A, 0x00, 0x09])
        #expect(try HexInput.parse("# a comment 12\nFF // another 34\n5A") == [0xFF, 0x5A])
        #expect(try HexInput.parse("") == [])
    }

    @Test func rejectsWithAPosition() {
        #expect(throws: HexInput.ParseError(line: 2, column: 4, reason: "'z' is not a hex digit")) { try HexInput.parse("FF\n5A z") }
        #expect(throws: HexInput.ParseError(line: 1, column: 4, reason: "a lone hex digit; bytes take two digits")) {
            try HexInput.parse("FF 5 A0")
        }
        #expect(throws: HexInput.ParseError(line: 1, column: 7, reason: "a lone hex digit; bytes take two digits")) {
            try HexInput.parse("FF 5A 0")
        }
    }

    @Test func textOrBinary() {
        #expect(HexInput.looksLikeText(Array("FF 5A\n".utf8)))
        #expect(!HexInput.looksLikeText([0xFF, 0x5A, 0x00, 0x09]))
        #expect(!HexInput.looksLikeText([0x55, 0x04, 0x00, 0x38]))
        #expect(!HexInput.looksLikeText([]))
    }

    @Test func format() {
        #expect(HexInput.format([0x0A, 0xFF]) == "0A FF")
        #expect(HexInput.format([0x0A, 0xFF], separator: "") == "0AFF")
    }
}

@Suite("JSON")
struct JSONValueTests {
    @Test func serialisesInBuildOrderAndEscapes() {
        let value = JSONValue.object([
            ("kind", .string("iap2")), ("n", .int(-3)), ("ok", .bool(true)), ("none", .null),
            ("list", .array([.int(1), .string("a\"b\\c\n\u{01}é")])),
        ])
        #expect(value.serialized() == #"{"kind":"iap2","n":-3,"ok":true,"none":null,"list":[1,"a\"b\\c\n\u0001é"]}"#)
        #expect(JSONValue.string("\u{7F}\u{9B}\u{202E}\u{2028}é").serialized() == #""\u007f\u009b\u202e\u2028é""#)
        #expect(value["n"] == .int(-3))
        #expect(value["missing"] == nil)
    }
}

@Suite("Frame reports")
struct FrameReportTests {
    @Test func samplesDecodeClean() throws {
        for name in ["boya-handshake.hex", "dji-syn.hex", "iap1-idps.hex"] {
            let result = CaptureDecoder.decode(try readSample(name))
            #expect(result.isClean, "\(name)")
            #expect(result.frames == result.reports.count)
        }
    }

    @Test func djiSynShowsEveryField() throws {
        let result = CaptureDecoder.decode(try readSample("dji-syn.hex"))
        let report = try #require(result.reports.first)
        #expect(report.summary == "iAP2 SYN seq=0x00 ack=0x00 sid=0  23 bytes, payload 13, checksums ok (header 0x10, payload 0xDD)")
        #expect(report.details == [
            "link parameters: version 1, max outstanding 5, max packet length 1024, retransmission timeout 2000 ms, "
                + "cumulative ACK timeout 20 ms, max retransmissions 30, max cumulative ACKs 5",
            "session 10: control v1",
        ])
        let parameters = try #require(report.json["linkParameters"])
        #expect(parameters["retransmissionTimeout"] == .int(2000))
        #expect(parameters["violations"] == .array([]))
    }

    @Test func sessionTypesLearnedFromTheSynSeparateEAData() throws {
        // SYN with control session 1 and EA session 2, then EA data on session 2.
        let syn = try LinkPacket.encode(control: .syn, sequence: 1, acknowledgement: 0, sessionID: 0,
                                        payload: bytes("01 05 04 00 13 88 00 FF 1E 03 01 00 01 02 02 01"))
        let data = try LinkPacket.encode(control: .ack, sequence: 2, acknowledgement: 0, sessionID: 2,
                                         payload: [0x00, 0x07] + Array("hello".utf8))
        let result = CaptureDecoder.decode(syn + data)
        #expect(result.reports.count == 2)
        #expect(result.reports[1].details == ["EA session 7: 5 bytes: 68 65 6C 6C 6F"])
        #expect(result.reports[1].json["sessionType"] == .string("external-accessory"))
        #expect(result.reports[1].json["eaSession"] == .int(7))
    }

    @Test("a control message spread over several packets is joined (the Clicks keyboard, PROTOCOL.md §7.7)")
    func controlMessageInParts() throws {
        let syn = try LinkPacket.encode(control: .syn, sequence: 1, acknowledgement: 0, sessionID: 0,
                                        payload: bytes("01 05 04 00 13 88 00 FF 1E 03 0A 00 01"))
        let message = ControlMessage(id: .identificationInformation, parameters: [.string(0, "Keyboard"), .blob(99, Array(repeating: 0x5A, count: 300))])
        let encoded = try message.encoded()
        var stream = syn
        var sequence: UInt8 = 2
        for start in stride(from: 0, to: encoded.count, by: 128) {
            stream += try LinkPacket.encode(control: .ack, sequence: sequence, acknowledgement: 0, sessionID: 10,
                                            payload: Array(encoded[start..<min(encoded.count, start + 128)]))
            sequence += 1
            if start == 128 {
                // The other side's whole message between two parts does not end it.
                stream += try LinkPacket.encode(control: .ack, sequence: 9, acknowledgement: sequence, sessionID: 10,
                                                payload: try ControlMessage(id: .startIdentification).encoded())
            }
        }
        let result = CaptureDecoder.decode(stream)
        #expect(result.isClean)
        let details = result.reports.flatMap(\.details)
        #expect(details.contains("IdentificationInformation (0x1D01), part 1: 128 of the \(encoded.count) bytes its header declares; the rest in the next packets"))
        #expect(details.contains("IdentificationInformation (0x1D01), part 2: 256 of \(encoded.count) bytes"))
        #expect(details.contains("IdentificationInformation (0x1D01), part 3, the last: joined from 3 packets"))
        #expect(details.contains("  [0] Name: \"Keyboard\""))
        #expect(!details.contains { $0.contains("declares") && $0.contains("present") })
        #expect(result.reports.contains { $0.json["part"]?["index"] == .int(3) })
    }

    @Test func identificationInformationInHumanTerms() throws {
        let message = ControlMessage(id: .identificationInformation, parameters: [
            .string(0, "Microphone"), .uint16List(6, [0xAE00, 0xAE02]), .uint8(8, 2),
            .group(10, [.uint8(0, 0xB1), .string(1, "BOYA.DeviceLink.com"), .uint8(2, 0)]),
            .group(16, [.uint16(0, 1), .string(1, "iAP2H"), .flag(2)]),
            .blob(99, [1, 2]), .blob(1, [0xC3, 0x28]),
        ])
        #expect(FrameInspector.describe(message) == [
            "IdentificationInformation (0x1D01) from accessory, 7 parameters",
            "  [0] Name: \"Microphone\"",
            "  [6] MessagesSentByAccessory: 0xAE00 StartPowerUpdates, 0xAE02 StopPowerUpdates",
            "  [8] PowerProvidingCapability: 2 Advanced",
            "  [10] SupportedExternalAccessoryProtocol:",
            "    [0] ExternalAccessoryProtocolIdentifier: 177 (0xB1)",
            "    [1] ExternalAccessoryProtocolName: \"BOYA.DeviceLink.com\"",
            "    [2] ExternalAccessoryProtocolMatchAction: 0 NoAction",
            "  [16] USBHostTransportComponent:",
            "    [0] TransportComponentIdentifier: 1 (0x0001)",
            "    [1] TransportComponentName: \"iAP2H\"",
            "    [2] TransportSupportsiAP2Connection: (flag)",
            "  [99] unknown: 2 bytes: 01 02",
            "  [1] ModelIdentifier: C3 28 (parameter 1 is not a valid string: not valid UTF-8)",
        ])
        let json = FrameInspector.json(message)
        #expect(json["name"] == .string("IdentificationInformation"))
    }

    @Test func droppedCandidatesSayWhichFieldIsWrong() {
        var packet = bytes("FF 5A 00 10 40 41 01 01 14 40 40 00 06 1D 00 5D")
        packet[15] = 0x5E
        let result = CaptureDecoder.decode(packet)
        #expect(!result.isClean)
        #expect(result.reports.first?.summary == "dropped 1 byte: bad iAP2 payload checksum")
        #expect(result.reports.first?.details.first == "iAP2 link payload checksum is wrong: expected 5D, found 5E")
        #expect(result.droppedBytes == packet.count)
    }

    @Test func anIncompleteTailIsReported() {
        let result = CaptureDecoder.decode(bytes("FF 5A 00 10 40 41 01 01 14 40 40"))
        #expect(result.incompleteBytes == 11)
        #expect(result.reports.last?.json["kind"] == .string("incomplete"))
        #expect(result.reports.last?.details.first == "iAP2 link packet is truncated: needs 16 bytes, only 11 present")
    }

    @Test func transactionIDModes() throws {
        let startIDPS = bytes("55 04 00 38 00 00 C4")
        let ack = bytes("55 06 00 02 00 00 00 38 C0")
        let auto = CaptureDecoder.decode(startIDPS + ack)
        #expect(auto.reports[1].json["transactionID"] == .int(0))
        #expect(auto.reports[1].details == ["status 0x00 Success for command 0x38 StartIDPS"])
        let off = CaptureDecoder.decode(ack, transactionIDs: .off)
        #expect(off.reports[0].json["transactionID"] == .null)
        let reply = CaptureDecoder.decode(IAP2Detect.iap1Reply)
        #expect(reply.reports[0].details.contains("this is the iAP1 answer to the iAP2 detect: the peer does not speak iAP2"))
    }

    @Test func iap1IdentificationAndAuthenticationInHumanTerms() throws {
        let tokens = try FIDToken.encodeList([
            FIDToken(type: 0, subtype: 0, data: [1, 0x00, 0, 0, 0, 2, 0, 0, 2, 0]),
            FIDToken(type: 0, subtype: 2, data: [0x01] + Array("AV Receiver".utf8) + [0]),
            FIDToken(type: 0, subtype: 2, data: [0x04, 1, 0, 3]),
            FIDToken(type: 0, subtype: 4, data: [1] + Array("com.acme.remote".utf8) + [0]),
        ])
        let packets = [
            bytes("55 04 00 38 00 00 C4"), // StartIDPS, transaction 0: ids on
            try IAP1Packet(lingo: 0, command: 0x39, transactionID: 1, payload: tokens).encoded(sync: false),
            try IAP1Packet(lingo: 0, command: 0x3A, transactionID: 1,
                           payload: FIDTokenAck.encodeList([FIDTokenAck(type: 0, subtype: 0, status: 0, extra: [0]),
                                                            FIDTokenAck(type: 0, subtype: 4, status: 1, extra: [1])])).encoded(sync: false),
            try IAP1Packet(lingo: 0, command: 0x15, transactionID: 2, payload: [2, 0, 3, 7] + [UInt8](repeating: 0x30, count: 128)).encoded(),
            try IAP1Packet(lingo: 0, command: 0x17, transactionID: 3, payload: [UInt8](repeating: 0xAB, count: 20) + [1]).encoded(),
        ]
        let result = CaptureDecoder.decode(packets.flatMap { $0 })
        #expect(result.isClean)
        #expect(result.reports[1].details == [
            "4 tokens",
            "token 00:00 IdentifyToken: lingoes General, options 0x00000002",
            "token 00:02 AccessoryInfoToken: name \"AV Receiver\"",
            "token 00:02 AccessoryInfoToken: firmware version 1.0.3",
            "token 00:04 EAProtocolToken: protocol 1 \"com.acme.remote\"",
        ])
        #expect(result.reports[2].details == ["2 acks", "IdentifyToken (00): accepted", "EAProtocolToken (01): required token failed"])
        #expect(result.reports[3].details == ["authentication 2.0, certificate section 3 of 0…7, 128 bytes"])
        #expect(result.reports[4].details == ["challenge 20 bytes, retry counter 1"])
        #expect(result.reports[4].summary.contains("GetAccessoryAuthenticationSignature (0x17) trans=0x0003"))
    }

    @Test func aLyingTokenListIsReportedNotTrusted() throws {
        let packet = try IAP1Packet(lingo: 0, command: 0x39, payload: [2, 0x40, 0x00, 0x02, 0x01]).encoded()
        let result = CaptureDecoder.decode(packet, transactionIDs: .off)
        #expect(result.reports.first?.details.first?.hasPrefix("malformed token list: ") == true)
    }

    @Test func accessoryStringsAreEscapedForPeopleAndExactInJSON() throws {
        // A name that would retitle the terminal, clear it and forge a line; a protocol name
        // with a right-to-left override.
        let name = "Evil\u{1B}]0;pwned\u{07}\u{1B}[2J\nfake line"
        let message = ControlMessage(id: .identificationInformation, parameters: [
            .string(0, name), .group(10, [.uint8(0, 1), .string(1, "com.acme\u{202E}lmth"), .uint8(2, 0)]),
        ])
        let packet = try LinkPacket.encode(control: .ack, sequence: 1, acknowledgement: 0, sessionID: 1, payload: try message.encoded())
        let tokens = try FIDToken.encodeList([FIDToken(type: 0, subtype: 2, data: [0x01] + Array("AV\u{9B}2J\r".utf8) + [0])])
        let iap1 = try IAP1Packet(lingo: 0, command: 0x39, payload: tokens).encoded()
        let result = CaptureDecoder.decode(packet + iap1, transactionIDs: .off)
        #expect(result.isClean)
        let text = result.reports.map { $0.text() }.joined(separator: "\n")
        #expect(text.contains(#"[0] Name: "Evil\u{1b}]0;pwned\u{7}\u{1b}[2J\nfake line""#))
        #expect(text.contains(#"[1] ExternalAccessoryProtocolName: "com.acme\u{202e}lmth""#))
        #expect(text.contains(#"AccessoryInfoToken: name "AV\u{9b}2J\r""#))
        #expect(!text.unicodeScalars.contains { $0 == "\u{1B}" || $0 == "\u{9B}" || $0 == "\u{202E}" || $0 == "\r" })
        #expect(text.split(separator: "\n").allSatisfy { !$0.hasPrefix("fake") })
        // The JSON keeps the exact string; its encoder escapes the controls.
        guard case let .array(messages) = try #require(result.reports.first?.json["messages"]),
              case let .array(parameters) = try #require(messages.first?["parameters"]) else {
            Issue.record("no parameters in the JSON report")
            return
        }
        #expect(parameters.first?["value"] == .string(name))
        #expect(result.reports[0].json.serialized().contains(#""value":"Evil\u001b]0;pwned\u0007\u001b[2J\nfake line""#))
    }

    @Test func garbageBetweenFrames() {
        let result = CaptureDecoder.decode([0x01, 0x02, 0x03] + IAP2Detect.bytes)
        #expect(result.reports.map(\.summary) == ["dropped 3 bytes: garbage", "detect  FF 55 02 00 EE 10  (iAP2 detect sequence)"])
    }
}

func bytes(_ hex: String) -> [UInt8] {
    (try? HexInput.parse(hex)) ?? []
}
