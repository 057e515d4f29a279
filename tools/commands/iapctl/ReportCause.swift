// iapctl report: the cause of the step that stopped, named from what the trace shows (a gap in
// the accessory's sequence numbers, a message it never sent, a refusal and its reason, a
// session it never answered, an accessory that left), with the frames that show it and advice
// that fits the cause and the policy.

import AccessoryHost
import IAPWire

/// Why a step failed, as the trace and the host's log show it.
struct ReportCause {
    /// The kinds of cause the report tells apart (the JSON `cause.kind`).
    enum Kind: String, CaseIterable {
        /// The port or device could not be opened, or no accessory was found.
        case notFound = "not-found"
        /// The accessory sent nothing, or nothing readable, to the detect.
        case noAnswer = "no-answer"
        /// The iAP2 link did not come up.
        case linkNotCompleted = "link-not-completed"
        /// The accessory's packets waited behind one it never sent again.
        case sequenceGap = "sequence-gap"
        /// The accessory stopped acknowledging the host's packets.
        case accessorySilent = "accessory-silent"
        /// The accessory took a request and never sent the message that answers it.
        case messageNeverSent = "message-never-sent"
        /// The host refused the accessory's authentication.
        case authenticationRefused = "authentication-refused"
        /// The host refused the accessory's identification.
        case identificationRefused = "identification-refused"
        /// The accessory took a session's start and never answered it.
        case sessionNeverAnswered = "session-never-answered"
        /// The accessory refused or ended a session.
        case sessionEnded = "session-ended"
        /// The accessory went away.
        case accessoryLeft = "accessory-left"
        /// Something else (the host's reason says what).
        case other
    }

    var kind: Kind
    /// One sentence.
    var summary: String
    /// The frames and host's lines that show it, one a line.
    var evidence: [String] = []
    /// What to do next.
    var advice: String
}

/// The requests whose answer a step waits for: the host's message and the accessory's.
private let awaitedAnswers: [String: [(request: MessageID, answer: MessageID)]] = [
    "authentication": [(.requestAuthenticationCertificate, .authenticationCertificate),
                       (.requestAuthenticationChallengeResponse, .authenticationResponse)],
    "identification": [(.startIdentification, .identificationInformation)],
]

/// Whether `acknowledgement` covers `sequence` (sequence numbers wrap at 256).
private func covers(_ acknowledgement: UInt8, _ sequence: UInt8) -> Bool { acknowledgement &- sequence < 128 }

/// A sequence number as the report's frame list prints it (decimal).
private func number(_ value: UInt8) -> String { String(value) }

/// A list of sequence numbers as ranges: `0x24…0x26, 0x29`.
private func numbers(_ values: [UInt8]) -> String {
    var runs: [(UInt8, UInt8)] = []
    for value in values {
        if let last = runs.last, last.1 &+ 1 == value { runs[runs.count - 1].1 = value } else { runs.append((value, value)) }
    }
    return runs.map { $0.0 == $0.1 ? number($0.0) : "\(number($0.0))…\(number($0.1))" }.joined(separator: ", ")
}

