extension CommandSpec {
    /// Parses a command line (without the program name) against this root spec.
    ///
    /// - `-h`/`--help` anywhere before `--` asks for the help of the deepest subcommand reached;
    ///   so does `help <subcommand> [<subcommand> ...]` where a subcommand is expected.
    /// - `--version` at any level asks for ``version`` (when the root has one).
    /// - `--` ends the options: every later word is positional.
    /// - Short flags combine (`-vj`); the last short option of a group may take the rest of the
    ///   word as its value (`-oFILE`).
    /// - A value option takes the next word unless that word looks like an option
    ///   (`-x`, `--x`); `-` alone and negative numbers are taken as values.
    ///
    /// - A value that fails its option's ``OptionSpec/check``, or an empty value, is a usage error.
    /// - An inherited option of a group the selected command refuses (``refusedGroups``) is a
    ///   usage error, wherever it was given.
    ///
    /// Help and version requests win over usage errors in the same command line. Help text is
    /// wrapped to `helpWidth` columns.
    package func parse(_ arguments: [String], helpWidth: Int = HelpRenderer.defaultWidth) throws(UsageError) -> ParseOutcome {
        var engine = ParseEngine(root: self, arguments: arguments, width: helpWidth)
        return try engine.parse()
    }
}

/// The state of one parse: the commands selected so far and what was given to them.
private struct ParseEngine {
    let root: CommandSpec
    let arguments: [String]
    var index = 0
    var chain: [CommandSpec]
    var counts: [String: Int] = [:]
    var values: [String: [String]] = [:]
    var positionalWords: [String] = []
    var helpRequested = false
    var versionRequested = false
    /// How each given option was spelled (`--serial`, `-a`), for errors raised later.
    var spellings: [String: String] = [:]
    /// The optional-value option given just before the current word without `=value`: a bare
    /// word after it may have been meant as its value.
    var optionalWithoutValue: String?
    let width: Int

    init(root: CommandSpec, arguments: [String], width: Int) {
        self.root = root
        self.arguments = arguments
        self.chain = [root]
        self.width = width
    }

    var current: CommandSpec { chain[chain.count - 1] }

    var hasVersion: Bool { root.version != nil }

    mutating func parse() throws(UsageError) -> ParseOutcome {
        do throws(UsageError) {
            if let helpOutcome = try scan() {
                return helpOutcome
            }
        } catch {
            if helpRequested || remainingWordsAsk(forHelp: true) {
                return .help(HelpRenderer.help(for: chain, width: width))
            }
            if versionRequested || remainingWordsAsk(forHelp: false), let version = root.version {
                return .version(version)
            }
            throw error
        }
        if helpRequested {
            return .help(HelpRenderer.help(for: chain, width: width))
        }
        if versionRequested, let version = root.version {
            return .version(version)
        }
        return .run(try finish())
    }

    // MARK: Scanning words

    /// Walks the words, selecting subcommands and recording options. Returns a help outcome when
    /// the `help` subcommand is met.
    mutating func scan() throws(UsageError) -> ParseOutcome? {
        var terminated = false
        while index < arguments.count {
            let word = arguments[index]
            index += 1
            let afterOptional = optionalWithoutValue
            optionalWithoutValue = nil
            if terminated {
                positionalWords.append(word)
            } else if word == "--" {
                terminated = true
            } else if word.hasPrefix("--") {
                try longOption(word)
            } else if isShortOptionGroup(word) {
                try shortOptions(word)
            } else {
                do throws(UsageError) {
                    if let outcome = try bareWord(word) { return outcome }
                } catch {
                    // `--simulate legacy-sensor list`: the word was meant as the option's value.
                    guard let afterOptional else { throw error }
                    var hinted = error
                    hinted.message += "; to give \(afterOptional) a value, write '\(afterOptional)=\(word)'"
                    throw hinted
                }
            }
        }
        return nil
    }

    /// Handles a word that is not an option: a subcommand, the `help` subcommand or a
    /// positional argument.
    mutating func bareWord(_ word: String) throws(UsageError) -> ParseOutcome? {
        let command = current
        guard !command.subcommands.isEmpty, positionalWords.isEmpty else {
            positionalWords.append(word)
            return nil
        }
        if let sub = command.subcommand(named: word) {
            chain.append(sub)
            return nil
        }
        if word == "help" {
            return .help(try helpSubcommand())
        }
        if command.positionals.isEmpty {
            throw unknownSubcommand(word, of: chain)
        }
        positionalWords.append(word)
        return nil
    }

