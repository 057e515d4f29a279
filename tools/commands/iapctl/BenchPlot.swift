// iapctl bench --plot: the run as one self-contained SVG (no script, no outside font or
// library): throughput over time each way, the send window in use against the accessory's
// limit, and the latency histogram; for a sweep, each row's throughput and latency.

import AccessoryBench
import Glibc
import IAPLink

enum BenchPlot {
    static let width = 900.0
    static let panelHeight = 230.0
    static let left = 80.0
    static let right = 30.0
    static let colorOut = "#1f77b4"
    static let colorIn = "#d9641e"

    /// Writes the picture of `rows` to `path`; false when the file cannot be written.
    static func write(_ rows: [(label: String, result: BenchResult)], to path: String, rowName: String = "row") -> Bool {
        let svg = rows.count == 1 ? single(rows[0].result) : sweep(rows, rowName: rowName)
        guard let file = fopen(path, "w") else { return false }
        let bytes = Array(svg.utf8)
        let written = bytes.withUnsafeBytes { fwrite($0.baseAddress, 1, $0.count, file) }
        return fclose(file) == 0 && written == bytes.count
    }

    /// Text safe inside SVG.
    static func escaped(_ text: String) -> String {
        var out = ""
        for character in text.unicodeScalars {
            switch character {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            default: out += character.value < 0x20 ? "?" : String(character)
            }
        }
        return out
    }

    static func number(_ value: Double) -> String { BenchText.decimal(value, 1) }

    /// A "nice" upper bound for an axis: 1, 2 or 5 times a power of ten at or above `value`.
    static func niceCeiling(_ value: Double) -> Double {
        guard value > 0, value.isFinite else { return 1 }
        let power = pow(10, floor(log10(value)))
        for step in [1.0, 2.0, 5.0, 10.0] where step * power >= value { return step * power }
        return 10 * power
    }

    /// A panel's frame: its title, axes with ticks and labels. Returns the SVG and a function
    /// that maps (x, y) in data units to the picture.
    static func panel(top: Double, title: String, xLabel: String, yLabel: String, xMax: Double, yMax: Double,
                      xTicks: [(Double, String)]? = nil) -> (String, (Double, Double) -> (Double, Double)) {
        let plotTop = top + 30, plotBottom = top + panelHeight - 40
        let plotLeft = left, plotRight = width - right
        let map: (Double, Double) -> (Double, Double) = { x, y in
            (plotLeft + (plotRight - plotLeft) * min(max(x / xMax, 0), 1), plotBottom - (plotBottom - plotTop) * min(max(y / yMax, 0), 1))
        }
        var svg = "<text x=\"\(number(plotLeft))\" y=\"\(number(top + 18))\" font-size=\"15\" font-weight=\"bold\">\(escaped(title))</text>\n"
        svg += "<rect x=\"\(number(plotLeft))\" y=\"\(number(plotTop))\" width=\"\(number(plotRight - plotLeft))\" height=\"\(number(plotBottom - plotTop))\" "
            + "fill=\"none\" stroke=\"#888\"/>\n"
        for index in 0...5 {
            let y = yMax * Double(index) / 5
            let (_, py) = map(0, y)
            svg += "<line x1=\"\(number(plotLeft))\" y1=\"\(number(py))\" x2=\"\(number(plotRight))\" y2=\"\(number(py))\" stroke=\"#ddd\"/>\n"
            svg += "<text x=\"\(number(plotLeft - 6))\" y=\"\(number(py + 4))\" font-size=\"11\" text-anchor=\"end\">\(BenchText.decimal(y, y < 10 ? 1 : 0))</text>\n"
        }
        let ticks = xTicks ?? (0...5).map { index in (xMax * Double(index) / 5, BenchText.decimal(xMax * Double(index) / 5, xMax < 5 ? 1 : 0)) }
        for (x, label) in ticks {
            let (px, _) = map(x, 0)
            svg += "<text x=\"\(number(px))\" y=\"\(number(plotBottom + 15))\" font-size=\"11\" text-anchor=\"middle\">\(escaped(label))</text>\n"
        }
        svg += "<text x=\"\(number((plotLeft + plotRight) / 2))\" y=\"\(number(plotBottom + 31))\" font-size=\"12\" text-anchor=\"middle\">\(escaped(xLabel))</text>\n"
        svg += "<text transform=\"translate(\(number(plotLeft - 50)),\(number((plotTop + plotBottom) / 2))) rotate(-90)\" font-size=\"12\" "
            + "text-anchor=\"middle\">\(escaped(yLabel))</text>\n"
        return (svg, map)
    }

