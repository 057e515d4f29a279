// `iapbench soak`: connect/disconnect cycles and a long transfer under loss, in one process,
// watching the host's memory and file descriptors for growth.

import AccessoryHost
import AccessorySimulator
import CLIKit
import Dispatch
import Foundation
import IAPInspect
import IAPTransport
import Synchronization

enum SoakBenchmarks {
    static func run(_ command: ParsedCommand) throws -> ExitCode {
        let cycles = try command.integer("cycles", in: 0...1_000_000) ?? 1_000
        let mebibytes = try command.integer("mib", in: 0...65_536) ?? 1_024
        let lossPercent = try command.integer("loss", in: 0...50) ?? 5
        let json = command.flag("json")
        #if DEBUG
        StandardError.write("warning: this is a debug build; its numbers mean nothing. Use: swift build -c release\n")
        #endif
        var flat = true
        if cycles > 0 {
            let samples = try connectCycles(cycles)
            flat = report("connect/disconnect cycles", samples, unit: "cycle", json: json) && flat
        }
        if mebibytes > 0 {
            let samples = try lossyTransfer(bytes: mebibytes << 20, sessions: 4, loss: Double(lossPercent) / 100)
            flat = report("\(mebibytes) MiB through 4 sessions at \(lossPercent) % loss", samples, unit: "\(4) MiB echoed", json: json) && flat
        }
        return flat ? .success : .software
    }

    struct Sample: Sendable {
        var figures: ProcessFigures
        var descriptors: Int
    }

    static func sample() -> Sample {
        let descriptors = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? 0
        return Sample(figures: .now(), descriptors: descriptors)
    }

    /// Compares the first and the last tenth of the samples: memory may settle (allocator pools
    /// fill), so "flat" allows 10 % or 4 MiB of drift between the two, whichever is larger;
    /// descriptors must be equal.
    static func report(_ name: String, _ samples: [Sample], unit: String, json: Bool) -> Bool {
        let tenth = max(1, samples.count / 10)
        func average(_ slice: ArraySlice<Sample>, _ value: (Sample) -> Int) -> Int { slice.map(value).reduce(0, +) / max(1, slice.count) }
        let first = samples.prefix(tenth), last = samples.suffix(tenth)
        let (rssFirst, rssLast) = (average(first) { $0.figures.residentKiB }, average(last) { $0.figures.residentKiB })
        let (fdFirst, fdLast) = (average(first, \.descriptors), average(last, \.descriptors))
        let (threadsFirst, threadsLast) = (average(first) { $0.figures.threads }, average(last) { $0.figures.threads })
        let memoryFlat = rssLast - rssFirst <= max(4_096, rssFirst / 10)
        let descriptorsFlat = fdLast <= fdFirst
        if json {
            StandardOutput.write(JSONValue.object([
                ("name", .string("soak: \(name)")), ("samples", .int(samples.count)),
                ("residentKiBFirstTenth", .int(rssFirst)), ("residentKiBLastTenth", .int(rssLast)),
                ("descriptorsFirstTenth", .int(fdFirst)), ("descriptorsLastTenth", .int(fdLast)),
                ("threadsFirstTenth", .int(threadsFirst)), ("threadsLastTenth", .int(threadsLast)),
                ("flat", .bool(memoryFlat && descriptorsFlat)),
            ]).serialized() + "\n")
        } else {
            StandardOutput.write("""
                soak: \(name) (\(samples.count) samples, one per \(unit); first tenth vs last tenth)
                  host resident memory: \(rssFirst / 1_024) MiB → \(rssLast / 1_024) MiB\(memoryFlat ? " (flat)" : " (GREW)")
                  host file descriptors: \(fdFirst) → \(fdLast)\(descriptorsFlat ? " (flat)" : " (GREW)")
                  host threads: \(threadsFirst) → \(threadsLast)

                """)
        }
        return memoryFlat && descriptorsFlat
    }

    /// `count` times: an accessory attaches, is identified, opens and echoes a session, and goes
    /// away; one sample per cycle.
    static func connectCycles(_ count: Int) throws -> [Sample] {
        let manager = AccessoryManager()
        defer { manager.stop() }
        let profile = LoopbackBenchmarks.echoProfile(sessions: 1, maxPacketLength: 4_096)
        var samples: [Sample] = []
        samples.reserveCapacity(count)
        for cycle in 0..<count {
            let runner = try SimulatorRunner(profile: profile, attachment: .memory { host in manager.attach(host) })
            runner.start()
            try blockingAwait {
                guard let accessory = await manager.waitForAccessory(timeout: .seconds(30)) else {
                    throw ToolFailure("cycle \(cycle): the accessory was not identified within 30 s")
                }
                let session = try await accessory.openSession(for: "bench.echo.1")
                try await session.write(Array(repeating: UInt8(truncatingIfNeeded: cycle), count: 64))
                var received = 0
                while received < 64, let chunk = try await session.read() { received += chunk.count }
                session.close()
            }
            runner.stop()
            guard try blockingAwait({ await manager.waitUntilNoAccessory(timeout: .seconds(30)) }) else {
                throw ToolFailure("cycle \(cycle): the accessory did not go away within 30 s of stopping")
            }
            samples.append(sample())
        }
        return samples
    }

