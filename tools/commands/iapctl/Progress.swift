import AccessoryHost
import AccessoryGadget
import AccessoryLogging
import AccessorySimulator
import BluetoothTransport
import CLIKit
import Dispatch
import Glibc
import IAPInspect
import IAPTransport
import Synchronization
import SystemCalls
import USBHost

/// Closes a send's session when the accessory's acknowledged count has not moved for `timeout`
/// while bytes are outstanding: an accessory that keeps the link alive (bare ACKs) but
/// acknowledges none of the data would otherwise hold the transfer for ever.
final class StallWatchdog {
    /// What the timer compares, shared with its handler.
    private final class Progress: Sendable {
        let state = Mutex((acknowledged: 0, written: 0, since: ContinuousClock.now))
    }
    private let timer: any DispatchSourceTimer
    private let progress = Progress()

    init(stream: AccessorySession, timeout: Duration, onStall: @escaping @Sendable () -> Void) {
        timer = DispatchSource.makeTimerSource(queue: DispatchQueue(label: "iapctl.send.watchdog"))
        let progress = self.progress
        let tick = min(1.0, max(0.05, seconds(timeout) / 4))
        timer.schedule(deadline: .now() + tick, repeating: tick)
        timer.setEventHandler {
            let acknowledged = stream.bytesAcknowledged
            let stalled = progress.state.withLock { state -> Bool in
                if acknowledged != state.acknowledged || acknowledged >= state.written {
                    state.acknowledged = acknowledged
                    state.since = .now
                    return false
                }
                return ContinuousClock.now - state.since >= timeout
            }
            if stalled { onStall() }
        }
        timer.resume()
    }

    /// `written` bytes have been handed to the session.
    func expect(_ written: Int) {
        progress.state.withLock { state in
            if state.acknowledged >= state.written { state.since = .now } // it was idle, not stalled
            state.written = written
        }
    }

    func cancel() { timer.cancel() }
}

/// `send`'s progress on a terminal (standard error): a bar, the bytes sent, the rate, the time
/// so far and the time left, redrawn at most ten times a second.
final class ProgressLine {
    let total: Int?
    private var lastDraw: ContinuousClock.Instant?
    private var drawn = false

    init(total: Int?) { self.total = total }

    func draw(sent: Int, since start: ContinuousClock.Instant, force: Bool = false) {
        let now = ContinuousClock.now
        if !force, let lastDraw, now - lastDraw < .milliseconds(100) { return }
        lastDraw = now
        drawn = true
        let elapsed = seconds(now - start)
        let rate = elapsed > 0 ? Double(sent) / elapsed : 0
        var line = ""
        if let total {
            let fraction = total == 0 ? 1 : min(1, Double(sent) / Double(total))
            let width = max(10, min(30, Terminal.columns(2) - 70))
            let filled = Int(fraction * Double(width))
            line += "[" + String(repeating: "#", count: filled) + String(repeating: " ", count: width - filled) + "] "
            line += "\(Int(fraction * 100))%  \(formatBytes(sent)) of \(formatBytes(total))"
        } else {
            line += formatBytes(sent)
        }
        line += "  \(formatRate(rate))  \(formatClock(elapsed)) elapsed"
        if let total, rate > 0, sent < total {
            line += ", \(formatClock(Double(total - sent) / rate)) left"
        }
        StandardError.write("\r" + line + "\u{1b}[K")
    }

    /// Ends the line (once something was drawn).
    func finish() {
        if drawn { StandardError.write("\n") }
        drawn = false
    }
}

func formatSeconds(_ seconds: Double) -> String {
    String(Double(Int(seconds * 1_000)) / 1_000)
}

func formatRate(_ bytesPerSecond: Double) -> String {
    if bytesPerSecond >= 1e6 { return String(Double(Int(bytesPerSecond / 1e4)) / 100) + " MB/s" }
    return String(Double(Int(bytesPerSecond / 10)) / 100) + " kB/s"
}

/// `12.34 MB`, `512 B`.
func formatBytes(_ bytes: Int) -> String {
    if bytes >= 1_000_000 { return String(Double(bytes / 10_000) / 100) + " MB" }
    if bytes >= 1_000 { return String(Double(bytes / 10) / 100) + " kB" }
    return "\(bytes) B"
}

/// `0:07`, `1:02:03`.
func formatClock(_ seconds: Double) -> String {
    let whole = Int(seconds.rounded())
    let (h, m, s) = (whole / 3_600, whole / 60 % 60, whole % 60)
    let two = { (n: Int) in n < 10 ? "0\(n)" : "\(n)" }
    return h > 0 ? "\(h):\(two(m)):\(two(s))" : "\(m):\(two(s))"
}