    static func polyline(_ points: [(Double, Double)], color: String, dashed: Bool = false) -> String {
        guard !points.isEmpty else { return "" }
        return "<polyline fill=\"none\" stroke=\"\(color)\" stroke-width=\"2\"" + (dashed ? " stroke-dasharray=\"6,4\"" : "")
            + " points=\"" + points.map { "\(number($0.0)),\(number($0.1))" }.joined(separator: " ") + "\"/>\n"
    }

    static func legend(_ items: [(String, String)], x: Double, y: Double) -> String {
        var svg = ""
        for (index, item) in items.enumerated() {
            let ix = x + Double(index) * 190
            svg += "<rect x=\"\(number(ix))\" y=\"\(number(y - 9))\" width=\"14\" height=\"4\" fill=\"\(item.1)\"/>"
            svg += "<text x=\"\(number(ix + 20))\" y=\"\(number(y - 4))\" font-size=\"12\">\(escaped(item.0))</text>\n"
        }
        return svg
    }

    static func document(height: Double, _ body: String, title: String) -> String {
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            + "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"\(Int(width))\" height=\"\(Int(height))\" viewBox=\"0 0 \(Int(width)) \(Int(height))\" "
            + "font-family=\"sans-serif\">\n<title>\(escaped(title))</title>\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n" + body + "</svg>\n"
    }

    /// One run: throughput over time, the window in use, the latency histogram.
    static func single(_ result: BenchResult) -> String {
        let slices = result.slices
        let duration = max(result.seconds, slices.last?.end ?? 0.001)
        let peak = max(slices.map { max($0.out, $0.in) }.max() ?? 0, 1) / 1e6
        var body = ""
        let title = "iapctl bench: \(result.settings.mode.rawValue) on \(result.protocols.joined(separator: ", ")), writes of "
            + "\(BenchText.bytes(result.settings.writeSize))"
        let (frame1, map1) = panel(top: 40, title: "Throughput over time", xLabel: "seconds from the start of the measurement",
                                   yLabel: "MB/s", xMax: duration, yMax: niceCeiling(peak))
        body += "<text x=\"\(number(left))\" y=\"24\" font-size=\"16\">\(escaped(title))</text>\n" + frame1
        if result.settings.mode.writes { body += polyline(slices.map { map1(($0.start + $0.end) / 2, $0.out / 1e6) }, color: colorOut) }
        if result.settings.mode.reads { body += polyline(slices.map { map1(($0.start + $0.end) / 2, $0.in / 1e6) }, color: colorIn) }
        var items: [(String, String)] = []
        if result.settings.mode.writes { items.append(("out (host → accessory)", colorOut)) }
        if result.settings.mode.reads { items.append(("in (accessory → host)", colorIn)) }
        body += legend(items, x: width - right - 390, y: 40 + 22)

        let top2 = 40 + panelHeight
        if let window = result.linkAfter?.sendWindow, window > 0 {
            let (frame2, map2) = panel(top: top2, title: "Send window in use (sampled)",
                                       xLabel: "seconds from the start of the measurement", yLabel: "packets in flight",
                                       xMax: duration, yMax: niceCeiling(Double(window) * 1.2))
            body += frame2
            body += polyline(slices.compactMap { slice in slice.inFlight.map { map2(slice.end, Double($0)) } }, color: colorOut)
            body += polyline([map2(0, Double(window)), map2(duration, Double(window))], color: "#c00", dashed: true)
            body += legend([("in flight", colorOut), ("the accessory's limit (\(window))", "#c00")], x: width - right - 390, y: top2 + 22)
        } else {
            body += "<text x=\"\(number(left))\" y=\"\(number(top2 + 40))\" font-size=\"13\">The send window is not seen from here "
                + "(through iapd, or iAP1): run with --direct to draw it.</text>\n"
        }

        let top3 = 40 + 2 * panelHeight
        let latency = result.latency
        if latency.count > 0 {
            let buckets = latency.counts.enumerated().filter { $0.element > 0 }
            let lowIndex = max(0, (buckets.first?.offset ?? 1) - 1), highIndex = (buckets.last?.offset ?? 1) + 1
            let span = Double(max(1, highIndex - lowIndex))
            let most = Double(buckets.map(\.element).max() ?? 1)
            let ticks = stride(from: lowIndex, through: highIndex, by: max(1, (highIndex - lowIndex) / 6)).map { index in
                (Double(index - lowIndex), BenchText.duration(LatencyHistogram.upperBound(index)))
            }
            let (frame3, map3) = panel(top: top3, title: "Round trips of \(result.settings.latencySize) bytes: \(latency.count) samples, "
                                       + "p50 \(BenchText.duration(latency.percentile(0.5))), p99 \(BenchText.duration(latency.percentile(0.99)))",
                                       xLabel: "round-trip time (each bar one bucket, 1/32 of a doubling)", yLabel: "samples",
                                       xMax: span, yMax: niceCeiling(most), xTicks: ticks)
            body += frame3
            let barWidth = (width - left - right) / span
            for (index, count) in buckets {
                let (x, y) = map3(Double(index - lowIndex) - 0.5, Double(count))
                let (_, base) = map3(0, 0)
                body += "<rect x=\"\(number(x))\" y=\"\(number(y))\" width=\"\(number(max(1, barWidth - 1)))\" height=\"\(number(base - y))\" fill=\"\(colorIn)\"/>\n"
            }
        } else {
            body += "<text x=\"\(number(left))\" y=\"\(number(top3 + 40))\" font-size=\"13\">No round trips in this run (echo and both modes time them).</text>\n"
        }
        return document(height: 40 + 3 * panelHeight, body, title: title)
    }

