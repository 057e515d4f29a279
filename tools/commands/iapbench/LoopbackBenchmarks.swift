import AccessoryBench
import AccessoryHost
import AccessorySimulator
import CLIKit
import Dispatch
import IAPInspect
import IAPLink
import IAPTransport
import Synchronization

/// `iapbench loopback` and `iapbench serial`: the whole stack, from an application's write
/// through the host, the link, a transport and the simulator's echo back to the application's
/// read. Measured beside the two link state machines wired directly (`iapbench link`'s figure)
/// in the same run.
enum LoopbackBenchmarks {
    /// An echo accessory with `count` echo protocols and large packets.
    /// With `native`, one more echo protocol, `bench.native`, travels on a native transport.
    static func echoProfile(sessions count: Int, maxPacketLength: Int, native: Bool = false) -> SimulatorProfile {
        SimulatorProfile(
            accessory: .init(name: "Bench Echo", model: "BENCH", manufacturer: "AccessoryHost", serialNumber: "BENCH-1",
                             firmwareVersion: "1.0", hardwareVersion: "A"),
            protocols: (1...count).map { SimulatorProfile.ProtocolSpec(name: "bench.echo.\($0)", behaviour: .echo) }
                + (native ? [SimulatorProfile.ProtocolSpec(name: "bench.native", behaviour: .echo, native: true)] : []),
            link: .init(maxPacketLength: maxPacketLength, maxOutstandingPackets: 32, retransmissionTimeoutMs: 1_000,
                        cumulativeAckTimeoutMs: 10, maxCumulativeAcks: 16),
            // The echo's own CRC-32 is the accessory's cost, not the host's.
            checksumsSessionData: false)
    }

    struct Rig {
        let manager: AccessoryManager
        /// The simulated accessory, when it runs in this process.
        let runner: SimulatorRunner?
        let accessory: Accessory
        var keepAlive: [any Sendable] = []
    }

    /// The echo accessory with the DJI goggles' link offer (PROTOCOL.md §2.3): 1024-byte
    /// packets, a window of 5, RTO 2000 ms, 20 ms cumulative-ACK timeout.
    /// Its one protocol, `bench.source`, sends `sourceBytes` to the host.
    static func gogglesProfile(sourceBytes: Int) -> SimulatorProfile {
        var profile = echoProfile(sessions: 1, maxPacketLength: 1_024)
        profile.protocols = [SimulatorProfile.ProtocolSpec(name: "bench.source", behaviour: .source, sourceBytes: sourceBytes)]
        profile.link = .init(maxPacketLength: 1_024, maxOutstandingPackets: 5, retransmissionTimeoutMs: 2_000, cumulativeAckTimeoutMs: 20)
        return profile
    }

