import TestSupport
import IAPWire
import Testing

@Suite("iAP2 link packets")
struct LinkPacketTests {
    struct Vector: Sendable, CustomTestStringConvertible {
        var name: String
        var hex: String
        var control: LinkControl
        var sequence: UInt8
        var acknowledgement: UInt8
        var sessionID: UInt8
        var payloadHex: String
        var testDescription: String { name }
    }

    static let synPayload = "01 05 04 00 13 88 00 FF 1E 03 01 00 01 02 02 01"

    /// Captured (BOYA) and computed (§2.7) packets from PROTOCOL.md.
    static let vectors: [Vector] = [
        Vector(name: "BOYA SYN", hex: "FF 5A 00 1A 80 01 10 00 FC " + synPayload + " 34",
               control: .syn, sequence: 0x01, acknowledgement: 0x10, sessionID: 0, payloadHex: synPayload),
        Vector(name: "BOYA SYN|ACK", hex: "FF 5A 00 1A C0 40 01 00 8C " + synPayload + " 34",
               control: [.syn, .ack], sequence: 0x40, acknowledgement: 0x01, sessionID: 0, payloadHex: synPayload),
        Vector(name: "BOYA ACK", hex: "FF 5A 00 09 40 01 40 00 1D",
               control: .ack, sequence: 0x01, acknowledgement: 0x40, sessionID: 0, payloadHex: ""),
        Vector(name: "StartIdentification", hex: "FF 5A 00 10 40 41 01 01 14 40 40 00 06 1D 00 5D",
               control: .ack, sequence: 0x41, acknowledgement: 0x01, sessionID: 1, payloadHex: "40 40 00 06 1D 00"),
        Vector(name: "StartExternalAccessoryProtocolSession",
               hex: "FF 5A 00 1B 40 43 04 01 04 40 40 00 11 EA 00 00 05 00 00 B1 00 06 00 01 00 01 C7",
               control: .ack, sequence: 0x43, acknowledgement: 0x04, sessionID: 1,
               payloadHex: "40 40 00 11 EA 00 00 05 00 00 B1 00 06 00 01 00 01"),
        Vector(name: "bare ACK", hex: "FF 5A 00 09 40 01 41 00 1C",
               control: .ack, sequence: 0x01, acknowledgement: 0x41, sessionID: 0, payloadHex: ""),
        Vector(name: "RequestAuthenticationCertificate", hex: "FF 5A 00 10 40 41 01 01 14 40 40 00 06 AA 00 D0",
               control: .ack, sequence: 0x41, acknowledgement: 0x01, sessionID: 1, payloadHex: "40 40 00 06 AA 00"),
        Vector(name: "EAK", hex: "FF 5A 00 0C 60 02 41 00 F8 43 44 79",
               control: [.ack, .eak], sequence: 0x02, acknowledgement: 0x41, sessionID: 0, payloadHex: "43 44"),
    ]

    @Test("encodes byte-exact", arguments: vectors)
    func encodes(_ vector: Vector) throws {
        let encoded = try LinkPacket.encode(control: vector.control, sequence: vector.sequence,
                                            acknowledgement: vector.acknowledgement, sessionID: vector.sessionID,
                                            payload: bytes(vector.payloadHex))
        #expect(encoded == bytes(vector.hex))
    }

    @Test("decodes byte-exact", arguments: vectors)
    func decodes(_ vector: Vector) throws {
        let (header, payload) = try LinkPacket.decode(bytes(vector.hex))
        #expect(header.control == vector.control)
        #expect(header.sequence == vector.sequence)
        #expect(header.acknowledgement == vector.acknowledgement)
        #expect(header.sessionID == vector.sessionID)
        #expect(header.packetLength == bytes(vector.hex).count)
        #expect(payload == bytes(vector.payloadHex))
    }

    @Test("finishes in place byte-exact", arguments: vectors)
    func finishesInPlace(_ vector: Vector) throws {
        let payload = bytes(vector.payloadHex)
        var slot = [UInt8](repeating: 0xCC, count: 9) + payload + [0xCC, 0xCC, 0xCC]
        var span = slot.mutableSpan
        var raw = span.mutableBytes
        let length = try LinkPacket.finish(in: &raw, control: vector.control, sequence: vector.sequence,
                                           acknowledgement: vector.acknowledgement, sessionID: vector.sessionID,
                                           payloadLength: payload.count)
        _ = consume raw
        _ = consume span
        #expect(Array(slot[..<length]) == bytes(vector.hex))
        #expect(slot[length...].allSatisfy { $0 == 0xCC })
    }