    /// A sweep: each row's throughput each way (bars) and its p50 latency.
    static func sweep(_ rows: [(label: String, result: BenchResult)], rowName: String) -> String {
        let peak = max(rows.map { max($0.result.rateOut, $0.result.rateIn) }.max() ?? 0, 1) / 1e6
        let count = Double(rows.count)
        let ticks = rows.enumerated().map { (Double($0.offset) + 0.5, $0.element.label) }
        let mode = rows.first?.result.settings.mode.rawValue ?? ""
        let title = "iapctl bench: \(mode) on \(rows.first?.result.protocols.joined(separator: ", ") ?? ""), one run per row"
        var body = "<text x=\"\(number(left))\" y=\"24\" font-size=\"16\">\(escaped(title))</text>\n"
        let (frame1, map1) = panel(top: 40, title: "Throughput per \(rowName)", xLabel: rowName, yLabel: "MB/s", xMax: count,
                                   yMax: niceCeiling(peak), xTicks: ticks)
        body += frame1
        let slot = (width - left - right) / count
        for (index, row) in rows.enumerated() {
            for (offset, value, color) in [(0.15, row.result.rateOut, colorOut), (0.5, row.result.rateIn, colorIn)] where value > 0 {
                let (x, y) = map1(Double(index) + offset, value / 1e6)
                let (_, base) = map1(0, 0)
                body += "<rect x=\"\(number(x))\" y=\"\(number(y))\" width=\"\(number(slot * 0.33))\" height=\"\(number(base - y))\" fill=\"\(color)\"/>\n"
            }
        }
        body += legend([("out (host → accessory)", colorOut), ("in (accessory → host)", colorIn)], x: width - right - 390, y: 40 + 22)
        let latencies = rows.map { $0.result.latency.count > 0 ? $0.result.latency.percentile(0.5) / 1e3 : 0 }
        if latencies.contains(where: { $0 > 0 }) {
            let top2 = 40 + panelHeight
            let (frame2, map2) = panel(top: top2, title: "Round-trip p50 per \(rowName)", xLabel: rowName, yLabel: "µs", xMax: count,
                                       yMax: niceCeiling(latencies.max() ?? 1), xTicks: ticks)
            body += frame2 + polyline(latencies.enumerated().map { map2(Double($0.offset) + 0.5, $0.element) }, color: colorIn)
        }
        return document(height: 40 + 2 * panelHeight, body, title: title)
    }
}
