// iapctl bench: what a run's figures say, for a person (the summary, the rows of a sweep, the
// limit that bound it), for a program (JSON), beside an earlier run, and as a picture (SVG).

import AccessoryLogging
import AccessoryBench
import CLIKit
import FoundationEssentials
import Glibc
import IAPInspect
import IAPLink

extension BenchResult {
    /// The rates of each slice between samples of the measurement, each way.
    var slices: [(start: Double, end: Double, out: Double, in: Double, inFlight: Int?)] {
        let measured = samples.drop { $0.time <= start }.prefix { $0.time <= start + seconds + 1e-9 }
        var previous = samples.last { $0.time <= start }
        var out: [(Double, Double, Double, Double, Int?)] = []
        for sample in measured {
            guard let before = previous, sample.time > before.time + 1e-6 else { continue }
            let span = sample.time - before.time
            out.append((before.time - start, sample.time - start, Double(sample.acknowledged - before.acknowledged) / span,
                        Double(sample.read - before.read) / span, sample.link?.packetsInFlight))
            previous = sample
        }
        return out
    }

    /// The median, 10th and 90th percentile of `values`.
    static func spread(_ values: [Double]) -> (median: Double, low: Double, high: Double)? {
        guard !values.isEmpty else { return nil }
        let sorted = values.sorted()
        func at(_ fraction: Double) -> Double { sorted[min(sorted.count - 1, Int(fraction * Double(sorted.count - 1) + 0.5))] }
        return (at(0.5), at(0.1), at(0.9))
    }

    /// The link's counters over the measurement (after minus before), with the gauges of the end.
    var linkDelta: LinkStatistics? {
        guard let after = linkAfter else { return nil }
        guard let before = linkBefore else { return after }
        var delta = after
        delta.packetsSent -= before.packetsSent
        delta.packetsReceived -= before.packetsReceived
        delta.retransmissions -= before.retransmissions
        delta.eaksSent -= before.eaksSent
        delta.eaksReceived -= before.eaksReceived
        delta.acksSent -= before.acksSent
        delta.payloadBytesSent -= before.payloadBytesSent
        delta.payloadBytesDelivered -= before.payloadBytesDelivered
        delta.dataPacketsDelivered -= before.dataPacketsDelivered
        delta.dataPacketsSent -= before.dataPacketsSent
        delta.windowFullNanoseconds -= before.windowFullNanoseconds
        delta.duplicatesReceived -= before.duplicatesReceived
        delta.outOfOrderReceived -= before.outOfOrderReceived
        return delta
    }

    /// The limit that bound the run, when the figures show one, with the numbers that show it.
    var limit: (name: String, evidence: String)? {
        let cpuShare = cpuSeconds / seconds
        if let baud = serialBaud, baud > 0 {
            let line = Double(baud) / 10 // 8N1: ten bits a byte
            let moved = max(rateOut, rateIn)
            // Near the line's rate (a pseudo-terminal is not paced by its baud rate, and moves more).
            if moved >= 0.7 * line, moved <= 1.2 * line {
                return ("the serial line's rate", "\(BenchText.rate(moved)) of the \(BenchText.rate(line)) a \(baud)-baud line carries (8N1)")
            }
        }
        if let link = linkDelta, link.sendWindow > 0 {
            let full = Double(link.windowFullNanoseconds) / 1e9 / seconds
            if full >= 0.5 {
                // What a window carries: as many packets as the window, of the size they had
                // (small writes make small packets).
                let meanPacket = link.dataPacketsSent > 0 ? link.payloadBytesSent / link.dataPacketsSent : link.sendPacketLength
                let perTrip = link.sendWindow * meanPacket
                let evidence = "packets waited behind a full window \(Int((full * 100).rounded())) % of the time; "
                    + "\(link.sendWindow) packet\(link.sendWindow == 1 ? "" : "s") in flight at most, of \(meanPacket) payload bytes on "
                    + "average (up to \(link.sendPacketLength) bytes a packet): \(perTrip) bytes per round trip"
                if link.cumulativeAckTimeoutMilliseconds > 0 {
                    let byTimer = Double(perTrip) / (Double(link.cumulativeAckTimeoutMilliseconds) / 1000)
                    if rateOut <= byTimer * 1.3 && rateOut >= byTimer * 0.5 {
                        return ("the accessory's acknowledgement timer",
                                evidence + "; one window per cumulative-ACK timeout (\(link.cumulativeAckTimeoutMilliseconds) ms) is "
                                    + "\(BenchText.rate(byTimer)), and the run moved \(BenchText.rate(rateOut))")
                    }
                }
                if link.sendPacketLength <= 1_024, link.sendWindow >= 4 {
                    return ("the accessory's packet size", evidence)
                }
                return ("the accessory's window", evidence)
            }
        }
        if cpuShare >= 0.9 {
            return ("the host's CPU", "\(BenchText.decimal(cpuShare, 2)) s of CPU per second (this process"
                        + (transport == "memory" ? ", the simulated accessory's work included" : "") + ")")
        }
        return nil
    }
}

