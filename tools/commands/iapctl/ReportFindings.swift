// iapctl report: the findings for an accessory's maker (each deviation from the reference the
// host tolerated on this accessory, where it is in the trace, what an iPhone is known to do
// about it and the source, from the simulator's catalogue of deviations), and the report as
// JSON.

import AccessoryHost
import AccessoryLogging
import AccessorySimulator
import IAPInspect
import IAPWire

/// One deviation the host tolerated on the accessory reported on.
struct ReportFinding {
    /// The catalogue's entry (its name, what an iPhone does, the source).
    var deviation: SimulatorProfile.Deviation
    /// Its frame in the report's frame list (1-based), when the trace shows it.
    var frame: Int?
    /// When it was seen (nanoseconds since the epoch).
    var time: UInt64?
    /// What was seen: the host's words, or what the trace shows.
    var seen: String
}

extension ReportRun {
    /// When a log record was made, in nanoseconds since the epoch.
    static func time(of record: LogRecord) -> UInt64 {
        UInt64(max(0, record.timestamp.components.seconds)) * 1_000_000_000 + UInt64(record.timestamp.components.attoseconds / 1_000_000_000)
    }

    /// The deviations from the reference the host tolerated on this accessory, in the order
    /// they were seen: from the host's `tolerated` lines (each placed at the accessory's frame
    /// the host was reading) and from the trace itself.
    var findings: [ReportFinding] {
        guard let index = wireIndex else { return [] }
        let frames = analysis.frames(on: index)
        var found: [ReportFinding] = []
        func add(_ deviation: SimulatorProfile.Deviation, frame: Int?, time: UInt64?, seen: String) {
            guard deviation.departsFromReference, !found.contains(where: { $0.deviation == deviation }) else { return }
            found.append(ReportFinding(deviation: deviation, frame: frame.map { $0 + 1 }, time: time, seen: seen))
        }
        func lastFromAccessory(atOrBefore time: UInt64) -> Int? { frames.lastIndex { $0.fromAccessory && $0.time <= time } }

        // What the host said it tolerated.
        for record in records {
            let text = record.message
            let tolerated = text.hasPrefix("tolerated: ")
            guard tolerated || text.contains("sends packets longer than") else { continue }
            let time = Self.time(of: record)
            let frame = lastFromAccessory(atOrBefore: time)
            if text.contains("sends packets longer than") { add(.oversizedPackets, frame: frame, time: time, seen: text) }
            if text.contains("never sent packet") { add(.neverRetransmits, frame: frame, time: time, seen: text) }
            for deviation in SimulatorProfile.Deviation.allCases {
                if let says = deviation.hostSays, text.contains(says) { add(deviation, frame: frame, time: time, seen: text) }
            }
        }

        // What the trace shows.
        let fromAccessory = frames.indices.filter { frames[$0].fromAccessory }
        if let firstSYN = fromAccessory.first(where: { frames[$0].syn != nil }) {
            let syn = frames[firstSYN]
            if !fromAccessory.contains(where: { $0 < firstSYN && frames[$0].isDetect }) {
                add(.skipsDetect, frame: firstSYN, time: syn.time, seen: "its first frame is its SYN, without the detect before it")
            }
            if let noise = fromAccessory.first(where: { $0 < firstSYN && frames[$0].kind == .dropped }) {
                add(.noiseBeforeLink, frame: noise, time: frames[noise].time,
                    seen: "\(frames[noise].length) bytes that are no frame before its link (\(frames[noise].note))")
            }
            if let parameters = syn.syn {
                let violations = parameters.violations()
                if !violations.isEmpty {
                    add(.outOfRangeTimers, frame: firstSYN, time: syn.time,
                        seen: "its SYN: " + violations.map(\.description).joined(separator: "; "))
                }
                if parameters.cumulativeAckTimeout > parameters.retransmissionTimeout {
                    add(.slowAcknowledgements, frame: firstSYN, time: syn.time,
                        seen: "its SYN: cumulative-ACK timeout \(parameters.cumulativeAckTimeout) ms, longer than its retransmission timeout "
                            + "\(parameters.retransmissionTimeout) ms")
                }
            }
        }
        if let restated = fromAccessory.first(where: { frames[$0].header?.control.contains([.syn, .ack]) ?? false }) {
            add(.restatesOffer, frame: restated, time: frames[restated].time, seen: "it sent a SYN|ACK (its own offer again)")
        }
        if let bare = fromAccessory.first(where: { index in
            guard let header = frames[index].header else { return false }
            return header.payloadLength == 0 && header.sessionID != 0 && header.control == .ack
        }) {
            add(.bareAcksOnControlSession, frame: bare, time: frames[bare].time,
                seen: "its bare ACKs go on session \(frames[bare].header?.sessionID ?? 0), not 0")
        }
        if let accessory, accessory.protocolVersion == .iap2, accessory.identity.protocols.contains(where: { $0.nativeTransportComponentIdentifier == nil }),
           !accessory.identity.messagesSent.contains(MessageID.statusExternalAccessoryProtocolSession.rawValue) {
            let frame = frames.lastIndex { $0.fromAccessory && $0.messageID == .identificationInformation }
            add(.noSessionStatus, frame: frame, time: frame.map { frames[$0].time },
                seen: "its identification does not list StatusExternalAccessoryProtocolSession among the messages it sends")
        }
        if let failure = accessory?.identity.authentication.failure, failure.kind == "malformed certificate" {
            let frame = frames.lastIndex { $0.fromAccessory && $0.messageID == .authenticationCertificate }
            add(.unverifiableCertificate, frame: frame, time: frame.map { frames[$0].time }, seen: "its certificate: \(failure.detail)")
        }
        return found.sorted { ($0.time ?? .max) < ($1.time ?? .max) }
    }

