import Glibc
import IAPInspect
import IAPLink

/// Keeps a value alive so the optimiser cannot drop the work that produced it.
@inline(never)
func blackHole<T>(_ value: T) {
    withExtendedLifetime(value) {}
}

/// Monotonic nanoseconds.
func nanoseconds() -> UInt64 {
    var spec = timespec()
    clock_gettime(CLOCK_MONOTONIC, &spec)
    return UInt64(spec.tv_sec) * 1_000_000_000 + UInt64(spec.tv_nsec)
}

/// One benchmark: a body that does `batch` units of work (frames, copies) moving `bytesPerBatch`
/// bytes, timed repeatedly.
struct Benchmark {
    var name: String
    var group: String
    var bytesPerBatch: Int
    var framesPerBatch: Int
    var body: () -> Void
}

/// What one benchmark measured: the median of several runs, and their spread.
struct Measurement {
    var name: String
    var group: String
    var bytesPerSecond: Double
    var framesPerSecond: Double
    var nanosecondsPerFrame: Double
    var spread: Double // (max - min) / median of the runs' rates
    var runs: Int
}

struct Harness {
    var secondsPerRun: Double
    var runs: Int

    /// Times `benchmark`: each run repeats the body until `secondsPerRun` has passed, and the
    /// median rate of `runs` runs is reported (the machines here are noisy; the median is honest).
    func measure(_ benchmark: Benchmark) -> Measurement {
        benchmark.body() // warm up caches and lazily initialised state
        var rates: [Double] = []
        var frameRates: [Double] = []
        for _ in 0..<runs {
            let budget = UInt64(secondsPerRun * 1e9)
            var batches = 0
            let start = nanoseconds()
            var now = start
            repeat {
                benchmark.body()
                batches += 1
                now = nanoseconds()
            } while now - start < budget
            let seconds = Double(now - start) / 1e9
            rates.append(Double(batches * benchmark.bytesPerBatch) / seconds)
            frameRates.append(Double(batches * benchmark.framesPerBatch) / seconds)
        }
        let sorted = rates.sorted()
        let median = sorted[sorted.count / 2]
        let frameMedian = frameRates.sorted()[frameRates.count / 2]
        return Measurement(
            name: benchmark.name, group: benchmark.group, bytesPerSecond: median, framesPerSecond: frameMedian,
            nanosecondsPerFrame: frameMedian > 0 ? 1e9 / frameMedian : 0,
            spread: median > 0 ? ((sorted.last ?? 0) - (sorted.first ?? 0)) / median : 0, runs: runs)
    }

    /// Runs `benchmark` a fixed number of times without timing (for allocation counting under a
    /// tool such as valgrind, where only the count of heap allocations matters).
    func repeatFixed(_ benchmark: Benchmark, count: Int) {
        for _ in 0..<count { benchmark.body() }
    }
}

enum Report {
    static func gigabytes(_ bytesPerSecond: Double) -> String { format(bytesPerSecond / 1e9, digits: 2) + " GB/s" }

    static func format(_ value: Double, digits: Int) -> String {
        var scale = 1.0
        for _ in 0..<digits { scale *= 10 }
        let rounded = (value * scale).rounded() / scale
        var text = String(rounded)
        if let dot = text.firstIndex(of: ".") {
            let decimals = text.distance(from: dot, to: text.endIndex) - 1
            if decimals < digits { text += String(repeating: "0", count: digits - decimals) }
        } else if digits > 0 {
            text += "." + String(repeating: "0", count: digits)
        }
        return text
    }

    static func duration(nanoseconds: Double) -> String {
        if nanoseconds >= 1_000_000 { return format(nanoseconds / 1_000_000, digits: 2) + " ms" }
        if nanoseconds >= 1_000 { return format(nanoseconds / 1_000, digits: 2) + " µs" }
        return format(nanoseconds, digits: 1) + " ns"
    }

    static func padded(_ text: String, _ width: Int) -> String {
        text.count >= width ? text + " " : text + String(repeating: " ", count: width - text.count)
    }

    static func leftPadded(_ text: String, _ width: Int) -> String {
        text.count >= width ? text : String(repeating: " ", count: width - text.count) + text
    }

    static func json(_ measurement: Measurement, baseline: Double?) -> JSONValue {
        var fields: [(String, JSONValue)] = [
            ("group", .string(measurement.group)), ("name", .string(measurement.name)),
            ("bytesPerSecond", .int(Int(measurement.bytesPerSecond))),
            ("framesPerSecond", .int(Int(measurement.framesPerSecond))),
            ("nanosecondsPerFrame", .string(format(measurement.nanosecondsPerFrame, digits: 1))),
            ("spread", .string(format(measurement.spread, digits: 3))), ("runs", .int(measurement.runs)),
        ]
        if let baseline, baseline > 0 { fields.append(("ratioToBaseline", .string(format(measurement.bytesPerSecond / baseline, digits: 3)))) }
        return .object(fields)
    }
}

/// Bare ACKs per data packet, one side of a link: the acknowledgements that went out alone
/// (``LinkStatistics/acksSent``) against the data packets the side took in order. Where data
/// flows both ways the cumulative ACK rides on the next data packet, so an echo should need
/// almost none (goal ≤ 0.1).
struct BareAcks {
    var acks = 0
    var dataPackets = 0

    init(before: LinkStatistics?, after: LinkStatistics?) {
        guard let before, let after else { return }
        acks = after.acksSent - before.acksSent
        dataPackets = after.dataPacketsDelivered - before.dataPacketsDelivered
    }

    init(acks: Int, dataPackets: Int) {
        self.acks = acks
        self.dataPackets = dataPackets
    }

    var perPacket: Double { dataPackets == 0 ? 0 : Double(acks) / Double(dataPackets) }
    var text: String { "\(Report.format(perPacket, digits: 3)) (\(acks) for \(dataPackets) data packets)" }
    var json: JSONValue {
        .object([("bareAcks", .int(acks)), ("dataPackets", .int(dataPackets)), ("perPacket", .string(Report.format(perPacket, digits: 3)))])
    }
}