/// The run in text.
enum BenchText {
    static func decimal(_ value: Double, _ digits: Int) -> String {
        guard value.isFinite else { return "-" }
        var scale = 1.0
        for _ in 0..<digits { scale *= 10 }
        let rounded = (value * scale).rounded() / scale
        var text = "\(rounded)"
        if let dot = text.firstIndex(of: ".") {
            let decimals = text.distance(from: dot, to: text.endIndex) - 1
            if decimals < digits { text += String(repeating: "0", count: digits - decimals) }
            if digits == 0 { text = String(text[..<dot]) }
        } else if digits > 0 {
            text += "." + String(repeating: "0", count: digits)
        }
        return text
    }

    /// Bytes per second as MB/s or kB/s (decimal units, as network tools give them).
    static func rate(_ bytesPerSecond: Double) -> String {
        bytesPerSecond >= 1e6 ? decimal(bytesPerSecond / 1e6, 2) + " MB/s" : decimal(bytesPerSecond / 1e3, 1) + " kB/s"
    }

    /// A size as it is written on the command line: 64, 2K, 64K, 16M.
    static func bytes(_ count: Int) -> String {
        if count >= 1_048_576, count % 1_048_576 == 0 { return "\(count / 1_048_576)M" }
        if count >= 1_024, count % 1_024 == 0 { return "\(count / 1_024)K" }
        return "\(count)"
    }

    static func duration(_ nanoseconds: Double) -> String {
        nanoseconds >= 1e6 ? decimal(nanoseconds / 1e6, 2) + " ms" : decimal(nanoseconds / 1e3, 1) + " µs"
    }