    /// `help [<subcommand> ...]`: the help of the named command below the current one. Words
    /// that look like options are ignored.
    mutating func helpSubcommand() throws(UsageError) -> String {
        var target = chain
        while index < arguments.count {
            let word = arguments[index]
            index += 1
            if word.hasPrefix("-") { continue }
            let command = target[target.count - 1]
            guard let sub = command.subcommand(named: word) else {
                throw unknownSubcommand(word, of: target)
            }
            target.append(sub)
        }
        return HelpRenderer.help(for: target, width: width)
    }

    /// `--name`, `--name=value`.
    mutating func longOption(_ word: String) throws(UsageError) {
        let body = word.dropFirst(2)
        let name: String
        let inline: String?
        if let equals = body.firstIndex(of: "=") {
            name = String(body[..<equals])
            inline = String(body[body.index(after: equals)...])
        } else {
            name = String(body)
            inline = nil
        }
        let visible = HelpRenderer.visibleOptions(for: chain)
        guard let spec = visible.last(where: { $0.long == name }) else {
            if HelpRenderer.refusedOptions(for: chain).contains(where: { $0.long == name }) {
                throw doesNotApply("--\(name)")
            }
            if name == "help" {
                helpRequested = true
                return
            }
            if name == "version", hasVersion {
                versionRequested = true
                return
            }
            var candidates = visible.map(\.long) + ["help"]
            if hasVersion { candidates.append("version") }
            var message = "unknown option '--\(name)'"
            if let guess = EditDistance.closest(to: name, among: candidates) {
                message += "; did you mean '--\(guess)'?"
            }
            throw error(message)
        }
        let spelling = "--\(name)"
        switch spec.kind {
        case .flag:
            if let inline {
                throw error("flag '\(spelling)' does not take a value (got '\(inline)')")
            }
            record(spec, spelling: spelling)
        case .value:
            if let inline {
                try record(spec, value: inline, spelling: spelling)
            } else {
                try record(spec, value: try nextValue(for: spec, spelling: spelling), spelling: spelling)
            }
        case .optionalValue:
            if let inline {
                try record(spec, value: inline, spelling: spelling)
            } else {
                record(spec, spelling: spelling)
                optionalWithoutValue = spelling
            }
        }
    }

    /// `-v`, `-vvj`, `-o FILE`, `-oFILE`, `-vo FILE`.
    mutating func shortOptions(_ word: String) throws(UsageError) {
        let letters = Array(word.dropFirst())
        let visible = HelpRenderer.visibleOptions(for: chain)
        var position = 0
        while position < letters.count {
            let letter = letters[position]
            position += 1
            guard let spec = visible.last(where: { $0.short == letter }) else {
                if HelpRenderer.refusedOptions(for: chain).contains(where: { $0.short == letter }) {
                    throw doesNotApply("-\(letter)")
                }
                if letter == "h" {
                    helpRequested = true
                    continue
                }
                var message = "unknown option '-\(letter)'"
                if letters.count > 1 {
                    message += " in '\(word)'"
                }
                let candidates = visible.map(\.long) + ["help"] + (hasVersion ? ["version"] : [])
                if letters.count > 1, let guess = EditDistance.closest(to: String(letters), among: candidates) {
                    message += "; did you mean '--\(guess)'?"
                }
                throw error(message)
            }
            let spelling = "-\(letter)"
            switch spec.kind {
            case .flag, .optionalValue:
                if position < letters.count, letters[position] == "=" {
                    let given = String(letters[(position + 1)...])
                    throw error("option '\(spelling)' does not take a value (got '\(given)')")
                }
                record(spec, spelling: spelling)
            case .value:
                if position < letters.count {
                    var attached = letters[position...]
                    if attached.first == "=" { attached = attached.dropFirst() }
                    position = letters.count
                    try record(spec, value: String(attached), spelling: spelling)
                } else {
                    let value = try nextValue(for: spec, spelling: spelling)
                    try record(spec, value: value, spelling: spelling)
                }
            }
        }
    }

    /// The next word as the value of `spec`, unless it is missing or looks like an option.
    mutating func nextValue(for spec: OptionSpec, spelling: String) throws(UsageError) -> String {
        guard index < arguments.count, !looksLikeOption(arguments[index]) else {
            throw error("missing value for option \(spec.display(as: spelling))")
        }
        let value = arguments[index]
        index += 1
        return value
    }

    mutating func record(_ spec: OptionSpec, spelling: String) {
        counts[spec.long, default: 0] += 1
        spellings[spec.long] = spellings[spec.long] ?? spelling
    }

