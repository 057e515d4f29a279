/// Text from outside the program (an accessory's name, a protocol string, a reason a peer gave)
/// made safe to show to a person on a terminal or in a log line.
///
/// An accessory chooses its own strings. Printed raw, `ESC]0;…BEL` retitles the terminal,
/// `ESC[2J` clears it, a newline forges a line of output and a right-to-left override reorders
/// what follows. ``Swift/StringProtocol/escapedForTerminal`` shows such characters as the escapes
/// of a Swift string literal, so nothing reaches the terminal as a control and the text still
/// reads unambiguously:
///
/// | in the text | shown as |
/// |---|---|
/// | `\` | `\\` |
/// | newline, carriage return, tab | `\n`, `\r`, `\t` |
/// | any other C0 control (U+0000–U+001F, ESC included), DEL (U+007F), a C1 control (U+0080–U+009F) | `\u{` lower-case hex `}`: `\u{1b}`, `\u{7f}`, `\u{9b}` |
/// | a bidirectional formatting character (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069), the line and paragraph separators (U+2028, U+2029) | the same: `\u{202e}` |
///
/// Every other character, printable text of any script included (`Zürich 東京`), is left as it
/// is. JSON output needs none of this: its encoder escapes controls itself and keeps the string
/// exact.
public enum TerminalText {
    /// Whether `scalar` is shown as an escape (see ``TerminalText``).
    public static func needsEscape(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x00...0x1F, 0x5C, 0x7F...0x9F: return true
        case 0x061C, 0x200E, 0x200F, 0x2028...0x202E, 0x2066...0x2069: return true
        default: return false
        }
    }

    /// Appends `scalar` to `text`, escaped when ``needsEscape(_:)`` says so.
    static func append(_ scalar: Unicode.Scalar, to text: inout String) {
        switch scalar {
        case "\\": text += "\\\\"
        case "\n": text += "\\n"
        case "\r": text += "\\r"
        case "\t": text += "\\t"
        default:
            if needsEscape(scalar) {
                text += "\\u{" + String(scalar.value, radix: 16) + "}"
            } else {
                text.unicodeScalars.append(scalar)
            }
        }
    }
}

extension StringProtocol {
    /// The text with controls, escape sequences, line breaks, bidirectional overrides and
    /// backslashes shown as Swift string-literal escapes (`\u{1b}`, `\n`, `\u{202e}`, `\\`), so
    /// it can be printed for a person without the terminal acting on it. See ``TerminalText``
    /// for the whole scheme. Text with nothing to escape comes back unchanged.
    public var escapedForTerminal: String {
        guard unicodeScalars.contains(where: TerminalText.needsEscape) else { return String(self) }
        var result = ""
        result.reserveCapacity(utf8.count + 16)
        for scalar in unicodeScalars { TerminalText.append(scalar, to: &result) }
        return result
    }
}