    @Test func finishRefusesASmallBuffer() {
        var slot = [UInt8](repeating: 0, count: 20)
        var span = slot.mutableSpan
        var raw = span.mutableBytes
        #expect(throws: WireError.truncated(what: "transmit buffer", needed: 21, available: 20)) {
            _ = try LinkPacket.finish(in: &raw, control: .ack, sequence: 0, acknowledgement: 0, sessionID: 1, payloadLength: 11)
        }
    }

    @Test func requiresAcknowledgement() throws {
        func header(_ control: LinkControl, payload: Int) -> LinkPacketHeader {
            LinkPacketHeader(control: control, sequence: 0, acknowledgement: 0, sessionID: 0, payloadLength: payload)
        }
        #expect(header(.syn, payload: 13).requiresAcknowledgement)
        #expect(header(.ack, payload: 6).requiresAcknowledgement)
        #expect(!header(.ack, payload: 0).requiresAcknowledgement)
        #expect(!header([.ack, .eak], payload: 2).requiresAcknowledgement)
    }

    @Test("header length field", arguments: [0, 1, 8, 9, 10, 11, 65_535])
    func lengthField(length: Int) throws {
        var packet: [UInt8] = [0xFF, 0x5A, UInt8(length >> 8), UInt8(length & 0xFF), 0x40, 0x01, 0x02, 0x00]
        packet.append(Checksum.of(packet))
        let result = Result { () throws(WireError) in try LinkPacketHeader.decode(packet.span.bytes) }
        switch length {
        case 9, 11...:
            #expect(try result.get().packetLength == length)
        default:
            #expect(throws: WireError.invalidLength(what: "iAP2 link packet", length: length, allowed: "9, or 11 to 65535")) {
                try result.get()
            }
        }
    }

    @Test func lengthBeyondTheBufferIsTruncation() {
        // A header that claims 65535 bytes in front of a 12-byte buffer.
        var packet: [UInt8] = [0xFF, 0x5A, 0xFF, 0xFF, 0x40, 0x01, 0x02, 0x01]
        packet.append(Checksum.of(packet))
        packet += [1, 2, 3]
        #expect(throws: WireError.truncated(what: "iAP2 link packet", needed: 65_535, available: 12)) {
            _ = try LinkPacket.decode(packet.span.bytes)
        }
    }

    @Test func badChecksums() {
        var packet = bytes("FF 5A 00 10 40 41 01 01 14 40 40 00 06 AA 00 D0")
        packet[8] = 0x15
        #expect(throws: WireError.badChecksum(what: "iAP2 link header", expected: 0x14, found: 0x15)) { try LinkPacket.decode(packet) }
        packet[8] = 0x14
        packet[15] = 0xD1
        #expect(throws: WireError.badChecksum(what: "iAP2 link payload", expected: 0xD0, found: 0xD1)) { try LinkPacket.decode(packet) }
        #expect(throws: WireError.badSync(what: "iAP2 link packet", expected: [0xFF, 0x5A], found: [0xFF, 0x55])) {
            try LinkPacket.decode(IAP2Detect.bytes + [0, 0, 0])
        }
        #expect(throws: WireError.truncated(what: "iAP2 link header", needed: 9, available: 4)) { try LinkPacket.decode([0xFF, 0x5A, 0, 9]) }
    }

    @Test func largestPayloadRoundTrips() throws {
        var generator = SplitMix64(seed: 7)
        let payload = (0..<LinkPacketHeader.maxPayloadLength).map { _ in UInt8.random(in: 0...255, using: &generator) }
        let packet = try LinkPacket.encode(control: .ack, sequence: 9, acknowledgement: 8, sessionID: 2, payload: payload)
        #expect(packet.count == 65_535)
        let (header, decoded) = try LinkPacket.decode(packet)
        #expect(header.payloadLength == payload.count)
        #expect(decoded == payload)
        #expect(throws: WireError.tooLong(what: "iAP2 link payload", length: 65_526, maximum: 65_525)) {
            _ = try LinkPacket.encode(control: .ack, sequence: 0, acknowledgement: 0, sessionID: 2, payload: payload + [0])
        }
    }

    @Test func controlDescription() {
        #expect(LinkControl([.syn, .ack]).description == "SYN|ACK")
        #expect(LinkControl(rawValue: 0x41).description == "ACK|0x01")
        #expect(LinkControl().description == "none")
    }

    @Test func extendedAcknowledgementMissing() {
        // Peer acked 0x41 and holds 0x43 and 0x44: 0x42 is missing.
        #expect(ExtendedAcknowledgement.missing(after: 0x41, received: [0x43, 0x44]) == [0x42])
        // Wrap-around: acked 0xFE, holds 0x01 → 0xFF and 0x00 are missing.
        #expect(ExtendedAcknowledgement.missing(after: 0xFE, received: [0x01]) == [0xFF, 0x00])
        // Entries at or before the ack, or absurdly far ahead, are ignored.
        #expect(ExtendedAcknowledgement.missing(after: 0x10, received: [0x10, 0x05, 0x95]) == [])
        #expect(ExtendedAcknowledgement.missing(after: 0x10, received: []) == [])
    }

    @Test func eaSessionData() throws {
        var payload: [UInt8] = []
        let data: [UInt8] = [9, 8, 7]
        EASessionData.encode(sessionID: 0x0102, data: data.span.bytes, into: &payload)
        #expect(payload == [0x01, 0x02, 9, 8, 7])
        let (id, range) = try EASessionData.decode(payload.span.bytes)
        #expect(id == 0x0102)
        #expect(range == 2..<5)
        #expect(throws: WireError.truncated(what: "EA session data", needed: 2, available: 1)) {
            let short: [UInt8] = [1]
            _ = try EASessionData.decode(short.span.bytes)
        }
    }
}

