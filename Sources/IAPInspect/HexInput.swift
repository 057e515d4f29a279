/// Reads bytes written as hex text, the way people paste them from logs and captures.
///
/// Accepted: pairs of hex digits separated by anything of white space, commas, colons, dashes or
/// nothing at all; an optional `0x`/`0X` before each pair or run; comments from `#` or `//` to
/// the end of the line. Anything else is an error that names the line and column.
public enum HexInput {
    /// Why text could not be read as hex.
    public struct ParseError: Error, Hashable, Sendable, CustomStringConvertible {
        public var line: Int
        public var column: Int
        public var reason: String
        public init(line: Int, column: Int, reason: String) {
            self.line = line
            self.column = column
            self.reason = reason
        }
        public var description: String { "line \(line), column \(column): \(reason)" }
    }

    /// The bytes `text` spells.
    public static func parse(_ text: String) throws(ParseError) -> [UInt8] {
        var result: [UInt8] = []
        var high: UInt8?
        var highLine = 1, highColumn = 1
        var line = 1, column = 0
        var scalars = Array(text.unicodeScalars)[...]
        while let scalar = scalars.popFirst() {
            column += 1
            if scalar == "\n" {
                line += 1
                column = 0
                continue
            }
            if scalar == "#" || (scalar == "/" && scalars.first == "/") {
                while let next = scalars.first, next != "\n" { scalars.removeFirst() }
                continue
            }
            if scalar == "0", let next = scalars.first, next == "x" || next == "X", high == nil {
                scalars.removeFirst()
                column += 1
                continue
            }
            if let value = hexValue(scalar) {
                if let first = high {
                    result.append(first << 4 | value)
                    high = nil
                } else {
                    high = value
                    highLine = line
                    highColumn = column
                }
                continue
            }
            if scalar == " " || scalar == "\t" || scalar == "\r" || scalar == "," || scalar == ":" || scalar == "-" {
                if high != nil {
                    throw ParseError(line: highLine, column: highColumn, reason: "a lone hex digit; bytes take two digits")
                }
                continue
            }
            throw ParseError(line: line, column: column, reason: "'\(scalar.escaped(asASCII: true))' is not a hex digit")
        }
        if high != nil {
            throw ParseError(line: highLine, column: highColumn, reason: "a lone hex digit; bytes take two digits")
        }
        return result
    }

    /// Whether `bytes` look like text (and so should be read as hex) rather than raw binary:
    /// valid UTF-8 without control characters other than tab, CR and LF. Raw iAP captures fail
    /// this at once (`FF` alone is not UTF-8; headers hold small binary values).
    public static func looksLikeText(_ bytes: [UInt8]) -> Bool {
        guard !bytes.isEmpty, let text = String(validating: bytes, as: UTF8.self) else { return false }
        return !text.unicodeScalars.contains { $0.value < 0x20 && $0 != "\n" && $0 != "\r" && $0 != "\t" || $0.value == 0x7F }
    }

    private static func hexValue(_ scalar: Unicode.Scalar) -> UInt8? {
        switch scalar.value {
        case 0x30...0x39: return UInt8(scalar.value - 0x30)
        case 0x41...0x46: return UInt8(scalar.value - 0x41 + 10)
        case 0x61...0x66: return UInt8(scalar.value - 0x61 + 10)
        default: return nil
        }
    }

    /// Bytes as upper-case hex separated by spaces.
    public static func format(_ bytes: some Collection<UInt8>, separator: String = " ") -> String {
        let digits = Array("0123456789ABCDEF")
        var out = ""
        out.reserveCapacity(bytes.count * 3)
        var first = true
        for byte in bytes {
            if !first { out += separator }
            first = false
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0F)])
        }
        return out
    }
}
