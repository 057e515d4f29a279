/// The type of a link session in the SYN session table.
public struct LinkSessionType: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    /// The control session (authentication, identification, EA session control, …).
    public static let control = LinkSessionType(rawValue: 0)
    /// The file-transfer session.
    public static let fileTransfer = LinkSessionType(rawValue: 1)
    /// The External Accessory session that carries EA data.
    public static let externalAccessory = LinkSessionType(rawValue: 2)

    public var description: String {
        switch self {
        case .control: return "control"
        case .fileTransfer: return "file-transfer"
        case .externalAccessory: return "external-accessory"
        default: return "unknown(\(rawValue))"
        }
    }
}

/// One entry of the SYN session table.
public struct LinkSession: Hashable, Sendable {
    /// Session id used in the header of the session's packets (never 0).
    public var id: UInt8
    /// What the session carries.
    public var type: LinkSessionType
    /// Session protocol version.
    public var version: UInt8

    /// A session table entry: the session's `id` (1 … 255; 0 is not valid), what it carries and its
    /// protocol version (1 by default; some accessories advertise 2 for the control session).
    public init(id: UInt8, type: LinkSessionType, version: UInt8 = 1) {
        self.id = id
        self.type = type
        self.version = version
    }
}

/// The link synchronisation parameters carried in the payload of a SYN packet.
///
/// Layout: version, max outstanding packets, max received packet length (u16), retransmission
/// timeout in ms (u16), cumulative-ACK timeout in ms (u16), max retransmissions, max cumulative
/// ACKs, then 3 bytes per session (id, type, version).
public struct LinkParameters: Hashable, Sendable {
    /// Link protocol version (only 1 exists).
    public var version: UInt8
    /// How many unacknowledged packets the sender of these parameters accepts at once.
    public var maxOutstandingPackets: UInt8
    /// The longest packet (header included) the sender of these parameters accepts.
    public var maxPacketLength: UInt16
    /// Milliseconds before an unacknowledged packet is sent again.
    public var retransmissionTimeout: UInt16
    /// Milliseconds a receiver may wait before acknowledging.
    public var cumulativeAckTimeout: UInt16
    /// How often a packet is sent again before the link fails.
    public var maxRetransmissions: UInt8
    /// How many packets a receiver may leave unacknowledged.
    public var maxCumulativeAcks: UInt8
    /// The session table.
    public var sessions: [LinkSession]

    /// Size of the fixed part of the payload.
    public static let fixedSize = 10

    /// The most sessions a valid table lists: one per known session type (§2.3 allows no
    /// type twice and no type beyond External Accessory; see ``violations()``).
    public static let maxSessionCount = 3

    /// The longest valid SYN payload: the fixed part and a full session table.
    public static let maxEncodedLength = fixedSize + 3 * maxSessionCount

    /// The longest link packet that can carry a valid SYN (or SYN|ACK): header, the longest
    /// valid payload, payload checksum. Before its link is up a receiver expects nothing longer.
    public static let maxSYNPacketLength = LinkPacket.encodedLength(payloadLength: maxEncodedLength)

    /// Parameters as a SYN carries them; the timeouts are in milliseconds and the lengths in bytes.
    /// Nothing is range-checked here: ``violations()`` names every value outside its valid range.
    public init(
        version: UInt8 = 1, maxOutstandingPackets: UInt8, maxPacketLength: UInt16, retransmissionTimeout: UInt16,
        cumulativeAckTimeout: UInt16, maxRetransmissions: UInt8, maxCumulativeAcks: UInt8, sessions: [LinkSession]
    ) {
        self.version = version
        self.maxOutstandingPackets = maxOutstandingPackets
        self.maxPacketLength = maxPacketLength
        self.retransmissionTimeout = retransmissionTimeout
        self.cumulativeAckTimeout = cumulativeAckTimeout
        self.maxRetransmissions = maxRetransmissions
        self.maxCumulativeAcks = maxCumulativeAcks
        self.sessions = sessions
    }

    /// Decodes the structure of a SYN payload. Values are not range-checked here: call
    /// ``violations()`` for that, so a receiver can name every problem and counter-offer.
    public static func decode(_ payload: RawSpan) throws(WireError) -> LinkParameters {
        guard payload.byteCount >= fixedSize else {
            throw .truncated(what: "SYN parameters", needed: fixedSize, available: payload.byteCount)
        }
        let tableBytes = payload.byteCount - fixedSize
        guard tableBytes % 3 == 0 else {
            throw .invalidLength(what: "SYN session table", length: tableBytes, allowed: "a multiple of 3")
        }
        var sessions: [LinkSession] = []
        sessions.reserveCapacity(tableBytes / 3)
        var offset = fixedSize
        while offset < payload.byteCount {
            sessions.append(LinkSession(id: payload.byte(at: offset), type: LinkSessionType(rawValue: payload.byte(at: offset + 1)),
                                        version: payload.byte(at: offset + 2)))
            offset += 3
        }
        return LinkParameters(
            version: payload.byte(at: 0), maxOutstandingPackets: payload.byte(at: 1),
            maxPacketLength: payload.uint16BE(at: 2), retransmissionTimeout: payload.uint16BE(at: 4),
            cumulativeAckTimeout: payload.uint16BE(at: 6), maxRetransmissions: payload.byte(at: 8),
            maxCumulativeAcks: payload.byte(at: 9), sessions: sessions)
    }

    /// Decodes a SYN payload held in an array.
    public static func decode(_ payload: [UInt8]) throws(WireError) -> LinkParameters {
        try decode(payload.span.bytes)
    }

