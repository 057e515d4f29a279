/// The control bits of an iAP2 link packet header (byte 4).
public struct LinkControl: OptionSet, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    /// Link synchronisation: the payload carries ``LinkParameters``.
    public static let syn = LinkControl(rawValue: 0x80)
    /// The ACK field is valid (set on nearly every packet after the handshake).
    public static let ack = LinkControl(rawValue: 0x40)
    /// Extended acknowledgement: the payload lists sequence numbers received out of order.
    public static let eak = LinkControl(rawValue: 0x20)
    /// Link reset.
    public static let rst = LinkControl(rawValue: 0x10)
    /// The sender is going to sleep (also called SUS).
    public static let slp = LinkControl(rawValue: 0x08)

    /// Names of the set bits joined by `|`, e.g. `SYN|ACK`; unknown bits as hex.
    public var description: String {
        var names: [String] = []
        if contains(.syn) { names.append("SYN") }
        if contains(.ack) { names.append("ACK") }
        if contains(.eak) { names.append("EAK") }
        if contains(.rst) { names.append("RST") }
        if contains(.slp) { names.append("SLP") }
        let unknown = rawValue & 0x07
        if unknown != 0 { names.append("0x" + hexByte(unknown)) }
        return names.isEmpty ? "none" : names.joined(separator: "|")
    }
}

/// The 9-byte header of an iAP2 link packet.
///
/// ```
/// FF 5A | LEN u16 | CTL | SEQ | ACK | SID | HCK | payload … | PCK
/// ```
/// `LEN` counts the whole packet. A packet without payload is exactly 9 bytes and has no payload
/// checksum; otherwise `LEN = 10 + payload length`. `LEN = 10` (an empty payload with a checksum)
/// is rejected: no sender needs it and the encoder never produces it.
public struct LinkPacketHeader: Hashable, Sendable {
    /// The two synchronisation bytes `FF 5A`.
    public static let sync: (UInt8, UInt8) = (0xFF, 0x5A)
    /// Header size in bytes, header checksum included.
    public static let size = 9
    /// Bytes a packet with payload adds around it: the header and the payload checksum.
    public static let overhead = 10
    /// The largest packet the 16-bit length field can describe.
    public static let maxPacketLength = 65_535
    /// The largest payload one packet can carry.
    public static let maxPayloadLength = maxPacketLength - overhead

    /// Control bits.
    public var control: LinkControl
    /// Sequence number of this packet (8 bits, wrapping).
    public var sequence: UInt8
    /// Last in-order sequence number received from the peer (valid when ``control`` has `.ack`).
    public var acknowledgement: UInt8
    /// Link session id: 0 for link-only packets, otherwise a session from the SYN table.
    public var sessionID: UInt8
    /// Total packet length, header and checksums included.
    public var packetLength: Int

    /// Payload bytes in the packet (0 for a 9-byte packet).
    @inlinable
    public var payloadLength: Int { packetLength > Self.size ? packetLength - Self.overhead : 0 }

    /// Creates a header for a packet with `payloadLength` payload bytes.
    @inlinable
    public init(control: LinkControl, sequence: UInt8, acknowledgement: UInt8, sessionID: UInt8, payloadLength: Int) {
        self.control = control
        self.sequence = sequence
        self.acknowledgement = acknowledgement
        self.sessionID = sessionID
        self.packetLength = LinkPacket.encodedLength(payloadLength: payloadLength)
    }

    /// Validates the sync bytes, the length field and the header checksum of the 9 bytes at the
    /// start of `bytes` (which may be longer: the payload is not looked at).
    @inlinable
    public static func decode(_ bytes: RawSpan) throws(WireError) -> LinkPacketHeader {
        guard bytes.byteCount >= size else {
            throw .truncated(what: "iAP2 link header", needed: size, available: bytes.byteCount)
        }
        guard bytes.byte(at: 0) == 0xFF, bytes.byte(at: 1) == 0x5A else {
            throw .badSync(what: "iAP2 link packet", expected: [0xFF, 0x5A], found: bytes.copyBytes(0..<2))
        }
        let header = bytes.extracting(0..<size)
        guard Checksum.verifies(header) else {
            let expected = Checksum.of(bytes.extracting(0..<8))
            throw .badChecksum(what: "iAP2 link header", expected: expected, found: bytes.byte(at: 8))
        }
        let length = Int(bytes.uint16BE(at: 2))
        guard length == size || length > overhead else {
            throw .invalidLength(what: "iAP2 link packet", length: length, allowed: "9, or 11 to 65535")
        }
        return LinkPacketHeader(
            control: LinkControl(rawValue: bytes.byte(at: 4)),
            sequence: bytes.byte(at: 5),
            acknowledgement: bytes.byte(at: 6),
            sessionID: bytes.byte(at: 7),
            packetLength: length
        )
    }

