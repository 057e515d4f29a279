// iapctl: talk to MFi-style accessories from Linux. This file holds the command table and hands
// each subcommand to its own file.

import AccessoryGadget
import AccessorySimulator
import CLIKit
import IAPDaemonCommand
import ProjectVersion

// One executable, both tools: started by the name iapd (the package's /usr/bin/iapd is a link to
// iapctl), this is the daemon. One copy of the Swift runtime serves both (docs/ARCHITECTURE.md,
// "The package").
if CommandLine.arguments.first?.split(separator: "/").last == "iapd" {
    IAPDaemonCommand.main()
}

let verboseOption = OptionSpec.flag("verbose", short: "v", help: "Log more (repeat for more detail).", inherited: true)

let decodeCommand = CommandSpec(
    name: "decode",
    abstract: "Decode iAP1/iAP2 frames from hex text or raw bytes.",
    discussion: """
        Reads a capture (a file, or standard input when no file or '-' is given) and prints every \
        frame it finds: iAP2 link packets with their control messages or EA data, iAP1 packets \
        with lingo and command names, the iAP2 detect sequence, and any bytes that had to be \
        dropped, with the reason. Hex text may use spaces, newlines, commas, colons, '0x' \
        prefixes and '#' comments; with the default --format auto, the first block read (up to \
        64 KiB) decides between hex text and raw bytes. The input is read in 64 KiB blocks and \
        each frame is printed as soon as it is decoded, so a capture of any size, or a pipe that \
        stays open, shows its frames at once in bounded memory; a mistake in hex text stops the \
        decoding there, after the frames before it. Exit status: 0 when every byte belonged to a \
        valid frame, 65 when bytes were dropped, the input ended inside a frame or the hex text \
        has a mistake. With --pcap (or a pcap/pcapng file under --format auto) the input is a \
        capture: a Linux usbmon capture (tcpdump -i usbmonN, Wireshark), whose iAP2 interface's \
        bulk endpoints are decoded with frames reassembled across transfers, or a trace of \
        --trace-file FILE.pcapng; each frame is shown with its capture record, time, place and \
        direction. Each authentication response in the input (iAP2 AuthenticationResponse, iAP1 \
        RetAccessoryAuthenticationSignature) is checked against the challenge sent before it \
        and the certificate the accessory sent before that, step by step: the certificate read, \
        its key, the challenge's length, the signature (valid, or which side changed), the \
        chain to the CA certificates given with --trust (not checked without it), and the \
        validity period (information, unless --check-validity). The trace of an iapctl report \
        made without --full has its certificate zeroed, and says so.
        """,
    options: [
        .flag("json", help: "Print one JSON object per frame, one per line (JSON Lines), as they are decoded."),
        .value("format", valueName: "format", help: "How the input is written (auto also knows pcap and pcapng captures).",
               defaultValue: "auto", allowedValues: ["auto", "hex", "raw", "pcap"]),
        .flag("pcap", help: "The input is a pcap or pcapng capture: a Linux usbmon capture, or a trace of --trace-file FILE.pcapng."),
        .value("transaction-ids", valueName: "mode", help: "Whether iAP1 packets carry transaction ids (auto: after StartIDPS).",
               defaultValue: "auto", allowedValues: ["auto", "on", "off"]),
        .value("kinds", valueName: "list", help: "Frame kinds to look for, comma separated: iap2, iap1, detect.",
               defaultValue: "iap2,iap1,detect"),
        OptionSpec.value("trust", valueName: "file|dir", help: "CA certificates (PEM file, or a directory of them) the captured "
                         + "certificates' chains are checked against.").completing(.files),
        .flag("check-validity", help: "Count a captured certificate outside its validity period as a failed step."),
    ],
    positionals: [PositionalSpec("input", help: "The file to read; '-' or nothing for standard input.", optional: true, completion: .files)],
    refusedGroups: [OptionGroup.accessory, OptionGroup.authentication],
    examples: [CommandExample("iapctl decode tools/data/samples/boya-handshake.hex", "A file of hex, frame by frame."),
               CommandExample("iapctl decode --pcap accessory.pcap", "A usbmon capture of a real accessory."),
               CommandExample("iapctl decode --trust accessories-ca.pem trace.pcapng", "A trace, with its authentication checked to the CA.")],
    exitStatuses: [ExitStatusDescription(.success, "every byte belonged to a valid frame"),
                   ExitStatusDescription(.usage, "usage error"),
                   ExitStatusDescription(.dataError, "bytes were dropped, the input ended inside a frame, or the hex text has a mistake"),
                   ExitStatusDescription(.noInput, "the input cannot be read")]
)