    /// Appends the encoded parameters to `output`.
    public func encode(into output: inout [UInt8]) {
        output.append(version)
        output.append(maxOutstandingPackets)
        output.appendUInt16BE(maxPacketLength)
        output.appendUInt16BE(retransmissionTimeout)
        output.appendUInt16BE(cumulativeAckTimeout)
        output.append(maxRetransmissions)
        output.append(maxCumulativeAcks)
        for session in sessions {
            output.append(session.id)
            output.append(session.type.rawValue)
            output.append(session.version)
        }
    }

    /// The encoded parameters.
    public var encoded: [UInt8] {
        var output: [UInt8] = []
        output.reserveCapacity(Self.fixedSize + 3 * sessions.count)
        encode(into: &output)
        return output
    }

    /// A field of the fixed part, for naming it in a ``LinkParameterViolation``.
    public enum Field: String, Hashable, Sendable, CaseIterable {
        /// The link protocol version (valid: 1).
        case version
        /// The receive window in packets (valid: 1 … 127).
        case maxOutstandingPackets = "max outstanding packets"
        /// The longest packet accepted, header included, in bytes (valid: 24 … 65535).
        case maxPacketLength = "max packet length"
        /// The retransmission timeout in milliseconds (valid: 20 … 65535).
        case retransmissionTimeout = "retransmission timeout"
        /// The longest a receiver waits before acknowledging, in milliseconds (valid: 10 … 32767).
        case cumulativeAckTimeout = "cumulative ACK timeout"
        /// How often a packet is sent again before the link fails (valid: 1 … 30).
        case maxRetransmissions = "max retransmissions"
        /// How many packets a receiver may leave unacknowledged (valid: 0 … 127).
        case maxCumulativeAcks = "max cumulative ACKs"

        /// The valid range of the field (Apple's reference link code).
        public var validRange: ClosedRange<Int> {
            switch self {
            case .version: return 1...1
            case .maxOutstandingPackets: return 1...127
            case .maxPacketLength: return 24...65_535
            case .retransmissionTimeout: return 20...65_535
            case .cumulativeAckTimeout: return 10...32_767
            case .maxRetransmissions: return 1...30
            case .maxCumulativeAcks: return 0...127
            }
        }
    }

    /// The value of a fixed field as an `Int`.
    public func value(of field: Field) -> Int {
        switch field {
        case .version: return Int(version)
        case .maxOutstandingPackets: return Int(maxOutstandingPackets)
        case .maxPacketLength: return Int(maxPacketLength)
        case .retransmissionTimeout: return Int(retransmissionTimeout)
        case .cumulativeAckTimeout: return Int(cumulativeAckTimeout)
        case .maxRetransmissions: return Int(maxRetransmissions)
        case .maxCumulativeAcks: return Int(maxCumulativeAcks)
        }
    }

    /// Every rule these parameters break; empty when they are acceptable.
    ///
    /// Checks the ranges of each field, and the session table: at least one control session,
    /// no session id 0, no unknown session types, no duplicate ids or types.
    public func violations() -> [LinkParameterViolation] {
        var result: [LinkParameterViolation] = []
        for field in Field.allCases where !field.validRange.contains(value(of: field)) {
            result.append(.outOfRange(field: field, value: value(of: field)))
        }
        var ids = Set<UInt8>()
        var types = Set<LinkSessionType>()
        for session in sessions {
            if session.id == 0 { result.append(.sessionIDZero) }
            if session.type.rawValue > LinkSessionType.externalAccessory.rawValue {
                result.append(.unknownSessionType(session.type.rawValue))
            }
            if !ids.insert(session.id).inserted { result.append(.duplicateSessionID(session.id)) }
            if !types.insert(session.type).inserted { result.append(.duplicateSessionType(session.type)) }
        }
        if !types.contains(.control) { result.append(.noControlSession) }
        return result
    }

    /// The first session of `type`, if any.
    public func session(ofType type: LinkSessionType) -> LinkSession? {
        sessions.first { $0.type == type }
    }
}

/// A rule of §2.3 that a set of ``LinkParameters`` breaks.
public enum LinkParameterViolation: Hashable, Sendable, CustomStringConvertible {
    /// A fixed field outside its valid range.
    case outOfRange(field: LinkParameters.Field, value: Int)
    /// The session table has no control session.
    case noControlSession
    /// A session uses id 0, which is reserved for link-only packets.
    case sessionIDZero
    /// A session id appears twice.
    case duplicateSessionID(UInt8)
    /// A session type appears twice.
    case duplicateSessionType(LinkSessionType)
    /// A session type other than control, file transfer and External Accessory.
    case unknownSessionType(UInt8)

    public var description: String {
        switch self {
        case let .outOfRange(field, value):
            let range = field.validRange
            return "\(field.rawValue) \(value) is outside \(range.lowerBound)...\(range.upperBound)"
        case .noControlSession: return "the session table has no control session"
        case .sessionIDZero: return "a session uses id 0, which is reserved for link packets"
        case let .duplicateSessionID(id): return "session id \(id) appears more than once"
        case let .duplicateSessionType(type): return "session type \(type) appears more than once"
        case let .unknownSessionType(raw): return "session type \(raw) is unknown"
        }
    }
}

extension LinkParameters {
    /// Whether two SYN payloads agree on everything both sides share (version, timing values,
    /// retransmissions, cumulative ACKs, sessions), whatever their receive limits
    /// (`maxOutstandingPackets`, `maxPacketLength`), which each side states for itself.
    public func agreesApartFromReceiveLimits(with other: LinkParameters) -> Bool {
        var mine = self
        mine.maxOutstandingPackets = other.maxOutstandingPackets
        mine.maxPacketLength = other.maxPacketLength
        return mine == other
    }
}