    /// The summary of one run.
    static func summary(_ result: BenchResult, intervals: Bool) -> String {
        var out: [String] = []
        let settings = result.settings
        out.append("\(settings.mode.rawValue) on \(result.protocols.map(\.escapedForTerminal).joined(separator: ", ")), writes of "
                   + "\(bytes(settings.writeSize)), \(decimal(result.seconds, 2)) s after \(decimal(settings.warmup, 1)) s of warm-up"
                   + (result.transport.isEmpty ? "" : ", over \(result.transport.escapedForTerminal)"))
        if intervals {
            for slice in result.slices {
                var line = "  \(decimal(slice.start, 2))–\(decimal(slice.end, 2)) s"
                if settings.mode.writes { line += "  out \(rate(slice.out))" }
                if settings.mode.reads { line += "  in \(rate(slice.in))" }
                if let inFlight = slice.inFlight, let window = result.linkAfter?.sendWindow, window > 0 { line += "  in flight \(inFlight)/\(window)" }
                out.append(line)
            }
        }
        func way(_ name: String, _ total: Double, _ values: [Double]) -> String {
            var line = "\(name) \(rate(total))"
            if let spread = BenchResult.spread(values) {
                line += " (samples: median \(rate(spread.median)), 10–90 % \(rate(spread.low))–\(rate(spread.high)))"
            }
            return line
        }
        let slices = result.slices
        var throughput: [String] = []
        if settings.mode.writes { throughput.append(way("out", result.rateOut, slices.map(\.out))) }
        if settings.mode.reads { throughput.append(way("in", result.rateIn, slices.map(\.in))) }
        out.append("throughput: " + throughput.joined(separator: "; "))
        switch result.verified {
        case true?: out.append("echo: every byte that came back matches what was sent")
        case false?: out.append("ECHO DIFFERS: \(result.mismatch ?? "a byte that came back differs from what was sent")")
        case nil: if settings.mode.echoes { out.append("echo: not compared (--no-verify)") }
        }
        if result.latency.count > 0 {
            let latency = result.latency
            out.append("latency (\(latency.count) round trips of \(settings.latencySize) bytes): p50 \(duration(latency.percentile(0.5))), "
                       + "p90 \(duration(latency.percentile(0.9))), p99 \(duration(latency.percentile(0.99))), max \(duration(latency.maximum))")
        }
        if let link = result.linkDelta, link.dataPacketsSent == 0, link.dataPacketsDelivered == 0, result.bytesOut + result.bytesIn > 0 {
            out.append("link: none of these bytes went over the iAP2 link (a native transport carries them)")
        } else if let link = result.linkDelta {
            let meanOut = link.dataPacketsSent > 0 ? link.payloadBytesSent / link.dataPacketsSent : 0
            let meanIn = link.dataPacketsDelivered > 0 ? link.payloadBytesDelivered / link.dataPacketsDelivered : 0
            let full = Double(link.windowFullNanoseconds) / 1e9 / result.seconds
            var line = "link: out \(link.dataPacketsSent) data packets (mean payload \(meanOut) bytes), in \(link.dataPacketsDelivered) "
                + "(mean \(meanIn)); window \(link.sendWindow) packet\(link.sendWindow == 1 ? "" : "s") of \(link.sendPacketLength) bytes, at most \(link.peakPacketsInFlight) in flight, "
                + "full \(Int((full * 100).rounded())) % of the time; retransmissions \(link.retransmissions), EAKs sent \(link.eaksSent) "
                + "received \(link.eaksReceived)"
            if link.dataPacketsDelivered > 0 { line += ", bare ACKs per data packet received \(decimal(Double(link.acksSent) / Double(link.dataPacketsDelivered), 2))" }
            out.append(line)
        } else {
            out.append("link: not seen from here (an accessory opened through iapd, or on iAP1); --direct opens it in this process")
        }
        let mebibytes = Double(result.bytesOut + result.bytesIn) / 1_048_576
        if mebibytes > 0 {
            out.append("host CPU: \(decimal(result.cpuSeconds / result.seconds, 2)) s per s, \(decimal(result.cpuSeconds / mebibytes * 1000, 2)) ms per MiB moved"
                       + (result.transport == "memory" ? " (the simulated accessory's work included)" : ""))
        }
        if let limit = result.limit {
            out.append("bound by \(limit.name): \(limit.evidence)")
        } else {
            out.append("bound by: none of the accessory's window, packet size or acknowledgement timer, the serial line or the host's CPU shows in the figures")
        }
        if let failure = result.failure { out.append("stopped early: \(failure.escapedForTerminal)") }
        return out.joined(separator: "\n") + "\n"
    }