    @usableFromInline
    init(control: LinkControl, sequence: UInt8, acknowledgement: UInt8, sessionID: UInt8, packetLength: Int) {
        self.control = control
        self.sequence = sequence
        self.acknowledgement = acknowledgement
        self.sessionID = sessionID
        self.packetLength = packetLength
    }

    /// Whether the peer must acknowledge this packet: a SYN, or a packet with payload whose
    /// control bits have ACK or SYN but not EAK. Bare ACKs and EAKs are never acknowledged.
    @inlinable
    public var requiresAcknowledgement: Bool {
        if control.contains(.syn) { return true }
        return payloadLength > 0 && control.contains(.ack) && !control.contains(.eak)
    }
}

/// Encoding and decoding of whole iAP2 link packets.
public enum LinkPacket {
    /// Bytes on the wire for a packet carrying `payloadLength` payload bytes.
    @inlinable
    public static func encodedLength(payloadLength: Int) -> Int {
        payloadLength == 0 ? LinkPacketHeader.size : payloadLength + LinkPacketHeader.overhead
    }

    /// Appends one packet to `output`.
    ///
    /// - Throws: ``WireError/tooLong(what:length:maximum:)`` when the payload exceeds
    ///   ``LinkPacketHeader/maxPayloadLength``.
    @inlinable
    public static func encode(
        control: LinkControl, sequence: UInt8, acknowledgement: UInt8, sessionID: UInt8,
        payload: RawSpan, into output: inout [UInt8]
    ) throws(WireError) {
        let payloadLength = payload.byteCount
        guard payloadLength <= LinkPacketHeader.maxPayloadLength else {
            throw .tooLong(what: "iAP2 link payload", length: payloadLength, maximum: LinkPacketHeader.maxPayloadLength)
        }
        let length = encodedLength(payloadLength: payloadLength)
        let start = output.count
        output.reserveCapacity(start + length)
        output.append(0xFF)
        output.append(0x5A)
        output.appendUInt16BE(UInt16(length))
        output.append(control.rawValue)
        output.append(sequence)
        output.append(acknowledgement)
        output.append(sessionID)
        var sum: UInt8 = 0
        for index in start..<(start + 8) { sum &+= output[index] }
        output.append(0 &- sum)
        if payloadLength > 0 {
            output.append(payload)
            output.append(Checksum.of(payload))
        }
    }

    /// One packet as a new array.
    @inlinable
    public static func encode(
        control: LinkControl, sequence: UInt8, acknowledgement: UInt8, sessionID: UInt8, payload: [UInt8] = []
    ) throws(WireError) -> [UInt8] {
        var output: [UInt8] = []
        try encode(control: control, sequence: sequence, acknowledgement: acknowledgement, sessionID: sessionID,
                   payload: payload.span.bytes, into: &output)
        return output
    }

    /// Completes a packet in place: the caller has already written `payloadLength` payload bytes
    /// at offset ``LinkPacketHeader/size`` of `buffer`; this writes the header before them and the
    /// payload checksum after them, and returns the packet length.
    ///
    /// This is the zero-copy send path: a writer fills a transmit slot after header headroom and
    /// the link layer finishes the packet where it lies.
    @inlinable
    public static func finish(
        in buffer: inout MutableRawSpan, control: LinkControl, sequence: UInt8, acknowledgement: UInt8,
        sessionID: UInt8, payloadLength: Int
    ) throws(WireError) -> Int {
        try finishHeader(in: &buffer, control: control, sequence: sequence, acknowledgement: acknowledgement,
                         sessionID: sessionID, payloadLength: payloadLength, payloadChecksum: true)
    }

    /// An empty buffer for a packet to be finished in place by
    /// ``finish(framed:control:sequence:acknowledgement:sessionID:checksummed:)``: it holds
    /// ``LinkPacketHeader/size`` bytes of headroom for the header and has room for
    /// `payloadCapacity` payload bytes and the payload checksum, so appending the payload and
    /// finishing it allocate nothing more.
    @inlinable
    public static func framedBuffer(payloadCapacity: Int) -> [UInt8] {
        var buffer: [UInt8] = []
        buffer.reserveCapacity(LinkPacketHeader.size + max(0, payloadCapacity) + 1)
        buffer.append(contentsOf: repeatElement(0, count: LinkPacketHeader.size))
        return buffer
    }

