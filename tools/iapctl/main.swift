// iapctl: talk to MFi-style accessories from Linux. This file holds the command table and hands
// each subcommand to its own file.

import CLIKit

let verboseOption = OptionSpec.flag("verbose", short: "v", help: "Log more (repeat for more detail).", inherited: true)

let decodeCommand = CommandSpec(
    name: "decode",
    abstract: "Decode iAP1/iAP2 frames from hex text or raw bytes.",
    discussion: """
        Reads a capture (a file, or standard input when no file or '-' is given) and prints every \
        frame it finds: iAP2 link packets with their control messages or EA data, iAP1 packets \
        with lingo and command names, the iAP2 detect sequence, and any bytes that had to be \
        dropped, with the reason. Hex text may use spaces, newlines, commas, colons, '0x' \
        prefixes and '#' comments. Exit status: 0 when every byte belonged to a valid frame, \
        65 when bytes were dropped or the input ended inside a frame.
        """,
    options: [
        .flag("json", help: "Print one JSON object per frame, one per line."),
        .value("format", valueName: "format", help: "How the input is written.", defaultValue: "auto", allowedValues: ["auto", "hex", "raw"]),
        .value("transaction-ids", valueName: "mode", help: "Whether iAP1 packets carry transaction ids (auto: after StartIDPS).",
               defaultValue: "auto", allowedValues: ["auto", "on", "off"]),
        .value("kinds", valueName: "list", help: "Frame kinds to look for, comma separated: iap2, iap1, detect.",
               defaultValue: "iap2,iap1,detect"),
    ],
    positionals: [PositionalSpec("input", help: "The file to read; '-' or nothing for standard input.", optional: true)]
)

let iapctl = CommandSpec(
    name: "iapctl",
    abstract: "Talk to MFi-style (iAP1/iAP2) accessories from Linux.",
    version: toolVersion(),
    options: [verboseOption],
    subcommands: [decodeCommand]
)

CommandLineTool.run(iapctl) { command in
    switch command.path.dropFirst().first {
    case "decode": return try DecodeCommand.run(command)
    default: throw ExitCode.software
    }
}
