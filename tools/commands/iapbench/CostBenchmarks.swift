import AccessoryBench
import AccessoryHost
import AccessoryLogging
import CLIKit
import Foundation
import IAPDaemon
import IAPInspect
import IAPWire

/// `iapbench cost`: what each path costs in instructions, which do not swing with the machine's
/// load as seconds do. Each path runs twice in a process of its own under
/// `valgrind --tool=cachegrind --cache-sim=no`, once with a small amount of work and once with a
/// larger one; the difference of the two counts, over the difference of the work, is the cost of
/// the work alone (start, set-up, identification and the end cancel out).
///
/// The figures: instructions per payload byte (per byte each way for the echoes, the process's
/// threads all counted: application, host, link and simulated accessory, and through iapd the
/// daemon and its client too) and per 64-byte round trip. The Python client's figure counts the
/// Python process alone (iapd runs in this process, outside valgrind).
///
/// The ring poller's busy-polling is turned off in the counted processes
/// (`ACCESSORYHOST_BUSY_POLL_US=0`): how often it spins depends on timing, which valgrind
/// stretches, so its count would follow the machine's load.
enum CostBenchmarks {
    /// One measured path: what a child process does with `amount` units.
    enum Path: String, CaseIterable {
        case memcpy, checksum, link, direct, daemon, python
        case directRoundTrip = "direct-round-trip", daemonRoundTrip = "daemon-round-trip", pythonRoundTrip = "python-round-trip"

        /// What the figure is per, and its amounts (small, large) for the two runs.
        var unit: (name: String, small: Int, large: Int) {
            switch self {
            case .memcpy, .checksum: ("payload byte", 16 << 20, 80 << 20)
            case .link: ("payload byte", 8 << 20, 40 << 20)
            case .direct, .daemon: ("payload byte each way", 4 << 20, 20 << 20)
            case .python: ("payload byte each way", 2 << 20, 10 << 20)
            case .directRoundTrip, .daemonRoundTrip: ("64-byte round trip", 500, 2_500)
            case .pythonRoundTrip: ("64-byte round trip", 200, 1_000)
            }
        }

        /// The bytes or round trips the figure divides by, for `amount`: an echo moves each byte
        /// both ways.
        func units(_ amount: Int) -> Double {
            switch self {
            case .direct, .daemon, .python: Double(amount) * 2
            default: Double(amount)
            }
        }

        var title: String {
            switch self {
            case .memcpy: "memcpy, 64 KiB at a time (baseline)"
            case .checksum: "the iAP2 checksum over 64 KiB at a time"
            case .link: "the link alone: two state machines in memory, 64 KiB payloads, acked"
            case .direct: "the direct session path: echo through the host and the simulator"
            case .daemon: "through iapd: echo through a client, iapd, the host and the simulator"
            case .python: "the Python client's echo through iapd (the Python process)"
            case .directRoundTrip: "the direct session path, 64-byte round trips"
            case .daemonRoundTrip: "through iapd, 64-byte round trips"
            case .pythonRoundTrip: "the Python client through iapd, 64-byte round trips (the Python process)"
            }
        }

        var isPython: Bool { self == .python || self == .pythonRoundTrip }

        /// How far above its record a figure may go before `--check` fails. The counts are of
        /// instructions, which do not change with load; what moves them is how the threads
        /// happen to take turns (how many packets one turn handles, how many calls a read
        /// takes): within 3 % from run to run for the Swift paths; for the Python process, whose
        /// every call goes through the interpreter and whose number of calls follows the
        /// timing, within 2 % for the echo (in steps of 256 KiB) and 17 % for the round trips.
        /// The bounds are several times the Swift paths' spread and twice the Python round
        /// trips': a change of the code path, not a reshuffle of turns, has to be behind a
        /// failure.
        var bound: Double { isPython ? 0.35 : 0.15 }
    }

    /// One path's figure.
    struct Figure {
        var path: Path
        var instructions: Double
    }

    // MARK: the child: the work itself

