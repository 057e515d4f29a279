/// The shells ``CommandSpec/completionScript(for:)`` writes completion for.
package enum CompletionShell: String, Sendable, CaseIterable {
    /// bash: a function registered with `complete -F`; needs no bash-completion package.
    case bash
    /// zsh: a `#compdef` function for a directory on `fpath`.
    case zsh
    /// fish: `complete` commands for `~/.config/fish/completions`.
    case fish
}

extension CommandSpec {
    /// A completion script for `shell`, from the same specs as help and the man page:
    /// subcommands (with their abstracts where the shell shows them), every option that applies
    /// to the command being typed (inherited ones included, refused groups left out), the values
    /// of options with ``OptionSpec/allowedValues``, and files or directories where an option
    /// or argument takes them (``ValueCompletion``).
    ///
    /// Install as `share/bash-completion/completions/<name>`, `share/zsh/site-functions/_<name>`
    /// or `share/fish/vendor_completions.d/<name>.fish`.
    package func completionScript(for shell: CompletionShell) -> String {
        switch shell {
        case .bash: return CompletionWriter(root: self).bash()
        case .zsh: return CompletionWriter(root: self).zsh()
        case .fish: return CompletionWriter(root: self).fish()
        }
    }
}

/// Writes the completion scripts. Every command of the tree is identified by its path
/// (`iapctl send`); the scripts find the path by walking the words typed so far, skipping the
/// values of options that take one.
struct CompletionWriter {
    let root: CommandSpec

    /// Every command with its chain, the root first.
    var chains: [[CommandSpec]] { [[root]] + root.allSubcommandChains() }

    var function: String { "_" + root.name.map { $0.isLetter || $0.isNumber ? $0 : "_" }.map(String.init).joined() }

    /// The spellings of every option in the tree that takes a value in the next word.
    var valueOptionSpellings: [String] {
        var spellings: Set<String> = []
        for chain in chains {
            for option in HelpRenderer.visibleOptions(for: chain) {
                guard case .value = option.kind else { continue }
                spellings.insert("--" + option.long)
                if let short = option.short { spellings.insert("-" + String(short)) }
            }
        }
        return spellings.sorted()
    }

    static func spellings(_ option: OptionSpec) -> [String] {
        ["--" + option.long] + (option.short.map { ["-" + String($0)] } ?? [])
    }

    /// What a value takes: the allowed words, or the kind of path.
    static func valueCompletion(_ option: OptionSpec) -> ValueCompletion {
        if let allowed = option.allowedValues { return .words(allowed) }
        return option.completion
    }

    /// `'text'` for the shell, with `'` inside written as `'\''`.
    /// `; argument=…` for a command's first positional (files, directories or a word list), the
    /// same in the bash and zsh scripts; empty when it completes nothing.
    static func argumentAssignment(_ command: CommandSpec) -> String {
        switch command.positionals.first?.completion {
        case nil, .none?: ""
        case .files?: "; argument=files"
        case .directories?: "; argument=directories"
        case .words(let words)?: "; argument=\(quoted(words.joined(separator: " ")))"
        }
    }

    static func quoted(_ text: String) -> String {
        "'" + text.replacingAll("'", with: "'\\''") + "'"
    }

    // MARK: bash

