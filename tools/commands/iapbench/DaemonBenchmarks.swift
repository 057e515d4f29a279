import AccessoryHost
import AccessoryLogging
import AccessorySimulator
import CLIKit
import Foundation
import IAPDaemon
import IAPInspect
import SystemCalls

/// `--daemon`: the same echo measured directly and through `iapd` (a `DaemonServer` in this
/// process on a Unix socket, the client a second `AccessoryManager` that connected to it), round
/// by round, so each daemon figure has its own direct figure from moments before. The two use
/// two echo protocols of one accessory (a protocol just closed is not free until the accessory
/// acknowledged the stop).
enum DaemonBenchmarks {
    /// A daemon serving `manager` on a socket in a directory of its own, and a client of it.
    struct Through {
        let server: DaemonServer
        let client: AccessoryManager
        let accessory: Accessory
        let directory: String
        /// The daemon's socket.
        var socketPath: String { directory + "/iapd.sock" }

        /// `sessionBufferLimit`: each of the client's sessions' write buffer (the direct path's
        /// own, for a like-for-like comparison).
        init(serving manager: AccessoryManager, sessionBufferLimit: Int = 4 << 20) throws {
            directory = FileManager.default.temporaryDirectory.appendingPathComponent("iapbench-\(getpid())").path
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            let path = directory + "/iapd.sock"
            guard case .success(let descriptor) = UnixSocket.listen(path: path) else { throw ExitCode.unavailable }
            server = DaemonServer(manager: manager, logger: Logger(label: "iapd", handler: NullLogHandler()))
            server.listen(descriptor: descriptor)
            var configuration = AccessoryManager.Configuration(sessionBufferLimit: sessionBufferLimit)
            configuration.daemonSocketPath = path
            client = AccessoryManager(configuration: configuration)
            try client.connectToDaemon()
            let client = self.client
            guard let found = try blockingAwait({ await client.waitForAccessory(timeout: .seconds(20)) }) else { throw ExitCode.unavailable }
            accessory = found
        }

        func stop() {
            client.stop()
            server.stop()
            try? FileManager.default.removeItem(atPath: directory)
        }
    }

    /// One figure per round, direct and through the daemon, and the ratio of each pair.
    struct Pairs {
        var direct: [Double] = []
        var daemon: [Double] = []
        var ratios: [Double] { zip(daemon, direct).map { $1 > 0 ? $0 / $1 : 0 } }
        static func median(_ values: [Double]) -> Double {
            let sorted = values.sorted()
            return sorted.isEmpty ? 0 : sorted[sorted.count / 2]
        }
    }

