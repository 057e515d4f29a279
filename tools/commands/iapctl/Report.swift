// iapctl report: connects to one accessory directly, runs every step as far as it goes (detect,
// link, authentication, identification, a short exchange on each protocol) and writes one text
// file a user can attach to a bug report: the steps with times, where it stopped and why, the
// USB device, the identification, the authentication, the notable log lines and the pcapng trace.

import AccessoryHost
import AccessoryLogging
import CLIKit
import Dispatch
import Glibc
import IAPAuthentication
import IAPInspect
import IAPLink
import IAPWire
import ProjectVersion
import Synchronization
import USBHost
import SystemCalls

/// `iapctl report`.
enum ReportCommand {
    /// The extraction command's file name when the report went to standard output.
    static let placeholderName = "REPORT.txt"
    /// What replaces serial numbers and certificate bytes without `--full`.
    static let leftOut = "(left out; --full includes it)"
    /// The probe written on each session: 16 bytes, recognisable in a trace.
    static let probe: [UInt8] = Array("iapctl probe #1\n".utf8)

    static let spec = CommandSpec(
        name: "report",
        abstract: "Connect to an accessory, run every step as far as it goes, and write a report to attach to a bug report.",
        discussion: """
            Opens the accessory directly (never through iapd: when iapd holds it, the report says \
            so and how to stop iapd), then runs the steps one after the other and records each \
            with its time, ✔ or ✘: open, detect, link (SYN, SYN|ACK, ACK and the parameters), \
            authentication (certificate, challenge, response, the policy's verdict), \
            identification (IdentificationInformation decoded), and for each declared protocol a \
            session: opened, a 16-byte probe written ('iapctl probe #1' and a newline; --no-write \
            leaves it out), what comes back within --read-timeout seconds (more for an accessory \
            that acknowledges late: twice its cumulative-ACK timeout is added), closed. A protocol that \
            refuses or ends is recorded and the next one is tried. The file says where it stopped \
            and the cause the trace shows (a gap in the accessory's sequence numbers, a message it \
            never sent, a refusal and its reason, a session it never answered, an accessory that \
            left) with the frames that show it, what to do next, the findings for the accessory's \
            maker (each deviation from the reference the host tolerated, where it is in the trace, \
            what an iPhone is known to do about it and the source), the USB device and its descriptors (on USB), \
            every identification field, the host's log lines at notice level and above (it logs at \
            debug level into memory while the report runs) and the tolerated deviations, and the \
            whole exchange as a pcapng trace, base64 between -----BEGIN PCAPNG TRACE----- and \
            -----END PCAPNG TRACE-----, with the one command that extracts it for iapctl decode \
            --pcap or Wireshark. Without --full the serial numbers (the accessory's, the USB \
            iSerial, the coprocessor's), the certificate's subject and serial number and the \
            certificate bytes are left out: replaced in the text, and overwritten in the trace \
            (X's and zeros of the same length, checksums recomputed, so it decodes as the original \
            did); session data in it is cut to its first 64 bytes per packet (add --trace-file \
            FILE.pcapng for every byte). An iAP1 accessory's trace is not embedded without --full (the report says so), \
            since its serial and certificate are not yet taken out of iAP1 frames. Read the file \
            before sending it: strings from the accessory are exact, with control characters \
            escaped. The file is written whatever the report found; a one-line summary goes to \
            standard error. Without -v nothing else is printed. With --json the file is one JSON \
            object instead (docs/json-schema.json, report).
            """,
        options: [
            accessoryOption,
            OptionSpec.value("output", short: "o", valueName: "file",
                             help: "Write the report here ('-' for standard output; default iapctl-report-YYYYMMDD-HHMMSS.txt "
                                 + "in the current directory).").completing(.files),
            .flag("full", help: "Include the serial numbers, the certificate and its bytes (in the text and the trace)."),
            .flag("json", help: "Write the report as one JSON object (result, cause, steps, findings, trace) instead of text."),
            .flag("no-write", help: "Open and close each session without writing the probe (for protocols where any bytes could act)."),
            OptionSpec.value("read-timeout", valueName: "seconds", help: "How long to wait for bytes back on each session (plus twice the cumulative-ACK timeout the accessory asked for).",
                             defaultValue: "0.5").checked(.number(0...60)),
        ],
        examples: [
            CommandExample("iapctl report", "The accessory on USB (or the only one found): iapctl-report-….txt here."),
            CommandExample("iapctl --serial /dev/ttyUSB0:115200 report -o accessory.txt", "An accessory on a UART."),
            CommandExample("iapctl --simulate=thermal-camera report -o - | less", "The simulator's report, read at once."),
            CommandExample("sed -n '/^-----BEGIN PCAPNG/,/^-----END PCAPNG/p' REPORT.txt | sed '1d;$d' | base64 -d > trace.pcapng",
                           "The trace out of a report, for iapctl decode --pcap trace.pcapng or Wireshark."),
        ],
        exitStatuses: [
            ExitStatusDescription(.success, "the report was written, whatever it found (the summary on standard error says where it stopped)"),
            ExitStatusDescription(.usage, "usage error, or several accessories match (pick one with --accessory)"),
            ExitStatusDescription(.dataError, "a simulator profile is not valid"),
            ExitStatusDescription(.noInput, "a simulator profile or --trust file cannot be read"),
            ExitStatusDescription(.cannotCreate, "the report file cannot be written (choose another with -o FILE, or -o - for standard output)"),
        ])

