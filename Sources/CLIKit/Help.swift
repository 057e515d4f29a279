extension CommandSpec {
    /// The help text of this command, or of the subcommand reached by following
    /// `subcommandPath` from it; `nil` when a name on the path is not a subcommand.
    ///
    /// The text has `OVERVIEW:`, `USAGE:`, `ARGUMENTS:`, `OPTIONS:` and `SUBCOMMANDS:` sections
    /// (the empty ones left out) separated by blank lines, with option and argument
    /// descriptions starting at column 26, and no trailing newline.
    public func helpText(for subcommandPath: [String] = []) -> String? {
        guard let chain = chain(following: subcommandPath) else { return nil }
        return HelpRenderer.help(for: chain)
    }

    /// The usage line (without `USAGE: `) of this command, or of the subcommand reached by
    /// following `subcommandPath`; `nil` when a name on the path is not a subcommand.
    public func usageLine(for subcommandPath: [String] = []) -> String? {
        guard let chain = chain(following: subcommandPath) else { return nil }
        return HelpRenderer.usage(for: chain)
    }

    private func chain(following names: [String]) -> [CommandSpec]? {
        var chain = [self]
        for name in names {
            guard let sub = chain[chain.count - 1].subcommand(named: name) else { return nil }
            chain.append(sub)
        }
        return chain
    }
}

/// Renders usage lines and help texts for a chain of commands (root first).
enum HelpRenderer {
    /// The column at which descriptions start in the `ARGUMENTS`, `OPTIONS` and `SUBCOMMANDS` lists.
    static let descriptionColumn = 26

    /// The options that apply to the last command of `chain`: the inherited options of its
    /// ancestors (outermost first), then its own; a nearer declaration of a long name replaces
    /// a farther one.
    static func visibleOptions(for chain: [CommandSpec]) -> [OptionSpec] {
        var collected: [OptionSpec] = []
        for (depth, command) in chain.enumerated() {
            let isLast = depth == chain.count - 1
            collected += command.options.filter { isLast || $0.inherited }
        }
        var result: [OptionSpec] = []
        for (position, option) in collected.enumerated() {
            let redefinedLater = collected[(position + 1)...].contains { $0.long == option.long }
            if !redefinedLater { result.append(option) }
        }
        return result
    }

    /// `iapctl <subcommand>` for a command that only dispatches, otherwise the path followed by
    /// every option (`[--json]`, `[--out <file>]`, `[--verbose ...]`) and positional argument.
    static func usage(for chain: [CommandSpec]) -> String {
        let path = chain.map(\.name).joined(separator: " ")
        let command = chain[chain.count - 1]
        if !command.subcommands.isEmpty, command.positionals.isEmpty {
            return path + " <subcommand>"
        }
        var parts = [path]
        for option in visibleOptions(for: chain) {
            parts.append("[" + option.synopsis + (option.repeatable ? " ..." : "") + "]")
        }
        for positional in command.positionals {
            parts.append(positional.synopsis)
        }
        return parts.joined(separator: " ")
    }

    /// The full help text of the last command of `chain`.
    static func help(for chain: [CommandSpec]) -> String {
        let command = chain[chain.count - 1]
        let root = chain[0]
        var sections: [String] = []
        if !command.abstract.isEmpty {
            sections.append("OVERVIEW: " + command.abstract)
        }
        if !command.discussion.isEmpty {
            sections.append(command.discussion)
        }
        sections.append("USAGE: " + usage(for: chain))

        if !command.positionals.isEmpty {
            let rows = command.positionals.map { row(label: "<\($0.name)>", text: $0.help) }
            sections.append((["ARGUMENTS:"] + rows).joined(separator: "\n"))
        }

        let options = visibleOptions(for: chain)
        var optionRows = options.map { row(label: label(of: $0), text: description(of: $0)) }
        if root.version != nil, !options.contains(where: { $0.long == "version" }) {
            optionRows.append(row(label: "--version", text: "Show the version."))
        }
        if !options.contains(where: { $0.long == "help" }) {
            let helpLabel = options.contains { $0.short == "h" } ? "--help" : "-h, --help"
            optionRows.append(row(label: helpLabel, text: "Show help information."))
        }
        sections.append((["OPTIONS:"] + optionRows).joined(separator: "\n"))

        if !command.subcommands.isEmpty {
            let rows = command.subcommands.map { row(label: $0.name, text: $0.abstract) }
            let helpPath = ([root.name, "help"] + chain.dropFirst().map(\.name)).joined(separator: " ")
            sections.append(
                (["SUBCOMMANDS:"] + rows).joined(separator: "\n")
                    + "\n\n  See '\(helpPath) <subcommand>' for detailed help."
            )
        }
        return sections.joined(separator: "\n\n")
    }

    /// `-o, --out <file>`, `--json`, `--simulate[=<profile>]`.
    static func label(of option: OptionSpec) -> String {
        var text = option.short.map { "-\($0), " } ?? ""
        text += "--" + option.long
        switch option.kind {
        case .flag: break
        case .value(let name): text += " <\(name)>"
        case .optionalValue(let name): text += "[=<\(name)>]"
        }
        return text
    }

    /// The help text followed by `(values: …)` and `(default: …)` when they apply.
    static func description(of option: OptionSpec) -> String {
        var parts: [String] = []
        if !option.help.isEmpty { parts.append(option.help) }
        if let allowed = option.allowedValues {
            parts.append("(values: " + allowed.joined(separator: ", ") + ")")
        }
        if let defaultValue = option.defaultValue {
            parts.append("(default: \(defaultValue))")
        }
        return parts.joined(separator: " ")
    }

    /// One list entry: two spaces, the label, the text from ``descriptionColumn`` on (on the
    /// next line when the label is too long). Lines of a multi-line text stay in the column.
    static func row(label: String, text: String) -> String {
        let lead = "  " + label
        guard !text.isEmpty else { return lead }
        let indent = String(repeating: " ", count: descriptionColumn)
        let body = text.split(separator: "\n", omittingEmptySubsequences: false)
            .enumerated()
            .map { $0.offset == 0 || $0.element.isEmpty ? String($0.element) : indent + $0.element }
            .joined(separator: "\n")
        if lead.count + 2 <= descriptionColumn {
            return lead + String(repeating: " ", count: descriptionColumn - lead.count) + body
        }
        return lead + "\n" + indent + body
    }
}