/// The options that find accessories (and trace them): every subcommand that talks to an
/// accessory takes them, before or after its name; `decode` and `simulate` refuse them. A new
/// one is one line here.
let hostOptions: [OptionSpec] = [
    OptionSpec.value("serial", valueName: "device[:baud]", help: "Look for an accessory on a serial port (repeatable).",
                     repeatable: true, inherited: true).completing(.files),
    .optionalValue("simulate", valueName: "profile", help: "Add the built-in simulated accessory (profile: a built-in name or a JSON "
                   + "file; the value needs '=').", defaultValue: "multi-sensor", inherited: true),
    .flag("bluetooth", help: "Also take accessories over Bluetooth: register the iAP2 service with BlueZ (paired accessories connect to it).",
          inherited: true),
    OptionSpec.value("bluetooth-connect", valueName: "address", help: "Connect out to this paired Bluetooth accessory (implies --bluetooth; "
                     + "repeatable).", repeatable: true, inherited: true),
    OptionSpec.value("bluetooth-channel", valueName: "channel", help: "The RFCOMM channel of the iAP2 service (1-30; 0: BlueZ picks a free one).",
                     defaultValue: "0", inherited: true).checked(.number(0...30)),
    .flag("bluetooth-agent", help: "Also be BlueZ's pairing agent, accepting Just Works pairing (for a host without a desktop's agent).",
          inherited: true),
    .flag("no-usb", help: "Do not look for USB accessories.", inherited: true),
    .flag("direct", help: "Open accessories in this process even when iapd runs (by default iapctl goes through it).", inherited: true),
    .flag("no-hotplug", help: "Poll the USB device list every second instead of using hotplug notifications.", inherited: true),
    .flag("no-detach", help: "Fail instead of detaching a kernel driver bound to an accessory's iAP interface.", inherited: true),
    OptionSpec.value("timeout", valueName: "seconds", help: "How long to wait for accessories to identify.", defaultValue: "3",
                     inherited: true).checked(.number(0...86_400)),
    .flag("trace", help: "Print every frame in both directions, decoded and timestamped, to standard error.", inherited: true),
    OptionSpec.value("trace-file", valueName: "path", help: "Write the trace to a file instead (pcapng for Wireshark when it ends "
                     + "in .pcapng).", inherited: true).completing(.files),
    .value("trace-format", valueName: "format", help: "The trace file's format (auto: pcapng for a .pcapng file, else text).",
           allowedValues: ["auto", "text", "pcapng"], inherited: true),
].map { $0.inGroup(OptionGroup.accessory) }
let accessoryOption = OptionSpec.value("accessory", short: "a", valueName: "id|serial|name",
                                       help: "Which accessory: its connection id, serial number or name (when several match, the "
                                           + "choice is an error listing them).")
let jsonOption = OptionSpec.flag("json", help: "Machine-readable output: one JSON object per line (docs/json-schema.json).")

let listCommand = CommandSpec(name: "list", abstract: "List the connected accessories.", options: [jsonOption])
let infoCommand = CommandSpec(name: "info", abstract: "Everything an accessory declared about itself.", options: [accessoryOption, jsonOption])
let watchCommand = CommandSpec(
    name: "watch", abstract: "Print accessories connecting and disconnecting until interrupted.",
    options: [jsonOption, OptionSpec.value("count", valueName: "n", help: "Stop after n events.").checked(.integer(1...1_000_000))])
