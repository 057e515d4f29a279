/// A control-session message id (e.g. `0x1D01` IdentificationInformation).
public struct MessageID: RawRepresentable, Hashable, Sendable, Comparable, CustomStringConvertible {
    public let rawValue: UInt16
    public init(rawValue: UInt16) { self.rawValue = rawValue }
    /// Creates an id from its raw value.
    public init(_ rawValue: UInt16) { self.rawValue = rawValue }

    public static func < (lhs: MessageID, rhs: MessageID) -> Bool { lhs.rawValue < rhs.rawValue }

    /// The catalogue name, or `0xHHHH` for an id not in the catalogue.
    public var description: String { MessageCatalogue.info(for: self)?.name ?? "0x" + hexByte(UInt8(rawValue >> 8)) + hexByte(UInt8(rawValue & 0xFF)) }
}

/// One parameter of a control-session message: `PLEN u16 | PID u16 | data`, where `PLEN`
/// counts its own 4-byte header.
///
/// The data is kept as bytes; typed accessors read it as the type the catalogue (or the caller)
/// says it has, and throw when the size does not fit. A group parameter holds further
/// parameters; ``group(maxDepth:)`` parses one level and remembers the depth, so nesting is
/// bounded however the bytes are built.
public struct Parameter: Hashable, Sendable {
    /// Bytes of the parameter header.
    public static let headerSize = 4
    /// How deep groups may nest by default (a top-level parameter is depth 0).
    public static let defaultMaxGroupDepth = 4

    /// The parameter id (meaning depends on the message, or on the enclosing group).
    public var id: UInt16
    /// The data after the 4-byte header.
    public var data: [UInt8]
    /// How many groups enclose this parameter (0 at the top level of a message).
    public var depth: Int

    /// Creates a parameter from its id and raw data.
    public init(id: UInt16, data: [UInt8] = [], depth: Int = 0) {
        self.id = id
        self.data = data
        self.depth = depth
    }

    public static func == (lhs: Parameter, rhs: Parameter) -> Bool { lhs.id == rhs.id && lhs.data == rhs.data }
    public func hash(into hasher: inout Hasher) {
        hasher.combine(id)
        hasher.combine(data)
    }

    /// Bytes on the wire.
    public var encodedLength: Int { Self.headerSize + data.count }

    // MARK: Building

    /// A flag: no data, presence means true.
    public static func flag(_ id: UInt16) -> Parameter { Parameter(id: id) }
    /// One byte (also the wire form of enums).
    public static func uint8(_ id: UInt16, _ value: UInt8) -> Parameter { Parameter(id: id, data: [value]) }
    /// A big-endian 16-bit value.
    public static func uint16(_ id: UInt16, _ value: UInt16) -> Parameter {
        var data: [UInt8] = []
        data.appendUInt16BE(value)
        return Parameter(id: id, data: data)
    }
    /// A big-endian 32-bit value.
    public static func uint32(_ id: UInt16, _ value: UInt32) -> Parameter {
        var data: [UInt8] = []
        data.appendUInt32BE(value)
        return Parameter(id: id, data: data)
    }
    /// A big-endian 64-bit value.
    public static func uint64(_ id: UInt16, _ value: UInt64) -> Parameter {
        var data: [UInt8] = []
        data.appendUInt64BE(value)
        return Parameter(id: id, data: data)
    }
    /// A boolean as one byte, 0 or 1.
    public static func bool(_ id: UInt16, _ value: Bool) -> Parameter { uint8(id, value ? 1 : 0) }
    /// A UTF-8 string, NUL-terminated on the wire.
    public static func string(_ id: UInt16, _ value: String) -> Parameter {
        Parameter(id: id, data: Array(value.utf8) + [0])
    }
    /// Raw bytes.
    public static func blob(_ id: UInt16, _ bytes: [UInt8]) -> Parameter { Parameter(id: id, data: bytes) }
    /// A packed list of big-endian 16-bit values (e.g. message ids).
    public static func uint16List(_ id: UInt16, _ values: [UInt16]) -> Parameter {
        var data: [UInt8] = []
        data.reserveCapacity(values.count * 2)
        for value in values { data.appendUInt16BE(value) }
        return Parameter(id: id, data: data)
    }
    /// A group holding further parameters.
    ///
    /// A member too long to encode (more than 65531 bytes of data) makes the group itself too
    /// long, so ``encode(into:)`` and ``ControlMessage/encode(into:)`` refuse the group: a wrong
    /// length never reaches the wire.
    public static func group(_ id: UInt16, _ parameters: [Parameter]) -> Parameter {
        var data: [UInt8] = []
        for parameter in parameters { parameter.appendUnchecked(to: &data) }
        return Parameter(id: id, data: data)
    }

    /// Most bytes of data one parameter can carry (its 16-bit length counts the 4-byte header).
    public static let maxDataLength = 0xFFFF - 4