    /// One row of a sweep (the heading before the first).
    static func row(_ label: String, _ result: BenchResult, first: Bool, heading: String) -> String {
        var out = ""
        if first {
            out += heading.padding(12) + "out".padding(14) + "in".padding(14) + "p50".padding(11) + "p99".padding(11)
                + "window full".padding(13) + "bound by\n"
        }
        let latency = result.latency.count > 0 ? (duration(result.latency.percentile(0.5)), duration(result.latency.percentile(0.99))) : ("-", "-")
        let full = result.linkDelta.map { "\(Int((Double($0.windowFullNanoseconds) / 1e9 / result.seconds * 100).rounded())) %" } ?? "-"
        out += label.padding(12) + (result.settings.mode.writes ? rate(result.rateOut) : "-").padding(14)
            + (result.settings.mode.reads ? rate(result.rateIn) : "-").padding(14) + latency.0.padding(11) + latency.1.padding(11)
            + full.padding(13) + (result.limit?.name ?? "-") + (result.verified == false ? "  ECHO DIFFERS" : "") + "\n"
        return out
    }
}

extension String {
    fileprivate func padding(_ width: Int) -> String { count >= width ? self + " " : self + String(repeating: " ", count: width - count) }
}

/// The run as JSON.
enum BenchJSON {
    static func run(_ label: String, _ result: BenchResult) -> JSONValue {
        let settings = result.settings
        func spread(_ values: [Double]) -> JSONValue {
            guard let spread = BenchResult.spread(values) else { return .null }
            return .object([("median", .number(spread.median)), ("p10", .number(spread.low)), ("p90", .number(spread.high))])
        }
        let slices = result.slices
        var fields: [(String, JSONValue)] = [
            ("label", .string(label)), ("mode", .string(settings.mode.rawValue)), ("writeSize", .int(settings.writeSize)),
            ("seconds", .number(result.seconds)), ("warmupSeconds", .number(settings.warmup)),
            ("bytesOut", .int(result.bytesOut)), ("bytesIn", .int(result.bytesIn)),
            // Everything the run moved, warm-up and tail included (the round trips not): what
            // the accessory's own counts are checked against.
            ("bytesWrittenTotal", .int(result.samples.last?.written ?? 0)), ("bytesReadTotal", .int(result.samples.last?.read ?? 0)),
            ("bytesPerSecondOut", .number(result.rateOut)), ("bytesPerSecondIn", .number(result.rateIn)),
            ("samplesOut", spread(slices.map(\.out))), ("samplesIn", spread(slices.map(\.in))),
            ("intervals", .array(slices.map { slice in
                .object([("start", .number(slice.start)), ("end", .number(slice.end)), ("bytesPerSecondOut", .number(slice.out)),
                         ("bytesPerSecondIn", .number(slice.in)), ("packetsInFlight", slice.inFlight.map { .int($0) } ?? .null)])
            })),
            ("verified", result.verified.map { .bool($0) } ?? .null), ("mismatch", result.mismatch.map { .string($0) } ?? .null),
            ("cpuSeconds", .number(result.cpuSeconds)),
            ("transport", .string(result.transport)),
        ]
        let latency = result.latency
        fields.append(("latency", latency.count == 0 ? .null : .object([
            ("size", .int(settings.latencySize)), ("count", .int(latency.count)),
            ("p50Nanoseconds", .number(latency.percentile(0.5))), ("p90Nanoseconds", .number(latency.percentile(0.9))),
            ("p99Nanoseconds", .number(latency.percentile(0.99))), ("maxNanoseconds", .number(latency.maximum)),
            ("buckets", .array(latency.counts.enumerated().filter { $0.element > 0 }.map {
                .object([("upperNanoseconds", .number(LatencyHistogram.upperBound($0.offset))), ("count", .int($0.element))])
            })),
        ])))
        if let link = result.linkDelta {
            fields.append(("link", .object([
                ("dataPacketsOut", .int(link.dataPacketsSent)), ("payloadBytesOut", .int(link.payloadBytesSent)),
                ("dataPacketsIn", .int(link.dataPacketsDelivered)), ("payloadBytesIn", .int(link.payloadBytesDelivered)),
                ("sendWindow", .int(link.sendWindow)), ("sendPacketLength", .int(link.sendPacketLength)),
                ("peakPacketsInFlight", .int(link.peakPacketsInFlight)), ("windowFullSeconds", .number(Double(link.windowFullNanoseconds) / 1e9)),
                ("cumulativeAckTimeoutMilliseconds", .int(link.cumulativeAckTimeoutMilliseconds)),
                ("retransmissions", .int(link.retransmissions)), ("eaksSent", .int(link.eaksSent)), ("eaksReceived", .int(link.eaksReceived)),
                ("bareAcksSent", .int(link.acksSent)),
            ])))
        } else {
            fields.append(("link", .null))
        }
        if let limit = result.limit {
            fields.append(("boundBy", .object([("limit", .string(limit.name)), ("evidence", .string(limit.evidence))])))
        } else {
            fields.append(("boundBy", .null))
        }
        fields.append(("failure", result.failure.map { .string($0) } ?? .null))
        return .object(fields)
    }