    static func runLoopback(_ command: ParsedCommand, emit: (String, [(String, JSONValue)], String) -> Void) throws -> ExitCode {
        let megabytes = try command.integer("mib", in: 1...4_096) ?? 256
        let rounds = try command.integer("rounds", in: 1...51) ?? 5
        let rig = try LoopbackBenchmarks.rig(sessions: 2, overPty: false)
        defer {
            rig.manager.stop()
            rig.runner?.stop()
        }
        let through = try Through(serving: rig.manager)
        defer { through.stop() }
        let remote = LoopbackBenchmarks.Rig(manager: through.client, runner: rig.runner, accessory: through.accessory)
        var throughput = Pairs(), latency = Pairs(), cpu = Pairs()
        for _ in 0..<rounds {
            let direct = try LoopbackBenchmarks.throughput(rig, sessions: 1, bytesPerSession: megabytes << 20)
            throughput.direct.append(direct.bytesPerSecond)
            cpu.direct.append(direct.cpuSeconds / Double(megabytes))
            let daemon = try LoopbackBenchmarks.throughput(remote, sessions: 1, bytesPerSession: megabytes << 20, firstProtocol: 2)
            throughput.daemon.append(daemon.bytesPerSecond)
            cpu.daemon.append(daemon.cpuSeconds / Double(megabytes))
            latency.direct.append(try LoopbackBenchmarks.roundTrips(rig, size: 64, count: 2_000).p50)
            latency.daemon.append(try LoopbackBenchmarks.roundTrips(remote, size: 64, count: 2_000, protocolNumber: 2).p50)
        }
        let direct = Pairs.median(throughput.direct), daemon = Pairs.median(throughput.daemon)
        let ratio = Pairs.median(throughput.ratios)
        emit("echo throughput, 1 session, direct (baseline)", [("bytesPerSecond", .int(Int(direct))), ("rounds", .int(rounds))],
             "baseline: in-process echo, 1 session, direct: \(Report.format(direct / 1e6, digits: 1)) MB/s each way (median of \(rounds) rounds)")
        emit("echo throughput, 1 session, through iapd",
             [("bytesPerSecond", .int(Int(daemon))), ("ratio", .string(Report.format(ratio, digits: 2))),
              ("ratioLowest", .string(Report.format(throughput.ratios.min() ?? 0, digits: 2))),
              ("ratioHighest", .string(Report.format(throughput.ratios.max() ?? 0, digits: 2)))],
             "through iapd: \(Report.format(daemon / 1e6, digits: 1)) MB/s each way, \(Report.format(ratio, digits: 2))× direct "
                + "(median of the rounds' ratios; lowest \(Report.format(throughput.ratios.min() ?? 0, digits: 2)), "
                + "highest \(Report.format(throughput.ratios.max() ?? 0, digits: 2)))")
        // The process's CPU per MiB echoed (the application, the link, the simulated accessory;
        // through iapd also the daemon's relay and the client's side of it): what iapd adds is
        // the difference, against the whole direct figure.
        let addedCPU = zip(cpu.daemon, cpu.direct).map { $0 - $1 }
        let addedShare = zip(addedCPU, cpu.direct).map { $1 > 0 ? $0 / $1 : 0 }
        emit("CPU per MiB echoed, direct (baseline)", [("cpuMicrosecondsPerMiB", .int(Int(Pairs.median(cpu.direct) * 1e6)))],
             "baseline: CPU per MiB echoed, direct: \(Report.format(Pairs.median(cpu.direct) * 1e3, digits: 2)) ms (the whole process: application, link, accessory)")
        emit("CPU per MiB echoed, added by iapd",
             [("cpuMicrosecondsPerMiB", .int(Int(Pairs.median(cpu.daemon) * 1e6))), ("addedMicrosecondsPerMiB", .int(Int(Pairs.median(addedCPU) * 1e6))),
              ("addedShare", .string(Report.format(Pairs.median(addedShare), digits: 2)))],
             "through iapd: CPU per MiB echoed \(Report.format(Pairs.median(cpu.daemon) * 1e3, digits: 2)) ms, "
                + "\(Report.format(Pairs.median(addedCPU) * 1e3, digits: 2)) ms more: \(Report.format(Pairs.median(addedShare), digits: 2))× the direct figure "
                + "(the relay, both sides of it; median of the rounds)")
        let added = zip(latency.daemon, latency.direct).map { $0 - $1 }
        emit("round trip, 64-byte messages, direct (baseline)", [("p50Nanoseconds", .int(Int(Pairs.median(latency.direct))))],
             "baseline: round trip of 64-byte messages, direct: p50 \(Report.duration(nanoseconds: Pairs.median(latency.direct)))")
        emit("round trip, 64-byte messages, through iapd",
             [("p50Nanoseconds", .int(Int(Pairs.median(latency.daemon)))), ("addedNanoseconds", .int(Int(Pairs.median(added))))],
             "through iapd: p50 \(Report.duration(nanoseconds: Pairs.median(latency.daemon))), "
                + "\(Report.duration(nanoseconds: Pairs.median(added))) more (median of the rounds' differences)")
        return .success
    }

