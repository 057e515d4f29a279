// iapctl bench: measures an accessory the host can reach, on protocols the user names: throughput
// each way over time, round-trip latency, and what the link did meanwhile; sweeps of write sizes
// and of the host's receive limits; a comparison with an earlier run; JSON and an SVG picture.

import AccessoryHost
import AccessoryLogging
import AccessoryBench
import CLIKit
import IAPInspect
import IAPLink
import IAPWire

/// `iapctl bench`.
enum BenchCommand {
    static let spec = CommandSpec(
        name: "bench",
        abstract: "Measure an accessory: throughput each way over time, round-trip latency, and what the link did.",
        discussion: """
            Opens a session on each protocol named (several run at once) and moves bytes in the mode \
            the protocol supports: echo (a block written, the same block read back, then the next: \
            round trips of the write size), both (the echo as a stream: writes and reads at once), \
            sink (the accessory consumes: the bytes it acknowledged count) or source (the accessory \
            produces, after --start's request when one is given). --reverse turns sink into source \
            and source into sink. What comes back from an echo is compared with what was sent, byte \
            for byte (--no-verify leaves it out), and the summary says so. After a warm-up the run \
            lasts --time seconds (or moves --bytes per session, with no warm-up); it samples the bytes moved and the link's \
            counters every --interval seconds (0.1 without it; with it, one line per interval), then \
            times --latency-count round trips of --latency-size bytes on the first protocol (echo and \
            both only). The summary gives the throughput each way (in total, and the median and \
            spread of the samples), the latency percentiles from a histogram that keeps every sample \
            in its bucket, the link's view (packets and their mean sizes each way, the send window \
            in use against the accessory's limit, the time spent with packets waiting behind a full \
            window, retransmissions, EAKs, the host's bare ACKs per data packet), the host's CPU per \
            MiB, and the limit that bound the run when the figures show one (the accessory's window, \
            its packet size, its acknowledgement timer, the serial line's rate, the host's CPU), \
            with the numbers that show it. The link's view needs the accessory opened here: through \
            iapd (the default when it runs) only the bytes are seen; --direct opens it here. \
            --write-sizes runs the measurement once per size and prints one row each, so the knee \
            shows; --host-limits connects again for each of the host's advertised receive limits \
            (PACKETSxBYTES). --compare RUN.json prints a run beside an earlier --json run with the \
            ratios. --plot FILE.svg draws the throughput over time each way, the window in use \
            against the accessory's limit and the latency histogram in one self-contained SVG. \
            iapbench measures the host itself against its simulator; this measures an accessory.
            """,
        options: [
            accessoryOption,
            .value("mode", short: "m", valueName: "mode", help: "echo, both (echo with reads and writes overlapped), sink or source.",
                   defaultValue: "both", allowedValues: BenchMode.allCases.map(\.rawValue)),
            OptionSpec.value("time", short: "t", valueName: "seconds", help: "How long to measure, after the warm-up.",
                             defaultValue: "5").checked(.number(0.05...86_400)),
            .value("bytes", short: "n", valueName: "size", help: "Bytes per session instead of a time (e.g. 16M)."),
            .value("write-size", short: "l", valueName: "size", help: "The size of each write (e.g. 512, 2K, 64K).", defaultValue: "64K"),
            OptionSpec.value("warmup", valueName: "seconds", help: "Moved before the measurement starts, not counted.",
                             defaultValue: "0.5").checked(.number(0...3_600)),
            OptionSpec.value("interval", short: "i", valueName: "seconds", help: "Print a line per interval (and sample at it).")
                .checked(.number(0.01...3_600)),
            .flag("reverse", short: "R", help: "Sink becomes source and source becomes sink."),
            .value("start", valueName: "hex|@file", help: "Bytes written first on each session of a source run (the request that starts it)."),
            .value("latency-size", valueName: "size", help: "The round trips' message size (0: no round trips).", defaultValue: "64"),
            .value("latency-count", valueName: "count", help: "How many round trips (at most 10 s of them).", defaultValue: "1000"),
            .flag("no-verify", help: "Do not compare what an echo sends back."),
            .value("write-sizes", valueName: "list", help: "Run once per write size and print a row each (e.g. 64,512,2K,16K,64K)."),
            .value("host-limits", valueName: "list", help: "Connect again and run once per receive limit the host advertises, "
                   + "PACKETSxBYTES each (e.g. 1x4096,8x4096,32x65535)."),
            OptionSpec.value("compare", valueName: "file", help: "Print this run beside an earlier one (its --json output) with the ratios.")
                .completing(.files),
            OptionSpec.value("plot", valueName: "file", help: "Draw the run as an SVG picture into this file.").completing(.files),
            .flag("json", help: "Print every figure as one JSON object (docs/json-schema.json, bench)."),
        ],
        positionals: [PositionalSpec("protocol", help: "The protocols to measure on, one session each, at once.", variadic: true)],
        examples: [
            CommandExample("iapctl --simulate bench com.example.echo", "The built-in simulator's echo, 5 s each way at once."),
            CommandExample("iapctl bench -m sink -t 10 -i 1 com.acme.firmware", "A real accessory's sink, a line a second."),
            CommandExample("iapctl bench --write-sizes 64,512,2K,16K,64K --plot echo.svg com.acme.echo", "Where the knee is, with a picture."),
            CommandExample("iapctl bench --json com.acme.echo > before.json; iapctl bench --compare before.json com.acme.echo",
                           "A change, measured against the run before it."),
        ],
        exitStatuses: [
            ExitStatusDescription(.success, "the run (or every row) completed; an echo came back byte for byte"),
            ExitStatusDescription(.usage, "usage error"),
            ExitStatusDescription(.dataError, "an echo differed from what was sent"),
            ExitStatusDescription(.noInput, "the --start or --compare file cannot be read"),
            ExitStatusDescription(.unavailable, "no accessory with the protocol, or the session did not open"),
            ExitStatusDescription(.cannotCreate, "the --plot file cannot be written"),
            ExitStatusDescription(.ioError, "the accessory went away or ended a session during the run"),
        ])

