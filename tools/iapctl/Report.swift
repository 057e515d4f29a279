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
            and the host's reason, what to do next, the USB device and its descriptors (on USB), \
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
            standard error. Without -v nothing else is printed.
            """,
        options: [
            accessoryOption,
            OptionSpec.value("output", short: "o", valueName: "file",
                             help: "Write the report here ('-' for standard output; default iapctl-report-YYYYMMDD-HHMMSS.txt "
                                 + "in the current directory).").completing(.files),
            .flag("full", help: "Include the serial numbers, the certificate and its bytes (in the text and the trace)."),
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

        let text = run.render(fileName: path == "-" ? placeholderName : path)
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
            throw ToolError(description: "cannot write the report '\(path)': \(String(cString: strerror(errno))); "
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
            throw ToolError(description: "cannot write the report '\(path)': \(String(cString: strerror(failed ? code : errno)))",
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
enum StepOutcome {
    /// ✔
    case passed
    /// ✘, with the reason (the host's, where it gave one).
    case failed(String)
    /// An earlier step failed.
    case notReached
}

/// One line of the step list, with the details shown under it.
struct ReportStep {
    /// `open`, `detect`, `link`, `authentication`, `identification`, `session PROTOCOL`.
    var name: String
    /// ✔, ✘ or not reached.
    var outcome: StepOutcome
    /// When it finished (or failed), nanoseconds since the epoch.
    var time: UInt64?
    /// What it did, in a line.
    var summary: String
    /// The frames and host's lines that show it, one a line.
    var details: [String] = []

    /// ✔, ✘ or · for people.
    var mark: String {
        switch outcome {
        case .passed: return "✔"
        case .failed: return "✘"
        case .notReached: return "·"
        }
    }

    /// The reason it failed, if it did.
    var failure: String? {
        if case let .failed(reason) = outcome { return reason }
        return nil
    }
}

/// What one session did: opened, the probe written, what came back, closed.
struct SessionProbe {
    /// The protocol string (exact; escaped where written).
    var protocolName: String
    /// Its identifier in the identification.
    var identifier: UInt8
    /// Whether it is bound to a native-transport component.
    var native: Bool
    /// When the open was asked for, and when the close was done (nanoseconds since the epoch).
    var started: UInt64
    var finished: UInt64 = 0
    /// ✘ when it did not open, the write failed, or the accessory ended it.
    var outcome: StepOutcome = .passed
    /// What happened, in order.
    var lines: [String] = []

    /// How long a probe waits, in seconds: for bytes back, and for the close to be acknowledged.
    struct Timing {
        var read: Double
        var close: Double
    }

    /// The bytes a session received, as its handler hands them over.
    final class Collector: Sendable {
        struct State {
            var bytes: [UInt8] = []
            var count = 0
            var firstAt: UInt64?
            var end: String?
            var ended = false
        }
        let state = Mutex(State())
        let done = DispatchSemaphore(value: 0)
        let enough: Int

        init(enough: Int) { self.enough = enough }

        func add(_ bytes: [UInt8]) {
            guard !bytes.isEmpty else { return }
            let signal = state.withLock { state -> Bool in
                if state.firstAt == nil { state.firstAt = wallNanoseconds() }
                state.bytes += bytes.prefix(max(0, 64 - state.bytes.count))
                let before = state.count
                state.count += bytes.count
                return before < enough && state.count >= enough
            }
            if signal { done.signal() }
        }

        func end(_ reason: String?) {
            let signal = state.withLock { state -> Bool in
                if state.end == nil { state.end = reason }
                defer { state.ended = true }
                return !state.ended
            }
            if signal { done.signal() }
        }
    }

    /// Opens `item` on `accessory`, writes the probe (unless `write` is false), collects what
    /// comes back for `timing.read` seconds (or until 16 bytes have), and closes it.
    static func run(_ item: ExternalAccessoryProtocol, on accessory: Accessory, write: Bool, timing: Timing) -> SessionProbe {
        let readTimeout = timing.read
        var probe = SessionProbe(protocolName: item.name, identifier: item.identifier,
                                 native: item.nativeTransportComponentIdentifier != nil, started: wallNanoseconds())
        guard accessory.isConnected else {
            probe.outcome = .failed("the accessory had gone before the session could be opened")
            probe.finished = wallNanoseconds()
            return probe
        }
        let session: AccessorySession
        do {
            session = try blockingAwait { try await accessory.openSession(for: item.name) }
        } catch {
            probe.outcome = .failed("the session did not open: \(error)")
            probe.finished = wallNanoseconds()
            return probe
        }
        let opened = wallNanoseconds()
        probe.lines.append("opened in \(ReportText.milliseconds(opened - probe.started))"
                           + (session.usesNativeTransport ? ", on its native transport"
                              : accessory.protocolVersion == .iap1 ? ", as an iAP1 data session" : ", on the iAP2 link"))
        let collector = Collector(enough: write ? ReportCommand.probe.count : 1)
        session.setEventHandler(queue: DispatchQueue(label: "iapctl.report.session")) { [weak session] event in
            switch event {
            case .hasBytesAvailable: collector.add(session?.readAvailable() ?? [])
            case let .errorOccurred(error): collector.end("\(error)")
            case .endEncountered: collector.end(nil)
            default: break
            }
        }
        var writeStarted = opened
        if write {
            writeStarted = wallNanoseconds()
            do {
                let taken = try session.writeAvailable(ReportCommand.probe)
                probe.lines.append(taken == ReportCommand.probe.count
                                   ? "wrote the \(taken)-byte probe: \(ReportText.preview(ReportCommand.probe))"
                                   : "the session took \(taken) of the \(ReportCommand.probe.count) probe bytes at once (it was full)")
            } catch {
                probe.outcome = .failed("writing the probe failed: \(error)")
            }
        }
        _ = collector.done.wait(timeout: .now() + readTimeout)
        let received = collector.state.withLock { $0 }
        if received.count > 0 {
            let after = (received.firstAt ?? writeStarted) - min(received.firstAt ?? writeStarted, writeStarted)
            var line = "read \(received.count) byte\(received.count == 1 ? "" : "s"), the first \(ReportText.milliseconds(after)) after "
                + (write ? "the write" : "the open") + ": \(ReportText.preview(received.bytes))"
            if received.count > received.bytes.count { line += " …" }
            if write, received.bytes.starts(with: ReportCommand.probe) { line += " (the probe echoed)" }
            probe.lines.append(line)
        } else if received.ended {
            probe.lines.append("nothing came back before the session ended")
        } else {
            probe.lines.append("nothing came back within \(ReportText.seconds(readTimeout)) (a sink, or a protocol that speaks only when asked in its own terms)")
        }
        if received.ended {
            let reason = received.end ?? "the accessory ended the session"
            probe.lines.append("the session ended: \(reason)")
            if case .passed = probe.outcome { probe.outcome = .failed("the session ended: \(reason)") }
        }
        if write {
            probe.lines.append("bytes the accessory acknowledged: \(session.bytesAcknowledged)")
        }
        let closing = wallNanoseconds()
        do {
            let closeTimeout = Duration.milliseconds(Int(timing.close * 1000))
            try blockingAwait { try await session.close(timeout: closeTimeout) }
            probe.lines.append("closed in \(ReportText.milliseconds(wallNanoseconds() - closing))")
        } catch {
            probe.lines.append("closing: \(error)")
            if case .passed = probe.outcome { probe.outcome = .failed("closing: \(error)") }
        }
        probe.finished = wallNanoseconds()
        return probe
    }
}

/// Everything one report found, and its text.
struct ReportRun {
    /// When the report started and when the accessory was let go (nanoseconds since the epoch).
    let started: UInt64
    var finished: UInt64 = 0
    /// `--full`: serials and the certificate included.
    let full: Bool
    /// The command line (for the policy options it names).
    let command: ParsedCommand
    /// The accessory reported on, once identified.
    var accessory: Accessory?
    /// Why the host could not even start (a serial port that cannot be opened).
    var setupFailure: String?
    /// Why no accessory was chosen (none identified, none matching `--accessory`).
    var choiceFailure: String?
    /// One probe per declared protocol.
    var sessions: [SessionProbe] = []
    /// The link's counters after the sessions.
    var linkStatistics: LinkStatistics?
    /// Whether the accessory was still connected once the sessions were done.
    var connectedAtEnd = false
    /// Accessories that went away during the sessions: when, which, why.
    var departures: [(UInt64, Int, String)] = []
    /// Transports that failed before an accessory was identified on them, as "location: reason".
    var failures: [String] = []
    /// iapd's socket, when iapd answers on it.
    var daemonSocket: String?
    /// The traced transports, by pcapng interface.
    var wires: [ReportTrace.Wire] = []
    /// The trace read back.
    var analysis = TraceAnalysis(blocks: [], full: false)
    /// The host's log records (debug and above), and how many older ones were not kept.
    var records: [LogRecord] = []
    var droppedRecords = 0

    init(started: UInt64, full: Bool, command: ParsedCommand) {
        self.started = started
        self.full = full
        self.command = command
    }

    // MARK: What it found

    /// The traced wire the report is about: the accessory's, or the first that failed, or the only one.
    var wireIndex: Int? {
        if let accessory { return wires.lastIndex { $0.location == accessory.location } }
        if let failed = wires.firstIndex(where: { wire in failures.contains { $0.hasPrefix(wire.location + ": ") } }) { return failed }
        return wires.isEmpty ? nil : 0
    }

    /// The host's reason the wire failed, if it did.
    var failureReason: String? {
        guard let index = wireIndex else { return failures.first }
        let prefix = wires[index].location + ": "
        return failures.first { $0.hasPrefix(prefix) }.map { String($0.dropFirst(prefix.count)) }
    }

    /// Serial numbers (and the certificate's subject and serial) to leave out without `--full`:
    /// worked out once by ``prepare()``.
    private(set) var secrets: [(String, String)] = []
    /// The certificate the accessory sent, as the host read it: set by ``prepare()``.
    private(set) var certificate: CertificateSummary?

    /// Reads the certificate and gathers what to leave out, once the run is over.
    mutating func prepare() {
        certificate = readCertificate()
        secrets = findSecrets()
    }

    private func findSecrets() -> [(String, String)] {
        guard !full else { return [] }
        var values = analysis.serialNumbers
        if let accessory { values.append(accessory.serialNumber) }
        for wire in wires { if let serial = wire.usb?.serialNumber { values.append(serial) } }
        if let serial = accessory?.usbDevice?.serialNumber { values.append(serial) }
        if let serial = certificate?.serialNumber { values.append(serial) }
        if let subject = certificate?.subject { values.append(subject) }
        // A short value would take ordinary words with it: it is left out where it follows
        // "serial " (a location, a log line) and where it is printed as a field.
        let patterns = Set(values.filter { !$0.isEmpty }).map { value in
            value.count >= 3 ? (value, ReportCommand.leftOut) : ("serial " + value, "serial " + ReportCommand.leftOut)
        }
        return patterns.sorted { $0.0.count > $1.0.count }
    }

    private func readCertificate() -> CertificateSummary? {
        if let certificate = accessory?.identity.authentication.certificate { return certificate }
        guard let index = wireIndex, let der = analysis.certificates[index] else { return nil }
        if case let .success(summary) = CertificateReader.summary(of: der) { return summary }
        return nil
    }

    /// Text from outside for the file: serials left out (without --full), control characters escaped.
    func shown(_ text: String) -> String {
        scrubbed(text).escapedForTerminal
    }

    /// Text already escaped (a frame's summary), with the serials left out without --full.
    func scrubbed(_ text: String) -> String {
        var text = text
        for (secret, replacement) in secrets { text = text.replacing(secret, with: replacement) }
        return text
    }

    /// A field that is a serial number: left out whole without `--full`.
    func serial(_ value: String?) -> String {
        guard let value else { return "(none)" }
        return full ? "\"\(value.escapedForTerminal)\"" : ReportCommand.leftOut
    }

    /// The time of `nanoseconds` from the start, e.g. `+0.012 s`.
    func at(_ nanoseconds: UInt64?) -> String {
        guard let nanoseconds else { return "        " }
        let text = "+" + ReportText.seconds(Double(nanoseconds - min(nanoseconds, started)) / 1e9)
        return text.count < 9 ? text + String(repeating: " ", count: 9 - text.count) : text
    }

    /// The steps, in order.
    var steps: [ReportStep] {
        var steps: [ReportStep] = []
        let reason = failureReason
        guard let index = wireIndex else {
            var why = setupFailure ?? reason ?? choiceFailure ?? "no accessory was found"
            if let daemonSocket { why += "; " + Self.daemonAdvice(daemonSocket) }
            steps.append(ReportStep(name: "open", outcome: .failed(why), time: finished, summary: "the accessory's port or device"))
            return steps + Self.notReached(["detect", "link", "authentication", "identification", "sessions"])
        }
        let wire = wires[index]
        let frames = analysis.frames(on: index)
        let incoming = frames.filter(\.fromAccessory)
        steps.append(ReportStep(name: "open", outcome: .passed, time: frames.first?.time, summary: shown(wire.location)))

        // Detect.
        let accessoryDetect = incoming.first { $0.isDetect }
        let accessorySYN = incoming.first { $0.header?.control.contains(.syn) ?? false }
        let iap1 = analysis.iap1Interfaces.contains(index)
        if let accessoryDetect {
            steps.append(ReportStep(name: "detect", outcome: .passed, time: accessoryDetect.time, summary: "the accessory answered the host's detect"))
        } else if let accessorySYN {
            steps.append(ReportStep(name: "detect", outcome: .passed, time: accessorySYN.time,
                                    summary: "the accessory sent a SYN without a detect (tolerated)"))
        } else if iap1, let first = incoming.first {
            steps.append(ReportStep(name: "detect", outcome: .passed, time: first.time, summary: "the accessory answered in iAP1"))
        } else {
            let dropped = incoming.reduce(0) { $0 + $1.droppedCount }
            let waited = frames.first.map { " in \(ReportText.seconds(Double(finished - min(finished, $0.time)) / 1e9)) after the host's detect" } ?? ""
            var why = incoming.isEmpty ? "the accessory sent nothing" + waited
                : "the accessory sent only bytes the host could not read as frames (\(dropped) dropped)" + waited
            if let reason { why += "; the host: \(reason)" }
            steps.append(ReportStep(name: "detect", outcome: .failed(why), time: finished,
                                    summary: "the host sent the iAP2 detect"))
            return steps + Self.notReached(["link", "authentication", "identification", "sessions"])
        }

        if iap1 {
            steps.append(ReportStep(name: "link", outcome: .passed, time: incoming.first?.time, summary: "iAP1: no iAP2 link (the accessory speaks iAP1)"))
            if let accessory {
                let outcome = accessory.identity.authentication
                steps.append(ReportStep(name: "authentication", outcome: .passed, time: nil, summary: "policy: \(shown(outcome.description))"))
                steps.append(ReportStep(name: "identification", outcome: .passed, time: nil, summary: identitySummary(accessory.identity)))
            } else {
                steps.append(ReportStep(name: "authentication and identification", outcome: .failed(reason ?? "the accessory was not identified"),
                                        time: frames.last?.time, summary: "iAP1"))
                return steps + Self.notReached(["sessions"])
            }
            return steps + sessionSteps
        }

        // Link.
        var link = ReportStep(name: "link", outcome: .passed, time: nil, summary: "")
        let synFrames = frames.filter { $0.header?.control.contains(.syn) ?? false }
        for frame in synFrames {
            link.details.append("\(at(frame.time)) \(frame.direction.arrow)  \(scrubbed(frame.summary))")
        }
        let lastAnswer = frames.lastIndex { !$0.fromAccessory && ($0.header?.control.contains([.syn, .ack]) ?? false) }
        let linkUp = lastAnswer.flatMap { answer in
            frames[(answer + 1)...].first { $0.fromAccessory && ($0.header.map { $0.control.contains(.ack) && !$0.control.contains(.syn) } ?? false) }
        }
        if let up = records.last(where: { $0.message.hasPrefix("link up:") }) { link.details.append("the host: \(shown(up.message))") }
        if let linkUp {
            link.time = linkUp.time
            link.summary = "SYN, SYN|ACK, ACK" + (synFrames.count > 2 ? " (\(synFrames.count) SYN packets: offers and counter-offers)" : "")
            steps.append(link)
        } else {
            let why = accessorySYN == nil ? "the accessory sent no SYN" : "the accessory did not acknowledge the host's SYN|ACK"
            link.outcome = .failed(why + (reason.map { "; the host: \($0)" } ?? ""))
            link.time = frames.last?.time
            link.summary = "SYN, SYN|ACK, ACK"
            steps.append(link)
            return steps + Self.notReached(["authentication", "identification", "sessions"])
        }

        let firsts = FirstMessages(frames)
        let authentication = authenticationStep(firsts, lastTime: frames.last?.time, reason: reason)
        steps.append(authentication)
        if authentication.failure != nil { return steps + Self.notReached(["identification", "sessions"]) }
        var identification = identificationStep(firsts, lastTime: frames.last?.time, reason: reason)
        identification.details = Self.messageLines(frames, ids: [.startIdentification, .identificationInformation, .identificationAccepted,
                                                                 .identificationRejected, .cancelIdentification], at: at)
        for record in records where record.level >= .warning && record.message.contains("dentification") {
            identification.details.append("the host: \(shown(record.message))")
        }
        steps.append(identification)
        if identification.failure != nil { return steps + Self.notReached(["sessions"]) }
        return steps + sessionSteps
    }

    /// The authentication step from its messages: ✔ once the host sent AuthenticationSucceeded.
    func authenticationStep(_ firsts: FirstMessages, lastTime: UInt64?, reason: String?) -> ReportStep {
        var step = ReportStep(name: "authentication", outcome: .passed, time: nil, summary: "")
        let sequence: [(MessageID, Bool)] = [(.requestAuthenticationCertificate, false), (.authenticationCertificate, true),
                                             (.requestAuthenticationChallengeResponse, false), (.authenticationResponse, true),
                                             (.authenticationFailed, false), (.authenticationSucceeded, false)]
        for (id, fromAccessory) in sequence {
            guard let entry = firsts[id, fromAccessory: fromAccessory] else { continue }
            step.details.append("\(at(entry.time)) \(entry.arrow)  \(id)" + (entry.length.map { ": \($0) bytes" } ?? ""))
        }
        let verdict = accessory?.identity.authentication.description
            ?? records.last { $0.message.hasPrefix("authentication: ") }.map { String($0.message.dropFirst("authentication: ".count)) }
        var parts: [String] = []
        if let size = firsts[.authenticationCertificate, fromAccessory: true]?.length { parts.append("certificate \(size) bytes") }
        if let size = firsts[.requestAuthenticationChallengeResponse, fromAccessory: false]?.length { parts.append("challenge \(size) bytes") }
        if let size = firsts[.authenticationResponse, fromAccessory: true]?.length { parts.append("response \(size) bytes") }
        let refused = firsts[.authenticationFailed, fromAccessory: false] != nil
        parts.append("policy \(command.value("auth") ?? "record"): " + shown(verdict ?? (refused ? "refused" : "no verdict recorded")))
        step.summary = parts.joined(separator: ", ")
        if let succeeded = firsts[.authenticationSucceeded, fromAccessory: false] {
            step.time = succeeded.time
            return step
        }
        let why: String
        if refused {
            why = reason ?? "the host refused the accessory (AuthenticationFailed)"
        } else if firsts[.requestAuthenticationCertificate, fromAccessory: false] == nil {
            why = "the host did not ask for the certificate" + (reason.map { ": \($0)" } ?? "")
        } else if firsts[.authenticationCertificate, fromAccessory: true] == nil {
            why = "the accessory did not send its certificate" + (reason.map { "; the host: \($0)" } ?? "")
        } else if firsts[.authenticationResponse, fromAccessory: true] == nil {
            why = "the accessory did not answer the challenge" + (reason.map { "; the host: \($0)" } ?? "")
        } else {
            why = reason ?? "the host sent no verdict"
        }
        step.outcome = .failed(why)
        step.time = lastTime
        return step
    }

    /// The identification step: ✔ once the accessory is identified.
    func identificationStep(_ firsts: FirstMessages, lastTime: UInt64?, reason: String?) -> ReportStep {
        var step = ReportStep(name: "identification", outcome: .passed, time: nil, summary: "IdentificationInformation")
        if let accessory {
            step.time = firsts[.identificationAccepted, fromAccessory: false]?.time
            step.summary = identitySummary(accessory.identity)
            return step
        }
        let why: String
        if firsts[.startIdentification, fromAccessory: false] == nil {
            why = "the host did not start identification" + (reason.map { ": \($0)" } ?? "")
        } else if firsts[.identificationInformation, fromAccessory: true] == nil {
            why = "the accessory sent no IdentificationInformation" + (reason.map { "; the host: \($0)" } ?? "")
        } else {
            why = reason ?? "the identification was not accepted"
        }
        step.outcome = .failed(why)
        step.time = lastTime
        return step
    }

    /// A line per frame carrying one of `ids`: when, which way, which message.
    @inline(never)
    static func messageLines(_ frames: [TracedFrame], ids: Set<MessageID>, at: (UInt64?) -> String) -> [String] {
        var lines: [String] = []
        for frame in frames {
            guard let id = frame.messageID, ids.contains(id) else { continue }
            lines.append("\(at(frame.time)) \(frame.direction.arrow)  \(id)")
        }
        return lines
    }

    /// One step per session.
    var sessionSteps: [ReportStep] {
        guard let accessory else { return [] }
        if sessions.isEmpty { return [ReportStep(name: "sessions", outcome: .passed, time: nil, summary: "the accessory declares no protocols")] }
        return sessions.map { probe in
            var step = ReportStep(name: "session \(shown(probe.protocolName))", outcome: probe.outcome, time: probe.finished,
                                  summary: "protocol id \(probe.identifier)" + (probe.native ? ", native transport" : ""))
            step.details = probe.lines.map(shown)
            if case .failed = probe.outcome, !connectedAtEnd,
               let gone = departures.first(where: { $0.1 == accessory.connectionID }) {
                step.details.append("\(at(gone.0)) the accessory went away: \(shown(gone.2))")
            }
            return step
        }
    }

    static func notReached(_ names: [String]) -> [ReportStep] {
        names.map { ReportStep(name: $0, outcome: .notReached, time: nil, summary: "not reached") }
    }

    func identitySummary(_ identity: AccessoryIdentity) -> String {
        "\(shown(identity.name)) (\(shown(identity.manufacturer)) \(shown(identity.modelIdentifier)), firmware \(shown(identity.firmwareVersion))), "
            + "\(identity.protocols.count) protocol\(identity.protocols.count == 1 ? "" : "s")"
    }

    static func daemonAdvice(_ socket: String) -> String {
        "iapd is running (it listens at \(socket)) and holds the machine's accessories: stop it with "
            + "'sudo systemctl stop iapd.socket iapd.service' (or end the iapd process), run iapctl report again, "
            + "then start it again with 'sudo systemctl start iapd.socket'"
    }

    /// The one line for standard error, and the RESULT line.
    var verdict: String {
        let all = steps
        if let stop = all.first(where: { $0.failure != nil && !$0.name.hasPrefix("session ") }) {
            return "stopped at \(stop.name): \(stop.failure ?? "")"
        }
        let failedSessions = all.filter { $0.failure != nil }
        if let first = failedSessions.first {
            return "\(failedSessions.count) of \(sessions.count) sessions failed, the first at \(first.name): \(first.failure ?? "")"
        }
        return "all steps passed"
    }

    /// What to do next after the step that failed.
    static func advice(for step: String) -> String {
        switch step {
        case "open":
            return "Check that the accessory is connected ('iapctl -v list' shows what the host finds). For permission errors see "
                + "README, 'Access without root'; for a serial port, that no other program has it open."
        case "detect":
            return "The accessory did not answer. Check that it is powered and attached, and on a serial line the baud rate "
                + "(--serial DEVICE:BAUD) and the wiring (TX to RX)."
        case "link":
            return "The accessory did not complete the iAP2 link. The SYN packets above show its offer and the host's answer."
        case "authentication":
            return "Under --auth require an accessory must verify against --trust. Run the report again with --auth record "
                + "(the default) to see the steps after it; the certificate and the verdict are below."
        case "identification":
            return "The host refused the accessory's IdentificationInformation: the log lines below name the parameters "
                + "that are missing or wrong; the decoded identification shows what it sent."
        default:
            return "The session step records what the accessory did; the log lines below say more. The other protocols were still tried."
        }
    }

    // MARK: The text

    func render(fileName: String) -> String {
        var out: [String] = []
        let steps = self.steps
        var name = utsname()
        uname(&name)
        func field<T>(_ value: inout T) -> String {
            withUnsafeBytes(of: &value) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        }
        out.append("iapctl report")
        out.append("=============")
        out.append("written:  \(WallClock.iso8601(.nanoseconds(Int64(started)))) by iapctl \(toolVersion())")
        out.append("system:   \(field(&name.sysname)) \(field(&name.release)) \(field(&name.machine))")
        out.append("command:  iapctl " + CommandLine.arguments.dropFirst().map { ReportText.shellQuoted($0.escapedForTerminal) }.joined(separator: " "))
        out.append("privacy:  " + (full ? "--full: serial numbers and the certificate are included"
                                         : "serial numbers, the certificate's subject and serial and the certificate bytes are left out (--full includes them)"))
        out.append("")
        out.append("RESULT: \(verdict.escapedForTerminal)")
        out.append("")
        out.append("STEPS (times from the start of the report)")
        for step in steps {
            out.append("  \(step.mark) \(at(step.time))  \(step.name): \(step.summary)")
            if let failure = step.failure { out.append("      ✘ \(shown(failure))") }
            for detail in step.details { out.append("      \(detail)") }
        }
        if let stop = steps.first(where: { $0.failure != nil }) {
            out.append("")
            out.append("WHERE IT STOPPED")
            out.append("  \(stop.name): \(shown(stop.failure ?? ""))")
            if stop.name == "open", daemonSocket != nil {
                out.append("  next: Stop iapd (below), then run the report again.")
            } else {
                out.append("  next: " + Self.advice(for: stop.name.hasPrefix("session ") ? "session" : stop.name))
            }
        }
        if let daemonSocket {
            out.append("")
            out.append("IAPD")
            out.append("  " + Self.daemonAdvice(daemonSocket) + ".")
        }
        if failures.count > 1 || (failures.count == 1 && wireIndex.map({ !failures[0].hasPrefix(wires[$0].location) }) ?? true) {
            out.append("")
            out.append("OTHER FAILURES")
            for failure in failures { out.append("  \(shown(failure))") }
        }
        out += connectionSection()
        out += usbSection()
        out += linkSection()
        out += authenticationSection()
        out += identificationSection()
        out += logSection()
        out += framesSection()
        out += traceSection(fileName: fileName)
        return out.joined(separator: "\n") + "\n"
    }

    func connectionSection() -> [String] {
        guard let index = wireIndex else { return [] }
        let wire = wires[index]
        var out = ["", "CONNECTION", "  transport: \(wire.kind.rawValue)", "  location:  \(shown(wire.location))"]
        if let accessory {
            out.append("  connection id: \(accessory.connectionID), protocol \(accessory.protocolVersion.rawValue), "
                       + (connectedAtEnd ? "still connected after the sessions" : "gone before the sessions were done"))
            for (time, id, reason) in departures where id == accessory.connectionID {
                out.append("  \(at(time)) disconnected: \(shown(reason))")
            }
        }
        if wires.count > 1 {
            out.append("  other traced connections: " + wires.enumerated().filter { $0.offset != index }.map { shown($0.element.location) }.joined(separator: "; "))
        }
        return out
    }

    func usbSection() -> [String] {
        guard let device = accessory?.usbDevice ?? wireIndex.flatMap({ wires[$0].usb }) else { return [] }
        let d = device.descriptor
        var out = ["", "USB DEVICE"]
        out.append("  id:            \(d.idString) (vendor 0x\(ReportText.hex4(d.vendorID)), product 0x\(ReportText.hex4(d.productID)))")
        out.append("  where:         bus \(device.bus) address \(device.address), port \(device.location), \(device.devicePath)")
        out.append("  manufacturer:  " + (device.manufacturer.map { "\"\(shown($0))\"" } ?? "(none)"))
        out.append("  product:       " + (device.product.map { "\"\(shown($0))\"" } ?? "(none)"))
        out.append("  serial:        " + serial(device.serialNumber))
        out.append("  release:       0x\(ReportText.hex4(d.release)), device class 0x\(ReportText.hex2(d.deviceClass)), "
                   + "\(d.configurationCount) configuration\(d.configurationCount == 1 ? "" : "s"), "
                   + "active: \(device.activeConfiguration.map(String.init) ?? "none")")
        for configuration in device.configurations {
            out.append("  configuration \(configuration.value): attributes 0x\(ReportText.hex2(configuration.attributes)), "
                       + "max power \(Int(configuration.maxPower) * 2) mA")
            for interface in configuration.interfaces {
                var line = "    interface \(interface.number) alt \(interface.alternateSetting): class \(interface.classTriple)"
                if let name = device.nativeInterfaceNames[interface.number] {
                    line += ", name \"\(shown(name))\""
                } else if interface.nameIndex != 0 {
                    line += ", name string \(interface.nameIndex) (not read)"
                }
                out.append(line)
                for endpoint in interface.endpoints { out.append("      \(endpoint)") }
            }
        }
        if let function = device.function {
            out.append("  iAP2 interface: configuration \(function.configurationValue), interface \(function.interface.number), "
                       + "\(function.bulkIn) / \(function.bulkOut)")
            for native in function.nativeInterfaces {
                out.append("  native transport: interface \(native.number) alt \(native.alternateSetting), \(native.bulkIn) / \(native.bulkOut)")
            }
        }
        return out
    }

    func linkSection() -> [String] {
        guard let statistics = linkStatistics else { return [] }
        return ["", "LINK COUNTERS (at the end)",
                "  packets sent \(statistics.packetsSent), received \(statistics.packetsReceived), retransmissions \(statistics.retransmissions), "
                    + "duplicates \(statistics.duplicatesReceived), out of order \(statistics.outOfOrderReceived), EAKs sent \(statistics.eaksSent) "
                    + "received \(statistics.eaksReceived), malformed SYNs \(statistics.malformedSYNsDropped), partial frames abandoned "
                    + "\(statistics.partialFramesAbandoned)"]
    }

    func authenticationSection() -> [String] {
        guard wireIndex != nil else { return [] }
        var out = ["", "AUTHENTICATION"]
        out.append("  policy:      --auth \(command.value("auth") ?? "record")" + (command.value("trust").map { ", --trust \(shown($0))" } ?? ", no --trust")
                   + (command.flag("check-validity") ? ", --check-validity" : ""))
        if let outcome = accessory?.identity.authentication {
            out.append("  verdict:     \(shown(outcome.description))")
            if outcome.status != .notChecked {
                out.append("  signature:   \(outcome.signatureVerified ? "verified" : "not verified")")
                out.append("  chain:       \(outcome.chainVerified ? "to a trust anchor" : "not verified")")
            }
        } else if let line = records.last(where: { $0.message.hasPrefix("authentication: ") }) {
            out.append("  verdict:     \(shown(String(line.message.dropFirst("authentication: ".count))))")
        } else if let index = wireIndex, FirstMessages(analysis.frames(on: index))[.authenticationFailed, fromAccessory: false] != nil {
            out.append("  verdict:     refused: \(shown(failureReason ?? "AuthenticationFailed"))")
        } else {
            out.append("  verdict:     none recorded")
        }
        if let certificate {
            out.append("  certificate:")
            out.append("    subject:   " + (full ? "\"\(certificate.subject.escapedForTerminal)\"" : ReportCommand.leftOut))
            out.append("    issuer:    \"\(shown(certificate.issuer))\"")
            out.append("    serial:    " + serial(certificate.serialNumber))
            out.append("    valid:     \(certificate.notBefore) to \(certificate.notAfter) (\(certificate.validity.rawValue))")
            out.append("    key:       \(shown(certificate.key))" + (certificate.scheme.map { ", \($0)" } ?? ""))
            out.append("    signature: \(shown(certificate.signatureAlgorithm))")
        }
        if let index = wireIndex, let der = analysis.certificates[index] {
            if full {
                out.append("  certificate bytes (\(der.count), as sent, base64):")
                out += base64Lines(der).map { "    " + $0 }
            } else {
                out.append("  certificate bytes (\(der.count)): \(ReportCommand.leftOut)")
            }
        }
        return out
    }

    func identificationSection() -> [String] {
        var out = ["", "IDENTIFICATION"]
        guard let identity = accessory?.identity else {
            if let index = wireIndex, let message = analysis.identifications[index] {
                out.append("  (not accepted; the IdentificationInformation as sent:)")
                var copy = message
                if !full {
                    copy.parameters = copy.parameters.map { parameter in
                        parameter.id == IdentificationParameter.serialNumber ? .string(parameter.id, ReportCommand.leftOut) : parameter
                    }
                }
                out += FrameInspector.describe(copy).map { "  " + shown($0) }
            } else {
                out.append("  not reached")
            }
            return out
        }
        func name(_ id: UInt16) -> String { "0x\(ReportText.hex4(id)) \(MessageID(id))" }
        out.append("  name:              \"\(shown(identity.name))\"")
        out.append("  model:             \"\(shown(identity.modelIdentifier))\"")
        out.append("  manufacturer:      \"\(shown(identity.manufacturer))\"")
        out.append("  serial number:     " + serial(identity.serialNumber))
        out.append("  firmware revision: \"\(shown(identity.firmwareVersion))\"")
        out.append("  hardware revision: \"\(shown(identity.hardwareVersion))\"")
        out.append("  protocol version:  \(identity.protocolVersion.rawValue)")
        out.append("  messages sent (\(identity.messagesSent.count)):")
        out += identity.messagesSent.map { "    " + name($0) }
        out.append("  messages received (\(identity.messagesReceived.count)):")
        out += identity.messagesReceived.map { "    " + name($0) }
        let power = ["none", "Lightning receptacle pass-through", "advanced"]
        out.append("  power:             provides \(identity.powerProvidingCapability < 3 ? power[Int(identity.powerProvidingCapability)] : "\(identity.powerProvidingCapability)"), "
                   + "draws up to \(identity.maximumCurrentDrawnFromDevice) mA from the device")
        out.append("  languages:         \(shown(identity.currentLanguage)) (supports \(identity.supportedLanguages.map(shown).joined(separator: ", ")))")
        if let team = identity.appMatchTeamID { out.append("  app match team id: \"\(shown(team))\"") }
        if let plan = identity.productPlanUID { out.append("  product plan UID:  \"\(shown(plan))\"") }
        out.append("  protocols (\(identity.protocols.count)):")
        for item in identity.protocols {
            let native = item.nativeTransportComponentIdentifier.map { component in
                ", native transport component \(component)"
                    + (accessory?.usbDevice?.nativeInterfaceNames.first { $0.value == item.name }.map { " (USB interface \($0.key))" } ?? "")
            } ?? ""
            out.append("    \(item.identifier)  \"\(shown(item.name))\"  match action \(item.matchAction)\(native)")
        }
        out.append("  transport components (\(identity.transportComponents.count)):")
        for component in identity.transportComponents {
            let address = component.bluetoothAddress.map { bytes in ", MAC " + bytes.map(ReportText.hex2).joined(separator: ":") } ?? ""
            out.append("    \(component.kindName) \(component.identifier) \"\(shown(component.name))\"\(component.supportsIAP2 ? ", iAP2" : "")\(address)")
        }
        return out
    }

    func logSection() -> [String] {
        var out = ["", "LOG (the host's lines at notice level and above, and the tolerated deviations)"]
        let notable = records.filter { $0.level >= .notice || $0.message.hasPrefix("tolerated") }
        if notable.isEmpty { out.append("  (none)") }
        for record in notable {
            let time = UInt64(max(0, record.timestamp.components.seconds)) * 1_000_000_000 + UInt64(record.timestamp.components.attoseconds / 1_000_000_000)
            var line = "  \(at(time)) \(record.level): \(shown(record.message))"
            for key in record.metadata.keys.sorted() { line += " \(key)=\(shown(record.metadata[key] ?? ""))" }
            out.append(line)
        }
        out.append("  (\(records.count - notable.count) lines at info and debug level not shown"
                   + (droppedRecords > 0 ? "; \(droppedRecords) older lines were not kept" : "") + ")")
        return out
    }

    func framesSection() -> [String] {
        guard let index = wireIndex else { return [] }
        let frames = analysis.frames(on: index)
        let limit = 200
        var out = ["", "FRAMES (\(frames.count) on this connection" + (frames.count > limit ? "; the first \(limit)" : "") + ")"]
        for frame in frames.prefix(limit) { out.append("  \(at(frame.time)) \(frame.direction.arrow)  \(scrubbed(frame.summary))") }
        if frames.count > limit { out.append("  … \(frames.count - limit) more in the trace") }
        return out
    }

    func traceSection(fileName: String) -> [String] {
        var out = ["", "TRACE"]
        let withheld = !full && !analysis.iap1Interfaces.isEmpty
        if withheld {
            out.append("  Not embedded: the accessory spoke iAP1, and its serial number and certificate are not taken out of iAP1 frames.")
            out.append("  Run the report again with --full to embed it (it then holds them), or send the report as it is.")
            return out
        }
        let bytes = analysis.embeddedTrace
        out.append("  The whole exchange in pcapng (iapctl's trace format, \(bytes.count) bytes, \(analysis.frames.count) frames"
                   + (full ? "" : "; the serial numbers and certificate bytes overwritten in \(analysis.redactedFrames) frame\(analysis.redactedFrames == 1 ? "" : "s"), checksums recomputed") + ").")
        if analysis.cutPackets > 0 {
            out.append("  Session data is cut to its first \(TraceAnalysis.keptDataBytes) bytes per packet (\(analysis.cutPackets) packets, "
                       + "\(analysis.cutBytes) bytes left out; the packets encoded again with their checksums): for every byte, "
                       + "run the report with --trace-file FILE.pcapng.")
        }
        out.append("  Extract it, then read it with iapctl decode or Wireshark (tools/wireshark/iap.lua):")
        out.append("    sed -n '/^-----BEGIN PCAPNG/,/^-----END PCAPNG/p' \(ReportText.shellQuoted(fileName)) | sed '1d;$d' | base64 -d > trace.pcapng")
        out.append("    iapctl decode --pcap trace.pcapng")
        out.append("-----BEGIN PCAPNG TRACE-----")
        out += base64Lines(bytes)
        out.append("-----END PCAPNG TRACE-----")
        return out
    }
}

/// The first frame of each control message, by id and sender: when, which way, and the length
/// of its parameter 0 (the certificate, the challenge, the response). Plain values, read once.
struct FirstMessages {
    /// One message's first frame.
    struct Entry {
        var time: UInt64
        var arrow: String
        var length: Int?
    }
    private var entries: [UInt32: Entry] = [:]

    @inline(never)
    init(_ frames: [TracedFrame]) {
        for frame in frames {
            guard let message = frame.message else { continue }
            let key = Self.key(message.id, frame.fromAccessory)
            if entries[key] == nil {
                entries[key] = Entry(time: frame.time, arrow: frame.direction.arrow, length: message.parameter(0).map { $0.data.count })
            }
        }
    }

    /// The first `id` sent by the accessory (or by the host).
    subscript(_ id: MessageID, fromAccessory fromAccessory: Bool) -> Entry? { entries[Self.key(id, fromAccessory)] }

    private static func key(_ id: MessageID, _ fromAccessory: Bool) -> UInt32 { UInt32(id.rawValue) << 1 | (fromAccessory ? 1 : 0) }
}

/// Small formatting helpers of the report.
enum ReportText {
    static func hex2(_ value: UInt8) -> String { value < 16 ? "0" + String(value, radix: 16, uppercase: true) : String(value, radix: 16, uppercase: true) }
    static func hex4(_ value: UInt16) -> String { hex2(UInt8(value >> 8)) + hex2(UInt8(value & 0xFF)) }

    /// Seconds with milliseconds, e.g. `0.012 s`.
    static func seconds(_ value: Double) -> String {
        let milliseconds = Int((value * 1000).rounded())
        let fraction = String(milliseconds % 1000)
        return "\(milliseconds / 1000)." + String(repeating: "0", count: 3 - fraction.count) + fraction + " s"
    }

    /// A duration in nanoseconds as milliseconds with one decimal, e.g. `1.3 ms`.
    static func milliseconds(_ nanoseconds: UInt64) -> String {
        let tenths = (nanoseconds + 50_000) / 100_000
        return "\(tenths / 10).\(tenths % 10) ms"
    }

    /// Bytes as hex and, where printable, as text: `69 61 70 … "iap…"`.
    static func preview(_ bytes: [UInt8]) -> String {
        let shown = bytes.prefix(32)
        let hex = shown.map(hex2).joined(separator: " ")
        let text = String(shown.map { $0 >= 0x20 && $0 < 0x7F ? Character(Unicode.Scalar($0)) : "." })
        return hex + (bytes.count > shown.count ? " …" : "") + "  \"\(text)\""
    }

    /// A word as a shell reads it back: as it is when it is plain, else in single quotes.
    static func shellQuoted(_ word: String) -> String {
        let plain = !word.isEmpty && word.unicodeScalars.allSatisfy { scalar in
            (scalar >= "a" && scalar <= "z") || (scalar >= "A" && scalar <= "Z") || (scalar >= "0" && scalar <= "9")
                || "-_./=:,+@%".unicodeScalars.contains(scalar)
        }
        return plain ? word : "'" + word.replacing("'", with: "'\\''") + "'"
    }

    /// SYN parameters in a line.
    static func parameters(_ p: LinkParameters) -> String {
        "v\(p.version), \(p.maxOutstandingPackets) packets of \(p.maxPacketLength) bytes, retransmission \(p.retransmissionTimeout) ms, "
            + "cumulative ACK \(p.cumulativeAckTimeout) ms, \(p.maxRetransmissions) retransmissions, \(p.maxCumulativeAcks) cumulative ACKs; "
            + "sessions " + p.sessions.map { "\($0.id) \($0.type) v\($0.version)" }.joined(separator: ", ")
    }
}
