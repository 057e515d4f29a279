import IAPWire
import Testing
import TestSupport

@Suite("Control-session messages")
struct ControlMessageTests {
    @Test func startIdentificationIsEmpty() throws {
        let message = try ControlMessage.decode(bytes("40 40 00 06 1D 00"))
        #expect(message.id == .startIdentification)
        #expect(message.parameters.isEmpty)
        #expect(try ControlMessage(id: .startIdentification).encoded() == bytes("40 40 00 06 1D 00"))
    }

    @Test func startExternalAccessoryProtocolSession() throws {
        let wire = bytes("40 40 00 11 EA 00 00 05 00 00 B1 00 06 00 01 00 01")
        let message = try ControlMessage.decode(wire)
        #expect(message.id == .startExternalAccessoryProtocolSession)
        #expect(try message.parameter(0)?.uint8() == 0xB1)
        #expect(try message.parameter(1)?.uint16() == 1)
        let built = ControlMessage(id: .startExternalAccessoryProtocolSession, parameters: [.uint8(0, 0xB1), .uint16(1, 1)])
        #expect(try built.encoded() == wire)
    }

    @Test func statusExternalAccessoryProtocolSession() throws {
        let wire = bytes("40 40 00 11 EA 03 00 06 00 00 00 01 00 05 00 01 00")
        let message = try ControlMessage.decode(wire)
        #expect(message.id == .statusExternalAccessoryProtocolSession)
        #expect(try message.parameter(0)?.uint16() == 1)
        #expect(try message.parameter(1)?.uint8() == 0)
    }

    /// An IdentificationInformation built like the BOYA capture (PROTOCOL.md §3.3), through
    /// every typed writer and reader.
    static let identification = ControlMessage(id: .identificationInformation, parameters: [
        .string(0, "Microphone"), .string(1, "BOYA mini 2"), .string(2, "Shenzhen jiayz photo industrial ltd"),
        .string(3, "CFD7387E79"), .string(34, "25964b2d38e94eee"), .string(4, "1.1.0"), .string(5, "1.1.0"),
        .uint16List(6, [0xAE00, 0xAE02, 0xAE03]), .uint16List(7, [0xAE01, 0xEA00, 0xEA01]),
        .uint8(8, 2), .uint16(9, 100),
        .group(10, [.uint8(0, 0xB1), .string(1, "BOYA.DeviceLink.com"), .uint8(2, 0)]),
        .string(12, "en"), .string(13, "en"),
        .group(16, [.uint16(0, 1), .string(1, "iAP2H"), .flag(2)]),
    ])

    @Test func identificationRoundTrip() throws {
        let wire = try Self.identification.encoded()
        #expect(wire.count == Self.identification.encodedLength)
        #expect(Array(wire[0..<2]) == [0x40, 0x40])
        #expect(Int(wire[2]) << 8 | Int(wire[3]) == wire.count)
        let decoded = try ControlMessage.decode(wire)
        #expect(decoded == Self.identification)
        #expect(try decoded.parameter(2)?.string() == "Shenzhen jiayz photo industrial ltd")
        #expect(try decoded.parameter(6)?.uint16List() == [0xAE00, 0xAE02, 0xAE03])
        #expect(try decoded.parameter(9)?.uint16() == 100)
        let protocolGroup = try #require(try decoded.parameter(10)?.group())
        #expect(try protocolGroup.first { $0.id == 1 }?.string() == "BOYA.DeviceLink.com")
        #expect(protocolGroup.allSatisfy { $0.depth == 1 })
        let transport = try #require(try decoded.parameter(16)?.group())
        #expect(transport.first { $0.id == 2 }?.isFlag == true)
    }

    @Test func repeatedParametersKeepTheirOrder() throws {
        let message = ControlMessage(id: .identificationInformation, parameters: [
            .string(13, "en"), .string(0, "x"), .string(13, "de"), .string(13, "ja"),
        ])
        let decoded = try ControlMessage.decode(try message.encoded())
        #expect(try decoded.parameters(13).map { try $0.string() } == ["en", "de", "ja"])
    }