    /// The FINDINGS section.
    func findingsSection() -> [String] {
        guard wireIndex != nil else { return [] }
        let all = findings
        var out = ["", "FINDINGS (deviations from the reference the host tolerated on this accessory: it works here, and may not "
                       + "after an iPhone update; for the accessory's maker)"]
        if all.isEmpty { out.append("  (none seen)") }
        for (number, finding) in all.enumerated() {
            var place = ""
            if let frame = finding.frame, let index = wireIndex {
                let traced = analysis.frames(on: index)[frame - 1]
                place = ", frame #\(frame) (\(at(traced.time).prefix { $0 != " " }) \(traced.direction.arrow))"
            }
            out.append("  \(number + 1). \(finding.deviation.rawValue)\(place)")
            out.append("     seen:   \(shown(finding.seen))")
            out.append("     iPhone: \(finding.deviation.iPhone)")
            out.append("     source: \(finding.deviation.source)")
        }
        return out
    }

    /// The report as one JSON object (`iapctl report --json`; docs/json-schema.json, `report`).
    func renderJSON() -> String {
        let steps = self.steps
        let stop = steps.first { $0.failure != nil }
        let cause = stop.map { self.cause(of: $0) }
        func time(_ nanoseconds: UInt64?) -> JSONValue {
            nanoseconds.map { .number(Double($0 - min($0, started)) / 1e9) } ?? .null
        }
        var fields: [(String, JSONValue)] = [
            ("result", .string(scrubbed(verdict))),
            ("stoppedAt", stop.map { .string($0.name) } ?? .null),
            ("cause", cause.map { cause in
                .object([("kind", .string(cause.kind.rawValue)), ("summary", .string(scrubbed(cause.summary))),
                         ("evidence", .array(cause.evidence.map { .string(scrubbed($0)) })), ("advice", .string(cause.advice))])
            } ?? .null),
            ("steps", .array(steps.map { step in
                let outcome: String
                switch step.outcome {
                case .passed: outcome = "passed"
                case .failed: outcome = "failed"
                case .notReached: outcome = "not-reached"
                }
                return .object([("name", .string(step.name)), ("outcome", .string(outcome)), ("time", time(step.time)),
                                ("summary", .string(step.summary)), ("failure", step.failure.map { .string(scrubbed($0)) } ?? .null),
                                ("details", .array(step.details.map { .string($0) }))])
            })),
            ("findings", .array(findings.map { finding in
                .object([("deviation", .string(finding.deviation.rawValue)), ("frame", finding.frame.map { .int($0) } ?? .null),
                         ("time", time(finding.time)), ("seen", .string(scrubbed(finding.seen))),
                         ("iPhone", .string(finding.deviation.iPhone)), ("source", .string(finding.deviation.source))])
            })),
            ("authentication", .object([
                ("policy", .string(command.value("auth") ?? "record")),
                ("verdict", accessory.map { .string(scrubbed($0.identity.authentication.description)) } ?? .null),
            ])),
        ]
        if let accessory {
            fields.append(("accessory", .object([
                ("name", .string(scrubbed(accessory.identity.name))), ("manufacturer", .string(scrubbed(accessory.identity.manufacturer))),
                ("model", .string(scrubbed(accessory.identity.modelIdentifier))),
                ("firmwareVersion", .string(scrubbed(accessory.identity.firmwareVersion))),
                ("serialNumber", full ? .string(accessory.serialNumber) : .null),
                ("protocolVersion", .string(accessory.protocolVersion.rawValue)),
                ("protocols", .array(accessory.identity.protocols.map { .string(scrubbed($0.name)) })),
            ])))
        } else {
            fields.append(("accessory", .null))
        }
        let withheld = !full && !analysis.iap1Interfaces.isEmpty
        fields.append(("trace", withheld ? .null : .string(base64Lines(analysis.embeddedTrace, width: max(4, 2 * analysis.embeddedTrace.count)).joined())))
        return JSONOutput.line(fields)
    }
}
