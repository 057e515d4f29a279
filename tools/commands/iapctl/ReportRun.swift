// iapctl report: the steps it runs and what it finds (ReportRun), each protocol's probe.

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
            let rejection = records.last { $0.message.hasPrefix("identification rejected: ") }
            why = reason ?? rejection.map { "the host rejected it: " + String($0.message.dropFirst("identification rejected: ".count)) }
                ?? "the identification was not accepted"
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
            if case .passed = probe.outcome, let unanswered = unansweredSession(probe) { step.outcome = .failed(unanswered) }
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

    /// The one line for standard error, and the RESULT line: where it stopped and the cause
    /// the trace shows.
    var verdict: String {
        let all = steps
        if let stop = all.first(where: { $0.failure != nil && !$0.name.hasPrefix("session ") }) {
            return "stopped at \(stop.name): \(cause(of: stop).summary)"
        }
        let failedSessions = all.filter { $0.failure != nil }
        if let first = failedSessions.first {
            return "\(failedSessions.count) of \(sessions.count) sessions failed, the first at \(first.name): \(cause(of: first).summary)"
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
            return "The messages above show how far the authentication went; the certificate and the verdict are under AUTHENTICATION, "
                + "and 'iapctl decode' checks a captured exchange offline (on the trace of a report made with --full)."
        case "identification":
            return "The host refused the accessory's IdentificationInformation: the log lines below name the parameters "
                + "that are missing or wrong; the decoded identification shows what it sent."
        default:
            return "The session step records what the accessory did; the log lines below say more. The other protocols were still tried."
        }
    }
}