    /// Runs the report; 0 once the file is written, 73 when it cannot be, 64 for a usage error.
    static func run(_ command: ParsedCommand) throws -> ExitCode {
        let started = wallNanoseconds()
        let full = command.flag("full")
        let readTimeout = Double(command.value("read-timeout") ?? "0.5") ?? 0.5
        let path = command.value("output") ?? defaultFileName(at: started)
        // Created first: a report that cannot be written is known before anything runs.
        let file = try ReportFile(path: path)
        let verbosity = command.count("verbose")
        let log = ReportLogHandler(echoLevel: verbosity > 0 ? Logger.verbosity(verbosity) : nil)
        let trace = ReportTrace(full: full)
        var run = ReportRun(started: started, full: full, command: command)

        let context: HostContext?
        do {
            context = try HostContext(command, hooks: HostContext.Hooks(logger: Logger(label: "iapctl", logLevel: .debug, handler: log),
                                                                        transportTap: { trace.tap($0) }, direct: true))
        } catch let error as ToolError where error.exitCode == .unavailable || error.exitCode == .noPermission || error.exitCode == .osError {
            // A port that cannot be opened is a finding, not a reason to write nothing.
            run.setupFailure = error.description
            context = nil
        } catch {
            file.discard()
            throw error
        }
        if let context {
            defer { context.shutdown() }
            do {
                run.accessory = try chooseAccessory(context, command: command)
            } catch let error as ToolError where error.exitCode == .unavailable {
                run.choiceFailure = error.description
            } catch {
                file.discard()
                throw error
            }
            let departures = DepartureLog()
            let eventQueue = DispatchQueue(label: "iapctl.report.events")
            let subscription = context.manager.onEvent(queue: eventQueue) { event in
                if case let .disconnected(accessory, reason) = event {
                    departures.entries.withLock { $0.append((wallNanoseconds(), accessory.connectionID, reason)) }
                }
            }
            if let accessory = run.accessory {
                // An accessory that acknowledges late (a cumulative-ACK timeout of 1.5 s, a window of
                // one packet) gets the time its own link parameters need on top.
                let slack = trace.linkTiming(of: accessory.location)
                let timing = SessionProbe.Timing(read: readTimeout + 2 * (slack?.cumulativeAck ?? 0),
                                                 close: 2 + 2 * (slack?.cumulativeAck ?? 0) + (slack?.retransmission ?? 0))
                for item in accessory.identity.protocols {
                    run.sessions.append(SessionProbe.run(item, on: accessory, write: !command.flag("no-write"), timing: timing))
                }
                run.linkStatistics = accessory.linkStatistics
                run.connectedAtEnd = accessory.isConnected
            }
            context.manager.queue.sync {} // what the manager has announced…
            eventQueue.sync {} // …has been heard
            subscription.cancel()
            run.departures = departures.entries.withLock { $0 }
            run.failures = context.failures.entries.withLock { $0 }
            let daemonPath = AccessoryManager.defaultDaemonSocketPath
            run.daemonSocket = daemonAnswers(at: daemonPath) ? daemonPath : nil
        }
        run.finished = wallNanoseconds()
        run.wires = trace.tracedWires
        run.analysis = TraceAnalysis(blocks: trace.recordedBlocks, full: full)
        run.records = log.memory.records
        run.droppedRecords = log.memory.droppedCount
        run.prepare()

        let text = command.flag("json") ? run.renderJSON() : run.render(fileName: path == "-" ? placeholderName : path)
        do {
            try file.write(text)
        } catch {
            StandardError.write("iapctl: \(error)\n")
            return .cannotCreate
        }
        let place = path == "-" ? "standard output" : path
        StandardError.write("report written to \(place.escapedForTerminal): \(run.verdict.escapedForTerminal)\n")
        return .success
    }

