import CLIKit
import Testing

@Suite("Argument parsing")
struct ParserTests {
    @Test func selectsSubcommandAndPath() throws {
        let command = try #require(parsed(["decode", "capture.bin"]))
        #expect(command.path == ["iapctl", "decode"])
        #expect(command.positional("input") == "capture.bin")
        #expect(command.positionals("input") == ["capture.bin"])
        #expect(!command.flag("json"))
        #expect(command.count("verbose") == 0)
    }

    @Test func nestedSubcommand() throws {
        let command = try #require(parsed(["session", "close"]))
        #expect(command.path == ["iapctl", "session", "close"])
    }

    @Test func optionalPositionalMayBeLeftOut() throws {
        let command = try #require(parsed(["decode"]))
        #expect(command.positional("input") == nil)
        #expect(command.positionals("input").isEmpty)
    }

    @Test(arguments: [
        ["decode", "--out", "x.txt"],
        ["decode", "--out=x.txt"],
        ["decode", "-o", "x.txt"],
        ["decode", "-ox.txt"],
        ["decode", "-o=x.txt"],
        ["decode", "-jo", "x.txt"],
        ["decode", "-jox.txt"],
    ])
    func valueOptionForms(arguments: [String]) throws {
        let command = try #require(parsed(arguments))
        #expect(command.value("out") == "x.txt")
        #expect(command.flag("out"))
        #expect(command.positional("input") == nil)
    }

    @Test func valueMayBeDashOrNegativeButNotEmpty() throws {
        #expect(usageError(["decode", "--out="])?.message == "empty value for option '--out <file>'")
        #expect(usageError(["probe", "--simulate="])?.message == "empty value for option '--simulate'")
        #expect(try #require(parsed(["decode", "--out", "-"])).value("out") == "-")
        #expect(try #require(parsed(["decode", "--skip", "-3"])).value("skip") == "-3")
    }

    @Test func defaultsAndLastValueWins() throws {
        let none = try #require(parsed(["decode"]))
        #expect(none.value("format") == "text")
        #expect(none.values("format") == ["text"])
        #expect(none.value("out") == nil)
        #expect(none.values("out").isEmpty)
        #expect(!none.flag("format"))

        let twice = try #require(parsed(["decode", "-f", "hex", "--format=tree"]))
        #expect(twice.value("format") == "tree")
        #expect(twice.values("format") == ["tree"])
        #expect(twice.count("format") == 2)
    }

    @Test func repeatableValuesAreCollected() throws {
        let command = try #require(parsed(["decode", "--filter", "general", "--filter=audio", "--filter", "display"]))
        #expect(command.values("filter") == ["general", "audio", "display"])
        #expect(command.value("filter") == "display")
        #expect(command.count("filter") == 3)
    }

    @Test func flagCounts() throws {
        #expect(try #require(parsed(["-vvv", "decode"])).count("verbose") == 3)
        #expect(try #require(parsed(["decode", "-v", "--verbose", "-vj"])).count("verbose") == 3)
        let once = try #require(parsed(["decode", "-v"]))
        #expect(once.count("verbose") == 1)
        #expect(once.flag("verbose"))
    }

    @Test func combinedShortFlags() throws {
        let command = try #require(parsed(["decode", "-vjv"]))
        #expect(command.count("verbose") == 2)
        #expect(command.flag("json"))
    }

    @Test func inheritedOptionsWorkBeforeAndAfterSubcommand() throws {
        let before = try #require(parsed(["--json", "--trace", "session", "open"]))
        #expect(before.flag("json"))
        #expect(before.flag("trace"))
        let after = try #require(parsed(["session", "open", "--json", "-v"]))
        #expect(after.flag("json"))
        #expect(after.count("verbose") == 1)
    }

    @Test func nonInheritedParentOptionOnlyBeforeSubcommand() throws {
        let before = try #require(parsed(["--config", "a.conf", "decode"]))
        #expect(before.value("config") == "a.conf")

        let error = try #require(usageError(["decode", "--config", "a.conf"]))
        #expect(error.message == "unknown option '--config'")
        #expect(error.commandPath == ["iapctl", "decode"])
    }