    func bash() -> String {
        var out = """
            # bash completion for \(root.name), generated from its command specs (\(root.name) --generate-completion-script bash).
            \(function)() {
                local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
                local path=\(root.name) word i
                local value_options=" \(valueOptionSpellings.joined(separator: " ")) "
                for ((i = 1; i < COMP_CWORD; i++)); do
                    word=${COMP_WORDS[i]}
                    if [[ $word == "=" ]]; then ((i++)); continue; fi
                    if [[ $value_options == *" $word "* ]]; then ((i++)); continue; fi
                    [[ $word == -* ]] && continue
                    case "$path $word" in

            """
        for chain in chains.dropFirst() {
            out += "            \(Self.quoted(chain.map(\.name).joined(separator: " ")))) path=\"$path $word\" ;;\n"
        }
        out += """
                    esac
                done
                # --option=value: bash splits at '='.
                if [[ $cur == "=" ]]; then prev=${COMP_WORDS[COMP_CWORD-1]}; cur=""; elif [[ $prev == "=" ]]; then prev=${COMP_WORDS[COMP_CWORD-2]}; fi
                local options="" subcommands="" argument=""
                case "$path|$prev" in

            """
        for chain in chains {
            let path = chain.map(\.name).joined(separator: " ")
            for option in HelpRenderer.visibleOptions(for: chain) where option.valueName != nil {
                let patterns = Self.spellings(option).map { Self.quoted(path + "|" + $0) }.joined(separator: "|")
                switch Self.valueCompletion(option) {
                case .none: out += "        \(patterns)) return ;;\n"
                case .files: out += "        \(patterns)) COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n"
                case .directories: out += "        \(patterns)) COMPREPLY=($(compgen -d -- \"$cur\")); return ;;\n"
                case .words(let words):
                    out += "        \(patterns)) COMPREPLY=($(compgen -W \(Self.quoted(words.joined(separator: " "))) -- \"$cur\")); return ;;\n"
                }
            }
        }
        out += """
                esac
                case "$path" in

            """
        for chain in chains {
            let command = chain[chain.count - 1]
            let options = HelpRenderer.visibleOptions(for: chain).flatMap(Self.spellings) + ["--help"]
                + (root.version != nil ? ["--version"] : [])
            var body = "options=\(Self.quoted(options.joined(separator: " ")))"
            if !command.subcommands.isEmpty {
                body += "; subcommands=\(Self.quoted((command.subcommands.map(\.name) + ["help"]).joined(separator: " ")))"
            }
            body += Self.argumentAssignment(command)
            out += "        \(Self.quoted(chain.map(\.name).joined(separator: " ")))) \(body) ;;\n"
        }
        out += """
                esac
                if [[ $cur == -* ]]; then
                    COMPREPLY=($(compgen -W "$options" -- "$cur"))
                elif [[ -n $subcommands ]]; then
                    COMPREPLY=($(compgen -W "$subcommands" -- "$cur"))
                elif [[ $argument == files ]]; then
                    COMPREPLY=($(compgen -f -- "$cur"))
                elif [[ $argument == directories ]]; then
                    COMPREPLY=($(compgen -d -- "$cur"))
                elif [[ -n $argument ]]; then
                    COMPREPLY=($(compgen -W "$argument" -- "$cur"))
                fi
            }
            complete -o filenames -o bashdefault -F \(function) \(root.name)

            """
        return out
    }

    // MARK: zsh

    func zsh() -> String {
        var out = """
            #compdef \(root.name)
            # zsh completion for \(root.name), generated from its command specs (\(root.name) --generate-completion-script zsh).
            \(function)() {
                local cmdpath=\(root.name) word prev=${words[CURRENT-1]} i
                local -a value_options opts subs
                local argument=""
                value_options=(\(valueOptionSpellings.joined(separator: " ")))
                for ((i = 2; i < CURRENT; i++)); do
                    word=${words[i]}
                    if (( ${value_options[(Ie)${word%%=*}]} )) && [[ $word != *=* ]]; then ((i++)); continue; fi
                    [[ $word == -* ]] && continue
                    case "$cmdpath $word" in

            """
        for chain in chains.dropFirst() {
            out += "            \(Self.quoted(chain.map(\.name).joined(separator: " ")))) cmdpath=\"$cmdpath $word\" ;;\n"
        }
        out += """
                    esac
                done
                local cur=${words[CURRENT]}
                if [[ $cur == --*=* ]]; then prev=${cur%%=*}; compset -P '*='; fi
                case "$cmdpath|$prev" in

            """
        for chain in chains {
            let path = chain.map(\.name).joined(separator: " ")
            for option in HelpRenderer.visibleOptions(for: chain) where option.valueName != nil {
                let patterns = Self.spellings(option).map { Self.quoted(path + "|" + $0) }.joined(separator: "|")
                switch Self.valueCompletion(option) {
                case .none: out += "        \(patterns)) return ;;\n"
                case .files: out += "        \(patterns)) _files; return ;;\n"
                case .directories: out += "        \(patterns)) _files -/; return ;;\n"
                case .words(let words): out += "        \(patterns)) compadd -- \(words.map(Self.quoted).joined(separator: " ")); return ;;\n"
                }
            }
        }
        out += """
                esac
                case "$cmdpath" in

            """
        for chain in chains {
            let command = chain[chain.count - 1]
            let options = HelpRenderer.visibleOptions(for: chain).map { option in
                "--" + option.long + ":" + HelpRenderer.description(of: option).replacingAll(":", with: "\\:")
            } + ["--help:Show help information."]
            var body = "opts=(\(options.map(Self.quoted).joined(separator: " ")))"
            if !command.subcommands.isEmpty {
                let subs = command.subcommands.map { $0.name + ":" + $0.abstract.replacingAll(":", with: "\\:") }
                    + ["help:Show the help of a subcommand."]
                body += "; subs=(\(subs.map(Self.quoted).joined(separator: " ")))"
            }
            body += Self.argumentAssignment(command)
            out += "        \(Self.quoted(chain.map(\.name).joined(separator: " ")))) \(body) ;;\n"
        }
        out += """
                esac
                if [[ $cur == -* ]]; then
                    _describe -t options option opts
                elif (( ${#subs} )); then
                    _describe -t commands subcommand subs
                elif [[ $argument == files ]]; then
                    _files
                elif [[ $argument == directories ]]; then
                    _files -/
                elif [[ -n $argument ]]; then
                    compadd -- ${=argument}
                fi
            }
            \(function) "$@"

            """
        return out
    }

