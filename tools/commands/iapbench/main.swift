// iapbench: honest numbers for AccessoryHost. Every figure is printed beside a baseline measured
// in the same run (the machines are noisy); build with `swift build -c release` first.

import CLIKit
import ProjectVersion
import IAPInspect

let codecCommand = CommandSpec(
    name: "codec",
    abstract: "Encode/decode throughput of iAP2 link packets and the frame scanner, beside memcpy.",
    discussion: """
        Measures, on one core: decoding (scanner + header + both checksums) and encoding of \
        64 KiB and 16-byte-payload link packets, and the scanner over a long mixed stream fed in \
        16 KiB chunks; each group beside a memcpy of the same bytes. Each figure is the median of \
        --runs runs of --seconds each. With --count N the bodies run N times untimed, for counting \
        heap allocations under valgrind (tools/checks/allocations.sh).
        """,
    options: [
        .flag("json", help: "Print one JSON object per measurement."),
        .value("seconds", valueName: "s", help: "Length of one timed run.", defaultValue: "0.3"),
        .value("runs", valueName: "n", help: "Timed runs per measurement; the median is reported.", defaultValue: "5"),
        .value("stream-mib", valueName: "n", help: "Size of the mixed stream in MiB.", defaultValue: "64"),
        .value("count", valueName: "n", help: "Run each body n times untimed and print nothing (allocation checks)."),
        .value("only", valueName: "group", help: "Run one group only.", allowedValues: ["large", "small", "stream"]),
    ]
)

let linkCommand = CommandSpec(
    name: "link",
    abstract: "Two iAP2 link state machines wired in memory: payload throughput and packets/s, beside the codec alone; and an endpoint's cost per received packet with 1,000 chunks queued in its session, beside 1.",
    options: [
        .flag("json", help: "Print one JSON object per measurement."),
        .value("seconds", valueName: "s", help: "Length of one timed run.", defaultValue: "0.3"),
        .value("runs", valueName: "n", help: "Timed runs per measurement; the median is reported.", defaultValue: "5"),
    ]
)

let loopbackCommand = CommandSpec(
    name: "loopback",
    abstract: "The whole stack in one process: app write → host → link → memory → simulator echo → back → app read.",
    options: [.flag("json", help: "Print one JSON object per measurement."),
              .value("mib", valueName: "n", help: "MiB echoed per measurement.", defaultValue: "256"),
              .flag("echo-only", help: "Only the one-session echo, without the baseline (what tools/checks/allocations.sh counts)."),
              .flag("daemon", help: "Echo throughput and 64-byte round trips through iapd (a daemon in this process on a Unix socket) beside the direct path, round by round."),
              .flag("accessory-bench", help: "iapctl bench's engine beside this benchmark's own echo and round-trip loops on the same session, round by round."),
              .value("rounds", valueName: "n", help: "Rounds of direct + daemon measurements (with --daemon, or --accessory-bench).", defaultValue: "5")]
)
let serialCommand = CommandSpec(
    name: "serial",
    abstract: "The whole stack over a pseudo-terminal (the tty path of serial accessories).",
    options: [.flag("json", help: "Print one JSON object per measurement."),
              .value("mib", valueName: "n", help: "MiB echoed per measurement.", defaultValue: "8")]
)

let usbCommand = CommandSpec(
    name: "usb",
    abstract: "EA sessions over a real USB device (the simulator as a FunctionFS gadget), beside a raw bulk echo through the same gadget.",
    discussion: """
        Needs root, configfs, FunctionFS and a USB device controller on this machine (dummy_hcd \
        in tools/usb-rig). The ceiling is a raw echo through the same gadget and the same USB \
        pipes of the host, without iAP2. Each round measures the ceiling, then the EA figures, \
        right after each other; the report gives the median of the rounds and each EA figure's \
        ratio to its own round's ceiling (median, lowest, highest), since the speed of a machine \
        (and of an emulated one, very much) drifts between rounds. With --daemon: one EA \
        echo session directly and through iapd (a daemon in this process serving the same \
        accessory to a client on a Unix socket), each round both, with the ratio of each round \
        and their median.
        """,
    options: [.flag("json", help: "Print one JSON object per measurement."),
              .flag("verbose", help: "Say on standard error what the gadget sees (bind, enable…)."),
              .flag("heap", help: "Heap slots instead of usbfs device memory (to compare with zero copy)."),
              .value("session-buffer", valueName: "KiB", help: "Each session's write buffer on the host (default: the library's, 1024)."),
              .value("transmit-buffers", valueName: "n", help: "Most transmit buffers in device memory the link lays packets out in (default: the library's, 64; 0 sends every frame through the OUT slots)."),
              .flag("native", help: "Also an EA session on a native transport (its own FF/F0/01 interface); exit 69 with the reason when it cannot be measured."),
              .flag("daemon", help: "Instead: one EA echo session directly and through iapd (a daemon in this process on a Unix socket, serving the same accessory), round by round, with the ratio of each round."),
              .value("mib", valueName: "n", help: "MiB echoed per measurement.", defaultValue: "64"),
              .value("rounds", valueName: "n", help: "Rounds of ceiling + EA measurements.", defaultValue: "3"),
              .value("udc", valueName: "name", help: "The device controller to bind the gadget to (default: the first)."),
              .value("gadget-requests", valueName: "n", help: "Transfers the FunctionFS gadget keeps queued per endpoint, as a controller does (default: 4; 1: one blocking read or write at a time)."),
              .value("perf", valueName: "dir", help: "Record each timed echo of this process (the host alone) with perf record -p into dir/LABEL.data.")]
)

