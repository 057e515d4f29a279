import CLIKit
import Testing

@Suite("Help text")
struct HelpTests {
    @Test func rootHelp() {
        #expect(sampleTool.helpText() == """
            OVERVIEW: Talk to iAP accessories over USB.

            USAGE: iapctl <subcommand>

            OPTIONS:
              -v, --verbose           Log more (repeat for more detail).
              -j, --json              Print JSON.
              --trace                 Trace every frame.
              --config <file>         Read settings from this file.
              --version               Show the version.
              -h, --help              Show help information.

            SUBCOMMANDS:
              decode                  Decode captured frames.
              probe                   Probe an attached accessory.
              send                    Send raw bytes.
              session                 Manage sessions.
              help                    Show the help of a subcommand.

              See 'iapctl help <subcommand>' for detailed help.
            """)
    }

    @Test func leafHelpWithInheritedOptionsDefaultsAndChoices() {
        #expect(sampleTool.helpText(for: ["decode"]) == """
            OVERVIEW: Decode captured frames.

            Reads a capture written by 'iapctl record'.

            USAGE: iapctl decode [<options>] [<input>]

            ARGUMENTS:
              <input>                 Capture file (stdin when absent).

            OPTIONS:
              -v, --verbose           Log more (repeat for more detail).
              -j, --json              Print JSON.
              --trace                 Trace every frame.
              -f, --format <style>    Output style. (values: text, hex, tree) (default:
                                      text)
              -o, --out <file>        Write to this file.
              --skip <n>              Frames to skip. (default: 0)
              --filter <lingo>        Only these lingoes.
              --version               Show the version.
              -h, --help              Show help information.
            """)
    }

    @Test func optionalValueLabelFitsTheColumnExactly() {
        #expect(sampleTool.helpText(for: ["probe"]) == """
            OVERVIEW: Probe an attached accessory.

            USAGE: iapctl probe [<options>]

            OPTIONS:
              -v, --verbose           Log more (repeat for more detail).
              -j, --json              Print JSON.
              --trace                 Trace every frame.
              --simulate[=<profile>]  Use a simulated accessory. (default: basic)
              --vendor <id>           USB vendor ID.
              --version               Show the version.
              -h, --help              Show help information.
            """)
    }

    @Test func nestedCommandHelpPointsAtHelpSubcommand() {
        #expect(sampleTool.helpText(for: ["session"]) == """
            OVERVIEW: Manage sessions.

            USAGE: iapctl session <subcommand>

            OPTIONS:
              -v, --verbose           Log more (repeat for more detail).
              -j, --json              Print JSON.
              --trace                 Trace every frame.
              --version               Show the version.
              -h, --help              Show help information.

            SUBCOMMANDS:
              open                    Open a session.
              close                   Close a session.
              help                    Show the help of a subcommand.

              See 'iapctl help session <subcommand>' for detailed help.
            """)
    }

    @Test func requiredAndVariadicArguments() {
        #expect(sampleTool.helpText(for: ["send"]) == """
            OVERVIEW: Send raw bytes.

            USAGE: iapctl send [--verbose ...] [--json] [--trace] <device> <bytes> ...

            ARGUMENTS:
              <device>                Device path.
              <bytes>                 Hex bytes.

            OPTIONS:
              -v, --verbose           Log more (repeat for more detail).
              -j, --json              Print JSON.
              --trace                 Trace every frame.
              --version               Show the version.
              -h, --help              Show help information.
            """)
    }

    @Test func longLabelsWrapAndTakenShortHKeepsHelpLong() throws {
        let spec = CommandSpec(
            name: "dump",
            options: [
                .flag("human-readable", short: "h", help: "Sizes in KiB."),
                .value("maximum-transfer-size", valueName: "bytes", help: "Largest USB transfer."),
                .optionalValue("level", valueName: "n", help: "Detail level.\nHigher is chattier.", allowedValues: ["1", "2", "3"]),
            ],
            positionals: [PositionalSpec("files", variadic: true)]
        )
        #expect(spec.helpText() == """
            USAGE: dump [<options>] <files> ...

            ARGUMENTS:
              <files>

            OPTIONS:
              -h, --human-readable    Sizes in KiB.
              --maximum-transfer-size <bytes>
                                      Largest USB transfer.
              --level[=<n>]           Detail level.
                                      Higher is chattier. (values: 1, 2, 3)
              --help                  Show help information.
            """)
        // With `-h` taken by an option, only `--help` asks for help.
        guard case .run(let command) = try spec.parse(["-h", "a"]) else {
            Issue.record("expected -h to be the declared flag")
            return
        }
        #expect(command.flag("human-readable"))
        guard case .help = try spec.parse(["--help"]) else {
            Issue.record("expected help")
            return
        }
    }

    @Test func unknownPathHasNoHelp() {
        #expect(sampleTool.helpText(for: ["nope"]) == nil)
        #expect(sampleTool.usageLine(for: ["session", "nope"]) == nil)
        #expect(sampleTool.usageLine(for: ["session", "open"]) == "iapctl session open [--verbose ...] [--json] [--trace]")
    }

    @Test func helpTextHasNoTrailingWhitespace() throws {
        for path in [[], ["decode"], ["probe"], ["send"], ["session"], ["session", "open"]] {
            let text = try #require(sampleTool.helpText(for: path))
            for line in text.split(separator: "\n") {
                #expect(line.last != " ", "trailing space in \(path): '\(line)'")
            }
        }
    }
}
