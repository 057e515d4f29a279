/// Reads bytes written as hex text, the way people paste them from logs and captures.
///
/// Accepted: pairs of hex digits separated by anything of white space, commas, colons, dashes or
/// nothing at all; an optional `0x`/`0X` before each pair or run; comments from `#` or `//` to
/// the end of the line. Anything else is an error that names the line and column.
public enum HexInput {
    /// Why text could not be read as hex.
    public struct ParseError: Error, Hashable, Sendable, CustomStringConvertible {
        /// The line of the mistake, counted from 1.
        public var line: Int
        /// The column of the mistake, counted from 1 in Unicode scalars.
        public var column: Int
        /// What is wrong, for a person (e.g. "a lone hex digit; bytes take two digits").
        public var reason: String
        /// An error at `line` and `column` (both counted from 1) saying `reason`.
        public init(line: Int, column: Int, reason: String) {
            self.line = line
            self.column = column
            self.reason = reason
        }
        public var description: String { "line \(line), column \(column): \(reason)" }
    }

    /// The bytes `text` spells.
    public static func parse(_ text: String) throws(ParseError) -> [UInt8] {
        var parser = Parser()
        var bytes: [UInt8] = []
        let utf8 = Array(text.utf8)
        try parser.parse(utf8.span.bytes, into: &bytes)
        try parser.finish()
        return bytes
    }

    /// Reads hex text given in pieces of any size, holding only a few bytes of state: a pair of
    /// digits, a `0x`, a `//` or a UTF-8 character may be cut between two pieces. The text is
    /// the one ``parse(_:)`` reads, and so are the errors (with their line and column); text that
    /// is not UTF-8 is an error too. After an error the parser is not used again.
    public struct Parser: Sendable {
        /// A character whose meaning depends on the next one: `/` (a comment if another follows)
        /// or `0` (a prefix if `x` follows).
        private var deferred: (scalar: Unicode.Scalar, line: Int, column: Int)?
        private var high: UInt8?
        private var highLine = 1, highColumn = 1
        private var line = 1, column = 0
        private var inComment = false
        /// The bytes of a UTF-8 character read so far, and how many it has.
        private var character: [UInt8] = []
        private var characterLength = 0

        /// Creates a parser at the start of the text.
        public init() {}

        /// Reads the next piece of the text, appending the bytes it completes to `bytes`. When it
        /// throws, the bytes of the text before the error are in `bytes`.
        public mutating func parse(_ piece: RawSpan, into bytes: inout [UInt8]) throws(ParseError) {
            var failure: ParseError?
            piece.withUnsafeBytes { buffer in
                do throws(ParseError) {
                    for byte in buffer {
                        if characterLength == 0, byte < 0x80 {
                            try take(Unicode.Scalar(byte), into: &bytes)
                        } else {
                            try takeUTF8(byte, into: &bytes)
                        }
                    }
                } catch {
                    failure = error
                }
            }
            if let failure { throw failure }
        }

        /// Ends the text: a digit without its pair, a `/` alone or a character cut short is an
        /// error.
        public mutating func finish() throws(ParseError) {
            if characterLength > 0 {
                throw ParseError(line: line, column: column + 1,
                                 reason: "the text ends inside a UTF-8 character; it is cut short, or binary (use --format raw)")
            }
            var none: [UInt8] = []
            _ = try resolveDeferred(next: nil, into: &none)
            if high != nil {
                throw ParseError(line: highLine, column: highColumn, reason: "a lone hex digit; bytes take two digits")
            }
        }

        private mutating func takeUTF8(_ byte: UInt8, into bytes: inout [UInt8]) throws(ParseError) {
            if characterLength == 0 {
                switch byte {
                case 0xC2...0xDF: characterLength = 2
                case 0xE0...0xEF: characterLength = 3
                case 0xF0...0xF4: characterLength = 4
                default: throw notText(byte)
                }
                character.removeAll(keepingCapacity: true)
                character.append(byte)
                return
            }
            guard byte & 0xC0 == 0x80 else { throw notText(byte) }
            character.append(byte)
            guard character.count == characterLength else { return }
            characterLength = 0
            // Overlong forms and surrogates fail here.
            guard let text = String(validating: character, as: UTF8.self), let scalar = text.unicodeScalars.first else {
                throw notText(character[0])
            }
            try take(scalar, into: &bytes)
        }

        private func notText(_ byte: UInt8) -> ParseError {
            ParseError(line: line, column: column + 1,
                       reason: "byte 0x\(HexInput.format([byte])) is not UTF-8 text; use --format raw for binary input")
        }

