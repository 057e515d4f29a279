/// General-lingo (0x00) command ids of the identification, authentication and data-session flows
/// (PROTOCOL.md §1.5).
public enum IAP1Command {
    /// RequestIdentify (0x00).
    public static let requestIdentify: UInt8 = 0x00
    /// iPodAck (0x02).
    public static let iPodAck: UInt8 = 0x02
    /// RequestLingoProtocolVersion (0x0F).
    public static let requestLingoProtocolVersion: UInt8 = 0x0F
    /// ReturnLingoProtocolVersion (0x10).
    public static let returnLingoProtocolVersion: UInt8 = 0x10
    /// RequestTransportMaxPayloadSize (0x11).
    public static let requestTransportMaxPayloadSize: UInt8 = 0x11
    /// ReturnTransportMaxPayloadSize (0x12).
    public static let returnTransportMaxPayloadSize: UInt8 = 0x12
    /// IdentifyDeviceLingoes (0x13).
    public static let identifyDeviceLingoes: UInt8 = 0x13
    /// GetAccessoryAuthenticationInfo (0x14).
    public static let getAccessoryAuthenticationInfo: UInt8 = 0x14
    /// RetAccessoryAuthenticationInfo (0x15).
    public static let retAccessoryAuthenticationInfo: UInt8 = 0x15
    /// AckAccessoryAuthenticationInfo (0x16).
    public static let ackAccessoryAuthenticationInfo: UInt8 = 0x16
    /// GetAccessoryAuthenticationSignature (0x17).
    public static let getAccessoryAuthenticationSignature: UInt8 = 0x17
    /// RetAccessoryAuthenticationSignature (0x18).
    public static let retAccessoryAuthenticationSignature: UInt8 = 0x18
    /// AckAccessoryAuthenticationStatus (0x19).
    public static let ackAccessoryAuthenticationStatus: UInt8 = 0x19
    /// GetiPodOptionsForLingo (0x4B).
    public static let getiPodOptionsForLingo: UInt8 = 0x4B
    /// RetiPodOptionsForLingo (0x4C).
    public static let retiPodOptionsForLingo: UInt8 = 0x4C
    /// StartIDPS (0x38).
    public static let startIDPS: UInt8 = 0x38
    /// SetFIDTokenValues (0x39).
    public static let setFIDTokenValues: UInt8 = 0x39
    /// AckFIDTokenValues (0x3A).
    public static let ackFIDTokenValues: UInt8 = 0x3A
    /// EndIDPS (0x3B).
    public static let endIDPS: UInt8 = 0x3B
    /// IdpsStatus (0x3C).
    public static let idpsStatus: UInt8 = 0x3C
    /// OpenDataSessionForProtocol (0x3F).
    public static let openDataSessionForProtocol: UInt8 = 0x3F
    /// CloseDataSession (0x40).
    public static let closeDataSession: UInt8 = 0x40
    /// AccessoryAck (0x41).
    public static let accessoryAck: UInt8 = 0x41
    /// AccessoryDataTransfer (0x42).
    public static let accessoryDataTransfer: UInt8 = 0x42
    /// iPodDataTransfer (0x43).
    public static let iPodDataTransfer: UInt8 = 0x43
}

/// iPodAck and AccessoryAck status codes the flows use (PROTOCOL.md §1.6).
public enum IAP1AckStatus {
    /// Success (0x00).
    public static let success: UInt8 = 0x00
    /// Unknown Session ID (0x01).
    public static let unknownSessionID: UInt8 = 0x01
    /// Command Failed (0x02).
    public static let commandFailed: UInt8 = 0x02
    /// Out Of Resources (0x03).
    public static let outOfResources: UInt8 = 0x03
    /// Bad Parameter (0x04).
    public static let badParameter: UInt8 = 0x04
    /// Not Authenticated (0x07).
    public static let notAuthenticated: UInt8 = 0x07
    /// Bad Authentication Version (0x08).
    public static let badAuthenticationVersion: UInt8 = 0x08
    /// Certificate Invalid (0x0A).
    public static let certificateInvalid: UInt8 = 0x0A
    /// Dropped Data (0x17).
    public static let droppedData: UInt8 = 0x17
}

/// One FID token of SetFIDTokenValues: `len type subtype data…`, where `len` counts the bytes
/// after itself (PROTOCOL.md §1.7).
public struct FIDToken: Hashable, Sendable {
    /// The token type (first byte of its kind).
    public var type: UInt8
    /// The token subtype.
    public var subtype: UInt8
    /// The bytes after type and subtype.
    public var data: [UInt8]

    /// A token of kind `type`/`subtype` carrying `data`. Encoding throws for more than 253 data
    /// bytes: the token's length byte counts type, subtype and data.
    public init(type: UInt8, subtype: UInt8, data: [UInt8]) {
        self.type = type
        self.subtype = subtype
        self.data = data
    }

