/// Why bytes could not be decoded (or a value could not be encoded) as an iAP frame or message.
///
/// Every case says what was wrong with which field, so a trace or a log line can tell a person
/// what the accessory (or the caller) got wrong. Decoding never traps on malformed input: it
/// throws one of these.
public enum WireError: Error, Equatable, Hashable, Sendable, CustomStringConvertible {
    /// Fewer bytes than the structure needs.
    case truncated(what: String, needed: Int, available: Int)
    /// The bytes do not start with the expected synchronisation bytes.
    case badSync(what: String, expected: [UInt8], found: [UInt8])
    /// A checksum did not verify.
    case badChecksum(what: String, expected: UInt8, found: UInt8)
    /// A length field holds a value the format does not allow.
    case invalidLength(what: String, length: Int, allowed: String)
    /// A length field disagrees with the number of bytes actually present.
    case lengthMismatch(what: String, declared: Int, actual: Int)
    /// Too much data to encode in the length field of the format.
    case tooLong(what: String, length: Int, maximum: Int)
    /// A parameter's data has the wrong size for the type it is read as.
    case wrongParameterSize(parameterID: UInt16, expected: String, actual: Int)
    /// A string parameter is not valid UTF-8, or has a NUL byte before its end.
    case invalidString(parameterID: UInt16, reason: String)
    /// A parameter group nests deeper than allowed.
    case groupNestingTooDeep(parameterID: UInt16, limit: Int)

    public var description: String {
        switch self {
        case let .truncated(what, needed, available):
            return "\(what) is truncated: needs \(needed) bytes, only \(available) present"
        case let .badSync(what, expected, found):
            return "\(what) does not start with \(hex(expected)) (found \(hex(found)))"
        case let .badChecksum(what, expected, found):
            return "\(what) checksum is wrong: expected \(hex([expected])), found \(hex([found]))"
        case let .invalidLength(what, length, allowed):
            return "\(what) length \(length) is not allowed (valid: \(allowed))"
        case let .lengthMismatch(what, declared, actual):
            return "\(what) declares \(declared) bytes but \(actual) are present"
        case let .tooLong(what, length, maximum):
            return "\(what) of \(length) bytes is longer than the format allows (\(maximum))"
        case let .wrongParameterSize(id, expected, actual):
            return "parameter \(id) has \(actual) data bytes; its type (\(expected)) needs a different size"
        case let .invalidString(id, reason):
            return "parameter \(id) is not a valid string: \(reason)"
        case let .groupNestingTooDeep(id, limit):
            return "parameter \(id) nests groups deeper than \(limit) levels"
        }
    }
}

/// Bytes as upper-case hex separated by spaces, e.g. `FF 5A`.
@usableFromInline
func hex(_ bytes: [UInt8]) -> String {
    var out = ""
    out.reserveCapacity(bytes.count * 3)
    for (index, byte) in bytes.enumerated() {
        if index > 0 { out.append(" ") }
        out.append(hexByte(byte))
    }
    return out
}

/// A byte as two upper-case hex digits, e.g. `0A`.
public func hexByte(_ byte: UInt8) -> String {
    let digits: [Character] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "A", "B", "C", "D", "E", "F"]
    return String([digits[Int(byte >> 4)], digits[Int(byte & 0x0F)]])
}