    /// A size: a number of bytes, with K (1024) or M (1024²) after it.
    static func size(_ text: String, option: String, command: ParsedCommand) throws -> Int {
        let trimmed = text.trimmingSpaces
        var digits = trimmed
        var unit = 1
        if let last = trimmed.last, "kKmM".contains(last) {
            digits = String(trimmed.dropLast())
            unit = "kK".contains(last) ? 1_024 : 1_048_576
        }
        guard let value = Int(digits), value >= 0, value <= (1 << 40) / unit else {
            throw UsageError("'\(text)' in --\(option) is not a size; write bytes, e.g. 512, 2K or 16M",
                             usage: "iapctl bench --\(option) SIZE", commandPath: command.path)
        }
        return value * unit
    }

    static func run(_ command: ParsedCommand) throws -> ExitCode {
        let protocols = command.positionals("protocol")
        guard !protocols.isEmpty else {
            throw UsageError("name the protocol to measure on (iapctl list shows an accessory's protocols)",
                             usage: "iapctl bench [<options>] <protocol> ...", commandPath: command.path)
        }
        var mode = BenchMode(rawValue: command.value("mode") ?? "both") ?? .both
        if command.flag("reverse") {
            switch mode {
            case .sink: mode = .source
            case .source: mode = .sink
            case .echo, .both:
                throw UsageError("--reverse turns sink into source and source into sink; an echo goes both ways already",
                                 usage: "iapctl bench --mode sink|source --reverse <protocol>", commandPath: command.path)
            }
        }
        let writeSize = try size(command.value("write-size") ?? "64K", option: "write-size", command: command)
        guard (1...(16 << 20)).contains(writeSize) else {
            throw UsageError("--write-size must be 1 byte to 16M", usage: "iapctl bench --write-size SIZE <protocol>", commandPath: command.path)
        }
        let sweepSizes = try command.value("write-sizes").map { list in
            try list.split(separator: ",").map { try size(String($0), option: "write-sizes", command: command) }
        }
        if let sweepSizes, sweepSizes.isEmpty || sweepSizes.contains(where: { !(1...(16 << 20)).contains($0) }) {
            throw UsageError("--write-sizes takes sizes of 1 byte to 16M, comma separated", usage: "iapctl bench --write-sizes 64,512,2K <protocol>",
                             commandPath: command.path)
        }
        let hostLimits = try command.value("host-limits").map { try parseLimits($0, command: command) }
        var startRequest: [UInt8]?
        if let start = command.value("start") {
            startRequest = try readRequest(start)
        }
        let earlier = try command.value("compare").map(BenchComparison.load)
        let settings = BenchSettings(
            mode: mode, seconds: command.value("bytes") == nil ? Double(command.value("time") ?? "5") ?? 5 : nil,
            bytes: try command.value("bytes").map { try size($0, option: "bytes", command: command) },
            // With --bytes every byte counts: no warm-up.
            writeSize: writeSize, warmup: command.value("bytes") == nil ? Double(command.value("warmup") ?? "0.5") ?? 0.5 : 0,
            tick: Double(command.value("interval") ?? "0.1") ?? 0.1, verify: !command.flag("no-verify"),
            latencySize: try size(command.value("latency-size") ?? "64", option: "latency-size", command: command),
            latencyCount: try command.integer("latency-count", in: 0...1_000_000) ?? 1_000, startRequest: startRequest)

        var rows: [(label: String, result: BenchResult)] = []
        if let hostLimits {
            for limit in hostLimits {
                var link = LinkConfiguration.device
                link.parameters.maxOutstandingPackets = UInt8(limit.packets)
                link.parameters.maxPacketLength = UInt16(limit.bytes)
                let result = try measure(command, protocols: protocols, link: link) { accessory, sessions in
                    var result = BenchMeasurement.run(settings, accessory: accessory, sessions: sessions)
                    (result.transport, result.serialBaud) = place(of: accessory)
                    return result
                }
                rows.append(("\(limit.packets)x\(limit.bytes)", result))
                if !command.flag("json") { StandardOutput.write(BenchText.row(rows.last!.label, result, first: rows.count == 1, heading: "host limits")) }
            }
        } else {
            rows = try measure(command, protocols: protocols, link: nil) { accessory, sessions in
                var made: [(String, BenchResult)] = []
                for size in sweepSizes ?? [writeSize] {
                    var row = settings
                    row.writeSize = size
                    var result = BenchMeasurement.run(row, accessory: accessory, sessions: sessions)
                    (result.transport, result.serialBaud) = place(of: accessory)
                    made.append((BenchText.bytes(size), result))
                    if sweepSizes != nil, !command.flag("json") {
                        StandardOutput.write(BenchText.row(made.last!.0, result, first: made.count == 1, heading: "write size"))
                    }
                    if result.failure != nil { break }
                }
                return made
            }
        }
        let sweep = hostLimits != nil ? "host-limits" : sweepSizes != nil ? "write-size" : nil
        if command.flag("json") {
            StandardOutput.write(BenchJSON.line(rows, sweep: sweep))
        } else if sweep == nil, let only = rows.first {
            StandardOutput.write(BenchText.summary(only.result, intervals: command.value("interval") != nil))
        }
        if let earlier, !command.flag("json") { StandardOutput.write(BenchComparison.text(rows, earlier: earlier)) }
        if let path = command.value("plot") {
            guard BenchPlot.write(rows, to: path, rowName: hostLimits != nil ? "host receive limits" : "write size") else {
                throw ToolError(description: "cannot write the picture '\(path)'; choose another place with --plot FILE.svg", exitCode: .cannotCreate)
            }
        }
        if rows.contains(where: { $0.result.verified == false }) { return .dataError }
        if let failed = rows.first(where: { $0.result.failure != nil }) {
            throw ToolError(description: "the run stopped: \(failed.result.failure ?? "")", exitCode: .ioError)
        }
        return .success
    }