        private mutating func take(_ scalar: Unicode.Scalar, into bytes: inout [UInt8]) throws(ParseError) {
            column += 1
            if inComment {
                if scalar == "\n" {
                    inComment = false
                    line += 1
                    column = 0
                }
                return
            }
            if deferred != nil, try resolveDeferred(next: scalar, into: &bytes) { return }
            if scalar == "\n" {
                line += 1
                column = 0
                return
            }
            if scalar == "#" {
                inComment = true
                return
            }
            if scalar == "/" || (scalar == "0" && high == nil) {
                deferred = (scalar, line, column)
                return
            }
            try takeDigitOrSeparator(scalar, line: line, column: column, into: &bytes)
        }

        /// Decides the deferred character now that `next` follows it (nil at the end). Returns
        /// true when `next` was part of it (the second `/`, the `x`).
        private mutating func resolveDeferred(next: Unicode.Scalar?, into bytes: inout [UInt8]) throws(ParseError) -> Bool {
            guard let held = deferred else { return false }
            deferred = nil
            if held.scalar == "/" {
                guard next == "/" else {
                    throw ParseError(line: held.line, column: held.column, reason: "'/' is not a hex digit")
                }
                inComment = true
                return true
            }
            if next == "x" || next == "X" { return true }
            try takeDigitOrSeparator(held.scalar, line: held.line, column: held.column, into: &bytes)
            return false
        }

        private mutating func takeDigitOrSeparator(
            _ scalar: Unicode.Scalar, line: Int, column: Int, into bytes: inout [UInt8]
        ) throws(ParseError) {
            if let value = HexInput.hexValue(scalar) {
                if let first = high {
                    bytes.append(first << 4 | value)
                    high = nil
                } else {
                    high = value
                    highLine = line
                    highColumn = column
                }
                return
            }
            if scalar == " " || scalar == "\t" || scalar == "\r" || scalar == "," || scalar == ":" || scalar == "-" {
                if high != nil {
                    throw ParseError(line: highLine, column: highColumn, reason: "a lone hex digit; bytes take two digits")
                }
                return
            }
            throw ParseError(line: line, column: column, reason: "'\(scalar.escaped(asASCII: true))' is not a hex digit")
        }
    }

    /// Whether `bytes` look like text (and so should be read as hex) rather than raw binary:
    /// valid UTF-8 without control characters other than tab, CR and LF. Raw iAP captures fail
    /// this at once (`FF` alone is not UTF-8; headers hold small binary values).
    ///
    /// - Parameters:
    ///   - bytes: the start of the input (a block is enough to decide).
    ///   - isPrefix: `bytes` are the first of a longer input, so a UTF-8 character cut off at
    ///     their end does not count against them.
    public static func looksLikeText(_ bytes: [UInt8], isPrefix: Bool = false) -> Bool {
        var end = bytes.count
        if isPrefix {
            // Leave out a character whose last bytes are still to come.
            var index = bytes.count - 1
            while index >= 0, index >= bytes.count - 3, bytes[index] & 0xC0 == 0x80 { index -= 1 }
            if index >= 0 {
                let lead = bytes[index]
                let length = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1
                if length > bytes.count - index { end = index }
            }
        }
        guard end > 0, let text = String(validating: bytes[0..<end], as: UTF8.self) else { return false }
        return !text.unicodeScalars.contains { $0.value < 0x20 && $0 != "\n" && $0 != "\r" && $0 != "\t" || $0.value == 0x7F }
    }

    fileprivate static func hexValue(_ scalar: Unicode.Scalar) -> UInt8? {
        switch scalar.value {
        case 0x30...0x39: return UInt8(scalar.value - 0x30)
        case 0x41...0x46: return UInt8(scalar.value - 0x41 + 10)
        case 0x61...0x66: return UInt8(scalar.value - 0x61 + 10)
        default: return nil
        }
    }

    /// Bytes as upper-case hex separated by spaces.
    public static func format(_ bytes: some Collection<UInt8>, separator: String = " ") -> String {
        let count = bytes.count
        guard count > 0 else { return "" }
        let length = count * 2 + (count - 1) * separator.utf8.count
        // Written as UTF-8 in place: this runs for every frame `iapctl decode` prints.
        return String(unsafeUninitializedCapacity: length) { buffer in
            var index = 0
            for byte in bytes {
                if index > 0 {
                    for unit in separator.utf8 {
                        buffer[index] = unit
                        index += 1
                    }
                }
                buffer[index] = digit(byte >> 4)
                buffer[index + 1] = digit(byte & 0x0F)
                index += 2
            }
            return index
        }
    }

    private static func digit(_ nibble: UInt8) -> UInt8 {
        nibble < 10 ? 0x30 + nibble : 0x41 - 10 + nibble
    }
}
