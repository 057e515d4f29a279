/// The description of one command of a tool: its options, its positional arguments and its
/// subcommands. The root spec of a tool parses the command line (``parse(_:helpWidth:)``) and renders help
/// (``helpText(for:width:)``).
///
/// Options marked ``OptionSpec/inherited`` apply to the command that declares them and to all of
/// its subcommands, at any depth (typical: `-v/--verbose`, `--json`, `--trace` on the root).
/// `-h/--help` is always available; `--version` is available at every level when the root has a
/// ``version``.
package struct CommandSpec: Sendable {
    /// The command's name: the tool name for the root, the word that selects it otherwise.
    package var name: String
    /// A one-line description, shown after `OVERVIEW:` and in the parent's `SUBCOMMANDS:` list.
    package var abstract: String
    /// Longer text shown in this command's help after the overview.
    package var discussion: String
    /// The options this command accepts (besides the inherited options of its ancestors).
    package var options: [OptionSpec]
    /// The positional arguments, in order; only the last may be variadic.
    package var positionals: [PositionalSpec]
    /// The commands selected by a word after this one.
    package var subcommands: [CommandSpec]
    /// The version string printed by `--version`; only read on the root spec.
    package var version: String?
    /// Groups of inherited options (``OptionSpec/group``) that do not apply to this command nor
    /// to its subcommands: given anyway (before or after the command's name), they are a usage
    /// error that says so, rather than being accepted and ignored.
    package var refusedGroups: Set<String>
    /// Command lines worth copying, shown under `EXAMPLES:` in help and in the man page.
    package var examples: [CommandExample]
    /// What each exit status means, shown under `EXIT STATUS:` in help and in the man page.
    package var exitStatuses: [ExitStatusDescription]

    /// Describes a command; every part but the name may be left out.
    package init(
        name: String,
        abstract: String = "",
        discussion: String = "",
        version: String? = nil,
        options: [OptionSpec] = [],
        positionals: [PositionalSpec] = [],
        subcommands: [CommandSpec] = [],
        refusedGroups: Set<String> = [],
        examples: [CommandExample] = [],
        exitStatuses: [ExitStatusDescription] = []
    ) {
        self.name = name
        self.abstract = abstract
        self.discussion = discussion
        self.version = version
        self.options = options
        self.positionals = positionals
        self.subcommands = subcommands
        self.refusedGroups = refusedGroups
        self.examples = examples
        self.exitStatuses = exitStatuses
    }

    /// The subcommand with the given name, if this command has one.
    package func subcommand(named name: String) -> CommandSpec? {
        subcommands.first { $0.name == name }
    }
}