    /// Whether iapd listens at `path`: a connection is accepted, or refused for want of
    /// permission (its socket is for the group iapd). A socket file nobody listens on is not iapd.
    static func daemonAnswers(at path: String) -> Bool {
        let descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return false }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (index, byte) in bytes.enumerated() { raw[index] = byte }
            raw[bytes.count] = 0
        }
        let result = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        return result == 0 || errno == EACCES || errno == EPERM
    }

    /// `iapctl-report-YYYYMMDD-HHMMSS.txt`, in local time.
    static func defaultFileName(at nanoseconds: UInt64) -> String {
        var seconds = time_t(nanoseconds / 1_000_000_000)
        var parts = tm()
        localtime_r(&seconds, &parts)
        func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        return "iapctl-report-\(parts.tm_year + 1900)\(two(parts.tm_mon + 1))\(two(parts.tm_mday))-"
            + "\(two(parts.tm_hour))\(two(parts.tm_min))\(two(parts.tm_sec)).txt"
    }
}

/// The report file, created before the run (so that a file that cannot be written stops it at
/// once, 73) and written at the end in one piece; `-` is standard output.
final class ReportFile {
    private let path: String
    private var handle: UnsafeMutablePointer<FILE>?

    init(path: String) throws {
        self.path = path
        if path == "-" { return }
        guard let opened = fopen(path, "w") else {
            throw ToolError(description: "cannot write the report '\(path)': \(SystemError.last.text); "
                                + "choose another place with -o FILE (or -o - for standard output)", exitCode: .cannotCreate)
        }
        handle = opened
    }

    /// Writes the whole report and closes the file.
    func write(_ text: String) throws {
        guard let handle else {
            StandardOutput.write(text)
            return
        }
        self.handle = nil
        let bytes = Array(text.utf8)
        let written = bytes.withUnsafeBytes { fwrite($0.baseAddress, 1, $0.count, handle) }
        let failed = written != bytes.count || fflush(handle) != 0
        let code = errno
        if fclose(handle) != 0 || failed {
            throw ToolError(description: "cannot write the report '\(path)': \(SystemError(failed ? code : errno).text)",
                            exitCode: .cannotCreate)
        }
    }

    /// Removes the file created for a report that will not be written (a usage error).
    func discard() {
        guard let handle else { return }
        fclose(handle)
        self.handle = nil
        unlink(path)
    }
}

/// The host's log during the report: every record kept in memory (debug level and above), and
/// those at the `-v` level echoed to standard error.
final class ReportLogHandler: LogHandler {
    /// The records.
    let memory = InMemoryLogHandler()
    private let echo: LogLevel?

    init(echoLevel: LogLevel?) { echo = echoLevel }

    func log(_ record: LogRecord) {
        memory.log(record)
        if let echo, record.level >= echo { StderrLogHandler().log(record) }
    }
}

/// Accessories that went away during the report, with when and why.
final class DepartureLog: Sendable {
    let entries = Mutex<[(UInt64, Int, String)]>([])
}

/// One step's verdict.