    @Test func doubleDashEndsOptions() throws {
        let command = try #require(parsed(["send", "--", "-dev", "--json", "-v"]))
        #expect(command.positional("device") == "-dev")
        #expect(command.positionals("bytes") == ["--json", "-v"])
        #expect(!command.flag("json"))
        #expect(command.count("verbose") == 0)

        let decode = try #require(parsed(["decode", "-j", "--", "--help"]))
        #expect(decode.positional("input") == "--help")
        #expect(decode.flag("json"))
    }

    @Test func variadicPositional() throws {
        let command = try #require(parsed(["send", "/dev/a", "ff", "55", "02"]))
        #expect(command.positional("device") == "/dev/a")
        #expect(command.positional("bytes") == "ff")
        #expect(command.positionals("bytes") == ["ff", "55", "02"])
    }

    @Test func optionalValueForms() throws {
        let absent = try #require(parsed(["probe"]))
        #expect(!absent.flag("simulate"))
        #expect(absent.value("simulate") == "basic")

        let bare = try #require(parsed(["probe", "--simulate"]))
        #expect(bare.flag("simulate"))
        #expect(bare.value("simulate") == "basic")

        let given = try #require(parsed(["probe", "--simulate=ipod-nano"]))
        #expect(given.flag("simulate"))
        #expect(given.value("simulate") == "ipod-nano")
    }

    @Test func optionalValueDoesNotTakeNextWord() {
        let error = usageError(["probe", "--simulate", "ipod"])
        #expect(error?.message == "unexpected argument 'ipod'")
    }

    @Test func integerHelper() throws {
        let command = try #require(parsed(["probe", "--vendor", "0x05AC"]))
        #expect(try command.integer("vendor") == 0x05AC)
        #expect(try command.integer("vendor", in: 0...0xFFFF) == 1452)

        let decimal = try #require(parsed(["decode", "--skip", "12"]))
        #expect(try decimal.integer("skip", in: 0...100) == 12)
        let defaulted = try #require(parsed(["decode"]))
        #expect(try defaulted.integer("skip") == 0)
        let absent = try #require(parsed(["probe"]))
        #expect(try absent.integer("vendor") == nil)

        let negative = try #require(parsed(["decode", "--skip=-0x10"]))
        #expect(try negative.integer("skip") == -16)
    }

    @Test func integerHelperErrors() throws {
        let notNumber = try #require(parsed(["probe", "--vendor", "apple"]))
        #expect(throws: UsageError.self) { try notNumber.integer("vendor") }
        do {
            _ = try notNumber.integer("vendor")
        } catch {
            #expect(error.message == "invalid value 'apple' for '--vendor <id>': expected an integer")
            #expect(error.commandPath == ["iapctl", "probe"])
        }
        let tooBig = try #require(parsed(["probe", "--vendor", "70000"]))
        do {
            _ = try tooBig.integer("vendor", in: 0...0xFFFF)
            Issue.record("expected a range error")
        } catch {
            #expect(error.message == "invalid value '70000' for '--vendor <id>': must be in the range 0...65535")
        }
        for bad in ["+", "0x", "--5", "1_000", "99999999999999999999", "0x-5", " 5"] {
            let command = try #require(parsed(["probe", "--vendor=\(bad)"]))
            #expect(throws: UsageError.self, "'\(bad)'") { try command.integer("vendor") }
        }
    }

    @Test func helpAnywhereGivesDeepestCommandHelp() throws {
        let root = try #require(helpOutcome(["--help"]))
        #expect(root.hasPrefix("OVERVIEW: Talk to iAP accessories over USB."))
        let decode = try #require(helpOutcome(["decode", "-h"]))
        #expect(decode.hasPrefix("OVERVIEW: Decode captured frames."))
        let later = try #require(helpOutcome(["--help", "session", "open"]))
        #expect(later.hasPrefix("OVERVIEW: Open a session."))
        let combined = try #require(helpOutcome(["decode", "-vh"]))
        #expect(combined == decode)
    }

