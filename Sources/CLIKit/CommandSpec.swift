/// The description of one command of a tool: its options, its positional arguments and its
/// subcommands. The root spec of a tool parses the command line (``parse(_:)``) and renders help
/// (``helpText(for:)``).
///
/// Options marked ``OptionSpec/inherited`` apply to the command that declares them and to all of
/// its subcommands, at any depth (typical: `-v/--verbose`, `--json`, `--trace` on the root).
/// `-h/--help` is always available; `--version` is available at every level when the root has a
/// ``version``.
public struct CommandSpec: Sendable {
    /// The command's name: the tool name for the root, the word that selects it otherwise.
    public var name: String
    /// A one-line description, shown after `OVERVIEW:` and in the parent's `SUBCOMMANDS:` list.
    public var abstract: String
    /// Longer text shown in this command's help after the overview.
    public var discussion: String
    /// The options this command accepts (besides the inherited options of its ancestors).
    public var options: [OptionSpec]
    /// The positional arguments, in order; only the last may be variadic.
    public var positionals: [PositionalSpec]
    /// The commands selected by a word after this one.
    public var subcommands: [CommandSpec]
    /// The version string printed by `--version`; only read on the root spec.
    public var version: String?

    /// Describes a command; every part but the name may be left out.
    public init(
        name: String,
        abstract: String = "",
        discussion: String = "",
        version: String? = nil,
        options: [OptionSpec] = [],
        positionals: [PositionalSpec] = [],
        subcommands: [CommandSpec] = []
    ) {
        self.name = name
        self.abstract = abstract
        self.discussion = discussion
        self.version = version
        self.options = options
        self.positionals = positionals
        self.subcommands = subcommands
    }

    /// The subcommand with the given name, if this command has one.
    public func subcommand(named name: String) -> CommandSpec? {
        subcommands.first { $0.name == name }
    }
}

/// One named option of a command: a flag, an option that takes a value, or one whose value is
/// optional.
///
/// Options are looked up in a ``ParsedCommand`` by their ``long`` name (without the dashes).
public struct OptionSpec: Sendable {
    /// What an option takes on the command line.
    public enum Kind: Sendable, Equatable, Hashable {
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
    public var long: String
    /// The optional one-character short name (`v` for `-v`).
    public var short: Character?
    /// Whether the option is a flag or takes a value.
    public var kind: Kind
    /// The text shown for the option in help.
    public var help: String
    /// The value reported when the option is not given, shown in help as `(default: x)`.
    public var defaultValue: String?
    /// When set, the only accepted values; help shows them as `(values: a, b)`.
    public var allowedValues: [String]?
    /// Whether the option may usefully be given several times: for value options, whether
    /// ``ParsedCommand/values(_:)`` collects all of them (otherwise the last one wins). Help
    /// shows repeatable options with `...`. Flags are always counted.
    public var repeatable: Bool
    /// Whether the option also applies to every subcommand of the command that declares it.
    public var inherited: Bool

    /// Describes an option; prefer the ``flag(_:short:help:repeatable:inherited:)``,
    /// ``value(_:short:valueName:help:defaultValue:allowedValues:repeatable:inherited:)`` and
    /// ``optionalValue(_:short:valueName:help:defaultValue:allowedValues:inherited:)`` shorthands.
    public init(
        long: String,
        short: Character? = nil,
        kind: Kind = .flag,
        help: String = "",
        defaultValue: String? = nil,
        allowedValues: [String]? = nil,
        repeatable: Bool = false,
        inherited: Bool = false
    ) {
        self.long = long
        self.short = short
        self.kind = kind
        self.help = help
        self.defaultValue = defaultValue
        self.allowedValues = allowedValues
        self.repeatable = repeatable
        self.inherited = inherited
    }

    /// A flag (`--long`, `-s`); `repeatable` marks counted flags like `-vvv` in help.
    public static func flag(
        _ long: String,
        short: Character? = nil,
        help: String = "",
        repeatable: Bool = false,
        inherited: Bool = false
    ) -> OptionSpec {
        OptionSpec(long: long, short: short, kind: .flag, help: help, repeatable: repeatable, inherited: inherited)
    }

    /// An option that requires a value (`--long <valueName>`).
    public static func value(
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
    public static func optionalValue(
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
public struct PositionalSpec: Sendable {
    /// The name used for lookups and shown in help as `<name>`.
    public var name: String
    /// The text shown for the argument in help.
    public var help: String
    /// Whether the argument may be left out.
    public var isOptional: Bool
    /// Whether the argument collects all remaining positional words; only the last may be.
    public var isVariadic: Bool

    /// Describes a positional argument; required and single unless told otherwise.
    public init(_ name: String, help: String = "", optional: Bool = false, variadic: Bool = false) {
        self.name = name
        self.help = help
        self.isOptional = optional
        self.isVariadic = variadic
    }

    /// How the argument appears in a usage line: `<in>`, `[<in>]`, `<in> ...`, `[<in> ...]`.
    var synopsis: String {
        let core = isVariadic ? "<\(name)> ..." : "<\(name)>"
        return isOptional ? "[\(core)]" : core
    }
}