extension ReportRun {
    /// The cause of `step`'s failure, from the trace and the host's log.
    func cause(of step: ReportStep) -> ReportCause {
        // Texts from outside (the host's reasons quote the accessory) are escaped and scrubbed
        // here, once: a cause is printed as it is.
        let reason = shown(step.failure ?? "")
        let policy = command.value("auth") ?? "record"
        guard let index = wireIndex else {
            return ReportCause(kind: .notFound, summary: reason, advice: Self.advice(for: "open"))
        }
        let frames = analysis.frames(on: index)
        if let left = accessoryLeft(step, frames: frames) { return left }
        if step.name == "detect" { return ReportCause(kind: .noAnswer, summary: reason, advice: Self.advice(for: "detect")) }
        if step.name == "link" { return ReportCause(kind: .linkNotCompleted, summary: reason, advice: Self.advice(for: "link")) }
        if step.name == "authentication", let refusal = frames.first(where: { !$0.fromAccessory && $0.messageID == .authenticationFailed }) {
            var cause = ReportCause(kind: .authenticationRefused, summary: "the host refused the accessory's authentication: \(reason)",
                                    evidence: ["\(at(refusal.time)) host → acc  AuthenticationFailed"], advice: "")
            cause.advice = policy == "require"
                ? "Under --auth require an accessory must verify against --trust (the verdict is under AUTHENTICATION). Check the "
                    + "captured exchange offline with 'iapctl decode --trust CA.pem' on the trace of a report made with --full; run the "
                    + "report again with --auth record (the default) to see the steps after it."
                : "The accessory sent AuthenticationFailed's cause itself or the host could not go on; the log lines below say why."
            return cause
        }
        if step.name == "identification", let rejection = frames.first(where: { !$0.fromAccessory && $0.messageID == .identificationRejected }) {
            let why = records.first { $0.message.hasPrefix("identification rejected: ") }
                .map { String($0.message.dropFirst("identification rejected: ".count)) }
            var cause = ReportCause(kind: .identificationRefused,
                                    summary: "the host refused the accessory's IdentificationInformation" + (why.map { ": \(shown($0))" } ?? ""),
                                    advice: "The accessory's IdentificationInformation (decoded under IDENTIFICATION) lacks or gets wrong what the "
                                        + "host names; the accessory's maker must correct it (docs/LENIENCY.md says what the host takes as it is).")
            if let sent = frames.last(where: { $0.fromAccessory && $0.messageID == .identificationInformation }) {
                cause.evidence.append("\(at(sent.time)) acc → host  IdentificationInformation")
            }
            cause.evidence.append("\(at(rejection.time)) host → acc  IdentificationRejected" + (why.map { ": \(shown($0))" } ?? ""))
            return cause
        }
        // A gap blames the step it happened in: its first EAK after the step before had passed.
        let before = steps.last { $0.time != nil && $0.failure == nil && ($0.time ?? 0) <= (step.time ?? .max) }?.time ?? 0
        if let gap = sequenceGap(frames, index: index, after: before) { return gap }
        if let stalled = unansweredRequest(step, frames: frames, index: index) { return stalled }
        if step.name.hasPrefix("session ") {
            if step.failure?.contains("never answered the session") == true {
                return ReportCause(kind: .sessionNeverAnswered, summary: reason,
                                   advice: "The accessory took StartExternalAccessoryProtocolSession and answered it neither with its status nor "
                                       + "with data. Check that the protocol is one its firmware serves now (some serve a protocol only after "
                                       + "a command on another, or only to their own app's first message), then send this report to its maker.")
            }
            return ReportCause(kind: .sessionEnded, summary: reason, advice: Self.advice(for: "session"))
        }
        return ReportCause(kind: .other, summary: reason, advice: Self.advice(for: step.name))
    }

    /// The accessory went away: a departure of the accessory reported on, or a transport that
    /// closed under a step before identification.
    private func accessoryLeft(_ step: ReportStep, frames: [TracedFrame]) -> ReportCause? {
        // A departure after the step ended is not its cause (a later session's, perhaps).
        let end = (step.time ?? finished) + 50_000_000
        let gone = accessory.flatMap { accessory in departures.first { $0.1 == accessory.connectionID && $0.0 <= end } }
        let closed = failureReason.flatMap { reason in
            ["disconnected", "closed", "vanished", "went away", "unplugged", "no such device"].contains { reason.lowercased().contains($0) } ? reason : nil
        }
        guard gone != nil || (closed != nil && accessory == nil) else { return nil }
        let reason = gone.map { shown($0.2) } ?? shown(closed ?? "")
        var cause = ReportCause(kind: .accessoryLeft, summary: "the accessory went away during \(step.name): \(reason)",
                                advice: "The accessory left the bus or closed its port. Check its power (a bus-powered accessory may draw more "
                                    + "than the port gives), the cable and hub, and the kernel's log (journalctl -k) for a USB reset at that "
                                    + "time; an accessory that leaves when it is not answered in time (the FLIR ONE, PROTOCOL.md §7.1) "
                                    + "shows a detect or SYN just before.")
        if let last = frames.last(where: \.fromAccessory) {
            cause.evidence.append("\(at(last.time)) acc → host  \(scrubbed(last.summary))  (the last frame from the accessory)")
        }
        if let gone { cause.evidence.append("\(at(gone.0)) disconnected: \(shown(gone.2))") }
        return cause
    }

