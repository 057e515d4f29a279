// The measurement of one run against an accessory, as `iapctl bench` makes it (and `iapbench
// loopback` beside its own loop, to show the tool costs nothing of its own): the sessions'
// movers (echo, both, sink, source), the sampler that records bytes and the link's counters over
// time, the latency loop and its histogram. Package access: the tools' shared engine, not API.

package import AccessoryHost
internal import CLIKit
internal import Dispatch
internal import Glibc
package import IAPLink
internal import Synchronization

/// What a run does with its sessions.
package enum BenchMode: String, CaseIterable, Sendable {
    /// A block written, the same block read back, then the next: round trips of the write size.
    case echo
    /// Writes and reads at once: the echo as a stream.
    case both
    /// Writes only: the accessory consumes (the bytes it acknowledged are counted).
    case sink
    /// Reads only: the accessory produces (after the start request, when one is given).
    case source

    /// Whether the accessory sends bytes back that can be compared with what was sent.
    package var echoes: Bool { self == .echo || self == .both }
    /// Whether the host writes.
    package var writes: Bool { self != .source }
    /// Whether the host reads.
    package var reads: Bool { self != .sink }
}

/// The settings of one run.
package struct BenchSettings: Sendable {
    package var mode: BenchMode
    /// How long to measure, after the warm-up (nil: until ``bytes``).
    package var seconds: Double?
    /// How many bytes per session (nil: for ``seconds``).
    package var bytes: Int?
    /// The size of each write.
    package var writeSize: Int
    /// Seconds moved before the measurement starts (not counted).
    package var warmup: Double
    /// Seconds between samples (the interval lines and the picture).
    package var tick: Double
    /// Compare echoed bytes with what was sent.
    package var verify: Bool
    /// The round trips' message size, and how many (0: no latency loop).
    package var latencySize: Int
    package var latencyCount: Int
    /// Bytes written once on each session before a source run (the request that starts it).
    package var startRequest: [UInt8]?
    /// Seconds without a byte moving after which the run is given up (its sessions closed).
    package var stallTimeout: Double = 10

    /// Settings of a run (see each field).
    package init(mode: BenchMode, seconds: Double?, bytes: Int?, writeSize: Int, warmup: Double, tick: Double, verify: Bool,
                 latencySize: Int, latencyCount: Int, startRequest: [UInt8]?) {
        self.mode = mode
        self.seconds = seconds
        self.bytes = bytes
        self.writeSize = writeSize
        self.warmup = warmup
        self.tick = tick
        self.verify = verify
        self.latencySize = latencySize
        self.latencyCount = latencyCount
        self.startRequest = startRequest
    }
}

/// One sample: when (seconds from the start of the measurement, negative in the warm-up), the
/// bytes moved so far each way (all sessions), and the link's counters then.
package struct BenchSample: Sendable {
    package var time: Double
    package var written: Int
    package var acknowledged: Int
    package var read: Int
    package var link: LinkStatistics?
    /// This process's CPU seconds so far.
    package var cpu: Double = 0
}

/// Round-trip times in buckets of 1/32 of a doubling from 1 µs up: every sample is kept in its
/// bucket, so any percentile is read from the histogram, within 2.2 % of the sample.
package struct LatencyHistogram: Sendable {
    package static let subBuckets = 32
    package static let floorNanoseconds = 1_000.0
    package private(set) var counts: [Int] = []
    package private(set) var count = 0
    package private(set) var maximum = 0.0
    package private(set) var minimum = Double.infinity

    /// An empty histogram.
    package init() {}

    /// The bucket of `nanoseconds`.
    package static func bucket(_ nanoseconds: Double) -> Int {
        guard nanoseconds > floorNanoseconds else { return 0 }
        return Int((log2(nanoseconds / floorNanoseconds) * Double(subBuckets)).rounded(.down)) + 1
    }

    /// The upper bound of bucket `index`, in nanoseconds.
    package static func upperBound(_ index: Int) -> Double {
        index == 0 ? floorNanoseconds : floorNanoseconds * exp2(Double(index) / Double(subBuckets))
    }

    package mutating func add(_ nanoseconds: Double) {
        let index = Self.bucket(nanoseconds)
        if index >= counts.count { counts += [Int](repeating: 0, count: index - counts.count + 1) }
        counts[index] += 1
        count += 1
        maximum = max(maximum, nanoseconds)
        minimum = min(minimum, nanoseconds)
    }

    /// The `fraction` percentile (0.5 for p50): the upper bound of the bucket it falls in (the
    /// maximum for the last).
    package func percentile(_ fraction: Double) -> Double {
        guard count > 0 else { return 0 }
        let rank = max(1, Int((fraction * Double(count)).rounded(.up)))
        var seen = 0
        for (index, value) in counts.enumerated() {
            seen += value
            if seen >= rank { return min(Self.upperBound(index), maximum) }
        }
        return maximum
    }
}