let waitCommand = CommandSpec(
    name: "wait", abstract: "Wait for an accessory that matches (or, with --gone, for none to match).",
    discussion: """
        Prints the accessory (as list does, or its JSON object) as soon as one that meets every \
        condition given is connected, at once if one already is. A condition given several times \
        matches any of its values, so an accessory that comes back under another identity (a \
        bootloader with its own product id or name, new firmware) is followed by listing both. \
        With --gone, waits until no connected accessory matches (after the accessories present at \
        start have identified). --timeout is 30 seconds here unless given. Exit status: 0 found \
        (or gone), 64 usage error, 75 not within the timeout (the message lists what is connected).
        """,
    options: [jsonOption,
              .value("name", valueName: "name", help: "The accessory's name (repeatable: any of them).", repeatable: true),
              .value("serial-number", valueName: "serial", help: "Its serial number (repeatable).", repeatable: true),
              .value("protocol", valueName: "protocol", help: "An EA protocol it declares (repeatable: any of them).", repeatable: true),
              .value("usb-id", valueName: "vid:pid", help: "Its USB vendor and product ids in hex (repeatable).", repeatable: true),
              .value("firmware", valueName: "version", help: "Its firmware revision (repeatable).", repeatable: true),
              .flag("gone", help: "Wait until no connected accessory matches instead.")])
let openCommand = CommandSpec(
    name: "open", abstract: "Open a session and bridge it to standard input and output, or to a Unix socket.",
    discussion: """
        Bytes read from standard input go to the accessory, bytes from the accessory go to standard \
        output, with back-pressure both ways. After standard input ends, output is copied until the \
        accessory has been quiet for --idle seconds. With --socket PATH the session is offered on \
        a Unix stream socket instead, for a program in any language: once the session is open, \
        iapctl creates the socket, readable and writable by you alone (0600, whatever the umask), \
        prints 'listening on PATH' on standard output, serves the first client that connects the \
        same way (the client's end of input ends the session after --idle seconds of quiet), tells \
        any other client that connects meanwhile that the session is taken (one line, then \
        closed), and removes the socket when done. Exit status: 0 done, 69 no \
        such accessory or protocol, 73 the socket cannot be created, 74 the accessory went away.
        """,
    options: [accessoryOption,
              OptionSpec.value("idle", valueName: "seconds", help: "Quiet time that ends the session after input ended.", defaultValue: "1")
                  .checked(.number(0...3_600)),
              OptionSpec.value("socket", valueName: "path", help: "Serve the session on a Unix socket at this path instead of standard "
                               + "input and output.").completing(.files)],
    positionals: [PositionalSpec("protocol", help: "The protocol string, e.g. com.example.echo.")],
    examples: [CommandExample("echo hi | iapctl --simulate open com.example.echo", "A session on standard input and output."),
               CommandExample("iapctl open com.example.firmware --socket /tmp/fw.sock", "The session on a Unix socket, for a script.")])