    /// Packets the accessory never sent again although the host's EAKs asked for them, with
    /// the packets that waited behind them.
    private func sequenceGap(_ frames: [TracedFrame], index: Int, after start: UInt64) -> ReportCause? {
        let eaks = frames.filter { !$0.fromAccessory && $0.time >= start && ($0.header?.control.contains(.eak) ?? false) }
        guard let firstEAK = eaks.first, let lastEAK = eaks.last else { return nil }
        var missing: [UInt8] = []
        var behind: [UInt8] = []
        for eak in eaks {
            guard let header = eak.header else { continue }
            for value in ExtendedAcknowledgement.missing(after: header.acknowledgement, received: eak.outOfOrder) where !missing.contains(value) {
                missing.append(value)
            }
            for value in eak.outOfOrder where !behind.contains(value) { behind.append(value) }
        }
        let resent = Set(frames.filter { $0.fromAccessory && $0.time >= firstEAK.time && ($0.header.map { $0.payloadLength > 0 } ?? false) }
            .compactMap { $0.header?.sequence })
        let lost = missing.filter { !resent.contains($0) }
        guard !lost.isEmpty else { return nil }
        let lostText = lost.count == 1 ? "packet \(number(lost[0]))" : "packets \(numbers(lost))"
        var summary = "the accessory's \(lostText) never came: its packets \(numbers(behind.sorted { ($0 &- lost[0]) < ($1 &- lost[0]) })) "
            + "came after and waited behind the gap; the host sent \(eaks.count) EAK\(eaks.count == 1 ? "" : "s") asking for "
            + (lost.count == 1 ? "it" : "them") + " and the accessory never sent " + (lost.count == 1 ? "it" : "them") + " again"
        var evidence = ["\(at(firstEAK.time)) host → acc  the first EAK: \(scrubbed(firstEAK.summary)), missing \(numbers(missing))",
                        "\(at(lastEAK.time)) host → acc  the last of \(eaks.count) EAKs"]
        if let skipped = records.first(where: { $0.message.contains("never sent packet") }) {
            let time = UInt64(max(0, skipped.timestamp.components.seconds)) * 1_000_000_000
                + UInt64(skipped.timestamp.components.attoseconds / 1_000_000_000)
            evidence.append("\(at(time)) the host: \(shown(skipped.message))")
        }
        if let incomplete = analysis.incompleteMessages[index]?.first {
            summary += "; so \(incomplete.id), spread over \(incomplete.parts) packets, never came whole (\(incomplete.received) of its "
                + "\(incomplete.declared) bytes)"
        }
        return ReportCause(kind: .sequenceGap, summary: summary, evidence: evidence,
                           advice: "The accessory lost a packet and did not send it again, where the reference retransmits it after its "
                               + "retransmission timeout (PROTOCOL.md §2.5). Check the cable, hub or serial line (its baud rate and flow "
                               + "control); when it happens at the same packet every time, it is the accessory's firmware: send this "
                               + "report to its maker.")
    }

