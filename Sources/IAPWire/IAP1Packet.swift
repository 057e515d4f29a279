/// A legacy iAP1 packet.
///
/// ```
/// [FF] 55 LEN           LINGO CMD[2 for lingo 04] [TRANS u16] PAYLOAD… CKSUM   small form
/// [FF] 55 00 LEN u16    LINGO CMD …                                     CKSUM   large form
/// ```
/// `LEN` counts lingo, command, transaction id and payload. The checksum makes the bytes from the
/// length field through the checksum sum to zero modulo 256 (the `FF` sync and `55` are not
/// covered). The `FF` sync byte is sent on UART and absent inside USB HID reports.
///
/// Encoding picks the small form when `LEN ≤ 0xFC` and the large form otherwise: implementations
/// disagree on the boundary (0xFC, 0xFF, 0x100), and 0xFC is the one every receiver accepts.
/// Decoding accepts both forms for any length.
///
/// Whether a transaction id is present is not visible in the bytes: it depends on how the
/// accessory identified (StartIDPS turns transaction ids on). Decoders take it as a parameter.
public struct IAP1Packet: Hashable, Sendable {
    /// The start-of-packet byte.
    public static let startOfPacket: UInt8 = 0x55
    /// The UART sync byte sent before each packet.
    public static let syncByte: UInt8 = 0xFF
    /// The largest `LEN` sent in the one-byte (small) form.
    public static let smallLengthLimit = 0xFC
    /// The largest `LEN` the large form can carry.
    public static let maxBodyLength = 0xFFFF
    /// The longest encoded packet: sync, start, 3 length bytes, body, checksum.
    public static let maxEncodedLength = 1 + 1 + 3 + maxBodyLength + 1

    /// The longest encoding of a packet whose payload (the command's parameters) is at most
    /// `payloadLength` bytes: sync, start, the large form's 3 length bytes, lingo, a 2-byte
    /// command, a transaction id, the payload, checksum; at most ``maxEncodedLength``.
    public static func maxEncodedLength(payloadLength: Int) -> Int {
        min(maxEncodedLength, 1 + 1 + 3 + 1 + 2 + 2 + max(0, payloadLength) + 1)
    }

    /// The lingo (command set).
    public var lingo: UInt8
    /// The command id; two bytes wide on the Extended Interface lingo (0x04), one byte otherwise.
    public var command: UInt16
    /// The transaction id, when the session uses them.
    public var transactionID: UInt16?
    /// The command's parameters.
    public var payload: [UInt8]

    /// A packet of `command` in `lingo` with `payload`; `transactionID` only when the session uses
    /// transaction ids (after StartIDPS). Lengths are checked when it is encoded.
    public init(lingo: UInt8, command: UInt16, transactionID: UInt16? = nil, payload: [UInt8] = []) {
        self.lingo = lingo
        self.command = command
        self.transactionID = transactionID
        self.payload = payload
    }

    /// Command id width in bytes for `lingo`: 2 for the Extended Interface lingo, else 1.
    @inlinable
    public static func commandWidth(lingo: UInt8) -> Int { lingo == 0x04 ? 2 : 1 }

    /// Bytes counted by the length field.
    public var bodyLength: Int {
        1 + Self.commandWidth(lingo: lingo) + (transactionID == nil ? 0 : 2) + payload.count
    }