    /// Finishes a packet built in a ``framedBuffer(payloadCapacity:)``: writes the header into the
    /// headroom and appends the payload checksum. With `checksummed`, the packet was finished
    /// before (a retransmission with a newer acknowledgement): the checksum is already there and
    /// only the header is written again.
    ///
    /// - Returns: false when the buffer holds no payload or more than one packet can carry (it is
    ///   left as it was).
    @inlinable
    public static func finish(
        framed packet: inout [UInt8], control: LinkControl, sequence: UInt8, acknowledgement: UInt8, sessionID: UInt8,
        checksummed: Bool = false
    ) -> Bool {
        finish(framed: &packet, control: control, sequence: sequence, acknowledgement: acknowledgement, sessionID: sessionID,
               checksummed: checksummed, payloadSum: nil)
    }

    /// ``finish(framed:control:sequence:acknowledgement:sessionID:checksummed:)`` for a payload
    /// whose sum is known already (`payloadSum`, from ``Checksum/append(_:to:)`` as the payload
    /// was laid out): the checksum is written without reading the payload again.
    @inlinable
    package static func finish(
        framed packet: inout [UInt8], control: LinkControl, sequence: UInt8, acknowledgement: UInt8, sessionID: UInt8,
        checksummed: Bool, payloadSum: UInt8?
    ) -> Bool {
        let payloadLength = packet.count - LinkPacketHeader.size - (checksummed ? 1 : 0)
        guard payloadLength > 0, payloadLength <= LinkPacketHeader.maxPayloadLength else { return false }
        if !checksummed { packet.append(0) }
        var span = packet.mutableSpan
        var raw = span.mutableBytes
        _ = try? finishHeader(in: &raw, control: control, sequence: sequence, acknowledgement: acknowledgement,
                              sessionID: sessionID, payloadLength: payloadLength, payloadChecksum: !checksummed, payloadSum: payloadSum)
        return true
    }

    /// Finishes a packet laid out in place in `packet`: header headroom, the payload, and one
    /// byte for the payload checksum at the end (the whole packet, as a transmit buffer holds
    /// it). Writes the header and, unless `checksummed` (a retransmission with a newer
    /// acknowledgement: the checksum is there already), the payload checksum.
    ///
    /// - Returns: false when the packet holds no payload or more than one packet can carry (it
    ///   is left as it was).
    @inlinable
    public static func finish(
        framedBytes packet: inout MutableRawSpan, control: LinkControl, sequence: UInt8, acknowledgement: UInt8,
        sessionID: UInt8, checksummed: Bool
    ) -> Bool {
        finish(framedBytes: &packet, control: control, sequence: sequence, acknowledgement: acknowledgement, sessionID: sessionID,
               checksummed: checksummed, payloadSum: nil)
    }

    /// ``finish(framedBytes:control:sequence:acknowledgement:sessionID:checksummed:)`` for a
    /// payload whose sum is known already (`payloadSum`, from ``Checksum/append(_:to:)``).
    @inlinable
    package static func finish(
        framedBytes packet: inout MutableRawSpan, control: LinkControl, sequence: UInt8, acknowledgement: UInt8,
        sessionID: UInt8, checksummed: Bool, payloadSum: UInt8?
    ) -> Bool {
        let payloadLength = packet.byteCount - LinkPacketHeader.size - 1
        guard payloadLength > 0, payloadLength <= LinkPacketHeader.maxPayloadLength else { return false }
        _ = try? finishHeader(in: &packet, control: control, sequence: sequence, acknowledgement: acknowledgement,
                              sessionID: sessionID, payloadLength: payloadLength, payloadChecksum: !checksummed, payloadSum: payloadSum)
        return true
    }

    /// Writes the header of a packet of `payloadLength` payload bytes at the start of `buffer`,
    /// and, with `payloadChecksum`, the checksum after the payload (from `payloadSum`, the sum of
    /// the payload's bytes, when the caller knows it; else read from the payload).
    @inlinable
    static func finishHeader(
        in buffer: inout MutableRawSpan, control: LinkControl, sequence: UInt8, acknowledgement: UInt8,
        sessionID: UInt8, payloadLength: Int, payloadChecksum: Bool, payloadSum: UInt8? = nil
    ) throws(WireError) -> Int {
        guard payloadLength >= 0, payloadLength <= LinkPacketHeader.maxPayloadLength else {
            throw .tooLong(what: "iAP2 link payload", length: payloadLength, maximum: LinkPacketHeader.maxPayloadLength)
        }
        let length = encodedLength(payloadLength: payloadLength)
        guard buffer.byteCount >= length else {
            throw .truncated(what: "transmit buffer", needed: length, available: buffer.byteCount)
        }
        buffer.setByte(0xFF, at: 0)
        buffer.setByte(0x5A, at: 1)
        buffer.setUInt16BE(UInt16(length), at: 2)
        buffer.setByte(control.rawValue, at: 4)
        buffer.setByte(sequence, at: 5)
        buffer.setByte(acknowledgement, at: 6)
        buffer.setByte(sessionID, at: 7)
        let headerSum = Checksum.sum(buffer.bytes.extracting(0..<8))
        buffer.setByte(0 &- headerSum, at: 8)
        if payloadLength > 0, payloadChecksum {
            let payloadEnd = LinkPacketHeader.size + payloadLength
            let sum = payloadSum ?? Checksum.sum(buffer.bytes.extracting(LinkPacketHeader.size..<payloadEnd))
            // A sum taken as the payload was laid out is the payload's (debug builds check it).
            assert(payloadSum == nil || sum == Checksum.sum(buffer.bytes.extracting(LinkPacketHeader.size..<payloadEnd)),
                   "the payload changed after its sum was taken")
            buffer.setByte(0 &- sum, at: payloadEnd)
        }
        return length
    }