    /// The host's request the step waited on that the accessory never answered: acknowledged
    /// and not answered (a message never sent), or not acknowledged at all (silent).
    private func unansweredRequest(_ step: ReportStep, frames: [TracedFrame], index: Int) -> ReportCause? {
        guard let pairs = awaitedAnswers[step.name] else { return nil }
        for (request, answer) in pairs {
            guard let asked = frames.last(where: { !$0.fromAccessory && $0.messageID == request }), let sequence = asked.header?.sequence else { continue }
            let after = frames.filter { $0.time >= asked.time }
            if after.contains(where: { $0.fromAccessory && $0.messageID == answer }) { continue }
            let waited = ReportText.seconds(Double(finished - min(finished, asked.time)) / 1e9)
            let sends = frames.filter { !$0.fromAccessory && $0.messageID == request }
            if let acknowledged = after.first(where: { $0.fromAccessory && ($0.header.map { covers($0.acknowledgement, sequence) } ?? false) }) {
                var summary = "the accessory acknowledged the host's \(request) and never sent \(answer) in the \(waited) that followed"
                if let part = analysis.incompleteMessages[index]?.first(where: { $0.id == answer }) {
                    summary = "the accessory began \(answer) in \(part.parts) packet\(part.parts == 1 ? "" : "s") but sent only "
                        + "\(part.received) of its \(part.declared) bytes in the \(waited) after the host's \(request)"
                }
                return ReportCause(kind: .messageNeverSent, summary: summary,
                                   evidence: ["\(at(asked.time)) host → acc  \(request) (seq \(number(sequence)))",
                                              "\(at(acknowledged.time)) acc → host  \(scrubbed(acknowledged.summary))  (acknowledges it)"],
                                   advice: "The accessory took the request and did not answer it: its firmware or its coprocessor is stuck at "
                                       + "this step. Unplug it and plug it in again; when it stays, send this report to its maker (the "
                                       + "host waits up to 10 s for an answer; a longer --timeout lets the report see more).")
            }
            let last = frames.last(where: \.fromAccessory)
            let spoke = after.filter(\.fromAccessory).count
            return ReportCause(kind: .accessorySilent,
                               summary: "the accessory did not acknowledge the host's \(request) (sent \(sends.count) time\(sends.count == 1 ? "" : "s")) "
                                   + (spoke == 0 ? "and sent nothing in the \(waited) after it"
                                      : "in the \(waited) after it, although it sent \(spoke) frame\(spoke == 1 ? "" : "s") (none acknowledging it)"),
                               evidence: ["\(at(asked.time)) host → acc  \(request) (seq \(number(sequence)))"]
                                   + (last.map { ["\(at($0.time)) acc → host  \(scrubbed($0.summary))  (the last frame from the accessory)"] } ?? []),
                               advice: "The accessory stopped answering on the link: check that it is still powered and attached, and on a "
                                   + "serial line the wiring and the baud rate.")
        }
        return nil
    }

    /// A session the accessory never answered: it declares StatusExternalAccessoryProtocolSession
    /// but sent none for the session the host started, and nothing came back on it. Nil when it
    /// answered, or when it does not declare the status (the FLIR ONE: served, PROTOCOL.md §7.1).
    func unansweredSession(_ probe: SessionProbe) -> String? {
        guard let accessory, accessory.protocolVersion == .iap2, !probe.native,
              accessory.identity.messagesSent.contains(MessageID.statusExternalAccessoryProtocolSession.rawValue),
              let index = wireIndex else { return nil }
        let frames = analysis.frames(on: index)
        guard let start = frames.last(where: { frame in
            !frame.fromAccessory && frame.messageID == .startExternalAccessoryProtocolSession
                && frame.message?.parameter(0)?.data.first == probe.identifier
        }), let idBytes = start.message?.parameter(1)?.data, idBytes.count == 2 else { return nil }
        let session = UInt16(idBytes[0]) << 8 | UInt16(idBytes[1])
        let answered = frames.contains { frame in
            frame.fromAccessory && frame.time >= start.time
                && ((frame.messageID == .statusExternalAccessoryProtocolSession && frame.message?.parameter(0)?.data == idBytes)
                    || frame.eaSession == session)
        }
        guard !answered else { return nil }
        return "the accessory never answered the session: it declares StatusExternalAccessoryProtocolSession but sent none for "
            + "session \(session) (started at \(String(at(start.time).prefix { $0 != " " }))), and nothing came back on it"
    }
}
