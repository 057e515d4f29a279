extension CommandSpec {
    /// The help text of this command, or of the subcommand reached by following
    /// `subcommandPath` from it; `nil` when a name on the path is not a subcommand.
    ///
    /// The text has `OVERVIEW:`, `USAGE:`, `ARGUMENTS:`, `OPTIONS:` (and one `<GROUP> OPTIONS:`
    /// per option group), `SUBCOMMANDS:`, `EXAMPLES:` and `EXIT STATUS:` sections (the empty
    /// ones left out) separated by blank lines, with option and argument descriptions starting
    /// at column 26, every line wrapped at `width` columns between words, and no trailing newline.
    package func helpText(for subcommandPath: [String] = [], width: Int = HelpRenderer.defaultWidth) -> String? {
        guard let chain = chain(following: subcommandPath) else { return nil }
        return HelpRenderer.help(for: chain, width: width)
    }

    /// The usage line (without `USAGE: `) of this command, or of the subcommand reached by
    /// following `subcommandPath`; `nil` when a name on the path is not a subcommand.
    package func usageLine(for subcommandPath: [String] = []) -> String? {
        guard let chain = chain(following: subcommandPath) else { return nil }
        return HelpRenderer.usage(for: chain)
    }

    /// The commands from this one down the path `names`, or nil when a name is not a subcommand.
    func chain(following names: [String]) -> [CommandSpec]? {
        var chain = [self]
        for name in names {
            guard let sub = chain[chain.count - 1].subcommand(named: name) else { return nil }
            chain.append(sub)
        }
        return chain
    }
}

