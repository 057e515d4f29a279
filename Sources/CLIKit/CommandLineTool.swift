internal import AccessoryLogging
internal import Glibc

/// Runs a tool's body for a parsed command line and turns every outcome into output and an
/// exit status.
///
/// | outcome | standard output | standard error | status |
/// | --- | --- | --- | --- |
/// | help asked | the help text | | 0 |
/// | `--version` | the version | | 0 |
/// | ``UsageError`` (parsing, or thrown by the body) | | `error: <message>`, usage line, `See '<command> --help'.` | 64 |
/// | ``ExitCode`` thrown by the body | | | that code |
/// | ``ExitCodeProviding`` error thrown by the body | | `error: <description>` | its ``ExitCodeProviding/exitCode`` |
/// | any other error thrown by the body | | `error: <description>` | 1 |
/// | body returns | | | what it returned |
///
/// Messages and descriptions are escaped for the terminal (`escapedForTerminal` of
/// AccessoryLogging): an error that quotes an accessory's name stays on its one line and sends
/// the terminal no controls. Code that builds an error message should not escape it again.
public enum CommandLineTool {
    /// Parses `arguments` against `spec`, runs `body` when a command is selected, writes what
    /// the outcome calls for (see the table on ``CommandLineTool``) and exits the process.
    public static func run(
        _ spec: CommandSpec,
        arguments: [String] = Array(CommandLine.arguments.dropFirst()),
        body: (ParsedCommand) throws -> ExitCode
    ) -> Never {
        let result = evaluate(spec, arguments: arguments, body: body)
        if !result.stdout.isEmpty { StandardOutput.write(result.stdout) }
        if !result.stderr.isEmpty { StandardError.write(result.stderr) }
        exit(result.exitCode.rawValue)
    }

    /// Does what ``run(_:arguments:body:)`` does, but returns the exit status and the text the
    /// tool itself would print instead of printing it and exiting. What `body` prints goes
    /// where it would anyway. Intended for tests.
    public static func evaluate(
        _ spec: CommandSpec,
        arguments: [String],
        body: (ParsedCommand) throws -> ExitCode
    ) -> (exitCode: ExitCode, stdout: String, stderr: String) {
        let outcome: ParseOutcome
        do {
            outcome = try spec.parse(arguments)
        } catch {
            return (.usage, "", usageMessage(error))
        }
        switch outcome {
        case .help(let text):
            return (.success, text + "\n", "")
        case .version(let version):
            return (.success, version + "\n", "")
        case .run(let parsed):
            do {
                return (try body(parsed), "", "")
            } catch let error as UsageError {
                return (.usage, "", usageMessage(error))
            } catch let code as ExitCode {
                return (code, "", "")
            } catch let error as any ExitCodeProviding {
                return (error.exitCode, "", "error: \(String(describing: error).escapedForTerminal)\n")
            } catch {
                return (.failure, "", "error: \(String(describing: error).escapedForTerminal)\n")
            }
        }
    }

    /// A usage error as printed: its message escaped for the terminal (it may quote what was
    /// typed), then the usage line and the pointer to help.
    static func usageMessage(_ error: UsageError) -> String {
        var escaped = error
        escaped.message = error.message.escapedForTerminal
        return "error: \(escaped)\n"
    }
}