/// What one run measured.
package struct BenchResult: Sendable {
    package var settings: BenchSettings
    package var protocols: [String]
    package var samples: [BenchSample] = []
    /// The measurement's length in seconds (warm-up not counted), and when it started
    /// relative to the end of the warm-up (the sample taken then: at or just before 0).
    package var seconds = 0.0
    package var start = 0.0
    /// Bytes each way in the measurement (warm-up not counted).
    package var bytesOut = 0
    package var bytesIn = 0
    /// Whether the echo matched byte for byte (nil: not compared).
    package var verified: Bool?
    /// Where it first differed, when it did.
    package var mismatch: String?
    package var latency = LatencyHistogram()
    /// The host's CPU seconds over the measurement (this process: with --simulate, the
    /// simulated accessory's too).
    package var cpuSeconds = 0.0
    /// The link's counters at the start and the end of the measurement (nil through iapd and on iAP1).
    package var linkBefore: LinkStatistics?
    package var linkAfter: LinkStatistics?
    /// The link's transport (usb, serial, bluetooth, memory) and where, for the summary.
    package var transport = ""
    /// A serial line's rate in bits per second, when it is one.
    package var serialBaud: Int?
    /// Why the run stopped early, when it did.
    package var failure: String?

    /// Bytes per second out (to the accessory) over the measurement.
    package var rateOut: Double { Double(bytesOut) / seconds }
    /// Bytes per second in (from the accessory) over the measurement.
    package var rateIn: Double { Double(bytesIn) / seconds }
}

/// The bytes written: a few blocks of the write size, each of bytes from one generator, written
/// in turn (block n of the stream is block n mod their count). Their count is odd and prime, so
/// the stream's period is no power of two and a block that comes back out of place is seen; each
/// write hands an array that exists already, so nothing is copied before the session's own copy
/// (a slice would be copied into a new array first).
package struct BenchPattern: Sendable {
    /// The size of each block (the write size).
    package let blockSize: Int
    /// The blocks: 7 of them up to 1 MiB, 3 above (bounded memory for large writes).
    package let blocks: [[UInt8]]

    package init(blockSize: Int) {
        self.blockSize = max(1, blockSize)
        var state: UInt32 = 0x2545_F491
        let count = self.blockSize <= 1 << 18 ? 7 : 3
        blocks = (0..<count).map { _ in
            (0..<max(1, blockSize)).map { _ in
                state = state &* 1_664_525 &+ 1_013_904_223
                return UInt8(truncatingIfNeeded: state >> 24)
            }
        }
    }

    /// The block written at stream offset `offset` (a multiple of the block size), or its first
    /// `count` bytes when fewer are written (the last write of a run of a number of bytes).
    package func block(at offset: Int, count: Int) -> [UInt8] {
        let block = blocks[(offset / blockSize) % blocks.count]
        return count >= blockSize ? block : Array(block.prefix(count))
    }
}

/// The counters the movers update and the sampler reads.
final class BenchCounters: Sendable {
    let written = Atomic<Int>(0)
    let read = Atomic<Int>(0)
    let stop = Atomic<Bool>(false)
    let mismatch = Mutex<String?>(nil)
    /// Set when nothing moved for the stall timeout.
    let stalled = Atomic<Bool>(false)
}