    @Test func typedReadersAndWriters() throws {
        #expect(try Parameter.uint32(1, 0xDEADBEEF).uint32() == 0xDEADBEEF)
        #expect(try Parameter.uint64(1, 0x0102_0304_0506_0708).uint64() == 0x0102_0304_0506_0708)
        #expect(try Parameter.bool(1, true).bool())
        #expect(try !Parameter.bool(1, false).bool())
        #expect(Parameter.string(1, "é").data == [0xC3, 0xA9, 0x00])
        #expect(try Parameter.blob(1, [0xC3, 0xA9]).string() == "é") // a missing NUL is tolerated
        #expect(Parameter.flag(9).isFlag)
    }

    @Test func typedReadersRejectWrongSizes() {
        #expect(throws: WireError.wrongParameterSize(parameterID: 3, expected: "uint16", actual: 3)) {
            try Parameter.blob(3, [1, 2, 3]).uint16()
        }
        #expect(throws: WireError.wrongParameterSize(parameterID: 3, expected: "uint8", actual: 0)) { try Parameter.flag(3).uint8() }
        #expect(throws: WireError.wrongParameterSize(parameterID: 6, expected: "uint16 list", actual: 3)) {
            try Parameter.blob(6, [1, 2, 3]).uint16List()
        }
        #expect(throws: WireError.invalidString(parameterID: 0, reason: "not valid UTF-8")) {
            try Parameter.blob(0, [0xC3, 0x28, 0x00]).string()
        }
        #expect(throws: WireError.invalidString(parameterID: 0, reason: "NUL byte before the end")) {
            try Parameter.blob(0, [0x41, 0x00, 0x42, 0x00]).string()
        }
    }

    @Test func groupsNestToTheLimitAndNoFurther() throws {
        // depth 0 → 1 → 2 → 3 → 4 is allowed by default; one more level is refused.
        var innermost = Parameter.uint8(0, 42)
        for level in 0..<4 { innermost = .group(UInt16(level + 1), [innermost]) }
        let message = ControlMessage(id: MessageID(0x1234), parameters: [innermost])
        let decoded = try ControlMessage.decode(try message.encoded())
        var current = try #require(decoded.parameters.first)
        for _ in 0..<4 { current = try #require(try current.group().first) }
        #expect(current.depth == 4)
        #expect(try current.uint8() == 42)

        let tooDeep = Parameter.group(9, [.uint8(0, 1)])
        let deep = Parameter(id: 9, data: tooDeep.data, depth: 4)
        #expect(throws: WireError.groupNestingTooDeep(parameterID: 9, limit: 4)) { try deep.group() }
        #expect(throws: WireError.groupNestingTooDeep(parameterID: 9, limit: 2)) {
            try Parameter(id: 9, data: tooDeep.data, depth: 2).group(maxDepth: 2)
        }
    }

    @Test func malformedMessages() {
        #expect(throws: WireError.badSync(what: "control message", expected: [0x40, 0x40], found: [0x40, 0x41])) {
            try ControlMessage.decode(bytes("40 41 00 06 1D 00"))
        }
        #expect(throws: WireError.invalidLength(what: "control message", length: 5, allowed: "6 to 65535")) {
            try ControlMessage.decode(bytes("40 40 00 05 1D 00"))
        }
        #expect(throws: WireError.lengthMismatch(what: "control message", declared: 16, actual: 6)) {
            try ControlMessage.decode(bytes("40 40 00 10 1D 00"))
        }
        #expect(throws: WireError.truncated(what: "control message header", needed: 6, available: 3)) {
            try ControlMessage.decode(bytes("40 40 00"))
        }
        // A parameter whose length is below its own header, and one that runs past the message.
        #expect(throws: WireError.invalidLength(what: "parameter 0", length: 3, allowed: "4 to 65535")) {
            try ControlMessage.decode(bytes("40 40 00 0A EA 01 00 03 00 00"))
        }
        #expect(throws: WireError.lengthMismatch(what: "parameter 0", declared: 8, actual: 5)) {
            try ControlMessage.decode(bytes("40 40 00 0B EA 01 00 08 00 00 01"))
        }
        #expect(throws: WireError.truncated(what: "parameter header", needed: 4, available: 2)) {
            try ControlMessage.decode(bytes("40 40 00 08 EA 01 00 04"))
        }
        // Trailing bytes after one complete message.
        #expect(throws: WireError.lengthMismatch(what: "control message", declared: 6, actual: 7)) {
            try ControlMessage.decode(bytes("40 40 00 06 1D 00 00"))
        }
    }

    @Test func twoMessagesInOnePayload() throws {
        let payload = bytes("40 40 00 06 1D 00 40 40 00 06 AA 05")
        let (first, length) = try ControlMessage.decode(prefixOf: payload.span.bytes)
        #expect(first.id == .startIdentification)
        let second = try ControlMessage.decode(payload.span.bytes.extracting(length..<payload.count))
        #expect(second.id == .authenticationSucceeded)
    }

    @Test func oversizedMessagesAreRefused() {
        let big = ControlMessage(id: .authenticationCertificate, parameters: [.blob(0, [UInt8](repeating: 1, count: 65_532))])
        #expect(throws: WireError.tooLong(what: "parameter 0", length: 65_536, maximum: 65_535)) { try big.encoded() }
        let many = ControlMessage(id: .authenticationCertificate, parameters: Array(repeating: .blob(0, [UInt8](repeating: 1, count: 40_000)), count: 2))
        #expect(throws: WireError.tooLong(what: "control message", length: 80_014, maximum: 65_535)) { try many.encoded() }
    }

    @Test func anOverlongMemberOfAGroupIsRefusedNotTruncated() {
        let member = Parameter.blob(7, [UInt8](repeating: 1, count: Parameter.maxDataLength + 1))
        var direct: [UInt8] = []
        #expect(throws: WireError.tooLong(what: "parameter 7", length: 65_536, maximum: 65_535)) { try member.encode(into: &direct) }
        #expect(direct.isEmpty)
        let nested = Parameter.group(10, [.group(11, [member])])
        var output: [UInt8] = []
        #expect(throws: WireError.tooLong(what: "parameter 10", length: 65_544, maximum: 65_535)) { try nested.encode(into: &output) }
        let message = ControlMessage(id: .identificationInformation, parameters: [nested])
        #expect(throws: WireError.tooLong(what: "parameter 10", length: 65_544, maximum: 65_535)) { try message.encoded() }
        let fits = Parameter.blob(7, [UInt8](repeating: 1, count: Parameter.maxDataLength))
        #expect(throws: Never.self) { try fits.encode(into: &output) }
        #expect(output.count == 65_535)
    }

    @Test func catalogue() {
        #expect(MessageID.identificationInformation.description == "IdentificationInformation")
        #expect(MessageID(0x4C01).description == "0x4C01")
        #expect(MessageCatalogue.family(of: MessageID(0x4C01)) == "MediaLibrary")
        #expect(MessageCatalogue.info(for: .powerUpdate)?.parameters[6]?.name == "BatteryChargeLevel")
        #expect(MessageCatalogue.info(for: .identificationRejected)?.parameters[10]?.type == .flag)
        #expect(MessageCatalogue.info(for: .identificationInformation)?.sender == .accessory)
        guard case let .group(sub)? = MessageCatalogue.identificationParameters[10]?.type else {
            Issue.record("SupportedExternalAccessoryProtocol is not a group")
            return
        }
        #expect(sub[3]?.name == "NativeTransportComponentIdentifier")
    }
}