    // MARK: fish

    func fish() -> String {
        var out = "# fish completion for \(root.name), generated from its command specs (\(root.name) --generate-completion-script fish).\n"
        let name = root.name
        out += "complete -c \(name) -f\n"
        // The subcommand being typed: the deepest path whose words have all been seen.
        out += """
            function _\(function)_path
                set -l words (commandline -opc)
                set -e words[1]
                set -l path \(name)
                set -l skip 0
                set -l value_options \(valueOptionSpellings.joined(separator: " "))
                for word in $words
                    if test $skip -eq 1; set skip 0; continue; end
                    if contains -- $word $value_options; set skip 1; continue; end
                    if string match -q -- '-*' $word; continue; end
                    switch "$path $word"
            """
        out += "\n"
        for chain in chains.dropFirst() {
            out += "            case \(Self.quoted(chain.map(\.name).joined(separator: " ")))\n                set path \"$path $word\"\n"
        }
        out += """
                    end
                end
                echo $path
            end

            """
        for chain in chains {
            let path = chain.map(\.name).joined(separator: " ")
            let condition = "-n \"test (_\(function)_path) = '\(path)'\""
            let command = chain[chain.count - 1]
            for sub in command.subcommands {
                out += "complete -c \(name) \(condition) -a \(Self.quoted(sub.name)) -d \(Self.quoted(sub.abstract))\n"
            }
            if !command.subcommands.isEmpty {
                out += "complete -c \(name) \(condition) -a help -d 'Show the help of a subcommand.'\n"
            }
            for option in HelpRenderer.visibleOptions(for: chain) {
                var line = "complete -c \(name) \(condition) -l \(option.long)"
                if let short = option.short { line += " -s \(short)" }
                if option.valueName != nil {
                    switch Self.valueCompletion(option) {
                    case .none: line += " -x"
                    case .files: line += " -r -F"
                    case .directories: line += " -x -a '(__fish_complete_directories)'"
                    case .words(let words): line += " -x -a \(Self.quoted(words.joined(separator: " ")))"
                    }
                }
                out += line + " -d \(Self.quoted(option.help))\n"
            }
            if let argument = command.positionals.first {
                switch argument.completion {
                case .none: break
                case .files: out += "complete -c \(name) \(condition) -F\n"
                case .directories: out += "complete -c \(name) \(condition) -a '(__fish_complete_directories)'\n"
                case .words(let words): out += "complete -c \(name) \(condition) -a \(Self.quoted(words.joined(separator: " ")))\n"
                }
            }
        }
        return out
    }
}
