// `iapbench ptys`: many serial accessories on one host process. The simulated accessories run in
// a child process (`iapbench pty-accessories`), one pseudo-terminal each, so that the host's
// memory, threads and CPU are its own.

import AccessoryHost
import AccessorySimulator
import CLIKit
import Dispatch
import Foundation
import IAPInspect
import IAPTransport
import Synchronization

enum ScaleBenchmarks {
    /// The host side: opens every pseudo-terminal the child made, waits until every accessory is
    /// identified, and reports the time, the memory and threads per accessory, and the CPU.
    static func run(_ command: ParsedCommand) throws -> ExitCode {
        let count = try command.integer("accessories", in: 1...4_096) ?? 1_000
        let timeout = try command.integer("timeout", in: 1...3_600) ?? 120
        let json = command.flag("json")
        #if DEBUG
        StandardError.write("warning: this is a debug build; its numbers mean nothing. Use: swift build -c release\n")
        #endif
        try raiseOpenFileLimit(to: count + 256)

        let child = Process()
        child.executableURL = URL(fileURLWithPath: try executablePath())
        child.arguments = ["pty-accessories", "--count", "\(count)"]
        let fromChild = Pipe()
        let toChild = Pipe()
        child.standardOutput = fromChild
        child.standardInput = toChild
        try child.run()
        defer {
            try? toChild.fileHandleForWriting.close() // the child stops at end of input
            child.waitUntilExit()
        }
        let paths = try readLines(count, from: fromChild.fileHandleForReading)

        let before = ProcessFigures.now()
        let manager = AccessoryManager(configuration: .init(answerTimeout: .seconds(30)))
        let tally = Mutex<(identified: Int, failed: [String])>((0, []))
        let done = DispatchSemaphore(value: 0)
        let subscription = manager.onEvent(queue: DispatchQueue(label: "iapbench.ptys.events")) { event in
            let finished = tally.withLock { tally -> Bool in
                switch event {
                case .connected: tally.identified += 1
                case let .failed(location, reason): tally.failed.append("\(location): \(reason)")
                case .disconnected, .appLaunchRequested: break
                }
                return tally.identified + tally.failed.count == count
            }
            if finished { done.signal() }
        }
        defer { subscription.cancel() }
        let start = ContinuousClock.now
        for path in paths {
            manager.attach(try SerialTransport(spec: try SerialPortSpec(parsing: path + ":3000000")))
        }
        let inTime = done.wait(timeout: .now() + .seconds(timeout)) == .success
        let elapsed = ContinuousClock.now - start
        let after = ProcessFigures.now()
        let (identified, failed) = tally.withLock { ($0.identified, $0.failed) }
        manager.stop()

        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        let rssPerAccessory = Double(after.residentKiB - before.residentKiB) / Double(count)
        let cpuPerAccessory = (after.cpuSeconds - before.cpuSeconds) / Double(count) * 1e3
        if json {
            StandardOutput.write(JSONValue.object([
                ("name", .string("pty accessories identified")), ("accessories", .int(count)), ("identified", .int(identified)),
                ("failed", .int(failed.count)), ("seconds", .string(Report.format(seconds, digits: 2))),
                ("residentKiBBefore", .int(before.residentKiB)), ("residentKiBAfter", .int(after.residentKiB)),
                ("residentKiBPerAccessory", .string(Report.format(rssPerAccessory, digits: 1))),
                ("threadsBefore", .int(before.threads)), ("threadsAfter", .int(after.threads)),
                ("cpuMillisecondsPerAccessory", .string(Report.format(cpuPerAccessory, digits: 2))),
            ]).serialized() + "\n")
        } else {
            StandardOutput.write("""
                iapbench ptys: \(count) simulated accessories, one pseudo-terminal each, in a child process
                  identified: \(identified) of \(count)\(failed.isEmpty ? "" : ", \(failed.count) failed") in \(Report.format(seconds, digits: 2)) s\(inTime ? "" : " (gave up after \(timeout) s)")
                  host resident memory: \(before.residentKiB / 1_024) MiB before, \(after.residentKiB / 1_024) MiB after: \(Report.format(rssPerAccessory, digits: 1)) KiB per accessory
                  host threads: \(before.threads) before, \(after.threads) after
                  host CPU to identify them: \(Report.format(after.cpuSeconds - before.cpuSeconds, digits: 2)) s (\(Report.format(cpuPerAccessory, digits: 2)) ms per accessory)

                """)
            for reason in failed.prefix(5) { StandardOutput.write("  failed: \(reason.escapedForTerminal)\n") }
        }
        return identified == count ? .success : .unavailable
    }

