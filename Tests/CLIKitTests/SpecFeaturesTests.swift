import CLIKit
import Testing

/// A tool with option groups, checked values, examples and exit statuses (issue 20).
private let hostTool = CommandSpec(
    name: "hostctl",
    abstract: "Talk to accessories.",
    discussion: "A long discussion that goes on and on so that it has to be wrapped somewhere sensible, between words, never inside a Unix socket.",
    version: "1.2.3",
    options: [
        .flag("verbose", short: "v", help: "Log more.", repeatable: true, inherited: true),
        OptionSpec.value("serial", valueName: "device", help: "A serial port.", repeatable: true, inherited: true)
            .inGroup("accessory").completing(.files),
        OptionSpec.optionalValue("simulate", valueName: "profile", help: "A simulated accessory.", inherited: true).inGroup("accessory"),
        OptionSpec.value("timeout", valueName: "seconds", help: "How long to wait.", defaultValue: "3", inherited: true)
            .inGroup("accessory").checked(.number(0...86_400)),
    ],
    subcommands: [
        CommandSpec(name: "list", abstract: "List accessories.",
                    options: [OptionSpec.value("count", valueName: "n", help: "At most n.").checked(.integer(1...100))]),
        CommandSpec(name: "decode", abstract: "Decode a capture.",
                    positionals: [PositionalSpec("input", help: "The capture.", optional: true, completion: .files)],
                    refusedGroups: ["accessory"]),
    ],
    examples: [CommandExample("hostctl --simulate list", "List the simulated accessory.")],
    exitStatuses: [ExitStatusDescription(.success, "done"), ExitStatusDescription(.usage, "usage error")]
)

private func outcome(_ arguments: [String]) -> Result<ParseOutcome, UsageError> {
    do { return .success(try hostTool.parse(arguments)) } catch { return .failure(error) }
}

private func message(_ arguments: [String]) -> String? {
    if case .failure(let error) = outcome(arguments) { return error.message }
    return nil
}

@Suite("Option groups, checked values, help for people, man page and completions")
struct SpecFeaturesTests {
    @Test func refusedGroupIsAnErrorBeforeOrAfterTheSubcommand() {
        #expect(message(["--serial", "/dev/x", "decode"]) == "option '--serial' does not apply to 'hostctl decode'")
        #expect(message(["decode", "--timeout", "2"]) == "option '--timeout' does not apply to 'hostctl decode'")
        #expect(message(["decode", "-v"]) == nil)
        #expect(message(["--serial", "/dev/x", "list"]) == nil)
    }

    @Test func checkedValuesAreUsageErrors() {
        #expect(message(["--timeout", "abc", "list"]) == "invalid value 'abc' for option '--timeout <seconds>': expected a number from 0 to 86400")
        #expect(message(["--timeout=-1", "list"]) == "invalid value '-1' for option '--timeout <seconds>': expected a number from 0 to 86400")
        #expect(message(["--timeout", "nan", "list"]) != nil)
        #expect(message(["--timeout", "0.5", "list"]) == nil)
        #expect(message(["list", "--count", "0"]) == "invalid value '0' for option '--count <n>': expected a whole number from 1 to 100")
        #expect(message(["list", "--count", "0x10"]) == nil)
    }

    @Test func aWordAfterAnOptionalValueOptionGetsTheEqualsHint() {
        #expect(message(["--simulate", "legacy", "list"])
                == "unknown subcommand 'legacy'; expected one of: list, decode; to give --simulate a value, write '--simulate=legacy'")
        #expect(message(["--simulate="]) == "empty value for option '--simulate'")
    }

    @Test func helpIsWrappedBetweenWordsAndHasExamplesAndExitStatus() throws {
        let text = try #require(hostTool.helpText(width: 60))
        for line in text.split(separator: "\n") {
            #expect(line.count <= 60, "too long: '\(line)'")
            #expect(line.last != " ")
        }
        #expect(text.contains("Unix\nsocket") || text.contains("Unix socket"))
        #expect(!text.contains("Uni\n"))
        #expect(text.contains("ACCESSORY OPTIONS:\n  --serial <device>"))
        #expect(text.contains("  help                    Show the help of a subcommand."))
        #expect(text.contains("EXAMPLES:\n  hostctl --simulate list\n      List the simulated accessory."))
        #expect(text.contains("EXIT STATUS:\n  0     done\n  64    usage error"))
        let decode = try #require(hostTool.helpText(for: ["decode"]))
        #expect(!decode.contains("--serial"))
    }

    @Test func manPageHasTheSectionsAndEscapesDashes() {
        let page = hostTool.manPage(date: "2026-12-01")
        #expect(page.hasPrefix(".TH \"HOSTCTL\" 1 \"2026\\-12\\-01\" \"hostctl 1.2.3\" \"User Commands\"\n"))
        for section in [".SH \"NAME\"", ".SH \"SYNOPSIS\"", ".SH \"DESCRIPTION\"", ".SH \"OPTIONS\"", ".SS \"ACCESSORY OPTIONS\"",
                        ".SH \"SUBCOMMANDS\"", ".SS \"hostctl list\"", ".SH \"EXAMPLES\"", ".SH \"EXIT STATUS\""] {
            #expect(page.contains(section + "\n"), "missing \(section)")
        }
        #expect(page.contains("\\fB\\-\\-serial\\fR \\fI<device>\\fR"))
        #expect(page.contains("The accessory options do not apply here."))
    }

    @Test func completionScriptsNameEverySubcommandAndOption() {
        let bash = hostTool.completionScript(for: .bash)
        #expect(bash.contains("complete -o filenames -o bashdefault -F _hostctl hostctl"))
        #expect(bash.contains("'hostctl') options='--verbose -v --serial --simulate --timeout --help --version'; subcommands='list decode help'"))
        #expect(bash.contains("'hostctl decode') options='--verbose -v --help --version'; argument=files"))
        let zsh = hostTool.completionScript(for: .zsh)
        #expect(zsh.hasPrefix("#compdef hostctl\n"))
        #expect(zsh.contains("'list:List accessories.'"))
        let fish = hostTool.completionScript(for: .fish)
        #expect(fish.contains("complete -c hostctl -n \"test (__hostctl_path) = 'hostctl'\" -a 'list' -d 'List accessories.'"))
        #expect(fish.contains("-l serial -r -F -d 'A serial port.'"))
    }

    @Test func generatorsAreReachedThroughTheTool() {
        let man = CommandLineTool.evaluate(hostTool, arguments: ["--generate-man-page"], manPageDate: "2026-12-01") { _ in .failure }
        #expect(man.exitCode == .success)
        #expect(man.stdout.hasPrefix(".TH"))
        let bash = CommandLineTool.evaluate(hostTool, arguments: ["--generate-completion-script", "bash"]) { _ in .failure }
        #expect(bash.stdout.contains("_hostctl()"))
        let bad = CommandLineTool.evaluate(hostTool, arguments: ["--generate-completion-script", "tcsh"]) { _ in .failure }
        #expect(bad.exitCode == .usage)
    }

    @Test func suggestionIsPublic() {
        #expect(Suggestion.closest(to: "com.example.ech", among: ["com.example.echo", "com.example.sink"]) == "com.example.echo")
        #expect(Suggestion.closest(to: "zzz", among: ["com.example.echo"]) == nil)
    }
}