let bluetoothCommand = CommandSpec(
    name: "bluetooth",
    abstract: "An EA echo session over iAP2 on RFCOMM between two local adapters, beside a raw RFCOMM echo between the same two.",
    discussion: """
        Needs BlueZ (bluetoothd) with two powered BR/EDR adapters on this machine that are \
        paired with each other (tools/usb-rig/bluetooth.sh sets that up on virtual controllers), \
        and root for the raw RFCOMM sockets. The host registers the iAP2 service on --channel; \
        the simulated accessory connects to it from the --accessory adapter. The ceiling is a \
        plain RFCOMM connection between the same adapters on --raw-channel, echoed without \
        iAP2. The accessory's side of both runs in a process of its own (iapbench \
        bluetooth-accessory), so the CPU time per MiB reported for the host is this process's \
        alone. Each round measures the ceiling, then the EA echo; the report gives each \
        round's ratio and the median of the ratios.
        """,
    options: [.flag("json", help: "Print one JSON object per measurement."),
              .flag("verbose", help: "Say on standard error what each round does."),
              .value("host", valueName: "address", help: "The host's adapter (bluetoothctl list shows the addresses)."),
              .value("accessory", valueName: "address", help: "The adapter the simulated accessory connects from."),
              .value("channel", valueName: "n", help: "The RFCOMM channel of the host's iAP2 service.", defaultValue: "7"),
              .value("raw-channel", valueName: "n", help: "The RFCOMM channel of the raw echo.", defaultValue: "9"),
              .value("perf", valueName: "dir", help: "Record each timed echo of this process (the host alone) with perf record -p into dir/LABEL.data."),
              .value("packet-length", valueName: "bytes", help: "The simulated accessory's largest link packet (what the host sends).", defaultValue: "16384"),
              .value("window", valueName: "n", help: "The simulated accessory's most packets outstanding (the host's send window).", defaultValue: "8"),
              .value("mib", valueName: "n", help: "MiB echoed per measurement.", defaultValue: "4"),
              .value("rounds", valueName: "n", help: "Rounds of raw + EA measurements.", defaultValue: "3")]
)

let ptysCommand = CommandSpec(
    name: "ptys",
    abstract: "Many serial accessories on one host: simulated accessories on pseudo-terminals (in a child process), all identified by one AccessoryManager.",
    discussion: """
        Reports the time until every accessory is identified, and the host process's resident \
        memory, threads and CPU time before and after (per accessory). Raises the soft limit on \
        open files as needed.
        """,
    options: [.flag("json", help: "Print one JSON object per measurement."),
              .value("accessories", valueName: "n", help: "Accessories, one pseudo-terminal each.", defaultValue: "1000"),
              .value("timeout", valueName: "s", help: "Give up after this many seconds.", defaultValue: "120")]
)
let ptyAccessoriesCommand = CommandSpec(
    name: "pty-accessories",
    abstract: "(Used by ptys.) Runs simulated accessories on pseudo-terminals, prints their paths, and stops at end of input.",
    options: [.value("count", valueName: "n", help: "Accessories.", defaultValue: "1000")]
)