    /// `iapbench cost --run PATH --amount N`: does the work of one run (under valgrind, started
    /// by the parent).
    static func runChild(_ path: Path, amount: Int) throws -> ExitCode {
        // The echoes write one 1 MiB payload again and again: making it costs the same in both
        // runs (a payload as long as the echo would cost more instructions than the echo).
        let chunk = 1 << 20
        let payload = path == .direct || path == .daemon ? CodecBenchmarks.pattern(chunk) : []
        switch path {
        case .memcpy:
            let source = CodecBenchmarks.pattern(64 << 10)
            var target = [UInt8](repeating: 0, count: 64 << 10)
            for _ in 0..<(amount >> 16) {
                target.withUnsafeMutableBytes { to in source.withUnsafeBytes { from in to.copyMemory(from: from) } }
                blackHole(target)
            }
        case .checksum:
            let source = CodecBenchmarks.pattern((64 << 10) + 64)
            var total: UInt8 = 0
            for index in 0..<(amount >> 16) {
                // Other bytes each time (the sum of the same ones would be taken out of the loop).
                let start = index & 63
                total &+= Checksum.sum(source.span.bytes.extracting(start..<(start + (64 << 10))))
            }
            blackHole(total)
        case .link:
            guard let benchmark = try LinkBenchmarks.all().first(where: { $0.name.hasPrefix("link: 64 KiB") }) else { return .software }
            for _ in 0..<max(1, amount / benchmark.bytesPerBatch) { benchmark.body() }
        case .direct, .directRoundTrip, .daemon, .daemonRoundTrip:
            let limit = AccessoryManager.Configuration().sessionBufferLimit
            let rig = try LoopbackBenchmarks.rig(sessions: 1, overPty: false, sessionBufferLimit: limit)
            defer {
                rig.manager.stop()
                rig.runner?.stop()
            }
            // Through iapd: a daemon in this process serving the rig's manager, and its client.
            let through = path == .daemon || path == .daemonRoundTrip
                ? try DaemonBenchmarks.Through(serving: rig.manager, sessionBufferLimit: limit) : nil
            defer { through?.stop() }
            let measured = through.map { LoopbackBenchmarks.Rig(manager: $0.client, runner: rig.runner, accessory: $0.accessory) } ?? rig
            if path == .direct || path == .daemon {
                _ = try LoopbackBenchmarks.throughput(measured, sessions: 1, bytesPerSession: chunk, payload: payload, repeats: amount / chunk)
            } else {
                _ = try LoopbackBenchmarks.roundTrips(measured, size: 64, count: amount)
            }
        case .python, .pythonRoundTrip:
            return .software // run by the parent: python3 under valgrind
        }
        return .success
    }

    // MARK: the parent: two runs a path under cachegrind

    /// The Python client's side of `python` and `python-round-trip`: connects to iapd's socket,
    /// opens the echo protocol and echoes (bytes) or makes round trips.
    static let pythonScript = """
        import sys
        import accessoryhost
        path, protocol, mode, amount = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
        with accessoryhost.connect(path) as client:
            accessory = client.wait_for(protocol=protocol)
            with client.open(accessory, protocol) as session:
                if mode == "bytes":
                    # In steps of 256 KiB, each written whole and read back whole before the
                    # next: how many calls a step takes follows the timing, and at 256 KiB a
                    # step a call more or less is a small part of the count.
                    step = 256 * 1024
                    data = bytes(range(256)) * (step // 256)
                    received = bytearray(step)
                    view = memoryview(received)
                    for _ in range(amount // step):
                        session.write(data, timeout=600)
                        done = 0
                        while done < step:
                            count = session.readinto(view[done:], timeout=600)
                            if count == 0:
                                sys.exit("the session ended early")
                            done += count
                        if received != data:
                            sys.exit("the echo differs")
                    view.release()
                else:
                    message = b"Z" * 64
                    buffer = bytearray(64)
                    view = memoryview(buffer)
                    for _ in range(amount):
                        session.write(message, timeout=60)
                        done = 0
                        while done < 64:
                            count = session.readinto(view[done:], timeout=60)
                            if count == 0:
                                sys.exit("the session ended early")
                            done += count
                    view.release()
        """