    /// Appends the parameter to `output`.
    ///
    /// - Throws: ``WireError/tooLong(what:length:maximum:)`` when the data is longer than
    ///   ``maxDataLength`` (then nothing is appended).
    public func encode(into output: inout [UInt8]) throws(WireError) {
        guard encodedLength <= 0xFFFF else {
            throw .tooLong(what: "parameter \(id)", length: encodedLength, maximum: 0xFFFF)
        }
        appendUnchecked(to: &output)
    }

    /// Appends without the length check. In a group an over-long member makes the group over-long
    /// (its data is longer still), and that is checked where the group is encoded.
    private func appendUnchecked(to output: inout [UInt8]) {
        output.appendUInt16BE(UInt16(truncatingIfNeeded: encodedLength))
        output.appendUInt16BE(id)
        output.append(contentsOf: data)
    }

    // MARK: Reading

    /// Whether the parameter has no data (a flag).
    public var isFlag: Bool { data.isEmpty }

    private func unsigned(_ size: Int, _ type: String) throws(WireError) -> UInt64 {
        guard data.count == size else { throw .wrongParameterSize(parameterID: id, expected: type, actual: data.count) }
        return data.reduce(0) { $0 << 8 | UInt64($1) }
    }

    /// The data as one byte.
    public func uint8() throws(WireError) -> UInt8 { UInt8(try unsigned(1, "uint8")) }
    /// The data as a big-endian 16-bit value.
    public func uint16() throws(WireError) -> UInt16 { UInt16(try unsigned(2, "uint16")) }
    /// The data as a big-endian 32-bit value.
    public func uint32() throws(WireError) -> UInt32 { UInt32(try unsigned(4, "uint32")) }
    /// The data as a big-endian 64-bit value.
    public func uint64() throws(WireError) -> UInt64 { try unsigned(8, "uint64") }
    /// The data as a boolean (one byte, non-zero is true).
    public func bool() throws(WireError) -> Bool { try uint8() != 0 }

    /// The data as a UTF-8 string. The terminating NUL is removed; a string without one is
    /// accepted (some accessories omit it). A NUL before the end, or invalid UTF-8, throws.
    public func string() throws(WireError) -> String {
        var bytes = data[...]
        if bytes.last == 0 { bytes = bytes.dropLast() }
        if bytes.contains(0) { throw .invalidString(parameterID: id, reason: "NUL byte before the end") }
        guard let string = String(validating: bytes, as: UTF8.self) else {
            throw .invalidString(parameterID: id, reason: "not valid UTF-8")
        }
        return string
    }

    /// The data as a UTF-8 string read up to its first NUL: bytes after the NUL (an accessory
    /// that pads or appends to a string, PROTOCOL.md §7.7) are ignored; a string without a NUL
    /// is taken whole. Invalid UTF-8 before the NUL throws.
    public func stringUpToNUL() throws(WireError) -> String {
        let bytes = data.firstIndex(of: 0).map { data[..<$0] } ?? data[...]
        guard let string = String(validating: bytes, as: UTF8.self) else {
            throw .invalidString(parameterID: id, reason: "not valid UTF-8")
        }
        return string
    }

    /// Whether bytes follow the data's first NUL (what ``stringUpToNUL()`` ignores and
    /// ``string()`` refuses).
    public var hasBytesAfterNUL: Bool {
        guard let nul = data.firstIndex(of: 0) else { return false }
        return nul < data.count - 1
    }

    /// The data as a packed list of big-endian 16-bit values.
    public func uint16List() throws(WireError) -> [UInt16] {
        guard data.count % 2 == 0 else {
            throw .wrongParameterSize(parameterID: id, expected: "uint16 list", actual: data.count)
        }
        let span = data.span.bytes
        return stride(from: 0, to: data.count, by: 2).map { span.uint16BE(at: $0) }
    }

    /// The data as a group of parameters, one level deep.
    ///
    /// - Throws: ``WireError/groupNestingTooDeep(parameterID:limit:)`` when the parameters would
    ///   lie deeper than `maxDepth`, or a framing error for malformed data.
    public func group(maxDepth: Int = Parameter.defaultMaxGroupDepth) throws(WireError) -> [Parameter] {
        guard depth + 1 <= maxDepth else { throw .groupNestingTooDeep(parameterID: id, limit: maxDepth) }
        return try Parameter.parseList(data.span.bytes, depth: depth + 1)
    }

    /// Parses parameters laid back to back filling `bytes` exactly.
    public static func parseList(_ bytes: RawSpan, depth: Int = 0) throws(WireError) -> [Parameter] {
        var result: [Parameter] = []
        var offset = 0
        while offset < bytes.byteCount {
            let remaining = bytes.byteCount - offset
            guard remaining >= headerSize else {
                throw .truncated(what: "parameter header", needed: headerSize, available: remaining)
            }
            let length = Int(bytes.uint16BE(at: offset))
            let id = bytes.uint16BE(at: offset + 2)
            guard length >= headerSize else {
                throw .invalidLength(what: "parameter \(id)", length: length, allowed: "4 to 65535")
            }
            guard length <= remaining else {
                throw .lengthMismatch(what: "parameter \(id)", declared: length, actual: remaining)
            }
            result.append(Parameter(id: id, data: bytes.copyBytes((offset + headerSize)..<(offset + length)), depth: depth))
            offset += length
        }
        return result
    }
}