    mutating func record(_ spec: OptionSpec, value: String, spelling: String) throws(UsageError) {
        if value.isEmpty {
            throw error("empty value for option \(spec.display(as: spelling))")
        }
        if let allowed = spec.allowedValues, !allowed.contains(value) {
            var message = "invalid value '\(value)' for option \(spec.display(as: spelling)); expected one of: "
                + allowed.joined(separator: ", ")
            if let guess = EditDistance.closest(to: value, among: allowed) {
                message = "invalid value '\(value)' for option \(spec.display(as: spelling)); did you mean '\(guess)'? "
                    + "(expected one of: " + allowed.joined(separator: ", ") + ")"
            }
            throw error(message)
        }
        if let check = spec.check, let problem = check.problem(with: value) {
            throw error("invalid value '\(value)' for option \(spec.display(as: spelling)): \(problem)")
        }
        record(spec, spelling: spelling)
        values[spec.long, default: []].append(value)
    }

    // MARK: Classifying words

    /// A word starting with `-` that is neither `-` alone nor a negative number (unless a short
    /// option of that digit exists).
    func isShortOptionGroup(_ word: String) -> Bool {
        guard word.hasPrefix("-"), word.count > 1 else { return false }
        return !isNegativeNumber(word)
    }

    func looksLikeOption(_ word: String) -> Bool {
        word.hasPrefix("--") || isShortOptionGroup(word)
    }

    func isNegativeNumber(_ word: String) -> Bool {
        let letters = Array(word)
        guard letters.count > 1, letters[0] == "-", letters[1].isASCII, letters[1].isNumber else { return false }
        let visible = HelpRenderer.visibleOptions(for: chain)
        return !visible.contains { $0.short == letters[1] }
    }

    /// Whether a word not yet read (before `--`) is `-h`/`--help` (or `--version`).
    func remainingWordsAsk(forHelp: Bool) -> Bool {
        for word in arguments[index...] {
            if word == "--" { return false }
            if forHelp, word == "-h" || word == "--help" { return true }
            if !forHelp, word == "--version" { return true }
        }
        return false
    }

    // MARK: Finishing

    /// Assigns positional words and builds the result, checking what is missing or extra.
    func finish() throws(UsageError) -> ParsedCommand {
        let command = current
        if !command.subcommands.isEmpty, command.positionals.isEmpty, positionalWords.isEmpty {
            // No bare word came (one would have selected a subcommand or been refused); words
            // after `--` are reported below as unexpected.
            let names = command.subcommands.map(\.name).joined(separator: ", ")
            throw error("missing subcommand; expected one of: " + names)
        }
        var assigned: [String: [String]] = [:]
        var remaining = positionalWords[...]
        for spec in command.positionals {
            if spec.isVariadic {
                if remaining.isEmpty, !spec.isOptional {
                    throw error("missing required argument '<\(spec.name)>'")
                }
                assigned[spec.name] = Array(remaining)
                remaining = []
            } else if let word = remaining.first {
                assigned[spec.name] = [word]
                remaining = remaining.dropFirst()
            } else if !spec.isOptional {
                throw error("missing required argument '<\(spec.name)>'")
            }
        }
        if let extra = remaining.first {
            throw error("unexpected argument '\(extra)'")
        }
        // Options given before a subcommand that refuses them (`iapctl --serial X decode`).
        let refused = Set(HelpRenderer.refusedOptions(for: chain).map(\.long))
        for long in counts.keys.sorted() where refused.contains(long) {
            throw doesNotApply(spellings[long] ?? "--\(long)")
        }
        var declared: [String: OptionSpec] = [:]
        for command in chain {
            for option in command.options {
                declared[option.long] = option
            }
        }
        return ParsedCommand(
            path: chain.map(\.name),
            declaredOptions: declared,
            counts: counts,
            givenValues: values,
            declaredPositionals: command.positionals.map(\.name),
            positionalValues: assigned,
            usage: HelpRenderer.usage(for: chain)
        )
    }

    // MARK: Errors

    func error(_ message: String) -> UsageError {
        UsageError(message, usage: HelpRenderer.usage(for: chain), commandPath: chain.map(\.name))
    }

    /// An inherited option the selected command refuses: it names the commands it belongs to.
    func doesNotApply(_ spelling: String) -> UsageError {
        let path = chain.map(\.name).joined(separator: " ")
        return error("option '\(spelling)' does not apply to '\(path)'")
    }

    func unknownSubcommand(_ word: String, of commands: [CommandSpec]) -> UsageError {
        let names = commands[commands.count - 1].subcommands.map(\.name)
        var message = "unknown subcommand '\(word)'"
        if let guess = EditDistance.closest(to: word, among: names) {
            message += "; did you mean '\(guess)'?"
        } else {
            message += "; expected one of: " + names.joined(separator: ", ")
        }
        return UsageError(message, usage: HelpRenderer.usage(for: commands), commandPath: commands.map(\.name))
    }
}