let sendCommand = CommandSpec(
    name: "send", abstract: "Send a file through a session, with progress and throughput.",
    discussion: """
        The file is read from disk as it is sent, in bounded memory, whatever its size. What the \
        accessory sends back is read and compared with the file (--verify-echo) or read and \
        discarded, so an echo nobody checks never holds the transfer up. On a terminal, standard \
        error shows the bytes sent, the rate, the time so far and the time left; on a pipe, \
        nothing until the summary. Success means every byte was acknowledged by the accessory. \
        When the accessory acknowledges nothing for --stall-timeout seconds, or on Ctrl-C, the \
        transfer stops and says how many bytes the accessory acknowledged; nothing is resent.
        """,
    options: [accessoryOption, jsonOption,
              .flag("verify-echo", help: "Read the accessory's echo back and compare it byte for byte."),
              OptionSpec.value("chunk", valueName: "bytes", help: "Bytes per write.", defaultValue: "65536").checked(.integer(1...(16 << 20))),
              OptionSpec.value("stall-timeout", valueName: "seconds", help: "Give up when the accessory acknowledges nothing for this long.",
                               defaultValue: "10").checked(.number(0.1...3_600))],
    positionals: [PositionalSpec("protocol", help: "The protocol string."),
                  PositionalSpec("file", help: "The file to send ('-' for standard input, without --verify-echo).", completion: .files)],
    examples: [CommandExample("iapctl --simulate send com.example.echo image.bin --verify-echo", "Send a file and check the echo.")],
    exitStatuses: [ExitStatusDescription(.success, "sent, acknowledged (and verified)"),
                   ExitStatusDescription(.dataError, "the echo differs"),
                   ExitStatusDescription(.noInput, "the file cannot be read"),
                   ExitStatusDescription(.unavailable, "no such accessory or protocol"),
                   ExitStatusDescription(.ioError, "the transfer broke or stalled; --json's bytesAcknowledged says how far it got"),
                   ExitStatusDescription(.interrupted, "interrupted (Ctrl-C), after the same summary")])
let simulateCommand = CommandSpec(
    name: "simulate", abstract: "Run a simulated accessory on a pseudo-terminal, a serial port or as a USB device, for another host to use.",
    discussion: """
        With --gadget the accessory becomes a USB device on this machine's USB device controller \
        (a board's OTG port, or dummy_hcd for a host on the same machine): a configfs gadget with \
        one FunctionFS function carrying the iAP2 interface. It needs root, configfs and the \
        libcomposite and usb_f_fs modules. The gadget is removed again on Ctrl-C or SIGTERM. Exit \
        status: 0 done, 64 usage error, 69 no controller or no gadget support, 77 not root.
        """,
    options: [OptionSpec.value("profile", valueName: "name|path", help: "A built-in profile name (\(SimulatorProfile.builtInNames.joined(separator: ", "))) "
                               + "or a JSON profile.", defaultValue: "multi-sensor").completing(.files),
              OptionSpec.value("port", valueName: "device[:baud]", help: "Run on this serial port instead of a new pseudo-terminal.").completing(.files),
              .flag("gadget", help: "Be a USB device (configfs gadget with FunctionFS) instead of a pseudo-terminal."),
              .value("bluetooth", valueName: "address:channel", help: "Be a Bluetooth accessory: connect over RFCOMM to the host at this "
                     + "address, on its iAP2 channel (sdptool browse or bluetoothctl on the host shows it)."),
              .value("bluetooth-from", valueName: "address", help: "With --bluetooth: the local adapter to connect from (default: any)."),
              .value("bluetooth-advertise", valueName: "channel", help: "Be a Bluetooth accessory as real ones are: advertise the iAP "
                     + "service through BlueZ only under the accessory's UUID 00000000-deca-fade-deca-deafdecacaff, on this RFCOMM "
                     + "channel (1-30), and serve each host that connects to it (iapctl --bluetooth-connect ADDRESS)."),
              .value("udc", valueName: "name", help: "With --gadget: the USB device controller to bind (default: the first in /sys/class/udc); the gadget is then iapsim-NAME in configfs with the FunctionFS instance iap2-NAME, so that one simulator can run per controller."),
              .value("usb-id", valueName: "vid:pid", help: "With --gadget: the USB vendor and product ids in hex.", defaultValue: "1209:0001"),
              .value("usb-layout", valueName: "name", help: "With --gadget: present the USB descriptor layout of a real accessory "
                     + "(\(USBDescriptorLayout.names.joined(separator: ", ")); its device class, configuration value, interfaces, interrupt "
                     + "endpoints, speed and ids, the endpoint numbers being the kernel's).", defaultValue: "standard"),
              .flag("sticks-until-reset", help: "With --gadget: after the first handshake, ignore the host until it resets the device "
                    + "or it is plugged in again (as the Teslong TD300 does).")],
    refusedGroups: [OptionGroup.accessory, OptionGroup.authentication],
    examples: [CommandExample("iapctl simulate --profile legacy-sensor", "An iAP1 accessory on a new pseudo-terminal; prints its path.")])