    /// `type << 8 | subtype`, the key the constants below use.
    public var kind: UInt16 { UInt16(type) << 8 | UInt16(subtype) }

    /// Identify (0x0000).
    public static let identify: UInt16 = 0x0000
    /// Accessory Caps (0x0001).
    public static let accessoryCaps: UInt16 = 0x0001
    /// Accessory Info (0x0002).
    public static let accessoryInfo: UInt16 = 0x0002
    /// Ea Protocol (0x0004).
    public static let eaProtocol: UInt16 = 0x0004
    /// Bundle Seed IDPref (0x0005).
    public static let bundleSeedIDPref: UInt16 = 0x0005
    /// Ea Protocol Metadata (0x0008).
    public static let eaProtocolMetadata: UInt16 = 0x0008

    /// AccessoryInfoToken info types.
    public enum InfoType {
        /// Name (0x01).
        public static let name: UInt8 = 0x01
        /// Firmware Version (0x04).
        public static let firmwareVersion: UInt8 = 0x04
        /// Hardware Version (0x05).
        public static let hardwareVersion: UInt8 = 0x05
        /// Manufacturer (0x06).
        public static let manufacturer: UInt8 = 0x06
        /// Model Number (0x07).
        public static let modelNumber: UInt8 = 0x07
        /// Serial Number (0x08).
        public static let serialNumber: UInt8 = 0x08
        /// Max Incoming Payload Size (0x09).
        public static let maxIncomingPayloadSize: UInt8 = 0x09
    }

    /// Decodes SetFIDTokenValues' payload: a token count, then the tokens back to back.
    ///
    /// - Throws: ``WireError`` when the count, a token's length or the payload's end disagree.
    public static func decodeList(_ payload: [UInt8]) throws(WireError) -> [FIDToken] {
        guard let count = payload.first else {
            throw .truncated(what: "SetFIDTokenValues", needed: 1, available: 0)
        }
        var tokens: [FIDToken] = []
        var offset = 1
        for index in 0..<Int(count) {
            guard offset < payload.count else {
                throw .lengthMismatch(what: "SetFIDTokenValues token count", declared: Int(count), actual: index)
            }
            let length = Int(payload[offset])
            guard length >= 2 else {
                throw .invalidLength(what: "FID token \(index + 1)", length: length, allowed: "2 to 255")
            }
            guard offset + 1 + length <= payload.count else {
                throw .truncated(what: "FID token \(index + 1)", needed: length, available: payload.count - offset - 1)
            }
            tokens.append(FIDToken(type: payload[offset + 1], subtype: payload[offset + 2],
                                   data: Array(payload[(offset + 3)..<(offset + 1 + length)])))
            offset += 1 + length
        }
        guard offset == payload.count else {
            throw .lengthMismatch(what: "SetFIDTokenValues", declared: offset, actual: payload.count)
        }
        return tokens
    }

    /// Encodes tokens as SetFIDTokenValues' payload.
    ///
    /// - Throws: ``WireError/tooLong(what:length:maximum:)`` for more than 255 tokens or a token
    ///   longer than 253 data bytes.
    public static func encodeList(_ tokens: [FIDToken]) throws(WireError) -> [UInt8] {
        guard tokens.count <= 0xFF else { throw .tooLong(what: "FID token list", length: tokens.count, maximum: 0xFF) }
        var payload: [UInt8] = [UInt8(tokens.count)]
        for token in tokens {
            guard token.data.count <= 0xFD else {
                throw .tooLong(what: "FID token \(token.type):\(token.subtype)", length: token.data.count, maximum: 0xFD)
            }
            payload.append(UInt8(token.data.count + 2))
            payload.append(token.type)
            payload.append(token.subtype)
            payload.append(contentsOf: token.data)
        }
        return payload
    }
}

/// The device's answer to one FID token in AckFIDTokenValues: `len type subtype status extra…`.
public struct FIDTokenAck: Hashable, Sendable {
    /// The token type (first byte of its kind).
    public var type: UInt8
    /// The token subtype.
    public var subtype: UInt8
    /// 0 accepted, 1 required token failed, 2 optional token failed, 3 not supported.
    public var status: UInt8
    /// What identifies the token among its kind (the info type, the protocol index).
    public var extra: [UInt8]

    /// Accepted.
    public static let accepted: UInt8 = 0
    /// Required Failed.
    public static let requiredFailed: UInt8 = 1
    /// Optional Failed.
    public static let optionalFailed: UInt8 = 2
    /// Not Supported.
    public static let notSupported: UInt8 = 3

    /// An acknowledgement of the token of kind `type`/`subtype` with `status` (``accepted``,
    /// ``requiredFailed``, ``optionalFailed`` or ``notSupported``); `extra` beyond 252 bytes is cut
    /// so the ack's length byte can count it.
    public init(type: UInt8, subtype: UInt8, status: UInt8, extra: [UInt8] = []) {
        self.type = type
        self.subtype = subtype
        self.status = status
        self.extra = Array(extra.prefix(0xFC))
    }

