internal import AccessoryLogging
internal import Glibc

/// Runs a tool's body for a parsed command line and turns every outcome into output and an
/// exit status.
///
/// | outcome | standard output | standard error | status |
/// | --- | --- | --- | --- |
/// | help asked | the help text | | 0 |
/// | `--version` | the version | | 0 |
/// | `--generate-completion-script bash\|zsh\|fish` (first word) | the completion script | | 0 |
/// | `--generate-man-page` (first word) | the man page in roff | | 0 |
/// | ``UsageError`` (parsing, or thrown by the body) | | `error: <message>`, usage line, `See '<command> --help'.` | 64 |
/// | ``ExitCode`` thrown by the body | | | that code |
/// | ``ExitCodeProviding`` error thrown by the body | | `error: <description>` | its ``ExitCodeProviding/exitCode`` |
/// | any other error thrown by the body | | `error: <description>` | 1 |
/// | body returns | | | what it returned |
///
/// Messages and descriptions are escaped for the terminal (`escapedForTerminal` of
/// AccessoryLogging): an error that quotes an accessory's name stays on its one line and sends
/// the terminal no controls. Code that builds an error message should not escape it again.
package enum CommandLineTool {
    /// Parses `arguments` against `spec`, runs `body` when a command is selected, writes what
    /// the outcome calls for (see the table on ``CommandLineTool``) and exits the process.
    ///
    /// Help is wrapped to the terminal's width when standard output is one, else to 80
    /// columns. `manPageDate` goes into the man page's header.
    package static func run(
        _ spec: CommandSpec,
        arguments: [String] = Array(CommandLine.arguments.dropFirst()),
        manPageDate: String = "",
        body: (ParsedCommand) throws -> ExitCode
    ) -> Never {
        let width = Terminal.isTTY(1) ? Terminal.columns(1) : HelpRenderer.defaultWidth
        let result = evaluate(spec, arguments: arguments, helpWidth: width, manPageDate: manPageDate, body: body)
        if !result.stdout.isEmpty { StandardOutput.write(result.stdout) }
        if !result.stderr.isEmpty { StandardError.write(result.stderr) }
        exit(result.exitCode.rawValue)
    }

    /// Does what ``run(_:arguments:manPageDate:body:)`` does, but returns the exit status and the text the
    /// tool itself would print instead of printing it and exiting. What `body` prints goes
    /// where it would anyway. Intended for tests.
    package static func evaluate(
        _ spec: CommandSpec,
        arguments: [String],
        helpWidth: Int = HelpRenderer.defaultWidth,
        manPageDate: String = "",
        body: (ParsedCommand) throws -> ExitCode
    ) -> (exitCode: ExitCode, stdout: String, stderr: String) {
        // The generators, for packaging (tools/install.sh): not commands a person types.
        if arguments.first == "--generate-man-page" {
            guard arguments.count == 1 else { return (.usage, "", "error: --generate-man-page takes nothing more\n") }
            return (.success, spec.manPage(date: manPageDate), "")
        }
        if arguments.first == "--generate-completion-script" {
            let names = CompletionShell.allCases.map(\.rawValue)
            guard arguments.count == 2, let shell = CompletionShell(rawValue: arguments[1]) else {
                return (.usage, "", "error: --generate-completion-script takes one of: \(names.joined(separator: ", "))\n")
            }
            return (.success, spec.completionScript(for: shell), "")
        }
        let outcome: ParseOutcome
        do {
            outcome = try spec.parse(arguments, helpWidth: helpWidth)
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