let usbGadgetCommand = CommandSpec(
    name: "usb-gadget",
    abstract: "(Used by usb.) Runs the benchmark's USB gadget in a process of its own, answers each input line with its CPU time and link counters, and stops at end of input.",
    options: [.value("mode", valueName: "mode", help: "What runs behind the gadget.", defaultValue: "simulator",
                     allowedValues: GadgetProcess.Mode.allCases.map(\.rawValue)),
              .value("udc", valueName: "name", help: "The device controller to bind a FunctionFS gadget to (default: the first)."),
              .flag("native", help: "Offer the echo accessory's native-transport interface too (as usb --native does)."),
              .value("requests", valueName: "n", help: "Transfers the FunctionFS gadget keeps queued per endpoint (default: the gadget's, 4).")]
)
let bluetoothAccessoryCommand = CommandSpec(
    name: "bluetooth-accessory",
    abstract: "(Used by bluetooth.) Runs the benchmark's Bluetooth accessory in a process of its own, answers each input line with its CPU time and link counters, and disconnects at end of input.",
    options: [.value("mode", valueName: "mode", help: "What runs on the connection.", defaultValue: "simulator",
                     allowedValues: BluetoothAccessoryProcess.Mode.allCases.map(\.rawValue)),
              .value("host", valueName: "address", help: "The host's adapter."),
              .value("accessory", valueName: "address", help: "The adapter to connect from."),
              .value("channel", valueName: "n", help: "The host's RFCOMM channel."),
              .value("packet-length", valueName: "bytes", help: "The simulator's maximum packet length.", defaultValue: "16384"),
              .value("window", valueName: "n", help: "The simulator's maximum outstanding packets.", defaultValue: "8")]
)
let soakCommand = CommandSpec(
    name: "soak",
    abstract: "Connect/disconnect cycles, then a long echo through 4 sessions under loss: is the host's memory and are its descriptors flat?",
    discussion: """
        In one process, with the simulated accessory in memory. Samples the host's resident \
        memory, open descriptors and threads after every cycle and every MiB, and compares the \
        first tenth of the samples with the last (memory may drift 10 % or 4 MiB, descriptors \
        not at all); exits 70 when either grew.
        """,
    options: [.flag("json", help: "Print one JSON object per measurement."),
              .value("cycles", valueName: "n", help: "Connect/disconnect cycles (0 to skip).", defaultValue: "1000"),
              .value("mib", valueName: "n", help: "MiB echoed in all through 4 sessions (0 to skip).", defaultValue: "1024"),
              .value("loss", valueName: "percent", help: "Frames dropped each way during the echo.", defaultValue: "5")]
)

let costCommand = CommandSpec(
    name: "cost",
    abstract: "Instructions per payload byte and per 64-byte round trip of each path, counted under cachegrind (they do not swing with the machine's load).",
    discussion: """
        Runs each path twice in a process of its own under valgrind --tool=cachegrind, with a \
        small and a larger amount of work, and reports the difference of the two counts over \
        the difference of the work: the cost of the work alone, start and set-up cancelled. \
        Paths: memcpy (the baseline), the iAP2 checksum, the link alone (two state machines in \
        memory), the direct session path (an echo through the host and the simulator, both in \
        the process, per payload byte each way), through iapd (a client, a daemon, the host and \
        the simulator in the process), the Python client's echo through iapd (the Python \
        process alone; needs --python-client), and 64-byte round trips of the last three. With \
        --check FILE, exits 65 when a figure is more than FILE's bound above its record \
        (tools/checks/bench/cost.json, which tools/test.sh checks); --write FILE records them. \
        Needs valgrind.
        """,
    options: [.flag("json", help: "Print one JSON object per figure."),
              .value("paths", valueName: "list", help: "Only these paths, comma separated: " + CostBenchmarks.Path.allCases.map(\.rawValue).joined(separator: ", ") + "."),
              .value("python-client", valueName: "dir", help: "The Python client's directory (tools/clients/python), for the Python paths."),
              .value("check", valueName: "file", help: "Compare with the figures recorded in file; exit 65 on a regression past its bound."),
              .value("write", valueName: "file", help: "Record the figures in file, each with its bound (15 %; 35 % for the Python process's)."),
              .value("run", valueName: "path", help: "(Used by cost itself, under valgrind.) Do one path's work and nothing else."),
              .value("amount", valueName: "n", help: "(Used by cost itself.) With --run: the bytes or round trips.")]
)

let iapbench = CommandSpec(
    name: "iapbench",
    abstract: "Benchmarks for AccessoryHost (release builds only give meaningful numbers).",
    version: AccessoryHostVersion.string,
    subcommands: [codecCommand, linkCommand, loopbackCommand, serialCommand, usbCommand, bluetoothCommand, ptysCommand, ptyAccessoriesCommand, usbGadgetCommand, bluetoothAccessoryCommand, soakCommand, costCommand]
)