    /// The Python interpreter itself (`python3` may be a launcher script, e.g. pyenv's shim,
    /// whose exec valgrind would not follow): what `sys.executable` says.
    static func pythonInterpreter() throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", "-c", "import sys; print(sys.executable)"]
        let output = Pipe()
        process.standardOutput = output
        do { try process.run() } catch { throw BenchError("cannot run python3 (\(error)): install it (apt-get install python3)") }
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        let path = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard process.terminationStatus == 0, path.hasPrefix("/") else { throw BenchError("python3 did not say where its interpreter is") }
        return path
    }

    /// ``pythonScript`` in a file in `directory`; its path.
    static func pythonScriptFile(in directory: String) throws -> String {
        let path = directory + "/cost-echo.py"
        guard FileManager.default.createFile(atPath: path, contents: Data(pythonScript.utf8)) else {
            throw BenchError("cannot write \(path)")
        }
        return path
    }

    /// Runs `arguments` under cachegrind and returns the instructions it counted.
    static func instructions(_ arguments: [String], environment: [String: String]? = nil) throws -> Double {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"] + arguments
        var environment = environment ?? ProcessInfo.processInfo.environment
        environment["ACCESSORYHOST_BUSY_POLL_US"] = "0" // timing-dependent work would make the count follow the load
        process.environment = environment
        let errors = Pipe()
        process.standardError = errors
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        let output = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let text = String(decoding: output, as: UTF8.self)
        guard process.terminationStatus == 0 else {
            throw BenchError("valgrind \(arguments.joined(separator: " ")) exited with \(process.terminationStatus):\n\(text.suffix(2_000))")
        }
        // "==PID== I   refs:      1,234,567"
        guard let line = text.split(separator: "\n").last(where: { $0.contains("I") && $0.contains("refs:") }),
              let count = Double(line.split(separator: ":").last.map { $0.filter(\.isNumber) } ?? "") else {
            throw BenchError("valgrind printed no instruction count:\n\(text.suffix(2_000))")
        }
        return count
    }

    /// `uname -m`: x86_64, aarch64…
    static func machineArchitecture() -> String {
        var names = utsname()
        uname(&names)
        return withUnsafeBytes(of: &names.machine) { bytes in
            String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
        }
    }

    /// This executable's own path (for the child runs).
    static func executablePath() -> String {
        (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    }

    /// The figures of `paths`: two runs each, the difference over the difference of the work.
    static func measure(_ paths: [Path], pythonClient: String?, log: (String) -> Void) throws -> [Figure] {
        var figures: [Figure] = []
        // The Python client's iapd: a daemon in this process (not counted) serving the simulated
        // echo accessory on a socket of its own.
        var daemon: (rig: LoopbackBenchmarks.Rig, through: DaemonBenchmarks.Through)?
        defer {
            if let daemon {
                daemon.through.stop()
                daemon.rig.manager.stop()
                daemon.rig.runner?.stop()
            }
        }
        for path in paths {
            var counts: [Double] = []
            for amount in [path.unit.small, path.unit.large] {
                if path.isPython {
                    guard let pythonClient else { break }
                    if daemon == nil {
                        let rig = try LoopbackBenchmarks.rig(sessions: 1, overPty: false)
                        daemon = (rig, try DaemonBenchmarks.Through(serving: rig.manager))
                    }
                    guard let socket = daemon?.through.socketPath else { return figures }
                    var environment = ProcessInfo.processInfo.environment
                    environment["PYTHONPATH"] = pythonClient
                    environment["PYTHONDONTWRITEBYTECODE"] = "1"
                    let script = try pythonScriptFile(in: daemon?.through.directory ?? "/tmp")
                    counts.append(try instructions([try pythonInterpreter(), script, socket, "bench.echo.1",
                                                    path == .python ? "bytes" : "messages", String(amount)], environment: environment))
                } else {
                    counts.append(try instructions([executablePath(), "cost", "--run", path.rawValue, "--amount", String(amount)]))
                }
            }
            guard counts.count == 2 else {
                log("cost: \(path.rawValue): skipped (give --python-client DIR, the Python client's directory, tools/clients/python)")
                continue
            }
            let figure = Figure(path: path, instructions: (counts[1] - counts[0]) / (path.units(path.unit.large) - path.units(path.unit.small)))
            figures.append(figure)
        }
        return figures
    }

    // MARK: the record and its check

    /// The recorded figures (`tools/checks/bench/cost.json`): for each path its instructions
    /// and how far above them a new figure may go (a fraction) before the check fails.
    struct Record {
        /// The machine's architecture (`uname -m`) the figures were counted on: instructions are
        /// another machine's on another architecture, and the check does not compare them.
        var architecture: String
        var figures: [String: (instructions: Double, bound: Double)]

        static func read(_ path: String) throws -> Record {
            guard let data = FileManager.default.contents(atPath: path),
                  let object = try JSONSerialization.jsonObject(with: data) as? [String: Any],
                  let architecture = object["architecture"] as? String,
                  let entries = object["figures"] as? [String: [String: Double]] else {
                throw BenchError("cannot read the cost record \(path): it must be {\"architecture\": \"x86_64\", \"figures\": {\"direct\": {\"instructions\": 1.6, \"bound\": 0.15}, …}}")
            }
            var figures: [String: (instructions: Double, bound: Double)] = [:]
            for (name, entry) in entries {
                guard let instructions = entry["instructions"], let bound = entry["bound"] else {
                    throw BenchError("the cost record \(path): \(name) needs instructions and bound")
                }
                figures[name] = (instructions, bound)
            }
            return Record(architecture: architecture, figures: figures)
        }

        func write(_ path: String) throws {
            var lines = ["{", "  \"architecture\": \"\(architecture)\",", "  \"figures\": {"]
            let sorted = figures.sorted { $0.key < $1.key }
            for (index, (name, figure)) in sorted.enumerated() {
                lines.append("    \"\(name)\": {\"instructions\": \(Report.format(figure.instructions, digits: figure.instructions < 100 ? 3 : 0)), "
                    + "\"bound\": \(figure.bound)}\(index + 1 < sorted.count ? "," : "")")
            }
            lines += ["  }", "}", ""]
            guard FileManager.default.createFile(atPath: path, contents: Data(lines.joined(separator: "\n").utf8)) else {
                throw BenchError("cannot write the cost record \(path)")
            }
        }
    }

    static func run(_ command: ParsedCommand) throws -> ExitCode {
        if let name = command.value("run") {
            guard let path = Path(rawValue: name) else { throw UsageError("no path '\(name)' (paths: \(Path.allCases.map(\.rawValue).joined(separator: ", ")))", usage: "iapbench cost [--paths LIST] [--check FILE | --write FILE]", commandPath: command.path) }
            guard let amount = try command.integer("amount", in: 1...(1 << 34)) else { throw UsageError("--run needs --amount", usage: "iapbench cost [--paths LIST] [--check FILE | --write FILE]", commandPath: command.path) }
            return try runChild(path, amount: amount)
        }
        #if DEBUG
        StandardError.write("warning: this is a debug build; its numbers mean nothing. Use: swift build -c release\n")
        #endif
        let json = command.flag("json")
        let paths = try command.value("paths").map { list in
            try list.split(separator: ",").map { name in
                guard let path = Path(rawValue: String(name)) else {
                    throw UsageError("--paths: no path '\(name)' (paths: \(Path.allCases.map(\.rawValue).joined(separator: ", ")))", usage: "iapbench cost [--paths LIST] [--check FILE | --write FILE]", commandPath: command.path)
                }
                return path
            }
        } ?? Path.allCases
        let figures = try measure(paths, pythonClient: command.value("python-client")) { StandardError.write($0 + "\n") }
        let memcpy = figures.first { $0.path == Path.memcpy }?.instructions
        for figure in figures {
            if json {
                var fields: [(String, JSONValue)] = [("name", .string(figure.path.rawValue)), ("unit", .string(figure.path.unit.name)),
                                                     ("instructions", .string(Report.format(figure.instructions, digits: 3)))]
                if let memcpy, figure.path.unit.name.hasPrefix("payload") { fields.append(("memcpys", .string(Report.format(figure.instructions / memcpy, digits: 2)))) }
                StandardOutput.write(JSONValue.object(fields).serialized() + "\n")
            } else {
                let ratio = memcpy.flatMap { figure.path.unit.name.hasPrefix("payload") && figure.path != Path.memcpy ? " (\(Report.format(figure.instructions / $0, digits: 1))× memcpy)" : nil } ?? ""
                StandardOutput.write("\(figure.path.title): \(Report.format(figure.instructions, digits: figure.instructions < 100 ? 3 : 0)) "
                    + "instructions per \(figure.path.unit.name)\(ratio)\n")
            }
        }
        var values: [String: Double] = [:]
        for figure in figures { values[figure.path.rawValue] = figure.instructions }
        if let path = command.value("write") {
            var record = Record(architecture: machineArchitecture(), figures: [:])
            for figure in figures { record.figures[figure.path.rawValue] = (figure.instructions, figure.path.bound) }
            try record.write(path)
            StandardError.write("cost: recorded \(figures.count) figures in \(path)\n")
        }
        if let path = command.value("check") {
            let record = try Record.read(path)
            guard record.architecture == machineArchitecture() else {
                StandardError.write("cost: not checked: \(path) was counted on \(record.architecture), this machine is \(machineArchitecture()) "
                    + "(record this architecture's figures with --write to check them here)\n")
                return .success
            }
            var failures: [String] = []
            for (name, recorded) in record.figures.sorted(by: { $0.key < $1.key }) {
                guard let now = values[name] else {
                    // A recorded path measured no more is a check that stopped checking.
                    if paths.contains(where: { $0.rawValue == name }) || Path(rawValue: name) == nil {
                        failures.append("\(name): recorded but not measured" + (Path(rawValue: name) == nil ? " (no such path)" : ""))
                    }
                    continue
                }
                if now <= 0 {
                    failures.append("\(name): \(Report.format(now, digits: 3)) instructions: the larger run cost no more than the smaller, so the measurement is broken")
                } else if now > recorded.instructions * (1 + recorded.bound) {
                    failures.append("\(name): \(Report.format(now, digits: 3)) instructions, more than the \(Report.format(recorded.instructions, digits: 3)) "
                        + "recorded +\(Report.format(recorded.bound * 100, digits: 0)) %")
                }
            }
            for failure in failures { StandardError.write("cost: failed: \(failure)\n") }
            if !failures.isEmpty {
                StandardError.write("cost: \(failures.count) figure(s) past their bound in \(path): find the cause (valgrind --tool=cachegrind and "
                    + "cg_annotate show where the instructions go), or record the new figures with --write \(path) and say why in CHANGELOG.md\n")
                return .dataError
            }
            StandardError.write("cost: \(values.count) figures within their bounds of \(path)\n")
        }
        return .success
    }
}