    /// Connects (with `link` as the host's link configuration when given), opens a session on
    /// each protocol, runs `body`, and closes everything.
    static func measure<T>(_ command: ParsedCommand, protocols: [String], link: LinkConfiguration?,
                           _ body: (Accessory, [(String, AccessorySession)]) throws -> T) throws -> T {
        var hooks = HostContext.Hooks()
        hooks.link = link
        let context = try HostContext(command, supportedProtocols: protocols, hooks: hooks)
        defer { context.shutdown() }
        let accessory = try chooseAccessory(context, command: command, protocolString: protocols[0])
        for name in protocols.dropFirst() where !accessory.protocolStrings.contains(name) {
            throw ToolError(description: "\(accessory.name.escapedForTerminal) does not declare \(name.escapedForTerminal); it declares "
                                + accessory.protocolStrings.map(\.escapedForTerminal).joined(separator: ", "), exitCode: .unavailable)
        }
        var sessions: [(String, AccessorySession)] = []
        defer { for (_, session) in sessions { session.close() } }
        for name in protocols { sessions.append((name, try openSession(accessory, name))) }
        return try body(accessory, sessions)
    }

    /// The transport's kind and, on a serial line, its rate (the location ends in `@ BAUD`).
    static func place(of accessory: Accessory) -> (transport: String, baud: Int?) {
        let kind = accessory.transportKind.rawValue
        guard kind == "serial", let at = accessory.location.lastIndex(of: "@") else { return (kind, nil) }
        return (kind, Int(accessory.location[accessory.location.index(after: at)...].filter(\.isNumber)))
    }

