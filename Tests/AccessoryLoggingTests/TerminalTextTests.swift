import AccessoryLogging
import Testing

@Suite("Text escaped for a terminal")
struct TerminalTextTests {
    @Test func escapeSequencesAreShownNotActedOn() {
        // Retitles the terminal (OSC … BEL), clears the screen, turns the text red.
        #expect("\u{1B}]0;pwned\u{07}".escapedForTerminal == #"\u{1b}]0;pwned\u{7}"#)
        #expect("\u{1B}[2J".escapedForTerminal == #"\u{1b}[2J"#)
        #expect("Mic\u{1B}[31m red".escapedForTerminal == #"Mic\u{1b}[31m red"#)
        // The one-byte C1 control sequence introducer, and the other C1 controls.
        #expect("\u{9B}2J".escapedForTerminal == #"\u{9b}2J"#)
        #expect("\u{80}\u{9F}".escapedForTerminal == #"\u{80}\u{9f}"#)
    }

    @Test func lineBreaksAndOtherControlsAreVisible() {
        #expect("Mic\nfake line".escapedForTerminal == #"Mic\nfake line"#)
        #expect("a\rb\tc".escapedForTerminal == #"a\rb\tc"#)
        #expect("\u{0}\u{8}\u{7F}".escapedForTerminal == #"\u{0}\u{8}\u{7f}"#)
        #expect("a\u{2028}b\u{2029}".escapedForTerminal == #"a\u{2028}b\u{2029}"#)
    }

    @Test func bidirectionalOverridesAreVisible() {
        // "Mic" then a right-to-left override: a terminal would show what follows reversed.
        #expect("Mic\u{202E}gpj.exe".escapedForTerminal == #"Mic\u{202e}gpj.exe"#)
        #expect("\u{2066}x\u{2069}\u{200F}\u{061C}".escapedForTerminal == #"\u{2066}x\u{2069}\u{200f}\u{61c}"#)
    }

    @Test func backslashIsEscapedSoTheResultIsUnambiguous() {
        // The text `\n` (two characters) and a newline must not look the same.
        #expect(#"C:\new"#.escapedForTerminal == #"C:\\new"#)
        #expect(#"\u{1b}"#.escapedForTerminal != "\u{1B}".escapedForTerminal)
    }

    @Test func printableTextIsUntouched() {
        for text in ["Zürich 東京", "Microphone Pro 2", "", "emoji 🎤 ok", "quote \" and ' stay", "naïve café"] {
            #expect(text.escapedForTerminal == text)
        }
        #expect("Zürich 東京"[...].escapedForTerminal == "Zürich 東京")
    }

    @Test func logLinesEscapeTheMessage() {
        let record = LogRecord(level: .info, label: "iapctl", message: "identified Evil\u{1B}[2J\nfake line",
                               metadata: ["name": "a\u{9B}b"], timestamp: .zero)
        #expect(StderrLogHandler.line(for: record)
            == #"1970-01-01T00:00:00.000000Z info iapctl: identified Evil\u{1b}[2J\nfake line name="a\u{9b}b""# + "\n")
    }
}
