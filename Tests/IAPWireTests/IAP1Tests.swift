import IAPWire
import Testing
import TestSupport

@Suite("iAP1 packets")
struct IAP1Tests {
    struct Vector: Sendable, CustomTestStringConvertible {
        var hex: String
        var packet: IAP1Packet
        var sync: Bool
        var testDescription: String { hex }
    }

    /// Captured and computed vectors from PROTOCOL.md §1.3.
    static let vectors: [Vector] = [
        Vector(hex: "55 04 00 38 00 00 C4", packet: IAP1Packet(lingo: 0, command: 0x38, transactionID: 0), sync: false),
        Vector(hex: "55 06 00 02 00 00 00 38 C0", packet: IAP1Packet(lingo: 0, command: 0x02, transactionID: 0, payload: [0x00, 0x38]), sync: false),
        Vector(hex: "55 04 00 11 00 01 EA", packet: IAP1Packet(lingo: 0, command: 0x11, transactionID: 1), sync: false),
        Vector(hex: "55 05 00 3B 00 09 00 B7", packet: IAP1Packet(lingo: 0, command: 0x3B, transactionID: 9, payload: [0]), sync: false),
        Vector(hex: "55 05 00 3C 00 09 00 B6", packet: IAP1Packet(lingo: 0, command: 0x3C, transactionID: 9, payload: [0]), sync: false),
        Vector(hex: "55 04 00 14 00 01 E7", packet: IAP1Packet(lingo: 0, command: 0x14, transactionID: 1), sync: false),
        Vector(hex: "FF 55 02 00 EE 10", packet: IAP1Packet(lingo: 0, command: 0xEE), sync: true),
        Vector(hex: "FF 55 04 00 02 04 EE 08", packet: IAP1Packet(lingo: 0, command: 0x02, payload: [0x04, 0xEE]), sync: true),
        Vector(hex: "FF 55 02 00 00 FE", packet: IAP1Packet(lingo: 0, command: 0x00), sync: true),
        Vector(hex: "FF 55 0E 00 13 FF FF FF FF FF FF FF FF FF FF FF FF EB",
               packet: IAP1Packet(lingo: 0, command: 0x13, payload: [UInt8](repeating: 0xFF, count: 12)), sync: true),
    ]

    @Test("encodes byte-exact", arguments: vectors)
    func encodes(_ vector: Vector) throws {
        #expect(try vector.packet.encoded(sync: vector.sync) == bytes(vector.hex))
    }

    @Test("decodes byte-exact", arguments: vectors)
    func decodes(_ vector: Vector) throws {
        let decoded = try IAP1Packet.decode(bytes(vector.hex), transactionIDs: vector.packet.transactionID != nil)
        #expect(decoded == vector.packet)
    }

    @Test func detectConstants() throws {
        #expect(IAP2Detect.bytes == bytes("FF 55 02 00 EE 10"))
        #expect(IAP2Detect.iap1Reply == bytes("FF 55 04 00 02 04 EE 08"))
        let reply = try IAP1Packet.decode(IAP2Detect.iap1Reply, transactionIDs: false)
        #expect(IAP2Detect.isIAP1Reply(reply))
        #expect(!IAP2Detect.isIAP1Reply(try IAP1Packet.decode(IAP2Detect.bytes, transactionIDs: false)))
    }

    @Test func extendedInterfaceUsesTwoByteCommands() throws {
        let packet = IAP1Packet(lingo: 0x04, command: 0x0012, transactionID: 7, payload: [1, 2])
        let encoded = try packet.encoded(sync: false)
        #expect(encoded == [0x55, 0x07, 0x04, 0x00, 0x12, 0x00, 0x07, 0x01, 0x02, Checksum.of([0x07, 0x04, 0x00, 0x12, 0x00, 0x07, 0x01, 0x02])])
        #expect(try IAP1Packet.decode(encoded, transactionIDs: true) == packet)
    }

    @Test("small form up to 0xFC, large form above", arguments: [0xFA, 0xFB, 0xFC, 0xFD, 0x100, 0xFFFF])
    func lengthForms(bodyLength: Int) throws {
        let packet = IAP1Packet(lingo: 0x00, command: 0x43, payload: [UInt8](repeating: 0xA5, count: bodyLength - 2))
        let encoded = try packet.encoded(sync: true)
        if bodyLength <= 0xFC {
            #expect(encoded[2] == UInt8(bodyLength))
            #expect(encoded.count == bodyLength + 4)
        } else {
            #expect(encoded[2] == 0)
            #expect(Int(encoded[3]) << 8 | Int(encoded[4]) == bodyLength)
            #expect(encoded.count == bodyLength + 6)
        }
        #expect(try IAP1Packet.decode(encoded, transactionIDs: false) == packet)
    }

    @Test func decodesLargeFormOfASmallLength() throws {
        // A sender that uses the large form for a short body is still understood.
        let body: [UInt8] = [0x00, 0x38, 0x00, 0x00]
        let packet = [0x55, 0x00, 0x00, 0x04] + body + [Checksum.of([0x00, 0x00, 0x04] + body)]
        #expect(try IAP1Packet.decode(packet, transactionIDs: true) == IAP1Packet(lingo: 0, command: 0x38, transactionID: 0))
    }