    @Test func helpWinsOverUsageErrors() throws {
        let afterError = try #require(helpOutcome(["decode", "--bogus", "--help"]))
        #expect(afterError.hasPrefix("OVERVIEW: Decode captured frames."))
        let missingValue = try #require(helpOutcome(["decode", "--out", "--help"]))
        #expect(missingValue.hasPrefix("OVERVIEW: Decode captured frames."))
        let missingSubcommand = try #require(helpOutcome(["session", "-h"]))
        #expect(missingSubcommand.hasPrefix("OVERVIEW: Manage sessions."))
    }

    @Test func helpSubcommand() throws {
        #expect(helpOutcome(["help"]) == sampleTool.helpText())
        #expect(helpOutcome(["help", "decode"]) == sampleTool.helpText(for: ["decode"]))
        #expect(helpOutcome(["help", "session", "open"]) == sampleTool.helpText(for: ["session", "open"]))
        #expect(helpOutcome(["session", "help", "close"]) == sampleTool.helpText(for: ["session", "close"]))
        let error = try #require(usageError(["help", "decdoe"]))
        #expect(error.message == "unknown subcommand 'decdoe'; did you mean 'decode'?")
    }

    @Test func versionAtAnyLevel() throws {
        for arguments in [["--version"], ["decode", "--version"], ["session", "open", "--version", "-v"]] {
            let outcome = try sampleTool.parse(arguments)
            guard case .version(let version) = outcome else {
                Issue.record("expected the version for \(arguments), got \(outcome)")
                continue
            }
            #expect(version == "iapctl 0.3.0")
        }
    }

    @Test func versionIsUnknownWithoutVersion() {
        let spec = CommandSpec(name: "tool", options: [.flag("verbose")])
        #expect(throws: UsageError("unknown option '--version'", usage: "tool [--verbose]", commandPath: ["tool"])) {
            try spec.parse(["--version"])
        }
    }

    @Test func leafCommandWithoutSubcommands() throws {
        let spec = CommandSpec(
            name: "hexdump",
            options: [.flag("canonical", short: "C")],
            positionals: [PositionalSpec("file")]
        )
        guard case .run(let command) = try spec.parse(["-C", "x.bin"]) else {
            Issue.record("expected a command")
            return
        }
        #expect(command.path == ["hexdump"])
        #expect(command.flag("canonical"))
        #expect(command.positional("file") == "x.bin")
    }

    @Test func positionalsOnAParentWithSubcommands() throws {
        let spec = CommandSpec(
            name: "tool",
            positionals: [PositionalSpec("target", optional: true)],
            subcommands: [CommandSpec(name: "list")]
        )
        guard case .run(let sub) = try spec.parse(["list"]), case .run(let own) = try spec.parse(["thing"]) else {
            Issue.record("expected commands")
            return
        }
        #expect(sub.path == ["tool", "list"])
        #expect(own.path == ["tool"])
        #expect(own.positional("target") == "thing")
    }
}

@Suite("Usage errors")
struct UsageErrorTests {
    @Test func unknownLongOptionSuggestsClosest() throws {
        let error = try #require(usageError(["decode", "--jsn"]))
        #expect(error.message == "unknown option '--jsn'; did you mean '--json'?")
        #expect(error.usage == sampleTool.usageLine(for: ["decode"]))
        #expect(error.commandPath == ["iapctl", "decode"])

        #expect(usageError(["decode", "--fromat=hex"])?.message == "unknown option '--fromat'; did you mean '--format'?")
        #expect(usageError(["--verbsoe"])?.message == "unknown option '--verbsoe'; did you mean '--verbose'?")
    }

    @Test func unknownOptionWithoutCloseMatch() {
        #expect(usageError(["decode", "--xyzzy"])?.message == "unknown option '--xyzzy'")
        #expect(usageError(["decode", "-q"])?.message == "unknown option '-q'")
        #expect(usageError(["decode", "-vq"])?.message == "unknown option '-q' in '-vq'")
    }