/// Renders usage lines and help texts for a chain of commands (root first).
package enum HelpRenderer {
    /// The width help is wrapped to when the output is not a terminal.
    package static let defaultWidth = 80
    /// The column at which descriptions start in the `ARGUMENTS`, `OPTIONS` and `SUBCOMMANDS` lists.
    static let descriptionColumn = 26

    /// The options that apply to the last command of `chain`: the inherited options of its
    /// ancestors (outermost first) that no command below refuses, then its own; a nearer
    /// declaration of a long name replaces a farther one.
    static func visibleOptions(for chain: [CommandSpec]) -> [OptionSpec] {
        var collected: [OptionSpec] = []
        for (depth, command) in chain.enumerated() {
            let isLast = depth == chain.count - 1
            let refused = chain[(depth + 1)...].reduce(into: Set<String>()) { $0.formUnion($1.refusedGroups) }
            collected += command.options.filter { option in
                (isLast || option.inherited) && !(option.group.map(refused.contains) ?? false)
            }
        }
        var result: [OptionSpec] = []
        for (position, option) in collected.enumerated() {
            let redefinedLater = collected[(position + 1)...].contains { $0.long == option.long }
            if !redefinedLater { result.append(option) }
        }
        return result
    }

    /// Inherited options of the ancestors that a command of `chain` refuses (by group).
    static func refusedOptions(for chain: [CommandSpec]) -> [OptionSpec] {
        let visible = Set(visibleOptions(for: chain).map(\.long))
        return chain.dropLast().flatMap { $0.options.filter { $0.inherited && !visible.contains($0.long) } }
    }

    /// `iapctl <subcommand>` for a command that only dispatches; otherwise the path followed by
    /// every option (`[--json]`, `[--out <file>]`, `[--verbose ...]`) and positional argument
    /// when that fits in `width` columns, else by `[<options>]` and the positional arguments.
    static func usage(for chain: [CommandSpec], width: Int = defaultWidth) -> String {
        let path = chain.map(\.name).joined(separator: " ")
        let command = chain[chain.count - 1]
        if !command.subcommands.isEmpty, command.positionals.isEmpty {
            return path + " <subcommand>"
        }
        let options = visibleOptions(for: chain)
        let positionals = command.positionals.map(\.synopsis)
        var parts = [path]
        for option in options {
            parts.append("[" + option.synopsis + (option.repeatable ? " ..." : "") + "]")
        }
        let full = (parts + positionals).joined(separator: " ")
        if full.count + "USAGE: ".count <= width || options.isEmpty { return full }
        return ([path, "[<options>]"] + positionals).joined(separator: " ")
    }

    /// The full help text of the last command of `chain`, wrapped at `width` columns.
    static func help(for chain: [CommandSpec], width requested: Int = defaultWidth) -> String {
        let width = max(40, requested)
        let command = chain[chain.count - 1]
        let root = chain[0]
        var sections: [String] = []
        if !command.abstract.isEmpty {
            sections.append(wrap("OVERVIEW: " + command.abstract, width: width, indent: 2))
        }
        if !command.discussion.isEmpty {
            sections.append(wrap(command.discussion, width: width, indent: 0))
        }
        sections.append(wrap("USAGE: " + usage(for: chain, width: width), width: width, indent: 7))

        if !command.positionals.isEmpty {
            let rows = command.positionals.map { row(label: "<\($0.name)>", text: $0.help, width: width) }
            sections.append((["ARGUMENTS:"] + rows).joined(separator: "\n"))
        }

        let options = visibleOptions(for: chain)
        var ungrouped = options.filter { $0.group == nil }.map { row(label: label(of: $0), text: description(of: $0), width: width) }
        if root.version != nil, !options.contains(where: { $0.long == "version" }) {
            ungrouped.append(row(label: "--version", text: "Show the version.", width: width))
        }
        if !options.contains(where: { $0.long == "help" }) {
            let helpLabel = options.contains { $0.short == "h" } ? "--help" : "-h, --help"
            ungrouped.append(row(label: helpLabel, text: "Show help information.", width: width))
        }
        sections.append((["OPTIONS:"] + ungrouped).joined(separator: "\n"))
        for group in groups(of: options) {
            let rows = options.filter { $0.group == group }.map { row(label: label(of: $0), text: description(of: $0), width: width) }
            sections.append(([group.uppercased() + " OPTIONS:"] + rows).joined(separator: "\n"))
        }

        if !command.subcommands.isEmpty {
            var rows = command.subcommands.map { row(label: $0.name, text: $0.abstract, width: width) }
            if !command.subcommands.contains(where: { $0.name == "help" }) {
                rows.append(row(label: "help", text: "Show the help of a subcommand.", width: width))
            }
            let helpPath = ([root.name, "help"] + chain.dropFirst().map(\.name)).joined(separator: " ")
            sections.append(
                (["SUBCOMMANDS:"] + rows).joined(separator: "\n")
                    + "\n\n" + wrap("  See '\(helpPath) <subcommand>' for detailed help.", width: width, indent: 2)
            )
        }
        if !command.examples.isEmpty {
            let rows = command.examples.map { example in
                wrap("  " + example.command, width: width, indent: 6) + "\n"
                    + wrap(String(repeating: " ", count: 6) + example.summary, width: width, indent: 6)
            }
            sections.append((["EXAMPLES:"] + rows).joined(separator: "\n"))
        }
        if !command.exitStatuses.isEmpty {
            let rows = command.exitStatuses.map { status in
                let code = "  " + String(status.code.rawValue)
                return wrap(code + String(repeating: " ", count: max(1, 8 - code.count)) + status.meaning, width: width, indent: 8)
            }
            sections.append((["EXIT STATUS:"] + rows).joined(separator: "\n"))
        }
        return sections.joined(separator: "\n\n")
    }

    /// The option groups among `options`, in the order they first appear.
    static func groups(of options: [OptionSpec]) -> [String] {
        var seen: [String] = []
        for option in options {
            if let group = option.group, !seen.contains(group) { seen.append(group) }
        }
        return seen
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
    /// next line when the label is too long), wrapped at `width`. Lines of a multi-line text
    /// stay in the column.
    static func row(label: String, text: String, width: Int = defaultWidth) -> String {
        let lead = "  " + label
        guard !text.isEmpty else { return lead }
        let indent = String(repeating: " ", count: descriptionColumn)
        let body = wrap(indent + text, width: width, indent: descriptionColumn)
        if lead.count + 2 <= descriptionColumn {
            return lead + body.dropFirst(lead.count)
        }
        return lead + "\n" + body
    }

    /// `text` with every line longer than `width` broken between words, continuation lines
    /// indented by `indent` spaces (and lines after a line break in `text` too, unless they are
    /// empty). A word longer than the room left stays whole on a line of its own.
    static func wrap(_ text: String, width: Int, indent: Int) -> String {
        let pad = String(repeating: " ", count: indent)
        var out: [String] = []
        for (number, original) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            var line = number == 0 || original.isEmpty || original.hasPrefix(" ") ? String(original) : pad + original
            while line.count > width {
                let limit = line.index(line.startIndex, offsetBy: width)
                let leading = line.prefix { $0 == " " }.count
                // The last space at or before the limit, past the indentation.
                guard let space = line[..<limit].lastIndex(of: " "),
                      line.distance(from: line.startIndex, to: space) > max(leading, indent)
                else {
                    // No room: break after the first word that ends past the limit.
                    guard let after = line[limit...].firstIndex(of: " ") else { break }
                    out.append(String(line[..<after]))
                    line = pad + line[line.index(after: after)...].drop { $0 == " " }
                    continue
                }
                out.append(String(line[..<space]))
                line = pad + line[line.index(after: space)...].drop { $0 == " " }
            }
            out.append(line)
        }
        return out.map { $0.hasSuffix(" ") ? String($0.reversed().drop { $0 == " " }.reversed()) : $0 }.joined(separator: "\n")
    }
}