/// One named option of a command: a flag, an option that takes a value, or one whose value is
/// optional.
///
/// Options are looked up in a ``ParsedCommand`` by their ``long`` name (without the dashes).
package struct OptionSpec: Sendable {
    /// What an option takes on the command line.
    package enum Kind: Sendable, Equatable, Hashable {
        /// A boolean switch that takes no value (`--json`, `-v`). Every occurrence is counted,
        /// so `-vvv` counts 3.
        case flag
        /// An option that requires a value: `--out FILE`, `--out=FILE`, `-o FILE` or `-oFILE`.
        /// `valueName` is what help shows in angle brackets (`<file>`).
        case value(valueName: String)
        /// An option that may be given alone (`--simulate`) or with a value, which must then be
        /// attached with `=` (`--simulate=PROFILE`); its short form never takes a value.
        case optionalValue(valueName: String)
    }

    /// The long name without the leading `--` (`"verbose"`); the key for lookups.
    package var long: String
    /// The optional one-character short name (`v` for `-v`).
    package var short: Character?
    /// Whether the option is a flag or takes a value.
    package var kind: Kind
    /// The text shown for the option in help.
    package var help: String
    /// The value reported when the option is not given, shown in help as `(default: x)`.
    package var defaultValue: String?
    /// When set, the only accepted values; help shows them as `(values: a, b)`.
    package var allowedValues: [String]?
    /// Whether the option may usefully be given several times: for value options, whether
    /// ``ParsedCommand/values(_:)`` collects all of them (otherwise the last one wins). Help
    /// shows repeatable options with `...`. Flags are always counted.
    package var repeatable: Bool
    /// Whether the option also applies to every subcommand of the command that declares it.
    package var inherited: Bool
    /// The heading the option is listed under in help (`"accessory"` lists it under
    /// `ACCESSORY OPTIONS:`); a command refuses a whole group with ``CommandSpec/refusedGroups``.
    package var group: String?
    /// What a value must look like; checked while parsing, so a bad value is a usage error
    /// before the command runs.
    package var check: ValueCheck?
    /// What shell completion offers for the value (files, directories, nothing); the
    /// ``allowedValues`` are offered whatever this says.
    package var completion: ValueCompletion

    /// Describes an option; prefer the ``flag(_:short:help:repeatable:inherited:)``,
    /// ``value(_:short:valueName:help:defaultValue:allowedValues:repeatable:inherited:)`` and
    /// ``optionalValue(_:short:valueName:help:defaultValue:allowedValues:inherited:)`` shorthands.
    package init(
        long: String,
        short: Character? = nil,
        kind: Kind = .flag,
        help: String = "",
        defaultValue: String? = nil,
        allowedValues: [String]? = nil,
        repeatable: Bool = false,
        inherited: Bool = false,
        group: String? = nil,
        check: ValueCheck? = nil,
        completion: ValueCompletion = .none
    ) {
        self.long = long
        self.short = short
        self.kind = kind
        self.help = help
        self.defaultValue = defaultValue
        self.allowedValues = allowedValues
        self.repeatable = repeatable
        self.inherited = inherited
        self.group = group
        self.check = check
        self.completion = completion
    }

    /// This option with its value checked as `check` (see ``ValueCheck``).
    package func checked(_ check: ValueCheck) -> OptionSpec {
        var copy = self
        copy.check = check
        return copy
    }

    /// This option with shell completion offering `completion` for its value.
    package func completing(_ completion: ValueCompletion) -> OptionSpec {
        var copy = self
        copy.completion = completion
        return copy
    }

    /// This option in the group `name` (listed under its heading; see ``group``).
    package func inGroup(_ name: String) -> OptionSpec {
        var copy = self
        copy.group = name
        return copy
    }

    /// A flag (`--long`, `-s`); `repeatable` marks counted flags like `-vvv` in help.
    package static func flag(
        _ long: String,
        short: Character? = nil,
        help: String = "",
        repeatable: Bool = false,
        inherited: Bool = false
    ) -> OptionSpec {
        OptionSpec(long: long, short: short, kind: .flag, help: help, repeatable: repeatable, inherited: inherited)
    }

    /// An option that requires a value (`--long <valueName>`).
    package static func value(
        _ long: String,
        short: Character? = nil,
        valueName: String = "value",
        help: String = "",
        defaultValue: String? = nil,
        allowedValues: [String]? = nil,
        repeatable: Bool = false,
        inherited: Bool = false
    ) -> OptionSpec {
        OptionSpec(
            long: long, short: short, kind: .value(valueName: valueName), help: help,
            defaultValue: defaultValue, allowedValues: allowedValues, repeatable: repeatable,
            inherited: inherited
        )
    }

    /// An option given alone or as `--long=<valueName>`.
    package static func optionalValue(
        _ long: String,
        short: Character? = nil,
        valueName: String = "value",
        help: String = "",
        defaultValue: String? = nil,
        allowedValues: [String]? = nil,
        inherited: Bool = false
    ) -> OptionSpec {
        OptionSpec(
            long: long, short: short, kind: .optionalValue(valueName: valueName), help: help,
            defaultValue: defaultValue, allowedValues: allowedValues, inherited: inherited
        )
    }

    /// The value name for options that take one, `nil` for flags.
    var valueName: String? {
        switch kind {
        case .flag: return nil
        case .value(let name), .optionalValue(let name): return name
        }
    }

    /// How the option appears in a usage line: `--json`, `--out <file>`, `--simulate[=<profile>]`.
    var synopsis: String {
        switch kind {
        case .flag: return "--\(long)"
        case .value(let name): return "--\(long) <\(name)>"
        case .optionalValue(let name): return "--\(long)[=<\(name)>]"
        }
    }

    /// How the option is named in error messages, using the spelling the user typed.
    func display(as spelling: String) -> String {
        switch kind {
        case .flag, .optionalValue: return "'\(spelling)'"
        case .value(let name): return "'\(spelling) <\(name)>'"
        }
    }
}