    @Test func singleDashLongOptionSuggestsDoubleDash() {
        #expect(usageError(["decode", "-trace"])?.message == "unknown option '-t' in '-trace'; did you mean '--trace'?")
    }

    @Test func missingOptionValue() {
        #expect(usageError(["decode", "--out"])?.message == "missing value for option '--out <file>'")
        #expect(usageError(["decode", "-o"])?.message == "missing value for option '-o <file>'")
        #expect(usageError(["decode", "--out", "--json"])?.message == "missing value for option '--out <file>'")
        #expect(usageError(["decode", "-o", "--"])?.message == "missing value for option '-o <file>'")
    }

    @Test func valueForAFlag() {
        #expect(usageError(["decode", "--json=1"])?.message == "flag '--json' does not take a value (got '1')")
        #expect(usageError(["decode", "-j=1"])?.message == "option '-j' does not take a value (got '1')")
    }

    @Test func invalidChoiceListsChoices() {
        #expect(
            usageError(["decode", "--format", "xml"])?.message
                == "invalid value 'xml' for option '--format <style>'; expected one of: text, hex, tree"
        )
        #expect(
            usageError(["decode", "-fxml"])?.message
                == "invalid value 'xml' for option '-f <style>'; expected one of: text, hex, tree"
        )
    }

    @Test func extraPositional() {
        #expect(usageError(["decode", "a.bin", "b.bin"])?.message == "unexpected argument 'b.bin'")
        #expect(usageError(["session", "open", "now"])?.message == "unexpected argument 'now'")
        #expect(usageError(["session", "--", "open"])?.message == "unexpected argument 'open'")
    }

    @Test func missingRequiredPositional() throws {
        let error = try #require(usageError(["send"]))
        #expect(error.message == "missing required argument '<device>'")
        #expect(error.usage == "iapctl send [--verbose ...] [--json] [--trace] <device> <bytes> ...")
        #expect(usageError(["send", "/dev/a"])?.message == "missing required argument '<bytes>'")
    }

    @Test func unknownSubcommand() {
        #expect(usageError(["decod"])?.message == "unknown subcommand 'decod'; did you mean 'decode'?")
        #expect(usageError(["prboe"])?.message == "unknown subcommand 'prboe'; did you mean 'probe'?")
        #expect(
            usageError(["frobnicate"])?.message
                == "unknown subcommand 'frobnicate'; expected one of: decode, probe, send, session"
        )
        #expect(usageError(["session", "shut"])?.commandPath == ["iapctl", "session"])
    }

    @Test func missingSubcommand() throws {
        let error = try #require(usageError([]))
        #expect(error.message == "missing subcommand; expected one of: decode, probe, send, session")
        #expect(error.usage == "iapctl <subcommand>")
        #expect(usageError(["-v", "session"])?.message == "missing subcommand; expected one of: open, close")
    }

    @Test func descriptionHasUsageAndHelpPointer() throws {
        let error = try #require(usageError(["probe", "--vendor"]))
        #expect(
            error.description == """
                missing value for option '--vendor <id>'
                USAGE: iapctl probe [<options>]
                See 'iapctl probe --help'.
                """
        )
    }
}

@Suite("Edit distance")
struct EditDistanceTests {
    @Test func suggestionsAreLimitedToCloseWords() throws {
        #expect(usageError(["decode", "--j"])?.message == "unknown option '--j'")
        #expect(usageError(["decode", "--jsno"])?.message == "unknown option '--jsno'; did you mean '--json'?")
        #expect(usageError(["decode", "--outt"])?.message == "unknown option '--outt'; did you mean '--out'?")
        #expect(usageError(["decode", "--trcae"])?.message == "unknown option '--trcae'; did you mean '--trace'?")
        #expect(usageError(["decode", "--tree"])?.message == "unknown option '--tree'")
        #expect(usageError(["decode", "--banana"])?.message == "unknown option '--banana'")
    }
}
