import CLIKit
import Testing

/// A small tool in the shape of `iapctl`, used by the parser, help and tool tests.
let sampleTool = CommandSpec(
    name: "iapctl",
    abstract: "Talk to iAP accessories over USB.",
    version: "iapctl 0.3.0",
    options: [
        .flag("verbose", short: "v", help: "Log more (repeat for more detail).", repeatable: true, inherited: true),
        .flag("json", short: "j", help: "Print JSON.", inherited: true),
        .flag("trace", help: "Trace every frame.", inherited: true),
        .value("config", valueName: "file", help: "Read settings from this file."),
    ],
    subcommands: [
        CommandSpec(
            name: "decode",
            abstract: "Decode captured frames.",
            discussion: "Reads a capture written by 'iapctl record'.",
            options: [
                .value(
                    "format", short: "f", valueName: "style", help: "Output style.", defaultValue: "text",
                    allowedValues: ["text", "hex", "tree"]
                ),
                .value("out", short: "o", valueName: "file", help: "Write to this file."),
                .value("skip", valueName: "n", help: "Frames to skip.", defaultValue: "0"),
                .value("filter", valueName: "lingo", help: "Only these lingoes.", repeatable: true),
            ],
            positionals: [PositionalSpec("input", help: "Capture file (stdin when absent).", optional: true)]
        ),
        CommandSpec(
            name: "probe",
            abstract: "Probe an attached accessory.",
            options: [
                .optionalValue(
                    "simulate", valueName: "profile", help: "Use a simulated accessory.", defaultValue: "basic"
                ),
                .value("vendor", valueName: "id", help: "USB vendor ID."),
            ]
        ),
        CommandSpec(
            name: "send",
            abstract: "Send raw bytes.",
            positionals: [
                PositionalSpec("device", help: "Device path."),
                PositionalSpec("bytes", help: "Hex bytes.", variadic: true),
            ]
        ),
        CommandSpec(
            name: "session",
            abstract: "Manage sessions.",
            subcommands: [
                CommandSpec(name: "open", abstract: "Open a session."),
                CommandSpec(name: "close", abstract: "Close a session."),
            ]
        ),
    ]
)

/// The parsed command for `arguments`, recording an issue when the outcome is not `.run`.
func parsed(_ arguments: [String], sourceLocation: SourceLocation = #_sourceLocation) -> ParsedCommand? {
    do {
        switch try sampleTool.parse(arguments) {
        case .run(let command):
            return command
        case .help:
            Issue.record("expected a command, got help", sourceLocation: sourceLocation)
        case .version:
            Issue.record("expected a command, got the version", sourceLocation: sourceLocation)
        }
    } catch {
        Issue.record("unexpected usage error: \(error.message)", sourceLocation: sourceLocation)
    }
    return nil
}

/// The usage error for `arguments`, recording an issue when parsing succeeds.
func usageError(_ arguments: [String], sourceLocation: SourceLocation = #_sourceLocation) -> UsageError? {
    do {
        let outcome = try sampleTool.parse(arguments)
        Issue.record("expected a usage error, got \(outcome)", sourceLocation: sourceLocation)
        return nil
    } catch {
        return error
    }
}

/// The help text for `arguments`, recording an issue when the outcome is not `.help`.
func helpOutcome(_ arguments: [String], sourceLocation: SourceLocation = #_sourceLocation) -> String? {
    do {
        if case .help(let text) = try sampleTool.parse(arguments) {
            return text
        }
        Issue.record("expected help", sourceLocation: sourceLocation)
    } catch {
        Issue.record("unexpected usage error: \(error.message)", sourceLocation: sourceLocation)
    }
    return nil
}