/// One positional argument of a command.
package struct PositionalSpec: Sendable {
    /// The name used for lookups and shown in help as `<name>`.
    package var name: String
    /// The text shown for the argument in help.
    package var help: String
    /// Whether the argument may be left out.
    package var isOptional: Bool
    /// Whether the argument collects all remaining positional words; only the last may be.
    package var isVariadic: Bool
    /// What shell completion offers for the argument.
    package var completion: ValueCompletion

    /// Describes a positional argument; required and single unless told otherwise.
    package init(_ name: String, help: String = "", optional: Bool = false, variadic: Bool = false,
                completion: ValueCompletion = .none) {
        self.name = name
        self.help = help
        self.isOptional = optional
        self.isVariadic = variadic
        self.completion = completion
    }

    /// How the argument appears in a usage line: `<in>`, `[<in>]`, `<in> ...`, `[<in> ...]`.
    var synopsis: String {
        let core = isVariadic ? "<\(name)> ..." : "<\(name)>"
        return isOptional ? "[\(core)]" : core
    }
}

/// What an option's value must look like (``OptionSpec/check``). The parser checks every value
/// given, so `--timeout abc` or `--timeout -1` is a usage error (exit 64) naming the option and
/// the accepted range, never a silent default.
package enum ValueCheck: Sendable, Equatable {
    /// A whole number (decimal, or hexadecimal with `0x`) in the range.
    case integer(ClosedRange<Int>)
    /// A decimal number (`2`, `0.5`) in the range: seconds, rates, sizes with a fraction.
    case number(ClosedRange<Double>)

    /// Nil when `text` passes, else what was expected (`"a number from 0 to 86400"`).
    func problem(with text: String) -> String? {
        switch self {
        case .integer(let range):
            guard let value = ParsedCommand.parseInteger(text), range.contains(value) else {
                return "expected a whole number from \(range.lowerBound) to \(range.upperBound)"
            }
            return nil
        case .number(let range):
            // Double(_:) also takes "nan", "inf" and hexadecimal floats: only plain decimals pass.
            let plain = !text.isEmpty && text.allSatisfy { $0.isASCII && ($0.isNumber || $0 == "." || $0 == "-" || $0 == "+") }
            guard plain, let value = Double(text), value.isFinite, range.contains(value) else {
                return "expected a number from \(ValueCheck.format(range.lowerBound)) to \(ValueCheck.format(range.upperBound))"
            }
            return nil
        }
    }

    /// `3` for 3.0, `0.5` for 0.5.
    static func format(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? String(Int(value)) : String(value)
    }
}

/// What shell completion offers for a value (``OptionSpec/completion``,
/// ``PositionalSpec/completion``).
package enum ValueCompletion: Sendable, Equatable {
    /// Nothing: the value is free text (a name, a number).
    case none
    /// File names (and directories to walk into).
    case files
    /// Directory names only.
    case directories
    /// These words.
    case words([String])
}

/// A command line shown as an example in help and in the man page.
package struct CommandExample: Sendable, Equatable {
    /// The command line, as typed (`iapctl --simulate list`).
    package var command: String
    /// What it does, in a few words.
    package var summary: String

    /// An example: `command`, then `summary`.
    package init(_ command: String, _ summary: String) {
        self.command = command
        self.summary = summary
    }
}

/// What one exit status of a command means.
package struct ExitStatusDescription: Sendable, Equatable {
    /// The status.
    package var code: ExitCode
    /// When the command exits with it.
    package var meaning: String

    /// Describes `code`.
    package init(_ code: ExitCode, _ meaning: String) {
        self.code = code
        self.meaning = meaning
    }
}