let iapctl = CommandSpec(
    name: "iapctl",
    abstract: "Talk to MFi-style (iAP1/iAP2) accessories from Linux.",
    discussion: """
        Accessories are found on USB (unless --no-usb), on the serial ports given with --serial, \
        and in the simulator (--simulate). A command that needs one accessory waits until every \
        source has identified its accessory (at most --timeout seconds) or the one asked for with \
        --accessory has appeared; when several match, it names them and exits 64. The options \
        of a group apply to every subcommand that talks to accessories, before or after its name. \
        --json output is described in docs/JSON.md. Completion scripts: iapctl \
        --generate-completion-script bash|zsh|fish (tools/install.sh installs them and the man page).
        """,
    version: toolVersion(),
    options: [verboseOption] + hostOptions + AuthenticationOptions.options,
    subcommands: [listCommand, infoCommand, watchCommand, waitCommand, openCommand, sendCommand, BenchCommand.spec, ReportCommand.spec,
                  simulateCommand, decodeCommand, statsCommand],
    examples: [
        CommandExample("iapctl --simulate list", "The built-in simulated accessory."),
        CommandExample("iapctl --serial /dev/ttyUSB0:115200 info --json", "An accessory on a UART, as JSON."),
        CommandExample("iapctl --simulate send com.example.echo image.bin --verify-echo", "A file through a session, the echo checked."),
        CommandExample("iapctl wait --protocol com.example.firmware --timeout 30", "Wait for an accessory (scripts)."),
        CommandExample("iapctl bench com.acme.echo", "Measure an accessory: throughput each way, latency, what the link did."),
        CommandExample("iapctl report", "A file to attach to a bug report: every step, where it stopped, the trace."),
        CommandExample("iapctl stats", "The running iapd's counters: accessories, sessions, bytes, failures."),
        CommandExample("iapctl help send", "The help of one subcommand."),
    ],
    exitStatuses: [
        ExitStatusDescription(.success, "done"),
        ExitStatusDescription(.failure, "any other failure (the message says what failed)"),
        ExitStatusDescription(.usage, "usage error, or several accessories match (pick one with --accessory)"),
        ExitStatusDescription(.dataError, "data did not verify: an echo that differs, a malformed capture or simulator profile"),
        ExitStatusDescription(.noInput, "an input file cannot be read (the file to send, a profile, --trust)"),
        ExitStatusDescription(.unavailable, "no such accessory or protocol, no USB device controller"),
        ExitStatusDescription(.software, "an internal error (a bug: please report it)"),
        ExitStatusDescription(.osError, "the system refused a resource (a pseudo-terminal, a USB gadget)"),
        ExitStatusDescription(.cannotCreate, "an output file or socket cannot be created (--trace-file, --socket)"),
        ExitStatusDescription(.ioError, "the accessory went away or stopped acknowledging mid-transfer"),
        ExitStatusDescription(.tempFail, "wait timed out"),
        ExitStatusDescription(.noPermission, "permission denied (the message names the group or udev rule)"),
        ExitStatusDescription(.interrupted, "interrupted by Ctrl-C"),
    ]
)

CommandLineTool.run(iapctl, manPageDate: AccessoryHostVersion.releaseDate) { command in
    switch command.path.dropFirst().first {
    case "decode": return try DecodeCommand.run(command)
    case "bench": return try BenchCommand.run(command)
    case "list": return try ListCommand.run(command)
    case "info": return try InfoCommand.run(command)
    case "watch": return try WatchCommand.run(command)
    case "wait": return try WaitCommand.run(command)
    case "open": return try OpenCommand.run(command)
    case "send": return try SendCommand.run(command)
    case "simulate": return try SimulateCommand.run(command)
    case "report": return try ReportCommand.run(command)
    case "stats": return try StatsCommand.run(command)
    default: throw ExitCode.software
    }
}