    /// `8x4096,32x65535` as (packets, bytes).
    static func parseLimits(_ text: String, command: ParsedCommand) throws -> [(packets: Int, bytes: Int)] {
        try text.split(separator: ",").map { item in
            let parts = item.lowercased().split(separator: "x")
            guard parts.count == 2, let packets = Int(parts[0]), let bytes = Int(parts[1]), (1...127).contains(packets),
                  (24...65_535).contains(bytes) else {
                throw UsageError("'\(item)' in --host-limits is not PACKETSxBYTES (packets 1–127, bytes 24–65535)",
                                 usage: "iapctl bench --host-limits 8x4096,32x65535 <protocol>", commandPath: command.path)
            }
            return (packets, bytes)
        }
    }

    /// The bytes of the file at `path`, read in pieces; at most `limit` of them (more is an error).
    static func wholeFile(_ path: String, limit: Int) throws -> [UInt8] {
        let input = try ChunkedInput(path: path)
        var bytes: [UInt8] = []
        var piece = [UInt8](repeating: 0, count: 65_536)
        while true {
            let count = try input.read(into: &piece)
            if count == 0 { break }
            bytes += piece[0..<count]
            guard bytes.count <= limit else { throw BenchError("more than \(limit) bytes") }
        }
        return bytes
    }

    /// `--start`: hex bytes, or `@FILE` for a file's bytes.
    static func readRequest(_ text: String) throws -> [UInt8] {
        if text.hasPrefix("@") {
            let path = String(text.dropFirst())
            do {
                return try wholeFile(path, limit: 1 << 20)
            } catch {
                throw ToolError(description: "cannot read --start '\(path)': \(error)", exitCode: .noInput)
            }
        }
        var parser = HexInput.Parser()
        var bytes: [UInt8] = []
        do {
            let text = Array(text.utf8)
            try parser.parse(text.span.bytes, into: &bytes)
            try parser.finish()
        } catch {
            throw ToolError(description: "--start is not hex (or @FILE): \(error)", exitCode: .usage)
        }
        return bytes
    }
}

extension String {
    /// Without spaces at either end.
    fileprivate var trimmingSpaces: String {
        String(drop { $0 == " " }.reversed().drop { $0 == " " }.reversed())
    }
}