    /// `iapbench usb --daemon`: one simulated accessory on a USB gadget, identified over USB by a
    /// manager in this process (the direct path) that a `DaemonServer` also serves to a client
    /// manager (the path through iapd). Each round echoes the same bytes through one session
    /// directly, then through the daemon (on the accessory's second echo protocol), and reports
    /// both and their ratio; the summary is the median of the rounds and of their ratios.
    static func runUSB(_ command: ParsedCommand, udc: String, megabytes: Int, rounds: Int) throws -> ExitCode {
        let json = command.flag("json")
        func megabytesPerSecond(_ rate: Double) -> String { Report.format(rate / 1e6, digits: 1) }
        return try USBBenchmarks.withAccessory(udc: udc) { rig, _ in
            let through = try Through(serving: rig.manager, sessionBufferLimit: USBBenchmarks.sessionBufferLimit)
            defer { through.stop() }
            let remote = LoopbackBenchmarks.Rig(manager: through.client, runner: rig.runner, accessory: through.accessory)
            var pairs = Pairs(), cpu = Pairs()
            for round in 1...rounds {
                USBBenchmarks.step("round \(round) of \(rounds): direct")
                let directRun = try LoopbackBenchmarks.throughput(rig, sessions: 1, bytesPerSession: megabytes << 20)
                USBBenchmarks.step("round \(round) of \(rounds): through iapd")
                let daemonRun = try LoopbackBenchmarks.throughput(remote, sessions: 1, bytesPerSession: megabytes << 20, firstProtocol: 2)
                let direct = directRun.bytesPerSecond, daemon = daemonRun.bytesPerSecond
                pairs.direct.append(direct)
                pairs.daemon.append(daemon)
                // This process is the host alone (the gadget runs in its own): the application,
                // the manager, and through iapd also the daemon's relay and the client's side.
                cpu.direct.append(directRun.cpuSeconds / Double(megabytes))
                cpu.daemon.append(daemonRun.cpuSeconds / Double(megabytes))
                let ratio = direct > 0 ? daemon / direct : 0
                if json {
                    StandardOutput.write(JSONValue.object([
                        ("name", .string("EA echo over iAP2, 1 session, round \(round)")), ("direct", .int(Int(direct))),
                        ("throughIapd", .int(Int(daemon))), ("ratio", .string(Report.format(ratio, digits: 3))),
                    ]).serialized() + "\n")
                } else {
                    StandardOutput.write("round \(round) of \(rounds): EA echo, 1 session: direct \(megabytesPerSecond(direct)) MB/s, "
                        + "through iapd \(megabytesPerSecond(daemon)) MB/s each way: \(Report.format(ratio, digits: 2))× direct\n")
                }
            }
            let direct = Pairs.median(pairs.direct), daemon = Pairs.median(pairs.daemon)
            let ratios = pairs.ratios, ratio = Pairs.median(ratios)
            let lowest = ratios.min() ?? 0, highest = ratios.max() ?? 0
            if json {
                StandardOutput.write(JSONValue.object([
                    ("name", .string("EA echo over iAP2, 1 session, direct (baseline)")), ("bytesPerSecond", .int(Int(direct))),
                    ("rounds", .array(pairs.direct.map { .int(Int($0)) })),
                ]).serialized() + "\n")
                StandardOutput.write(JSONValue.object([
                    ("name", .string("EA echo over iAP2, 1 session, through iapd")), ("bytesPerSecond", .int(Int(daemon))),
                    ("rounds", .array(pairs.daemon.map { .int(Int($0)) })), ("ratio", .string(Report.format(ratio, digits: 3))),
                    ("ratioRange", .array([.string(Report.format(lowest, digits: 3)), .string(Report.format(highest, digits: 3))])),
                ]).serialized() + "\n")
            } else {
                StandardOutput.write("baseline: EA echo over iAP2, 1 session, direct: \(megabytesPerSecond(direct)) MB/s each way "
                    + "(median of \(rounds) round\(rounds == 1 ? "" : "s"))\n")
                StandardOutput.write("EA echo over iAP2, 1 session, through iapd: \(megabytesPerSecond(daemon)) MB/s each way, "
                    + "\(Report.format(ratio, digits: 2))× direct (median of the rounds' ratios; lowest \(Report.format(lowest, digits: 2)), "
                    + "highest \(Report.format(highest, digits: 2)); goal ≥ 0.90×)\n")
            }
            let cpuRatio = Pairs.median(cpu.ratios)
            if json {
                StandardOutput.write(JSONValue.object([
                    ("name", .string("host CPU per MiB each way, EA echo, direct and through iapd")),
                    ("directMicroseconds", .int(Int(Pairs.median(cpu.direct) * 1e6))),
                    ("throughIapdMicroseconds", .int(Int(Pairs.median(cpu.daemon) * 1e6))), ("ratio", .string(Report.format(cpuRatio, digits: 3))),
                ]).serialized() + "\n")
            } else {
                StandardOutput.write("  host CPU per MiB each way (the gadget in a process of its own): direct "
                    + "\(Report.format(Pairs.median(cpu.direct) * 1e3, digits: 2)) ms, through iapd \(Report.format(Pairs.median(cpu.daemon) * 1e3, digits: 2)) ms, "
                    + "\(Report.format(cpuRatio, digits: 2))× (median of the rounds' ratios)\n")
            }
            return .success
        }
    }
}
