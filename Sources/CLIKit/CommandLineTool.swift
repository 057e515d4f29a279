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
            return (.usage, "", "error: \(error)\n")
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
                return (.usage, "", "error: \(error)\n")
            } catch let code as ExitCode {
                return (code, "", "")
            } catch let error as any ExitCodeProviding {
                return (error.exitCode, "", "error: \(error)\n")
            } catch {
                return (.failure, "", "error: \(error)\n")
            }
        }
    }
}