    /// Accessory-to-host throughput: reads `bytes` from `bench.source`.
    static func sourceThroughput(_ rig: Rig, bytes: Int) throws -> Double {
        let accessory = rig.accessory
        let start = ContinuousClock.now
        try blockingAwait {
            let stream = try await accessory.openSession(for: "bench.source")
            var received = 0
            while received < bytes, let chunk = try await stream.read() { received += chunk.count }
            stream.close()
            guard received == bytes else { throw ExitCode.dataError }
        }
        let elapsed = ContinuousClock.now - start
        return Double(bytes) / (Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
    }

    /// A manager and a simulated echo accessory over memory, or over a pseudo-terminal.
    /// `sessionBufferLimit`: each session's buffer each way on the host (4 MiB unless given; the
    /// allocation check runs with the library's default).
    static func rig(sessions: Int, overPty: Bool, profile custom: SimulatorProfile? = nil, link: LinkConfiguration = .device,
                    sessionBufferLimit: Int = 4 << 20) throws -> Rig {
        let manager = AccessoryManager(configuration: .init(link: link, sessionBufferLimit: sessionBufferLimit))
        let profile = custom ?? echoProfile(sessions: sessions, maxPacketLength: overPty ? 4_096 : 65_535, native: !overPty)
        var keep: [any Sendable] = []
        let runner: SimulatorRunner
        if overPty {
            let pty = try PseudoTerminal()
            keep.append(pty)
            runner = try SimulatorRunner(profile: profile, attachment: .transport(try pty.makeMasterTransport()))
            manager.attach(try SerialTransport(spec: try SerialPortSpec(parsing: pty.slavePath + ":3000000")))
        } else {
            runner = try SimulatorRunner(profile: profile, attachment: .memory { host in manager.attach(host) })
        }
        runner.start()
        let found = try blockingAwait { await manager.waitForAccessory(timeout: .seconds(20)) }
        guard let accessory = found else { throw ExitCode.unavailable }
        return Rig(manager: manager, runner: runner, accessory: accessory, keepAlive: keep)
    }

    /// Echo throughput: every session writes `bytesPerSession` and reads them back, all at once.
    /// `cpuSeconds`: the whole process's CPU time (user and system) over the timed part;
    /// `systemSeconds` its kernel part.
    /// `payload`: what each session writes, when the caller made it already (its length is
    /// `bytesPerSession`).
    /// `onManagerExecutor`: the writers and readers run on the manager's task executor (no
    /// thread hop when a call resumes) instead of the default one.
    /// `repeats`: each session writes its payload this many times (the bytes echoed are
    /// `bytesPerSession * repeats`), so that a long echo needs no long payload made first
    /// (`iapbench cost` counts instructions, and making the payload would be most of them).
    static func throughput(_ rig: Rig, sessions: Int, bytesPerSession: Int, native: Bool = false, firstProtocol: Int = 1,
                           payload made: [UInt8]? = nil, onManagerExecutor: Bool = false, repeats: Int = 1) throws
        -> (bytesPerSecond: Double, seconds: Double, cpuSeconds: Double, systemSeconds: Double) {
        let accessory = rig.accessory
        let payload = made ?? CodecBenchmarks.pattern(bytesPerSession)
        let streams = try blockingAwait {
            var opened: [AccessorySession] = []
            if native { return [try await accessory.openSession(for: "bench.native")] }
            for index in 0..<sessions { opened.append(try await accessory.openSession(for: "bench.echo.\(firstProtocol + index)")) }
            return opened
        }
        let start = ContinuousClock.now
        let cpuBefore = ProcessFigures.now()
        let executor: (any TaskExecutor)? = onManagerExecutor ? rig.manager.taskExecutor : nil
        try blockingAwait { try await withTaskExecutorPreference(executor) {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for stream in streams {
                    group.addTask { for _ in 0..<repeats { try await stream.write(payload) } }
                    group.addTask {
                        // The copying read into one kept buffer (no array per read).
                        var buffer: [UInt8] = []
                        buffer.reserveCapacity(1 << 20)
                        var received = 0
                        while received < bytesPerSession * repeats {
                            buffer.removeAll(keepingCapacity: true)
                            let count = try await stream.read(into: &buffer)
                            guard count > 0 else { break }
                            received += count
                        }
                        guard received == bytesPerSession * repeats else { throw ExitCode.dataError }
                    }
                }
                try await group.waitForAll()
            }
        } }
        let elapsed = ContinuousClock.now - start
        let cpuAfter = ProcessFigures.now()
        for stream in streams { stream.close() }
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        return (Double(bytesPerSession * repeats * sessions) / seconds, seconds, cpuAfter.cpuSeconds - cpuBefore.cpuSeconds,
                cpuAfter.systemSeconds - cpuBefore.systemSeconds)
    }

    /// Round trips of `size`-byte messages through one echo session: p50 and p99 in nanoseconds.
    /// With `onManagerExecutor`, the loop runs on the manager's task executor (no thread hop
    /// when a call resumes).
    static func roundTrips(_ rig: Rig, size: Int, count: Int, onManagerExecutor: Bool = false, protocolNumber: Int = 1) throws -> (p50: Double, p99: Double) {
        let accessory = rig.accessory
        let executor: (any TaskExecutor)? = onManagerExecutor ? rig.manager.taskExecutor : nil
        let samples = try blockingAwait { try await withTaskExecutorPreference(executor) {
            let stream = try await accessory.openSession(for: "bench.echo.\(protocolNumber)")
            let message = [UInt8](repeating: 0x5A, count: size)
            var samples: [Double] = []
            samples.reserveCapacity(count)
            for _ in 0..<count {
                let start = ContinuousClock.now
                try await stream.write(message)
                var received = 0
                while received < size, let chunk = try await stream.read() { received += chunk.count }
                let elapsed = ContinuousClock.now - start
                samples.append(Double(elapsed.components.seconds) * 1e9 + Double(elapsed.components.attoseconds) / 1e9)
            }
            stream.close()
            return samples
        } }
        let sorted = samples.sorted()
        return (sorted[sorted.count / 2], sorted[min(sorted.count - 1, sorted.count * 99 / 100)])
    }

