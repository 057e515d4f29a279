@testable import CLIKit
import Glibc
import Testing

@Suite("Terminal and output")
struct TerminalTests {
    @Test func pipeIsNotATerminal() {
        var fds: [Int32] = [-1, -1]
        #expect(pipe(&fds) == 0)
        defer {
            close(fds[0])
            close(fds[1])
        }
        #expect(!Terminal.isTTY(fds[0]))
        #expect(!Terminal.isTTY(fds[1]))
        #expect(Terminal.columns(fds[1]) == 80)
        #expect(Terminal.columns(-1) == 80)
        #expect(!Terminal.isTTY(-1))
    }
}

@Suite("Internals")
struct InternalTests {
    @Test func editDistance() {
        #expect(EditDistance.distance("", "") == 0)
        #expect(EditDistance.distance("", "abc") == 3)
        #expect(EditDistance.distance("json", "json") == 0)
        #expect(EditDistance.distance("jsn", "json") == 1)
        #expect(EditDistance.distance("josn", "json") == 1)
        #expect(EditDistance.distance("kitten", "sitting") == 3)
        #expect(EditDistance.closest(to: "decod", among: ["probe", "decode"]) == "decode")
        #expect(EditDistance.closest(to: "x", among: ["probe", "decode"]) == nil)
        // Ties go to the first candidate.
        #expect(EditDistance.closest(to: "cat", among: ["bat", "hat"]) == "bat")
    }

    @Test func integerParsing() {
        #expect(ParsedCommand.parseInteger("42") == 42)
        #expect(ParsedCommand.parseInteger("+42") == 42)
        #expect(ParsedCommand.parseInteger("-42") == -42)
        #expect(ParsedCommand.parseInteger("0xff") == 255)
        #expect(ParsedCommand.parseInteger("0XFF") == 255)
        #expect(ParsedCommand.parseInteger("9223372036854775807") == Int.max)
        #expect(ParsedCommand.parseInteger("-9223372036854775808") == Int.min)
        #expect(ParsedCommand.parseInteger("9223372036854775808") == nil)
        #expect(ParsedCommand.parseInteger("-9223372036854775809") == nil)
        #expect(ParsedCommand.parseInteger("ff") == nil)
        #expect(ParsedCommand.parseInteger("+-1") == nil)
    }
}