CommandLineTool.run(iapbench, manPageDate: AccessoryHostVersion.releaseDate) { command in
    switch command.path.dropFirst().first {
    case "codec": return try CodecCommand.run(command)
    case "loopback": return try LoopbackBenchmarks.run(command, overPty: false)
    case "serial": return try LoopbackBenchmarks.run(command, overPty: true)
    case "usb": return try USBBenchmarks.run(command)
    case "bluetooth": return try BluetoothBenchmarks.run(command)
    case "ptys": return try ScaleBenchmarks.run(command)
    case "soak": return try SoakBenchmarks.run(command)
    case "cost": return try CostBenchmarks.run(command)
    case "pty-accessories": return try ScaleBenchmarks.runAccessories(command)
    case "usb-gadget": return try GadgetProcess.serve(command)
    case "bluetooth-accessory": return try BluetoothAccessoryProcess.serve(command)
    case "link": return try CodecCommand.report(command, title: "iapbench link", benchmarks: try LinkBenchmarks.all(),
                                                baselineMarker: "(baseline)", ratioHeader: "vs base")
    default: throw ExitCode.software
    }
}

enum CodecCommand {
    static func run(_ command: ParsedCommand) throws -> ExitCode {
        let seconds = Double(command.value("seconds") ?? "0.3") ?? 0.3
        let runs = try command.integer("runs", in: 1...101) ?? 5
        let streamMiB = try command.integer("stream-mib", in: 1...1_024) ?? 64
        let only = command.value("only")
        let benchmarks = try CodecBenchmarks.all(streamMegabytes: only == nil || only == "stream" ? streamMiB : 1)
            .filter { only == nil || $0.group == only }
        let harness = Harness(secondsPerRun: seconds, runs: runs)
        if let count = try command.integer("count", in: 1...100_000_000) {
            for benchmark in benchmarks { harness.repeatFixed(benchmark, count: count) }
            return .success
        }
        return try report(command, title: "iapbench codec", benchmarks: benchmarks, baselineMarker: "memcpy", ratioHeader: "vs memcpy")
    }

    /// Times `benchmarks` and prints each beside the baseline of its group (the benchmark whose
    /// name contains `baselineMarker`, measured first).
    static func report(_ command: ParsedCommand, title: String, benchmarks: [Benchmark], baselineMarker: String,
                       ratioHeader: String) throws -> ExitCode {
        let seconds = Double(command.value("seconds") ?? "0.3") ?? 0.3
        let runs = try command.integer("runs", in: 1...101) ?? 5
        let harness = Harness(secondsPerRun: seconds, runs: runs)
        let json = command.flag("json")
        if !json {
            #if DEBUG
            StandardError.write("warning: this is a debug build; its numbers mean nothing. Use: swift build -c release\n")
            #endif
            StandardOutput.write("\(title): one core, median of \(runs) runs of \(seconds) s each\n")
            StandardOutput.write(Report.padded("measurement", 46) + Report.leftPadded("throughput", 12)
                + Report.leftPadded("per frame", 12) + Report.leftPadded("frames/s", 12) + Report.leftPadded(ratioHeader, 11)
                + Report.leftPadded("spread", 8) + "\n")
        }
        var baseline: [String: Double] = [:]
        for benchmark in benchmarks {
            let measurement = harness.measure(benchmark)
            if benchmark.name.contains(baselineMarker) { baseline[benchmark.group] = measurement.bytesPerSecond }
            let ratio = baseline[benchmark.group].map { measurement.bytesPerSecond / $0 }
            if json {
                StandardOutput.write(Report.json(measurement, baseline: baseline[benchmark.group]).serialized() + "\n")
            } else {
                let line = Report.padded(measurement.name, 46)
                    + Report.leftPadded(Report.gigabytes(measurement.bytesPerSecond), 12)
                    + Report.leftPadded(Report.duration(nanoseconds: measurement.nanosecondsPerFrame), 12)
                    + Report.leftPadded(Report.format(measurement.framesPerSecond / 1e6, digits: 2) + " M", 12)
                    + Report.leftPadded(ratio.map { Report.format($0, digits: 2) + "×" } ?? "", 11)
                    + Report.leftPadded(Report.format(measurement.spread * 100, digits: 1) + "%", 8)
                StandardOutput.write(line + "\n")
            }
        }
        return .success
    }
}
