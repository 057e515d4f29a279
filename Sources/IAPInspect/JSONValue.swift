internal import AccessoryLogging

/// A JSON value whose objects keep their keys in the order they were built, so that output
/// reads the same every time (`kind` first, details last).
public indirect enum JSONValue: Hashable, Sendable {
    /// JSON `null`.
    case null
    /// JSON `true` or `false`.
    case bool(Bool)
    /// A JSON number; integers only (every number in a frame report is one).
    case int(Int)
    /// A JSON number with a fraction (seconds, rates); written in the shortest form that reads
    /// back the same, and as `null` when it is not finite (JSON has no infinity or NaN).
    case number(Double)
    /// A JSON string, kept exact; ``serialized()`` escapes quotes, backslashes and controls.
    case string(String)
    /// A JSON array.
    case array([JSONValue])
    /// A JSON object whose members are written in this order.
    case object([(String, JSONValue)])

    public static func == (lhs: JSONValue, rhs: JSONValue) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null): return true
        case let (.bool(a), .bool(b)): return a == b
        case let (.int(a), .int(b)): return a == b
        case let (.number(a), .number(b)): return a == b
        case let (.string(a), .string(b)): return a == b
        case let (.array(a), .array(b)): return a == b
        case let (.object(a), .object(b)): return a.count == b.count && zip(a, b).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
        default: return false
        }
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(serialized())
    }

    /// The value of `key` in an object.
    public subscript(key: String) -> JSONValue? {
        guard case let .object(pairs) = self else { return nil }
        return pairs.first { $0.0 == key }?.1
    }

    /// Compact JSON text on one line. Strings are kept exact; controls, DEL, C1 controls and
    /// bidirectional overrides in them are written as `\u` escapes, so the line is safe to show.
    public func serialized() -> String {
        var out = ""
        write(to: &out)
        return out
    }

    private func write(to out: inout String) {
        switch self {
        case .null: out += "null"
        case let .bool(value): out += value ? "true" : "false"
        case let .int(value): out += String(value)
        case let .number(value): out += value.isFinite ? String(value) : "null"
        case let .string(value): Self.writeString(value, to: &out)
        case let .array(values):
            out += "["
            for (index, value) in values.enumerated() {
                if index > 0 { out += "," }
                value.write(to: &out)
            }
            out += "]"
        case let .object(pairs):
            out += "{"
            for (index, pair) in pairs.enumerated() {
                if index > 0 { out += "," }
                Self.writeString(pair.0, to: &out)
                out += ":"
                pair.1.write(to: &out)
            }
            out += "}"
        }
    }

    private static func writeString(_ value: String, to out: inout String) {
        out += "\""
        for scalar in value.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            default:
                // Controls must be escaped; DEL, C1 controls and bidirectional overrides are
                // escaped too, so JSON shown on a terminal cannot act on it. The string is the same.
                if TerminalText.needsEscape(scalar) {
                    let digits = Array("0123456789abcdef")
                    out += "\\u"
                    for shift in stride(from: 12, through: 0, by: -4) { out.append(digits[Int(scalar.value >> UInt32(shift)) & 0xF]) }
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        out += "\""
    }
}