    /// `bytes` echoed through `sessions` sessions, the host's transport dropping `loss` of the
    /// frames each way once the accessory is identified; one sample per `sessions` MiB echoed in all.
    static func lossyTransfer(bytes: Int, sessions: Int, loss: Double) throws -> [Sample] {
        let manager = AccessoryManager(configuration: .init(sessionBufferLimit: 4 << 20))
        defer { manager.stop() }
        var profile = LoopbackBenchmarks.echoProfile(sessions: sessions, maxPacketLength: 16_384)
        profile.link = .init(maxPacketLength: 16_384, maxOutstandingPackets: 32, retransmissionTimeoutMs: 40, cumulativeAckTimeoutMs: 10)
        let lossy = Mutex<LossyTransport?>(nil)
        let runner = try SimulatorRunner(profile: profile, attachment: .memory { host in
            let transport = LossyTransport(host, loss: loss, seed: 0x5EED)
            lossy.withLock { $0 = transport }
            manager.attach(transport)
        })
        runner.start()
        defer { runner.stop() }
        guard let accessory = try blockingAwait({ await manager.waitForAccessory(timeout: .seconds(30)) }) else {
            throw ToolFailure("the accessory was not identified within 30 s")
        }
        lossy.withLock { $0?.dropping.store(true, ordering: .relaxed) }
        let perSession = bytes / sessions
        let recorder = SampleRecorder()
        try blockingAwait {
            let streams = try await (1...sessions).asyncMap { try await accessory.openSession(for: "bench.echo.\($0)") }
            try await withThrowingTaskGroup(of: Void.self) { group in
                for stream in streams {
                    group.addTask {
                        let block = CodecBenchmarks.pattern(1 << 20)
                        var written = 0
                        while written < perSession {
                            try await stream.write(Array(block.prefix(perSession - written)))
                            written += min(block.count, perSession - written)
                        }
                    }
                    group.addTask {
                        var received = 0
                        var nextMiB = 1 << 20
                        while received < perSession, let chunk = try await stream.read() {
                            received += chunk.count
                            while received >= nextMiB {
                                nextMiB += 1 << 20
                                recorder.mebibyteEchoed(sessions: sessions)
                            }
                        }
                        guard received == perSession else { throw ExitCode.dataError }
                    }
                }
                try await group.waitForAll()
            }
            for stream in streams { stream.close() }
        }
        if let dropped = lossy.withLock({ $0?.droppedFrames }) {
            StandardOutput.write("  (frames dropped by the lossy transport: \(dropped))\n")
        }
        return recorder.samples
    }
}

/// One sample per MiB echoed in all (the readers of every session count).
final class SampleRecorder: Sendable {
    private let state = Mutex<(mebibytes: Int, samples: [SoakBenchmarks.Sample])>((0, []))
    func mebibyteEchoed(sessions: Int) {
        state.withLock { state in
            state.mebibytes += 1
            if state.mebibytes % sessions == 0 { state.samples.append(SoakBenchmarks.sample()) }
        }
    }
    var samples: [SoakBenchmarks.Sample] { state.withLock { $0.samples } }
}

extension ClosedRange where Bound == Int {
    func asyncMap<T: Sendable>(_ transform: @Sendable (Int) async throws -> T) async rethrows -> [T] {
        var results: [T] = []
        for value in self { results.append(try await transform(value)) }
        return results
    }
}

/// Wraps a transport and drops a share of the frames in each direction (deterministically,
/// from a seed) while `dropping` is set: loss on the wire, for the soak.
final class LossyTransport: Transport, @unchecked Sendable {
    // Sendability: `random` and `droppedFrames` are behind the lock; `base` is immutable.
    let base: any Transport
    let loss: Double
    let dropping = Atomic<Bool>(false)
    private let state: Mutex<(random: UInt64, dropped: Int)>

    init(_ base: any Transport, loss: Double, seed: UInt64) {
        self.base = base
        self.loss = loss
        state = Mutex((seed, 0))
    }

    var droppedFrames: Int { state.withLock { $0.dropped } }
    var description: String { base.description + " (lossy)" }
    var kind: TransportKind { base.kind }

    private func drop() -> Bool {
        guard dropping.load(ordering: .relaxed) else { return false }
        return state.withLock { state -> Bool in
            // xorshift64*: reproducible, and cheap beside a frame.
            state.random ^= state.random >> 12
            state.random ^= state.random << 25
            state.random ^= state.random >> 27
            let value = state.random &* 2_685_821_657_736_338_717
            let dropped = Double(value >> 11) / Double(1 << 53) < loss
            if dropped { state.dropped += 1 }
            return dropped
        }
    }

    func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) {
        base.activate(queue: queue) { [self] event in
            if case .closed = event { return handler(event) }
            if drop() { return }
            handler(event)
        }
    }

    func send(_ frame: [UInt8]) {
        if drop() { return }
        base.send(frame)
    }

    func cancel() { base.cancel() }
}