    /// Appends the encoded packet to `output`, with the `FF` sync byte when `sync` is true.
    ///
    /// - Throws: ``WireError/tooLong(what:length:maximum:)`` when the body exceeds 65535 bytes,
    ///   and ``WireError/invalidLength(what:length:allowed:)`` for a command id that does not fit
    ///   one byte on a lingo other than 0x04.
    public func encode(sync: Bool = true, into output: inout [UInt8]) throws(WireError) {
        let length = bodyLength
        guard length <= Self.maxBodyLength else {
            throw .tooLong(what: "iAP1 packet body", length: length, maximum: Self.maxBodyLength)
        }
        if Self.commandWidth(lingo: lingo) == 1, command > 0xFF {
            throw .invalidLength(what: "iAP1 command id", length: Int(command), allowed: "0 to 255 outside lingo 0x04")
        }
        if sync { output.append(Self.syncByte) }
        output.append(Self.startOfPacket)
        let checksumStart = output.count
        if length <= Self.smallLengthLimit {
            output.append(UInt8(length))
        } else {
            output.append(0)
            output.appendUInt16BE(UInt16(length))
        }
        output.append(lingo)
        if Self.commandWidth(lingo: lingo) == 2 {
            output.appendUInt16BE(command)
        } else {
            output.append(UInt8(command))
        }
        if let transactionID { output.appendUInt16BE(transactionID) }
        output.append(contentsOf: payload)
        var sum: UInt8 = 0
        for index in checksumStart..<output.count { sum &+= output[index] }
        output.append(0 &- sum)
    }

    /// The encoded packet.
    public func encoded(sync: Bool = true) throws(WireError) -> [UInt8] {
        var output: [UInt8] = []
        try encode(sync: sync, into: &output)
        return output
    }

    /// Decodes the body of a packet (lingo through payload, as delimited by ``IAP1Framing``).
    public static func decode(body: RawSpan, transactionIDs: Bool) throws(WireError) -> IAP1Packet {
        guard body.byteCount >= 1 else {
            throw .truncated(what: "iAP1 packet body", needed: 2, available: body.byteCount)
        }
        let lingo = body.byte(at: 0)
        let width = commandWidth(lingo: lingo)
        let fixed = 1 + width + (transactionIDs ? 2 : 0)
        guard body.byteCount >= fixed else {
            throw .truncated(what: "iAP1 packet (lingo \(hexByte(lingo)))", needed: fixed, available: body.byteCount)
        }
        let command = width == 2 ? body.uint16BE(at: 1) : UInt16(body.byte(at: 1))
        let transactionID = transactionIDs ? body.uint16BE(at: 1 + width) : nil
        return IAP1Packet(lingo: lingo, command: command, transactionID: transactionID,
                          payload: body.copyBytes(fixed..<body.byteCount))
    }

    /// Decodes a complete packet (with or without the `FF` sync byte) held in an array.
    public static func decode(_ bytes: [UInt8], transactionIDs: Bool) throws(WireError) -> IAP1Packet {
        let span = bytes.span.bytes
        let framing = try IAP1Framing.decode(span)
        guard framing.packetLength == bytes.count else {
            throw .lengthMismatch(what: "iAP1 packet", declared: framing.packetLength, actual: bytes.count)
        }
        return try decode(body: span.extracting(framing.body), transactionIDs: transactionIDs)
    }
}

/// Where the parts of an iAP1 packet lie: found by ``decode(_:)`` from the sync, start and
/// length bytes, and verified by the checksum.
public struct IAP1Framing: Hashable, Sendable {
    /// Whether the packet starts with the `FF` sync byte.
    public var hasSync: Bool
    /// Whether the length uses the 3-byte (large) form.
    public var isLargeForm: Bool
    /// Range of the body (lingo through payload) relative to the packet start.
    public var body: Range<Int>
    /// Total bytes of the packet, sync and checksum included.
    public var packetLength: Int { body.upperBound + 1 }

    /// Creates a framing description.
    @inlinable
    public init(hasSync: Bool, isLargeForm: Bool, body: Range<Int>) {
        self.hasSync = hasSync
        self.isLargeForm = isLargeForm
        self.body = body
    }

    /// Result of looking at the first bytes of a possible packet.
    public enum Probe: Hashable, Sendable {
        /// The bytes cannot start an iAP1 packet.
        case notAPacket
        /// More bytes are needed to know the packet length: at least this many in total.
        case needMore(Int)
        /// The length field says the packet has this framing (checksum not yet verified).
        case framing(IAP1Framing)
        /// The length field holds a value no packet may have.
        case invalidLength(Int)
    }