    @Test func bodyTooLongIsRefused() {
        let packet = IAP1Packet(lingo: 0, command: 0x43, payload: [UInt8](repeating: 0, count: 0xFFFF))
        #expect(throws: WireError.tooLong(what: "iAP1 packet body", length: 0x10001, maximum: 0xFFFF)) { try packet.encoded() }
    }

    @Test func oneByteCommandOutOfRangeIsRefused() {
        #expect(throws: WireError.self) { try IAP1Packet(lingo: 0, command: 0x100).encoded() }
    }

    @Test func badInput() {
        #expect(throws: WireError.badChecksum(what: "iAP1 packet", expected: 0xC4, found: 0xC5)) {
            try IAP1Packet.decode(bytes("55 04 00 38 00 00 C5"), transactionIDs: true)
        }
        #expect(throws: WireError.truncated(what: "iAP1 packet", needed: 7, available: 6)) {
            try IAP1Packet.decode(bytes("55 04 00 38 00 00"), transactionIDs: true)
        }
        #expect(throws: WireError.invalidLength(what: "iAP1 packet", length: 1, allowed: "2 to 65535")) {
            try IAP1Packet.decode(bytes("55 01 00 FF"), transactionIDs: false)
        }
        #expect(throws: WireError.badSync(what: "iAP1 packet", expected: [0x55], found: [0x54, 0x04])) {
            try IAP1Packet.decode(bytes("54 04 00 38 00 00 C4"), transactionIDs: true)
        }
        // A body too short for the transaction id the session uses.
        #expect(throws: WireError.self) { try IAP1Packet.decode(bytes("55 02 00 38 C6"), transactionIDs: true) }
        #expect(throws: WireError.lengthMismatch(what: "iAP1 packet", declared: 7, actual: 8)) {
            try IAP1Packet.decode(bytes("55 04 00 38 00 00 C4 00"), transactionIDs: true)
        }
    }

    @Test func catalogueNames() {
        #expect(IAP1Catalogue.commandName(lingo: 0, command: 0x38) == "StartIDPS")
        #expect(IAP1Catalogue.commandName(lingo: 0, command: 0x43) == "iPodDataTransfer")
        #expect(IAP1Catalogue.commandName(lingo: 0x04, command: 0x0012) == nil)
        #expect(IAP1Catalogue.lingoes[0x04] == "ExtendedInterface")
        #expect(IAP1Catalogue.ackStatuses[0x04] == "BadParameter")
    }

    @Test func fidTokensRoundTrip() throws {
        let tokens = [FIDToken(type: 0, subtype: 0, data: [1, 0, 0, 0, 0, 2, 0, 0, 2, 0]),
                      FIDToken(type: 0, subtype: 4, data: [1] + Array("com.acme.x".utf8) + [0])]
        let payload = try FIDToken.encodeList(tokens)
        #expect(payload.prefix(4) == [2, 12, 0, 0])
        #expect(try FIDToken.decodeList(payload) == tokens)
        #expect(throws: WireError.self) { try FIDToken.encodeList([FIDToken(type: 0, subtype: 2, data: [UInt8](repeating: 1, count: 254))]) }
    }

    @Test("FID token lists whose lengths lie are refused with the field named", arguments: [
        [UInt8](),                          // no count
        [2, 3, 0, 1, 0],                    // two announced, one present
        [1, 1, 0],                          // a token shorter than its type and subtype
        [1, 9, 0, 2, 1],                    // a length past the end
        [1, 3, 0, 1, 0, 0xEE],              // a byte after the last token
    ])
    func lyingTokenLists(payload: [UInt8]) {
        #expect(throws: WireError.self) { try FIDToken.decodeList(payload) }
    }

    @Test func fidTokenAcksRoundTrip() throws {
        let acks = [FIDTokenAck(type: 0, subtype: 0, status: 0, extra: [0]), FIDTokenAck(type: 0, subtype: 2, status: 2, extra: [1])]
        let payload = FIDTokenAck.encodeList(acks)
        #expect(payload == [2, 4, 0, 0, 0, 0, 4, 0, 2, 2, 1])
        #expect(try FIDTokenAck.decodeList(payload) == acks)
        #expect(throws: WireError.self) { try FIDTokenAck.decodeList([1, 2, 0, 0]) }
    }

    @Test func payloadReaderNamesTheField() throws {
        var reader = IAP1PayloadReader([0x00, 0x01, 0x61, 0x62], what: "OpenDataSessionForProtocol")
        #expect(try reader.uint16("session id") == 1)
        #expect(throws: WireError.invalidString(parameterID: 0, reason: "OpenDataSessionForProtocol name has no terminating NUL")) {
            _ = try reader.cString("name")
        }
        #expect(throws: WireError.truncated(what: "OpenDataSessionForProtocol count", needed: 4, available: 2)) {
            _ = try reader.uint32("count")
        }
    }
}