    /// Decodes and fully validates the packet at the start of `bytes` (header checksum, length,
    /// payload checksum). `bytes` may extend past the packet.
    ///
    /// - Returns: the header and the range of the payload within `bytes` (a view, not a copy).
    @inlinable
    public static func decode(_ bytes: RawSpan) throws(WireError) -> (header: LinkPacketHeader, payload: Range<Int>) {
        let header = try LinkPacketHeader.decode(bytes)
        guard bytes.byteCount >= header.packetLength else {
            throw .truncated(what: "iAP2 link packet", needed: header.packetLength, available: bytes.byteCount)
        }
        let payload = LinkPacketHeader.size..<(LinkPacketHeader.size + header.payloadLength)
        if header.payloadLength > 0 {
            let covered = bytes.extracting(payload.lowerBound..<(payload.upperBound + 1))
            guard Checksum.verifies(covered) else {
                throw .badChecksum(what: "iAP2 link payload", expected: Checksum.of(bytes.extracting(payload)),
                                   found: bytes.byte(at: payload.upperBound))
            }
        }
        return (header, payload)
    }

    /// Decodes the packet in `bytes`, which must hold exactly one packet.
    @inlinable
    public static func decode(_ bytes: [UInt8]) throws(WireError) -> (header: LinkPacketHeader, payload: [UInt8]) {
        let span = bytes.span.bytes
        let (header, payload) = try decode(span)
        guard header.packetLength == bytes.count else {
            throw .lengthMismatch(what: "iAP2 link packet", declared: header.packetLength, actual: bytes.count)
        }
        return (header, span.copyBytes(payload))
    }
}

/// The payload of an EAK packet: the sequence numbers the sender received out of order.
public enum ExtendedAcknowledgement {
    /// The sequence numbers a peer is missing, by the reference semantics: every number after
    /// `acknowledgement` up to the highest number in `received` (in wrapping 8-bit order) that
    /// is not itself in `received`. Numbers more than 127 ahead of `acknowledgement` are ignored
    /// as outside any possible window.
    public static func missing(after acknowledgement: UInt8, received: some Sequence<UInt8>) -> [UInt8] {
        var seen = [Bool](repeating: false, count: 128)
        var highest = 0
        for sequence in received {
            let distance = Int(sequence &- acknowledgement)
            guard distance >= 1, distance <= 127 else { continue }
            seen[distance] = true
            highest = max(highest, distance)
        }
        var result: [UInt8] = []
        if highest > 1 {
            for distance in 1..<highest where !seen[distance] {
                result.append(acknowledgement &+ UInt8(distance))
            }
        }
        return result
    }
}

/// EA session data as carried in a link packet on an External Accessory link session:
/// a 2-byte big-endian EA session identifier followed by the application's bytes.
public enum EASessionData {
    /// Size of the session identifier header.
    public static let headerSize = 2

    /// The EA session identifier and the range of the application bytes within `payload`.
    @inlinable
    public static func decode(_ payload: RawSpan) throws(WireError) -> (sessionID: UInt16, data: Range<Int>) {
        guard payload.byteCount >= headerSize else {
            throw .truncated(what: "EA session data", needed: headerSize, available: payload.byteCount)
        }
        return (payload.uint16BE(at: 0), headerSize..<payload.byteCount)
    }

    /// Appends the header and `data` to `output`.
    @inlinable
    public static func encode(sessionID: UInt16, data: RawSpan, into output: inout [UInt8]) {
        output.appendUInt16BE(sessionID)
        output.append(data)
    }

    /// Writes the header at `offset` of `buffer` (in-place send path).
    @inlinable
    public static func writeHeader(sessionID: UInt16, into buffer: inout MutableRawSpan, at offset: Int) {
        buffer.setUInt16BE(sessionID, at: offset)
    }
}