    /// Reads the sync, start and length bytes at the start of `bytes` without checking the
    /// checksum. Used by the scanner, which must know how many bytes to wait for.
    @inlinable
    public static func probe(_ bytes: RawSpan) -> Probe {
        var offset = 0
        let available = bytes.byteCount
        guard available >= 1 else { return .needMore(1) }
        var hasSync = false
        if bytes.byte(at: 0) == IAP1Packet.syncByte {
            guard available >= 2 else { return .needMore(2) }
            hasSync = true
            offset = 1
        }
        guard bytes.byte(at: offset) == IAP1Packet.startOfPacket else { return .notAPacket }
        guard available >= offset + 2 else { return .needMore(offset + 2) }
        let small = Int(bytes.byte(at: offset + 1))
        let bodyStart: Int
        let length: Int
        let large: Bool
        if small != 0 {
            length = small
            bodyStart = offset + 2
            large = false
        } else {
            guard available >= offset + 4 else { return .needMore(offset + 4) }
            length = Int(bytes.uint16BE(at: offset + 2))
            bodyStart = offset + 4
            large = true
        }
        guard length >= 2 else { return .invalidLength(length) }
        return .framing(IAP1Framing(hasSync: hasSync, isLargeForm: large, body: bodyStart..<(bodyStart + length)))
    }

    /// The checksum verifies over `packet` (which starts at the packet start).
    @inlinable
    public func checksumVerifies(in packet: RawSpan) -> Bool {
        let lengthStart = hasSync ? 2 : 1
        return Checksum.verifies(packet.extracting(lengthStart..<packetLength))
    }

    /// Finds and verifies the framing of the packet at the start of `bytes`.
    public static func decode(_ bytes: RawSpan) throws(WireError) -> IAP1Framing {
        switch probe(bytes) {
        case .notAPacket:
            throw .badSync(what: "iAP1 packet", expected: [0x55], found: bytes.copyBytes(0..<min(2, bytes.byteCount)))
        case let .needMore(count):
            throw .truncated(what: "iAP1 packet header", needed: count, available: bytes.byteCount)
        case let .invalidLength(length):
            throw .invalidLength(what: "iAP1 packet", length: length, allowed: "2 to 65535")
        case let .framing(framing):
            guard bytes.byteCount >= framing.packetLength else {
                throw .truncated(what: "iAP1 packet", needed: framing.packetLength, available: bytes.byteCount)
            }
            guard framing.checksumVerifies(in: bytes) else {
                let lengthStart = framing.hasSync ? 2 : 1
                let expected = Checksum.of(bytes.extracting(lengthStart..<(framing.packetLength - 1)))
                throw .badChecksum(what: "iAP1 packet", expected: expected, found: bytes.byte(at: framing.packetLength - 1))
            }
            return framing
        }
    }
}

/// The iAP2 detect sequence and the iAP1 reply that means "no iAP2 here".
public enum IAP2Detect {
    /// `FF 55 02 00 EE 10`: sent by an accessory to start iAP2; an iAP2 device answers with the
    /// same six bytes. (It is shaped like an iAP1 packet: lingo 0, command 0xEE.)
    public static let bytes: [UInt8] = [0xFF, 0x55, 0x02, 0x00, 0xEE, 0x10]
    /// `FF 55 04 00 02 04 EE 08`: iPodAck(BadParameter, 0xEE), the answer of a device that only
    /// speaks iAP1.
    public static let iap1Reply: [UInt8] = [0xFF, 0x55, 0x04, 0x00, 0x02, 0x04, 0xEE, 0x08]
    /// The detect command id on the General lingo.
    public static let command: UInt8 = 0xEE

    /// Whether an iAP1 body (lingo through payload) is the detect's body `00 EE`.
    @inlinable
    public static func isDetect(body: RawSpan) -> Bool {
        body.byteCount == 2 && body.byte(at: 0) == 0x00 && body.byte(at: 1) == command
    }

    /// Whether a decoded iAP1 packet is the "no iAP2" answer to the detect.
    public static func isIAP1Reply(_ packet: IAP1Packet) -> Bool {
        packet.lingo == 0x00 && packet.command == 0x02 && packet.transactionID == nil && packet.payload == [0x04, command]
    }
}