@Suite("SYN parameters")
struct LinkParametersTests {
    static let dji = bytes("01 05 04 00 07 D0 00 14 1E 05 0A 00 01")
    static let boya = bytes("01 05 04 00 13 88 00 FF 1E 03 01 00 01 02 02 01")

    @Test func djiParameters() throws {
        let parameters = try LinkParameters.decode(Self.dji)
        #expect(parameters == LinkParameters(version: 1, maxOutstandingPackets: 5, maxPacketLength: 1024,
                                             retransmissionTimeout: 2000, cumulativeAckTimeout: 20, maxRetransmissions: 30,
                                             maxCumulativeAcks: 5, sessions: [LinkSession(id: 0x0A, type: .control, version: 1)]))
        #expect(parameters.violations().isEmpty)
        #expect(parameters.encoded == Self.dji)
    }

    @Test func boyaParameters() throws {
        let parameters = try LinkParameters.decode(Self.boya)
        #expect(parameters.retransmissionTimeout == 5000)
        #expect(parameters.cumulativeAckTimeout == 255)
        #expect(parameters.maxCumulativeAcks == 3)
        #expect(parameters.sessions == [LinkSession(id: 1, type: .control), LinkSession(id: 2, type: .externalAccessory)])
        #expect(parameters.session(ofType: .externalAccessory)?.id == 2)
        #expect(parameters.violations().isEmpty)
        #expect(parameters.encoded == Self.boya)
    }

    @Test func structuralErrors() {
        #expect(throws: WireError.truncated(what: "SYN parameters", needed: 10, available: 9)) {
            try LinkParameters.decode(Array(Self.dji.prefix(9)))
        }
        #expect(throws: WireError.invalidLength(what: "SYN session table", length: 2, allowed: "a multiple of 3")) {
            try LinkParameters.decode(Array(Self.dji.prefix(12)))
        }
    }

    @Test func everyRangeIsChecked() throws {
        for field in LinkParameters.Field.allCases {
            var parameters = try LinkParameters.decode(Self.dji)
            let range = field.validRange
            let bad = range.lowerBound > 0 ? range.lowerBound - 1 : range.upperBound + 1
            switch field {
            case .version: parameters.version = UInt8(bad)
            case .maxOutstandingPackets: parameters.maxOutstandingPackets = UInt8(bad)
            case .maxPacketLength: parameters.maxPacketLength = UInt16(bad)
            case .retransmissionTimeout: parameters.retransmissionTimeout = UInt16(bad)
            case .cumulativeAckTimeout: parameters.cumulativeAckTimeout = UInt16(bad)
            case .maxRetransmissions: parameters.maxRetransmissions = UInt8(bad)
            case .maxCumulativeAcks: parameters.maxCumulativeAcks = UInt8(bad)
            }
            #expect(parameters.violations() == [.outOfRange(field: field, value: bad)], "\(field)")
        }
    }

    @Test func sessionTableRules() throws {
        var parameters = try LinkParameters.decode(Self.dji)
        parameters.sessions = [LinkSession(id: 0, type: .externalAccessory), LinkSession(id: 0, type: .externalAccessory),
                               LinkSession(id: 3, type: LinkSessionType(rawValue: 7))]
        #expect(parameters.violations() == [
            .sessionIDZero, .sessionIDZero, .duplicateSessionID(0), .duplicateSessionType(.externalAccessory),
            .unknownSessionType(7), .noControlSession,
        ])
        #expect(LinkParameterViolation.noControlSession.description == "the session table has no control session")
        #expect(LinkParameterViolation.outOfRange(field: .maxRetransmissions, value: 31).description
            == "max retransmissions 31 is outside 1...30")
    }
}