package enum BenchMeasurement {
    /// Runs one measurement on `sessions` (one per protocol, opened by the caller) of `accessory`.
    package static func run(_ settings: BenchSettings, accessory: Accessory, sessions: [(String, AccessorySession)],
                    pattern given: BenchPattern? = nil) -> BenchResult {
        let pattern = given ?? BenchPattern(blockSize: settings.writeSize)
        var result = BenchResult(settings: settings, protocols: sessions.map(\.0))
        let counters = BenchCounters()
        let sampleQueue = DispatchQueue(label: "iapctl.bench.sampler")
        let samples = Mutex<[BenchSample]>([])
        let clock = ContinuousClock()
        let origin = clock.now + .milliseconds(Int(settings.warmup * 1000))
        @Sendable func seconds(since instant: ContinuousClock.Instant) -> Double {
            let (whole, fraction) = (clock.now - instant).components
            return Double(whole) + Double(fraction) / 1e18
        }
        @Sendable func acknowledged() -> Int { sessions.reduce(0) { $0 + $1.1.bytesAcknowledged } }
        let deadline = settings.seconds.map { origin + .milliseconds(Int($0 * 1000)) }
        let progress = Mutex<(moved: Int, at: ContinuousClock.Instant)>((-1, clock.now))
        @Sendable func sample() {
            let moved = (counters.written.load(ordering: .relaxed), counters.read.load(ordering: .relaxed))
            // A run where nothing moves for the stall timeout is given up: its sessions closed.
            let stalled = progress.withLock { last -> Bool in
                let total = moved.0 + moved.1
                if total != last.moved { last = (total, clock.now) }
                return clock.now - last.at > .milliseconds(Int(settings.stallTimeout * 1000))
            }
            if stalled, !counters.stalled.exchange(true, ordering: .relaxed) {
                counters.stop.store(true, ordering: .relaxed)
                for (_, session) in sessions { session.close() }
            }
            // A source read for a time: its reads end at the deadline (one that has sent all it
            // had would otherwise hold the reader until the stall timeout).
            if settings.mode == .source, let deadline, clock.now >= deadline, !counters.stop.exchange(true, ordering: .relaxed) {
                for (_, session) in sessions { session.close() }
            }
            // Out counts what the accessory acknowledged, not what was handed to the session.
            let entry = BenchSample(time: seconds(since: origin), written: moved.0,
                                    acknowledged: settings.mode.writes ? acknowledged() : 0,
                                    read: moved.1, link: accessory.linkStatistics, cpu: processCPUSeconds())
            samples.withLock { $0.append(entry) }
        }
        // The sampler: one sample a tick, off every session's path.
        let timer = DispatchSource.makeTimerSource(queue: sampleQueue)
        let tick = max(0.01, settings.tick)
        timer.schedule(deadline: .now(), repeating: .milliseconds(Int(tick * 1000)), leeway: .milliseconds(1))
        timer.setEventHandler { sample() }
        timer.resume()

        let budget = settings.bytes
        let failure = Mutex<String?>(nil)
        do {
            try blockingAwait {
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for (_, session) in sessions {
                        group.addTask {
                            try await move(session, settings: settings, counters: counters, pattern: pattern,
                                           deadline: deadline, budget: budget)
                        }
                    }
                    try await group.waitForAll()
                }
            }
        } catch {
            failure.withLock { $0 = "\(error)" }
        }
        if counters.stalled.load(ordering: .relaxed) {
            failure.withLock {
                $0 = "nothing moved for \(Int(settings.stallTimeout)) s"
                    + (settings.mode == .source && settings.startRequest == nil ? " (a source that waits for a request: give it with --start)" : "")
            }
        }
        if settings.mode == .sink {
            // Done means acknowledged: the sink's figure counts what the accessory took.
            for (_, session) in sessions { _ = try? blockingAwait { try await session.drain(progressTimeout: .seconds(10)) } }
        }
        sampleQueue.sync { timer.cancel() }
        sampleQueue.sync { sample() }
        result.samples = samples.withLock { $0 }
        result.failure = failure.withLock { $0 }
        if let mismatch = counters.mismatch.withLock({ $0 }) {
            result.verified = false
            result.mismatch = mismatch
        } else if settings.mode.echoes, settings.verify, result.failure == nil {
            result.verified = true
        }
        // The measurement: from the last sample of the warm-up to the first at or after the
        // end of the time asked for (an echo's tail still coming back then, and the sink's
        // drain, are not counted), or to the last one for a number of bytes.
        let start = result.samples.min { abs($0.time) < abs($1.time) }
        let end = settings.seconds.flatMap { wanted in result.samples.first { $0.time >= wanted } } ?? result.samples.last
        if let start, let end {
            result.seconds = max(1e-9, end.time - start.time)
            result.start = start.time
            result.bytesOut = end.acknowledged - start.acknowledged
            result.bytesIn = end.read - start.read
            result.linkBefore = start.link
            result.linkAfter = end.link
            result.cpuSeconds = end.cpu - start.cpu
        }
        // Round trips, on the first session, after the throughput (echo modes only).
        if settings.mode.echoes, settings.latencySize > 0, settings.latencyCount > 0, result.failure == nil, let first = sessions.first?.1 {
            do {
                result.latency = try roundTrips(first, size: settings.latencySize, count: settings.latencyCount, pattern: pattern)
            } catch {
                result.failure = "the round trips: \(error)"
            }
        }
        return result
    }

    /// One session's part of the run, by mode.
    static func move(_ session: AccessorySession, settings: BenchSettings, counters: BenchCounters, pattern: BenchPattern,
                     deadline: ContinuousClock.Instant?, budget: Int?) async throws {
        let size = settings.writeSize
        @Sendable func more(_ sent: Int) -> Bool {
            if let budget, sent >= budget { return false }
            if let deadline, ContinuousClock.now >= deadline { return false }
            return !counters.stop.load(ordering: .relaxed)
        }
        switch settings.mode {
        case .echo:
            var buffer: [UInt8] = []
            buffer.reserveCapacity(size)
            var sent = 0
            while more(sent) {
                let count = budget.map { min(size, $0 - sent) } ?? size
                try await session.write(pattern.block(at: sent, count: count))
                counters.written.add(count, ordering: .relaxed)
                var back = 0
                while back < count {
                    buffer.removeAll(keepingCapacity: true)
                    let got = try await session.read(into: &buffer, maxBytes: count - back)
                    guard got > 0 else { throw BenchError("the accessory ended the session after \(sent + back) bytes came back") }
                    if settings.verify { check(buffer, at: sent + back, pattern: pattern, counters: counters) }
                    back += got
                    counters.read.add(got, ordering: .relaxed)
                }
                sent += count
            }
        case .both:
            let shared = WriterProgress()
            // The writer's word to the reader after each write and when it is done, so the
            // reader never waits in a read for an echo of bytes that were never written.
            let (signals, signal) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    defer {
                        shared.done.store(true, ordering: .releasing)
                        signal.finish()
                    }
                    var sent = 0
                    while more(sent) {
                        let count = budget.map { min(size, $0 - sent) } ?? size
                        // Outstanding from the moment the write starts: a write larger than the
                        // buffers completes only while its echo is being read.
                        shared.written.store(sent + count, ordering: .releasing)
                        signal.yield()
                        try await session.write(pattern.block(at: sent, count: count))
                        sent += count
                        counters.written.add(count, ordering: .relaxed)
                    }
                }
                group.addTask {
                    var buffer: [UInt8] = []
                    buffer.reserveCapacity(1 << 20)
                    var received = 0
                    var wakeups = signals.makeAsyncIterator()
                    while true {
                        let done = shared.done.load(ordering: .acquiring)
                        let written = shared.written.load(ordering: .acquiring)
                        if received >= written {
                            if done { break }
                            _ = await wakeups.next() // nothing outstanding: wait for the writer
                            continue
                        }
                        buffer.removeAll(keepingCapacity: true)
                        let got = try await session.read(into: &buffer)
                        guard got > 0 else { throw BenchError("the accessory ended the session after \(received) bytes came back") }
                        if settings.verify { check(buffer, at: received, pattern: pattern, counters: counters) }
                        received += got
                        counters.read.add(got, ordering: .relaxed)
                    }
                }
                try await group.waitForAll()
            }
        case .sink:
            var sent = 0
            while more(sent) {
                let count = budget.map { min(size, $0 - sent) } ?? size
                try await session.write(pattern.block(at: sent, count: count))
                sent += count
                counters.written.add(count, ordering: .relaxed)
            }
        case .source:
            if let request = settings.startRequest { try await session.write(request) }
            var buffer: [UInt8] = []
            buffer.reserveCapacity(1 << 20)
            var received = 0
            while more(received) {
                buffer.removeAll(keepingCapacity: true)
                let got: Int
                do {
                    got = try await session.read(into: &buffer, maxBytes: budget.map { max(1, min(1 << 20, $0 - received)) } ?? (1 << 20))
                } catch {
                    if counters.stop.load(ordering: .relaxed) { break } // closed at the deadline
                    throw error
                }
                guard got > 0 else { break } // a source that ends its data (or the session) ends the run
                received += got
                counters.read.add(got, ordering: .relaxed)
            }
        }
    }

    /// Compares bytes that came back at stream offset `offset` with the pattern; notes the
    /// first difference. The comparison folds every byte's difference into one accumulator in
    /// a plain index loop, which the compiler turns into vector instructions (a comparison that
    /// stops at the first difference, `elementsEqual`, does not vectorize, and cost as much as
    /// the whole echo's copies and checksums); the place of a difference is looked for only
    /// once one is known.
    static func check(_ bytes: [UInt8], at offset: Int, pattern: BenchPattern, counters: BenchCounters) {
        let size = pattern.blockSize
        var position = 0
        while position < bytes.count {
            let streamOffset = offset + position
            let expected = pattern.blocks[(streamOffset / size) % pattern.blocks.count]
            let start = streamOffset % size
            let count = min(bytes.count - position, size - start)
            var difference: UInt8 = 0
            var index = 0
            while index < count {
                difference |= bytes[position + index] ^ expected[start + index]
                index += 1
            }
            if difference != 0 {
                let first = (0..<count).first { bytes[position + $0] != expected[start + $0] } ?? 0
                counters.mismatch.withLock { $0 = $0 ?? "byte \(streamOffset + first) of the echo differs from what was sent" }
                counters.stop.store(true, ordering: .relaxed)
                return
            }
            position += count
        }
    }

    /// `count` round trips of `size`-byte messages (or as many as fit in 10 s).
    package static func roundTrips(_ session: AccessorySession, size: Int, count: Int, pattern: BenchPattern) throws -> LatencyHistogram {
        try blockingAwait {
            var histogram = LatencyHistogram()
            let message = size <= pattern.blockSize ? Array(pattern.blocks[0].prefix(size)) : BenchPattern(blockSize: size).blocks[0]
            let clock = ContinuousClock()
            let end = clock.now + .seconds(10)
            for _ in 0..<count {
                let start = clock.now
                try await session.write(message)
                var received = 0
                while received < size, let chunk = try await session.read(maxBytes: size - received) { received += chunk.count }
                guard received == size else { throw BenchError("the accessory ended the session during the round trips") }
                let (seconds, attoseconds) = (clock.now - start).components
                histogram.add(Double(seconds) * 1e9 + Double(attoseconds) / 1e9)
                if clock.now >= end { break }
            }
            return histogram
        }
    }

    /// This process's CPU seconds (user and system).
    package static func processCPUSeconds() -> Double {
        var usage = rusage()
        guard getrusage(RUSAGE_SELF.rawValue, &usage) == 0 else { return 0 }
        return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
    }
}

/// How far the writer of a `both` run has got, for its reader: the bytes written or being
/// written, and whether it is done.
final class WriterProgress: Sendable {
    let written = Atomic<Int>(0)
    let done = Atomic<Bool>(false)
}

/// A run that could not go on, in words.
package struct BenchError: Error, CustomStringConvertible {
    package var description: String
    package init(_ description: String) { self.description = description }
}