/// A control-session message: `40 40 | MSGLEN u16 | MSGID u16 | parameters…`, where `MSGLEN`
/// counts the whole message.
public struct ControlMessage: Hashable, Sendable {
    /// The start-of-message bytes `40 40`.
    public static let startOfMessage: UInt16 = 0x4040
    /// Bytes of the message header.
    public static let headerSize = 6
    /// The longest message the 16-bit length can describe.
    public static let maxLength = 65_535

    /// The message id.
    public var id: MessageID
    /// The parameters in wire order (ids may repeat to form lists).
    public var parameters: [Parameter]

    /// A message with `id` and `parameters` in the order they are to be sent. Nothing is checked
    /// here: ``encode(into:)`` throws ``WireError/tooLong(what:length:maximum:)`` when the message
    /// or a parameter outgrows its 16-bit length.
    public init(id: MessageID, parameters: [Parameter] = []) {
        self.id = id
        self.parameters = parameters
    }

    /// Bytes on the wire.
    public var encodedLength: Int { Self.headerSize + parameters.reduce(0) { $0 + $1.encodedLength } }

    /// The first parameter with `id`.
    public func parameter(_ id: UInt16) -> Parameter? { parameters.first { $0.id == id } }
    /// Every parameter with `id`, in order.
    public func parameters(_ id: UInt16) -> [Parameter] { parameters.filter { $0.id == id } }

    /// Appends the encoded message to `output`.
    ///
    /// - Throws: ``WireError/tooLong(what:length:maximum:)`` when the message or one of its
    ///   parameters does not fit its 16-bit length field.
    public func encode(into output: inout [UInt8]) throws(WireError) {
        try Self.checkLengths(parameters)
        let length = encodedLength
        guard length <= Self.maxLength else { throw .tooLong(what: "control message", length: length, maximum: Self.maxLength) }
        output.reserveCapacity(output.count + length)
        output.appendUInt16BE(Self.startOfMessage)
        output.appendUInt16BE(UInt16(length))
        output.appendUInt16BE(id.rawValue)
        for parameter in parameters { try parameter.encode(into: &output) }
    }

    private static func checkLengths(_ parameters: [Parameter]) throws(WireError) {
        for parameter in parameters where parameter.encodedLength > maxLength {
            throw .tooLong(what: "parameter \(parameter.id)", length: parameter.encodedLength, maximum: maxLength)
        }
    }

    /// The encoded message.
    public func encoded() throws(WireError) -> [UInt8] {
        var output: [UInt8] = []
        try encode(into: &output)
        return output
    }

    /// The length of the message at the start of `bytes`, from its header, once 4 bytes are
    /// there; nil before that.
    public static func declaredLength(in bytes: RawSpan) throws(WireError) -> Int? {
        guard bytes.byteCount >= 4 else { return nil }
        guard bytes.uint16BE(at: 0) == startOfMessage else {
            throw .badSync(what: "control message", expected: [0x40, 0x40], found: bytes.copyBytes(0..<2))
        }
        let length = Int(bytes.uint16BE(at: 2))
        guard length >= headerSize else {
            throw .invalidLength(what: "control message", length: length, allowed: "6 to 65535")
        }
        return length
    }

    /// Decodes the message at the start of `bytes`.
    ///
    /// - Returns: the message and how many bytes it used (a payload may hold several messages).
    public static func decode(prefixOf bytes: RawSpan) throws(WireError) -> (message: ControlMessage, length: Int) {
        guard let length = try declaredLength(in: bytes), bytes.byteCount >= headerSize else {
            throw .truncated(what: "control message header", needed: headerSize, available: bytes.byteCount)
        }
        guard length <= bytes.byteCount else {
            throw .lengthMismatch(what: "control message", declared: length, actual: bytes.byteCount)
        }
        let id = MessageID(bytes.uint16BE(at: 4))
        let parameters = try Parameter.parseList(bytes.extracting(headerSize..<length))
        return (ControlMessage(id: id, parameters: parameters), length)
    }

    /// Decodes exactly one message filling `bytes`.
    public static func decode(_ bytes: RawSpan) throws(WireError) -> ControlMessage {
        let (message, length) = try decode(prefixOf: bytes)
        guard length == bytes.byteCount else {
            throw .lengthMismatch(what: "control message", declared: length, actual: bytes.byteCount)
        }
        return message
    }

    /// Decodes exactly one message held in an array.
    public static func decode(_ bytes: [UInt8]) throws(WireError) -> ControlMessage {
        try decode(bytes.span.bytes)
    }
}
