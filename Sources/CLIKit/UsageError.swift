/// A command line that does not fit the tool's ``CommandSpec``: unknown option, missing value,
/// bad choice, extra argument and so on.
///
/// ``CommandLineTool`` prints it to standard error as
///
///     error: <message>
///     USAGE: <usage>
///     See '<command path> --help'.
///
/// and exits with ``ExitCode/usage``.
package struct UsageError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What was wrong, in one line without a trailing period (`unknown option '--jsn'; did you mean '--json'?`).
    package var message: String
    /// The usage line of the command the error concerns, without the `USAGE: ` prefix.
    package var usage: String
    /// The names from the root to the command the error concerns (`["iapctl", "decode"]`).
    package var commandPath: [String]

    /// Makes an error about the command at `commandPath` whose usage line is `usage`.
    package init(_ message: String, usage: String, commandPath: [String]) {
        self.message = message
        self.usage = usage
        self.commandPath = commandPath
    }

    /// The message, the usage line and a pointer to the command's help, one per line.
    package var description: String {
        "\(message)\nUSAGE: \(usage)\nSee '\(commandPath.joined(separator: " ")) --help'."
    }
}