    /// AckFIDTokenValues' payload for `acks` (at most 255).
    public static func encodeList(_ acks: [FIDTokenAck]) -> [UInt8] {
        var payload: [UInt8] = [UInt8(min(acks.count, 0xFF))]
        for ack in acks.prefix(0xFF) {
            let extra = ack.extra.prefix(0xFC)
            payload.append(UInt8(3 + extra.count))
            payload += [ack.type, ack.subtype, ack.status]
            payload += extra
        }
        return payload
    }

    /// Decodes AckFIDTokenValues' payload.
    public static func decodeList(_ payload: [UInt8]) throws(WireError) -> [FIDTokenAck] {
        guard let count = payload.first else { throw .truncated(what: "AckFIDTokenValues", needed: 1, available: 0) }
        var acks: [FIDTokenAck] = []
        var offset = 1
        for index in 0..<Int(count) {
            guard offset < payload.count else {
                throw .lengthMismatch(what: "AckFIDTokenValues ack count", declared: Int(count), actual: index)
            }
            let length = Int(payload[offset])
            guard length >= 3, offset + 1 + length <= payload.count else {
                throw .invalidLength(what: "FID token ack \(index + 1)", length: length, allowed: "3 to the bytes left")
            }
            acks.append(FIDTokenAck(type: payload[offset + 1], subtype: payload[offset + 2], status: payload[offset + 3],
                                    extra: Array(payload[(offset + 4)..<(offset + 1 + length)])))
            offset += 1 + length
        }
        guard offset == payload.count else {
            throw .lengthMismatch(what: "AckFIDTokenValues", declared: offset, actual: payload.count)
        }
        return acks
    }
}

/// Reads the fields of an iAP1 payload front to back, with a typed error naming the field when
/// the payload is too short. Off the hot path (identification, acks).
public struct IAP1PayloadReader: Sendable {
    /// The payload being read.
    public let bytes: [UInt8]
    /// How many bytes of ``bytes`` have been read: the next field starts here.
    public private(set) var offset = 0
    /// What is being read, for error messages (e.g. "OpenDataSessionForProtocol").
    public let what: String

    /// A reader at the start of `bytes`; `what` names the payload in the errors it throws (e.g.
    /// "OpenDataSessionForProtocol").
    public init(_ bytes: [UInt8], what: String) {
        self.bytes = bytes
        self.what = what
    }

    /// Bytes not read yet.
    public var remaining: Int { bytes.count - offset }

    private mutating func take(_ count: Int, _ field: String) throws(WireError) -> ArraySlice<UInt8> {
        guard remaining >= count else {
            throw .truncated(what: "\(what) \(field)", needed: count, available: remaining)
        }
        defer { offset += count }
        return bytes[offset..<(offset + count)]
    }

    /// Reads a byte.
    public mutating func uint8(_ field: String) throws(WireError) -> UInt8 { try take(1, field).first! }

    /// Reads a big-endian UInt16.
    public mutating func uint16(_ field: String) throws(WireError) -> UInt16 {
        try take(2, field).reduce(0) { $0 << 8 | UInt16($1) }
    }

    /// Reads a big-endian UInt32.
    public mutating func uint32(_ field: String) throws(WireError) -> UInt32 {
        try take(4, field).reduce(0) { $0 << 8 | UInt32($1) }
    }

    /// Reads a big-endian UInt64.
    public mutating func uint64(_ field: String) throws(WireError) -> UInt64 {
        try take(8, field).reduce(0) { $0 << 8 | UInt64($1) }
    }

    /// Reads the next `count` bytes.
    ///
    /// - Throws: ``WireError/truncated(what:needed:available:)`` naming `field` when fewer are left.
    public mutating func bytes(_ count: Int, _ field: String) throws(WireError) -> [UInt8] { Array(try take(count, field)) }

    /// The rest of the payload.
    public mutating func rest() -> [UInt8] {
        defer { offset = bytes.count }
        return Array(bytes[offset...])
    }

    /// A NUL-terminated UTF-8 string (the NUL is consumed). A string that runs to the end of the
    /// payload without its NUL is an error: the length lied.
    public mutating func cString(_ field: String) throws(WireError) -> String {
        guard let end = bytes[offset...].firstIndex(of: 0) else {
            throw .invalidString(parameterID: 0, reason: "\(what) \(field) has no terminating NUL")
        }
        let text = bytes[offset..<end]
        offset = end + 1
        guard let string = String(validating: text, as: UTF8.self) else {
            throw .invalidString(parameterID: 0, reason: "\(what) \(field) is not UTF-8")
        }
        return string
    }
}

extension Array where Element == UInt8 {
    /// Appends `string` as UTF-8 and a NUL, as iAP1 strings are sent.
    public mutating func appendCString(_ string: String) {
        append(contentsOf: Array(string.utf8))
        append(0)
    }
}