    /// `--accessory-bench`: `iapctl bench`'s engine (AccessoryBench) beside this benchmark's own
    /// loops on the same rig and session path, round by round: the echo's throughput (the
    /// engine's `both` mode, 1 MiB writes) and 64-byte round trips, with each round's ratio.
    /// What shows that the tool adds no cost of its own.
    static func accessoryBenchParity(_ command: ParsedCommand, megabytes: Int,
                                     emit: (String, [(String, JSONValue)], String) -> Void) throws -> ExitCode {
        let rounds = try command.integer("rounds", in: 1...100) ?? 5
        let bytes = megabytes << 20
        let rig = try rig(sessions: 1, overPty: false)
        defer {
            rig.manager.stop()
            rig.runner?.stop()
        }
        var ratios: [Double] = [], unverifiedRatios: [Double] = [], latencyRatios: [Double] = []
        var ownRates: [Double] = [], engineRates: [Double] = [], ownP50: [Double] = [], engineP50: [Double] = []
        func engine(verify: Bool) throws -> BenchResult {
            let session = try blockingAwait { try await rig.accessory.openSession(for: "bench.echo.1") }
            defer { session.close() }
            let settings = BenchSettings(mode: .both, seconds: nil, bytes: bytes, writeSize: 1 << 20, warmup: 0, tick: 0.1, verify: verify,
                                         latencySize: 64, latencyCount: 2_000, startRequest: nil)
            let result = BenchMeasurement.run(settings, accessory: rig.accessory, sessions: [("bench.echo.1", session)])
            guard result.failure == nil, result.verified != false else {
                throw BenchError("the engine's run failed: \(result.failure ?? result.mismatch ?? "the echo differed")")
            }
            return result
        }
        for round in 1...rounds {
            // Each round runs iapbench's loops, the engine verifying every byte (what iapctl
            // bench does by default) and the engine not verifying (--no-verify), in an order
            // that turns from round to round, so none always comes after another.
            var own = 0.0, p50 = 0.0
            var verified: BenchResult?, unverified: BenchResult?
            for turn in 0..<3 {
                switch (turn + round) % 3 {
                case 0:
                    own = try throughput(rig, sessions: 1, bytesPerSession: bytes).bytesPerSecond
                    p50 = try roundTrips(rig, size: 64, count: 2_000).p50
                case 1: verified = try engine(verify: true)
                default: unverified = try engine(verify: false)
                }
            }
            guard let result = verified, let plain = unverified else { return .software }
            let engineRate = result.rateIn
            let engineLatency = result.latency.percentile(0.5)
            ownRates.append(own)
            engineRates.append(engineRate)
            ownP50.append(p50)
            engineP50.append(engineLatency)
            ratios.append(engineRate / own)
            unverifiedRatios.append(plain.rateIn / own)
            latencyRatios.append(engineLatency / p50)
            emit("accessory bench parity, round \(round)",
                 [("round", .int(round)), ("loopBytesPerSecond", .int(Int(own))), ("engineBytesPerSecond", .int(Int(engineRate))),
                  ("ratio", .string(Report.format(engineRate / own, digits: 3))),
                  ("engineUnverifiedBytesPerSecond", .int(Int(plain.rateIn))),
                  ("unverifiedRatio", .string(Report.format(plain.rateIn / own, digits: 3))), ("loopP50Nanoseconds", .int(Int(p50))),
                  ("engineP50Nanoseconds", .int(Int(engineLatency))), ("latencyRatio", .string(Report.format(engineLatency / p50, digits: 3)))],
                 "round \(round): echo \(Report.format(own / 1e6, digits: 1)) MB/s by iapbench's loop, \(Report.format(engineRate / 1e6, digits: 1)) MB/s "
                    + "by iapctl bench's engine (\(Report.format(engineRate / own, digits: 3))×; not verifying \(Report.format(plain.rateIn / own, digits: 3))×); "
                    + "64-byte round trip p50 \(Report.duration(nanoseconds: p50)) and \(Report.duration(nanoseconds: engineLatency)) "
                    + "(\(Report.format(engineLatency / p50, digits: 3))×)")
        }
        func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }
        func range(_ values: [Double]) -> String { "rounds \(Report.format(values.min() ?? 0, digits: 2))–\(Report.format(values.max() ?? 0, digits: 2))" }
        emit("accessory bench parity, medians",
             [("loopBytesPerSecond", .int(Int(median(ownRates)))), ("engineBytesPerSecond", .int(Int(median(engineRates)))),
              ("ratio", .string(Report.format(median(ratios), digits: 3))), ("unverifiedRatio", .string(Report.format(median(unverifiedRatios), digits: 3))),
              ("loopP50Nanoseconds", .int(Int(median(ownP50)))), ("engineP50Nanoseconds", .int(Int(median(engineP50)))),
              ("latencyRatio", .string(Report.format(median(latencyRatios), digits: 3)))],
             "medians of \(rounds) rounds: throughput \(Report.format(median(engineRates) / 1e6, digits: 1)) MB/s against "
                + "\(Report.format(median(ownRates) / 1e6, digits: 1)) MB/s, \(Report.format(median(ratios), digits: 3))× (\(range(ratios))); "
                + "not verifying \(Report.format(median(unverifiedRatios), digits: 3))× (\(range(unverifiedRatios))); round-trip p50 "
                + "\(Report.format(median(latencyRatios), digits: 3))× (\(range(latencyRatios)))")
        return .success
    }

    static func run(_ command: ParsedCommand, overPty: Bool) throws -> ExitCode {
        let megabytes = try command.integer("mib", in: 1...4_096) ?? (overPty ? 8 : 256)
        let json = command.flag("json")
        var lines: [JSONValue] = []
        func emit(_ name: String, _ fields: [(String, JSONValue)], text: String) {
            if json {
                lines.append(.object([("name", .string(name))] + fields))
                StandardOutput.write(JSONValue.object([("name", .string(name))] + fields).serialized() + "\n")
            } else {
                StandardOutput.write(text + "\n")
            }
        }
        #if DEBUG
        StandardError.write("warning: this is a debug build; its numbers mean nothing. Use: swift build -c release\n")
        #endif
        if !overPty, command.flag("daemon") {
            return try DaemonBenchmarks.runLoopback(command) { name, fields, text in emit(name, fields, text: text) }
        }
        if !overPty, command.flag("accessory-bench") {
            return try accessoryBenchParity(command, megabytes: megabytes, emit: emit)
        }
        if !overPty, command.flag("echo-only") {
            // The library's default session buffer (what an application gets), not the larger
            // one the throughput figures use.
            let rig = try rig(sessions: 1, overPty: false, sessionBufferLimit: AccessoryManager.Configuration().sessionBufferLimit)
            let (rate, seconds, _, _) = try throughput(rig, sessions: 1, bytesPerSession: megabytes << 20)
            emit("echo throughput, 1 session(s)", [("bytesPerSecond", .int(Int(rate)))],
                 text: "in-process echo, 1 session: \(Report.format(rate / 1e6, digits: 1)) MB/s each way (\(megabytes) MiB in \(Report.format(seconds, digits: 2)) s)")
            rig.manager.stop()
            rig.runner?.stop()
            return .success
        }
        // Baseline from the same run: the two link state machines wired directly.
        let harness = Harness(secondsPerRun: 0.3, runs: 3)
        if let linkBench = try LinkBenchmarks.all().first(where: { $0.name.hasPrefix("link: 64 KiB") }) {
            let link = harness.measure(linkBench)
            emit("link state machines alone, 64 KiB payloads (baseline)", [("bytesPerSecond", .int(Int(link.bytesPerSecond)))],
                 text: "baseline: link state machines alone, 64 KiB payloads: \(Report.gigabytes(link.bytesPerSecond))")
        }
        for sessions in [1, 4] {
            let rig = try rig(sessions: sessions, overPty: overPty)
            let bytes = (megabytes << 20) / sessions
            let before = rig.accessory.dataPlaneStatistics
            let linksBefore = (rig.accessory.linkStatistics, rig.runner?.linkStatistics)
            let (rate, seconds, _, _) = try throughput(rig, sessions: sessions, bytesPerSession: bytes)
            let copies = rig.accessory.dataPlaneStatistics - before
            let hostAcks = BareAcks(before: linksBefore.0, after: rig.accessory.linkStatistics)
            let accessoryAcks = BareAcks(before: linksBefore.1, after: rig.runner?.linkStatistics)
            emit("echo throughput, \(sessions) session(s)",
                 [("sessions", .int(sessions)), ("bytes", .int(bytes * sessions)), ("bytesPerSecond", .int(Int(rate))),
                  ("seconds", .string(Report.format(seconds, digits: 3)))],
                 text: "\(overPty ? "pty" : "in-process") echo, \(sessions) session\(sessions == 1 ? "" : "s"): "
                    + "\(Report.format(rate / 1e6, digits: 1)) MB/s each way (\(megabytes) MiB in \(Report.format(seconds, digits: 2)) s)")
            emit("host copies per payload byte, \(sessions) session(s)",
                 [("out", .string(Report.format(copies.copiesPerByteOut, digits: 2))),
                  ("in", .string(Report.format(copies.copiesPerByteIn, digits: 2))),
                  ("bytesWritten", .int(copies.bytesWritten)), ("bytesRead", .int(copies.bytesRead))],
                 text: "  host copies per payload byte: out \(Report.format(copies.copiesPerByteOut, digits: 2)), "
                    + "in \(Report.format(copies.copiesPerByteIn, digits: 2)) (counted by the host's endpoint, read() "
                    + "included; \(overPty ? "plus one copy in by the serial transport, out of its read buffer" : "the in-memory transport copies nothing"))")
            emit("bare ACKs per data packet, \(sessions) session(s)", [("host", hostAcks.json), ("accessory", accessoryAcks.json)],
                 text: "  bare ACKs per data packet received: host \(hostAcks.text), accessory \(accessoryAcks.text)")
            if sessions == 1, !overPty {
                // The same echo on a native transport (raw bytes on a channel of its own, no link).
                let (native, nativeSeconds, _, _) = try throughput(rig, sessions: 1, bytesPerSession: megabytes << 20, native: true)
                emit("echo throughput, native transport", [("bytes", .int(megabytes << 20)), ("bytesPerSecond", .int(Int(native))),
                                                           ("seconds", .string(Report.format(nativeSeconds, digits: 3)))],
                     text: "in-process echo, native transport: \(Report.format(native / 1e6, digits: 1)) MB/s each way "
                        + "(\(megabytes) MiB in \(Report.format(nativeSeconds, digits: 2)) s)")
            }
            if sessions == 1 {
                let (p50, p99) = try roundTrips(rig, size: 64, count: overPty ? 500 : 2_000)
                emit("round trip, 64-byte messages", [("p50Nanoseconds", .int(Int(p50))), ("p99Nanoseconds", .int(Int(p99)))],
                     text: "round trip of 64-byte messages: p50 \(Report.duration(nanoseconds: p50)), p99 \(Report.duration(nanoseconds: p99))")
                let (fastP50, fastP99) = try roundTrips(rig, size: 64, count: overPty ? 500 : 2_000, onManagerExecutor: true)
                emit("round trip, 64-byte messages, on the manager's task executor",
                     [("p50Nanoseconds", .int(Int(fastP50))), ("p99Nanoseconds", .int(Int(fastP99)))],
                     text: "  the same loop on the manager's task executor: p50 \(Report.duration(nanoseconds: fastP50)), "
                        + "p99 \(Report.duration(nanoseconds: fastP99))")
            }
            rig.manager.stop()
            rig.runner?.stop()
            withExtendedLifetime(rig.keepAlive) {}
        }
        if !overPty {
            // An accessory that offers small packets (the DJI goggles' SYN) sends to the host:
            // the host answering with its own receive limits, as an iPhone does, against the
            // exact copy of the offer.
            let bytes = min(megabytes, 64) << 20
            var figures: [String: Double] = [:]
            for advertises in [false, true] {
                var link = LinkConfiguration.device
                link.advertisesReceiveLimits = advertises
                let rig = try rig(sessions: 1, overPty: false, profile: gogglesProfile(sourceBytes: bytes), link: link)
                figures[advertises ? "own" : "copy"] = try sourceThroughput(rig, bytes: bytes)
                rig.manager.stop()
                rig.runner?.stop()
            }
            let copy = figures["copy", default: 0], own = figures["own", default: 0]
            emit("accessory to host, 1024-byte offer, exact copy (baseline)", [("bytesPerSecond", .int(Int(copy)))],
                 text: "baseline: accessory offering 1024-byte packets and a window of 5 sends to the host, host answering "
                    + "with the exact copy: \(Report.format(copy / 1e6, digits: 1)) MB/s")
            emit("accessory to host, 1024-byte offer, host's own receive limits", [("bytesPerSecond", .int(Int(own)))],
                 text: "the same, host answering with its own receive limits (as an iPhone does): "
                    + "\(Report.format(own / 1e6, digits: 1)) MB/s (\(Report.format(copy > 0 ? own / copy : 0, digits: 2))×)")
        }
        return .success
    }
}