    /// The child: `count` simulated accessories on pseudo-terminals; prints each one's path, and
    /// runs until its standard input ends.
    static func runAccessories(_ command: ParsedCommand) throws -> ExitCode {
        let count = try command.integer("count", in: 1...4_096) ?? 1_000
        try raiseOpenFileLimit(to: 2 * count + 256)
        let profile = LoopbackBenchmarks.echoProfile(sessions: 1, maxPacketLength: 4_096, native: false)
        var terminals: [PseudoTerminal] = []
        var runners: [SimulatorRunner] = []
        for _ in 0..<count {
            let terminal = try PseudoTerminal()
            let runner = try SimulatorRunner(profile: profile, attachment: .transport(try terminal.makeMasterTransport()))
            runner.start()
            terminals.append(terminal)
            runners.append(runner)
        }
        StandardOutput.write(terminals.map(\.slavePath).joined(separator: "\n") + "\n")
        while !FileHandle.standardInput.availableData.isEmpty {} // until the host closes our input
        for runner in runners { runner.stop() }
        withExtendedLifetime(terminals) {}
        return .success
    }

    static func readLines(_ count: Int, from handle: FileHandle) throws -> [String] {
        var text = ""
        while text.count(where: { $0 == "\n" }) < count {
            let data = handle.availableData
            guard !data.isEmpty else { throw ToolFailure("the accessories' process ended before it made \(count) pseudo-terminals") }
            text += String(decoding: data, as: UTF8.self)
        }
        return text.split(separator: "\n").prefix(count).map(String.init)
    }

    static func executablePath() throws -> String {
        let path = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        return path
    }

    /// One pseudo-terminal per accessory, on both sides: raise the soft limit on open files.
    static func raiseOpenFileLimit(to wanted: Int) throws {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return }
        guard limit.rlim_cur < rlim_t(wanted) else { return }
        let hard = limit.rlim_max
        limit.rlim_cur = rlim_t(wanted)
        limit.rlim_max = max(hard, rlim_t(wanted)) // raising the hard limit works for root only
        guard setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else {
            throw ToolFailure("\(wanted) open files are needed and the hard limit is \(hard); raise it (ulimit -Hn, as root) or use fewer accessories")
        }
    }
}

/// This process's resident memory, threads and CPU time (from /proc and getrusage).
struct ProcessFigures: Sendable {
    var residentKiB = 0
    var threads = 0
    var cpuSeconds = 0.0
    /// The system (kernel) part of ``cpuSeconds``.
    var systemSeconds = 0.0

    static func now() -> ProcessFigures {
        var figures = ProcessFigures()
        if let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) {
            for line in status.split(separator: "\n") {
                let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
                guard fields.count >= 2 else { continue }
                if fields[0] == "VmRSS:" { figures.residentKiB = Int(fields[1]) ?? 0 }
                if fields[0] == "Threads:" { figures.threads = Int(fields[1]) ?? 0 }
            }
        }
        var usage = rusage()
        if getrusage(RUSAGE_SELF.rawValue, &usage) == 0 {
            figures.cpuSeconds = Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec)
                + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
            figures.systemSeconds = Double(usage.ru_stime.tv_sec) + Double(usage.ru_stime.tv_usec) / 1e6
        }
        return figures
    }
}
