/// What a command line asks for: run a command, show help, or show the version.
package enum ParseOutcome: Sendable {
    /// Run the command described by the parsed arguments.
    case run(ParsedCommand)
    /// Print this help text (of the command the user asked about) and exit successfully.
    case help(String)
    /// Print this version string and exit successfully.
    case version(String)
}

/// The options and positional arguments given to the command that a command line selected.
///
/// Lookups use the names declared in the ``CommandSpec``s along ``path``: an option's
/// ``OptionSpec/long`` name, a ``PositionalSpec/name``. Asking for a name that is not declared
/// there is a programmer error and traps.
package struct ParsedCommand: Sendable {
    /// The command names from the root to the selected command (`["iapctl", "decode"]`).
    package let path: [String]
    /// The options declared by the commands along `path`, by long name.
    let declaredOptions: [String: OptionSpec]
    /// How many times each option was given, by long name.
    let counts: [String: Int]
    /// The values given to each option, in command-line order, by long name.
    let givenValues: [String: [String]]
    /// The positional arguments declared by the selected command.
    let declaredPositionals: [String]
    /// The words assigned to each positional argument, by name.
    let positionalValues: [String: [String]]
    /// The selected command's usage line, for errors raised after parsing.
    let usage: String

    init(
        path: [String],
        declaredOptions: [String: OptionSpec],
        counts: [String: Int],
        givenValues: [String: [String]],
        declaredPositionals: [String],
        positionalValues: [String: [String]],
        usage: String
    ) {
        self.path = path
        self.declaredOptions = declaredOptions
        self.counts = counts
        self.givenValues = givenValues
        self.declaredPositionals = declaredPositionals
        self.positionalValues = positionalValues
        self.usage = usage
    }

    private func option(_ long: String) -> OptionSpec {
        guard let spec = declaredOptions[long] else {
            preconditionFailure("option '--\(long)' is not declared for '\(path.joined(separator: " "))'")
        }
        return spec
    }

    private func checkPositional(_ name: String) {
        precondition(
            declaredPositionals.contains(name),
            "positional '<\(name)>' is not declared for '\(path.joined(separator: " "))'"
        )
    }

    /// Whether the option was given at least once (in any form).
    package func flag(_ long: String) -> Bool {
        count(long) > 0
    }

    /// How many times the option was given (`-vvv` → 3); 0 when absent.
    package func count(_ long: String) -> Int {
        _ = option(long)
        return counts[long] ?? 0
    }

    /// The option's last given value, else its default value, else `nil`. An
    /// ``OptionSpec/Kind/optionalValue(valueName:)`` option given without `=value` reports its
    /// default here; use ``flag(_:)`` to know whether it was given.
    package func value(_ long: String) -> String? {
        let spec = option(long)
        return givenValues[long]?.last ?? spec.defaultValue
    }

    /// All values given to a repeatable option, in order (only the last one for a
    /// non-repeatable option); the default value alone when none was given; else empty.
    package func values(_ long: String) -> [String] {
        let spec = option(long)
        if let given = givenValues[long], let last = given.last {
            return spec.repeatable ? given : [last]
        }
        return spec.defaultValue.map { [$0] } ?? []
    }

    /// The word given for the positional argument (the first one for a variadic argument), or
    /// `nil` when an optional argument was left out.
    package func positional(_ name: String) -> String? {
        checkPositional(name)
        return positionalValues[name]?.first
    }

    /// All words given for the positional argument (several only for a variadic one).
    package func positionals(_ name: String) -> [String] {
        checkPositional(name)
        return positionalValues[name] ?? []
    }

    /// The option's value (as ``value(_:)``) read as an integer, or `nil` when it has none.
    ///
    /// Accepts an optional sign and decimal digits, or hexadecimal with a `0x` prefix (handy for
    /// USB vendor and product IDs). Throws a ``UsageError`` when the value is not an integer or
    /// lies outside `range`.
    package func integer(_ long: String, in range: ClosedRange<Int>? = nil) throws(UsageError) -> Int? {
        let spec = option(long)
        guard let text = value(long) else { return nil }
        let shown = spec.display(as: "--\(long)")
        guard let number = Self.parseInteger(text) else {
            throw UsageError(
                "invalid value '\(text)' for \(shown): expected an integer",
                usage: usage, commandPath: path
            )
        }
        if let range, !range.contains(number) {
            throw UsageError(
                "invalid value '\(text)' for \(shown): must be in the range \(range.lowerBound)...\(range.upperBound)",
                usage: usage, commandPath: path
            )
        }
        return number
    }

    /// Parses `[+-]digits` or `[+-]0xHEX`; `nil` for anything else, including overflow.
    static func parseInteger(_ text: String) -> Int? {
        var body = Substring(text)
        var negative = false
        if let first = body.first, first == "+" || first == "-" {
            negative = first == "-"
            body = body.dropFirst()
        }
        var radix = 10
        if body.hasPrefix("0x") || body.hasPrefix("0X") {
            radix = 16
            body = body.dropFirst(2)
        }
        // Int(_:radix:) accepts its own sign; a second one is not allowed here.
        guard let first = body.first, first != "+", first != "-" else { return nil }
        guard let magnitude = UInt(body, radix: radix) else { return nil }
        if negative {
            if magnitude == UInt(Int.max) + 1 { return Int.min }
            guard magnitude <= UInt(Int.max) else { return nil }
            return -Int(magnitude)
        }
        guard magnitude <= UInt(Int.max) else { return nil }
        return Int(magnitude)
    }
}
