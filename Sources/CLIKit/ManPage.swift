extension CommandSpec {
    /// The tool's manual page in roff (man(7) macros), from the same specs as its help: NAME,
    /// SYNOPSIS, DESCRIPTION, OPTIONS (one subsection per option group), one subsection per
    /// subcommand with its own usage, arguments and options, EXAMPLES and EXIT STATUS.
    ///
    /// Read it with `man -l FILE`; install it as `share/man/man1/<name>.1`. `date` goes into
    /// the page's header (`2026-12-01`); the version shown is ``version``.
    package func manPage(section: Int = 1, date: String = "") -> String {
        var out = ManPageWriter()
        let title = name.uppercased()
        out.line(".TH \(ManPageWriter.quoted(title)) \(section) \(ManPageWriter.quoted(date)) "
                 + "\(ManPageWriter.quoted(version.map { "\(name) \($0)" } ?? name)) \"User Commands\"")
        out.section("NAME")
        out.text("\(name) \\- \(ManPageWriter.escaped(abstract))", raw: true)
        out.section("SYNOPSIS")
        out.synopsis(HelpRenderer.usage(for: [self]))
        if !discussion.isEmpty {
            out.section("DESCRIPTION")
            out.paragraphs(discussion)
        }
        let rootOptions = HelpRenderer.visibleOptions(for: [self])
        out.section("OPTIONS")
        out.options(rootOptions.filter { $0.group == nil })
        if version != nil { out.item("\\fB\\-\\-version\\fR", "Show the version.") }
        out.item("\\fB\\-h\\fR, \\fB\\-\\-help\\fR", "Show help information.")
        for group in HelpRenderer.groups(of: rootOptions) {
            out.subsection(group.uppercased() + " OPTIONS")
            out.options(rootOptions.filter { $0.group == group })
        }
        if !subcommands.isEmpty {
            out.section("SUBCOMMANDS")
            for chain in allSubcommandChains() {
                let command = chain[chain.count - 1]
                out.subsection(chain.map(\.name).joined(separator: " "))
                if !command.abstract.isEmpty { out.paragraphs(command.abstract) }
                if !command.discussion.isEmpty { out.paragraphs(command.discussion) }
                out.synopsis(HelpRenderer.usage(for: chain))
                for positional in command.positionals where !positional.help.isEmpty {
                    out.item("\\fI<\(ManPageWriter.escaped(positional.name))>\\fR", positional.help)
                }
                // The command's own options; the inherited ones are described above.
                out.options(command.options)
                if !command.refusedGroups.isEmpty {
                    out.paragraphs("The " + command.refusedGroups.sorted().joined(separator: " and ") + " options do not apply here.")
                }
                if !command.examples.isEmpty { out.examples(command.examples) }
                if !command.exitStatuses.isEmpty { out.exitStatuses(command.exitStatuses, heading: false) }
            }
        }
        if !examples.isEmpty {
            out.section("EXAMPLES")
            out.examples(examples)
        }
        if !exitStatuses.isEmpty {
            out.section("EXIT STATUS")
            out.exitStatuses(exitStatuses, heading: true)
        }
        return out.text
    }

    /// Every chain from this command down to each subcommand at any depth, depth first.
    func allSubcommandChains() -> [[CommandSpec]] {
        var result: [[CommandSpec]] = []
        func walk(_ chain: [CommandSpec]) {
            for sub in chain[chain.count - 1].subcommands {
                result.append(chain + [sub])
                walk(chain + [sub])
            }
        }
        walk([self])
        return result
    }
}

/// Builds roff text: escapes what roff would take for requests or escapes.
struct ManPageWriter {
    var text = ""

    /// `\` as `\e`, `-` as `\-` (a real minus, which copies and pastes as one).
    static func escaped(_ text: String) -> String {
        var out = ""
        for character in text {
            switch character {
            case "\\": out += "\\e"
            case "-": out += "\\-"
            default: out.append(character)
            }
        }
        return out
    }

    static func quoted(_ text: String) -> String {
        "\"" + escaped(text).replacingAll("\"", with: "\\(dq") + "\""
    }

    /// A request (`.TH`, `.SH`, `.TP`…), written as it is.
    mutating func line(_ line: String) {
        text += line + "\n"
    }

    /// Text lines, escaped unless `raw`; a line that would start with `.` or `'` (a request)
    /// is guarded with `\&`.
    mutating func text(_ body: String, raw: Bool = false) {
        for part in body.split(separator: "\n", omittingEmptySubsequences: false) {
            let escaped = raw ? String(part) : Self.escaped(String(part))
            text += (escaped.first == "." || escaped.first == "'" ? "\\&" : "") + escaped + "\n"
        }
    }

    mutating func section(_ name: String) { line(".SH \(Self.quoted(name))") }
    mutating func subsection(_ name: String) { line(".SS \(Self.quoted(name))") }

    mutating func paragraphs(_ body: String) {
        for paragraph in body.split(separator: "\n\n") {
            line(".PP")
            text(String(paragraph))
        }
    }

    mutating func synopsis(_ usage: String) {
        line(".PP")
        line(".nf")
        text(usage)
        line(".fi")
    }

    mutating func item(_ label: String, _ body: String) {
        line(".TP")
        text(label, raw: true)
        text(body)
    }

    mutating func options(_ options: [OptionSpec]) {
        for option in options {
            var label = option.short.map { "\\fB\\-\(Self.escaped(String($0)))\\fR, " } ?? ""
            label += "\\fB\\-\\-\(Self.escaped(option.long))\\fR"
            switch option.kind {
            case .flag: break
            case .value(let name): label += " \\fI<\(Self.escaped(name))>\\fR"
            case .optionalValue(let name): label += "[=\\fI<\(Self.escaped(name))>\\fR]"
            }
            item(label, HelpRenderer.description(of: option))
        }
    }

    mutating func examples(_ examples: [CommandExample]) {
        for example in examples {
            line(".TP")
            text("\\fB" + Self.escaped(example.command) + "\\fR", raw: true)
            text(example.summary)
        }
    }

    mutating func exitStatuses(_ statuses: [ExitStatusDescription], heading: Bool) {
        if !heading {
            line(".PP")
            text("Exit status:")
        }
        for status in statuses {
            line(".TP")
            text(String(status.code.rawValue))
            text(status.meaning)
        }
    }
}

extension String {
    /// Every occurrence of `target` replaced by `replacement` (Foundation-free).
    func replacingAll(_ target: String, with replacement: String) -> String {
        guard !target.isEmpty else { return self }
        var out = ""
        var rest = self[...]
        while let range = rest.firstRange(of: target) {
            out += rest[..<range.lowerBound] + replacement
            rest = rest[range.upperBound...]
        }
        return out + rest
    }
}
