import CLIKit
import Testing

private struct DeviceGone: Error, CustomStringConvertible {
    var description: String { "the accessory went away" }
}

private struct NoPermission: ExitCodeProviding, CustomStringConvertible {
    var exitCode: ExitCode { .noPermission }
    var description: String { "cannot open /dev/bus/usb/001/004" }
}

private struct NoAccessory: ExitCodeProviding, CustomStringConvertible {
    var description: String
    var exitCode: ExitCode { .unavailable }
}

@Suite("CommandLineTool.evaluate")
struct CommandLineToolTests {
    @Test func helpGoesToStdoutWithStatusZero() {
        var ran = false
        let result = CommandLineTool.evaluate(sampleTool, arguments: ["decode", "--help"]) { _ in
            ran = true
            return .success
        }
        #expect(!ran)
        #expect(result.exitCode == .success)
        #expect(result.stdout == (sampleTool.helpText(for: ["decode"]) ?? "") + "\n")
        #expect(result.stderr.isEmpty)
    }

    @Test func versionGoesToStdout() {
        let result = CommandLineTool.evaluate(sampleTool, arguments: ["--version"]) { _ in .failure }
        #expect(result.exitCode == .success)
        #expect(result.stdout == "iapctl 0.3.0\n")
        #expect(result.stderr.isEmpty)
    }

    @Test func usageErrorGoesToStderrWithStatus64() {
        var ran = false
        let result = CommandLineTool.evaluate(sampleTool, arguments: ["decode", "--jsn"]) { _ in
            ran = true
            return .success
        }
        #expect(!ran)
        #expect(result.exitCode == .usage)
        #expect(result.exitCode.rawValue == 64)
        #expect(result.stdout.isEmpty)
        #expect(
            result.stderr == """
                error: unknown option '--jsn'; did you mean '--json'?
                USAGE: iapctl decode [<options>] [<input>]
                See 'iapctl decode --help'.

                """
        )
    }

    @Test func bodyResultIsTheStatus() {
        let result = CommandLineTool.evaluate(sampleTool, arguments: ["-vv", "probe", "--simulate=nano"]) { command in
            #expect(command.path == ["iapctl", "probe"])
            #expect(command.count("verbose") == 2)
            #expect(command.value("simulate") == "nano")
            return .unavailable
        }
        #expect(result.exitCode == .unavailable)
        #expect(result.stdout.isEmpty)
        #expect(result.stderr.isEmpty)
    }

    @Test func thrownErrorIsFailure() {
        let result = CommandLineTool.evaluate(sampleTool, arguments: ["session", "open"]) { _ in throw DeviceGone() }
        #expect(result.exitCode == .failure)
        #expect(result.stderr == "error: the accessory went away\n")
        #expect(result.stdout.isEmpty)
    }

    @Test func exitCodeProvidingErrorChoosesStatus() {
        let result = CommandLineTool.evaluate(sampleTool, arguments: ["probe"]) { _ in throw NoPermission() }
        #expect(result.exitCode == .noPermission)
        #expect(result.exitCode.rawValue == 77)
        #expect(result.stderr == "error: cannot open /dev/bus/usb/001/004\n")
    }

    @Test func thrownExitCodeEndsQuietly() {
        let result = CommandLineTool.evaluate(sampleTool, arguments: ["probe"]) { _ in throw ExitCode.tempFail }
        #expect(result.exitCode == .tempFail)
        #expect(result.stderr.isEmpty)
        #expect(result.stdout.isEmpty)
    }

    @Test func usageErrorFromBodyIsStatus64() {
        let result = CommandLineTool.evaluate(sampleTool, arguments: ["probe", "--vendor", "apple"]) { command in
            _ = try command.integer("vendor", in: 0...0xFFFF)
            return .success
        }
        #expect(result.exitCode == .usage)
        #expect(
            result.stderr == """
                error: invalid value 'apple' for '--vendor <id>': expected an integer
                USAGE: iapctl probe [<options>]
                See 'iapctl probe --help'.

                """
        )
    }

    @Test func errorsThatQuoteAnAccessoryStayOnTheirLine() {
        // A description quoting an accessory's name: it must not clear the screen or forge a line.
        let hostile = "Evil\u{1B}[2J\nerror: fake"
        let thrown = CommandLineTool.evaluate(sampleTool, arguments: ["probe"]) { _ in
            throw NoAccessory(description: "no accessory matching '\(hostile)'")
        }
        #expect(thrown.stderr == #"error: no accessory matching 'Evil\u{1b}[2J\nerror: fake'"# + "\n")
        #expect(!thrown.stderr.unicodeScalars.contains("\u{1B}"))
        // A usage error keeps its own three lines; only the message is escaped.
        let usage = CommandLineTool.evaluate(sampleTool, arguments: ["probe"]) { command in
            throw UsageError("no accessory named '\(hostile)'", usage: "iapctl probe", commandPath: command.path)
        }
        #expect(usage.stderr == #"error: no accessory named 'Evil\u{1b}[2J\nerror: fake'"# + "\nUSAGE: iapctl probe\nSee 'iapctl probe --help'.\n")
    }

    @Test func sysexitsValues() {
        let expected: [(ExitCode, Int32)] = [
            (.success, 0), (.failure, 1), (.usage, 64), (.dataError, 65), (.noInput, 66),
            (.unavailable, 69), (.software, 70), (.ioError, 74), (.tempFail, 75), (.noPermission, 77),
        ]
        for (code, raw) in expected {
            #expect(code.rawValue == raw)
            #expect(ExitCode(rawValue: raw) == code)
        }
        #expect(ExitCode.success.isSuccess)
        #expect(!ExitCode.usage.isSuccess)
        #expect(ExitCode.usage.description == "usage (64)")
        #expect(ExitCode(3).description == "3")
    }
}