    static func line(_ rows: [(label: String, result: BenchResult)], sweep: String?) -> String {
        JSONOutput.line([("protocols", .array((rows.first?.result.protocols ?? []).map { .string($0) })),
                         ("sweep", sweep.map { .string($0) } ?? .null),
                         ("runs", .array(rows.map { run($0.label, $0.result) }))])
    }
}

/// A run beside an earlier one (`--compare RUN.json`).
enum BenchComparison {
    /// The runs of an earlier `--json` output: label, throughput each way, p50 and p99.
    struct Earlier {
        var runs: [(label: String, out: Double, in: Double, p50: Double?, p99: Double?)]
    }

    static func load(_ path: String) throws -> Earlier {
        let text: String
        do {
            text = String(decoding: try BenchCommand.wholeFile(path, limit: 64 << 20), as: UTF8.self)
        } catch {
            throw ToolError(description: "cannot read --compare '\(path)': \(error)", exitCode: .noInput)
        }
        guard let line = text.split(separator: "\n").first,
              let decoded = try? JSONDecoder().decode(EarlierJSON.self, from: Data(line.utf8)) else {
            throw ToolError(description: "--compare '\(path)' is not the output of iapctl bench --json", exitCode: .noInput)
        }
        return Earlier(runs: decoded.runs.map { run in
            (run.label, run.bytesPerSecondOut, run.bytesPerSecondIn, run.latency?.p50Nanoseconds, run.latency?.p99Nanoseconds)
        })
    }

    /// The part of `--json`'s output a comparison reads.
    private struct EarlierJSON: Decodable {
        struct Run: Decodable {
            struct Latency: Decodable {
                var p50Nanoseconds: Double
                var p99Nanoseconds: Double
            }
            var label: String
            var bytesPerSecondOut: Double
            var bytesPerSecondIn: Double
            var latency: Latency?
        }
        var runs: [Run]
    }

    static func text(_ rows: [(label: String, result: BenchResult)], earlier: Earlier) -> String {
        var out = "beside the earlier run (ratio now / then):\n"
        for (index, row) in rows.enumerated() {
            guard let then = earlier.runs.first(where: { $0.label == row.label }) ?? (index < earlier.runs.count ? earlier.runs[index] : nil) else { continue }
            func ratio(_ now: Double, _ before: Double) -> String { before > 0 ? BenchText.decimal(now / before, 2) + "×" : "-" }
            var line = "  \(row.label): out \(BenchText.rate(row.result.rateOut)) vs \(BenchText.rate(then.out)) (\(ratio(row.result.rateOut, then.out))), "
                + "in \(BenchText.rate(row.result.rateIn)) vs \(BenchText.rate(then.in)) (\(ratio(row.result.rateIn, then.in)))"
            if row.result.latency.count > 0, let p50 = then.p50, let p99 = then.p99 {
                let now50 = row.result.latency.percentile(0.5), now99 = row.result.latency.percentile(0.99)
                line += ", p50 \(BenchText.duration(now50)) vs \(BenchText.duration(p50)) (\(ratio(now50, p50))), "
                    + "p99 \(BenchText.duration(now99)) vs \(BenchText.duration(p99)) (\(ratio(now99, p99)))"
            }
            out += line + "\n"
        }
        return out
    }
}
