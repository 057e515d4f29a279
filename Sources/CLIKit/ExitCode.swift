/// The status a command-line tool exits with, using the BSD `sysexits.h` conventions.
///
/// A body passed to ``CommandLineTool/run(_:arguments:manPageDate:body:)`` returns one of these. An
/// `ExitCode` is also an `Error`: throwing one from a body ends the tool with that status and
/// prints nothing more (the body is expected to have said what went wrong itself).
package struct ExitCode: RawRepresentable, Sendable, Equatable, Hashable, Error, CustomStringConvertible {
    /// The numeric status handed to `exit(3)`.
    package var rawValue: Int32

    /// Wraps a numeric exit status.
    package init(rawValue: Int32) {
        self.rawValue = rawValue
    }

    /// Wraps a numeric exit status.
    package init(_ rawValue: Int32) {
        self.rawValue = rawValue
    }

    /// `0`: the tool did what was asked.
    package static let success = ExitCode(0)
    /// `1`: a general failure that no more specific code describes (an operation failed).
    package static let failure = ExitCode(1)
    /// `64` (`EX_USAGE`): the command line was wrong: unknown option, missing argument, bad value.
    package static let usage = ExitCode(64)
    /// `65` (`EX_DATAERR`): the input data was malformed (a capture that does not decode).
    package static let dataError = ExitCode(65)
    /// `66` (`EX_NOINPUT`): an input file did not exist or could not be read.
    package static let noInput = ExitCode(66)
    /// `69` (`EX_UNAVAILABLE`): a service or device the tool needs is not there (no accessory attached).
    package static let unavailable = ExitCode(69)
    /// `70` (`EX_SOFTWARE`): an internal error was detected: a bug in the tool, not in its input.
    package static let software = ExitCode(70)
    /// `71` (`EX_OSERR`): the operating system refused something the tool needs that is not a
    /// file or a device of the user's (a pseudo-terminal cannot be created, a gadget cannot be built).
    package static let osError = ExitCode(71)
    /// `73` (`EX_CANTCREAT`): an output file or socket the user named cannot be created.
    package static let cannotCreate = ExitCode(73)
    /// `74` (`EX_IOERR`): reading or writing a file or device failed part way.
    package static let ioError = ExitCode(74)
    /// `75` (`EX_TEMPFAIL`): a temporary failure (timeout, device busy); trying again later may work.
    package static let tempFail = ExitCode(75)
    /// `77` (`EX_NOPERM`): the tool lacks the permission it needs (e.g. to open a USB device node).
    package static let noPermission = ExitCode(77)
    /// `130` (128 + `SIGINT`): interrupted by Ctrl-C, as shells report it.
    package static let interrupted = ExitCode(130)

    /// True for status `0`.
    package var isSuccess: Bool { rawValue == 0 }

    /// The symbolic name for the known codes (`"usage (64)"`), the bare number otherwise.
    package var description: String {
        switch rawValue {
        case 0: return "success (0)"
        case 1: return "failure (1)"
        case 64: return "usage (64)"
        case 65: return "dataError (65)"
        case 66: return "noInput (66)"
        case 69: return "unavailable (69)"
        case 70: return "software (70)"
        case 71: return "osError (71)"
        case 73: return "cannotCreate (73)"
        case 74: return "ioError (74)"
        case 75: return "tempFail (75)"
        case 77: return "noPermission (77)"
        case 130: return "interrupted (130)"
        default: return String(rawValue)
        }
    }
}

/// An error that knows which ``ExitCode`` a tool should end with when it escapes the tool's body.
///
/// ``CommandLineTool`` prints such an error as `error: <description>` and exits with
/// ``exitCode`` instead of ``ExitCode/failure``.
package protocol ExitCodeProviding: Error {
    /// The status the tool exits with when this error ends it.
    var exitCode: ExitCode { get }
}
