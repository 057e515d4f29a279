internal import AccessoryLogging
public import IAPWire

/// One frame (or run of dropped bytes) described for a person and for a program.
///
/// The summary and details are for a person: strings the frame carries (an accessory's name,
/// its protocol strings) appear in them escaped for a terminal (`escapedForTerminal` of
/// AccessoryLogging). The JSON keeps them exact.
public struct FrameReport: Sendable {
    /// One-line summary, e.g. `iAP2 ACK seq=0x41 ack=0x01 sid=1 (control) 16 bytes`.
    public var summary: String
    /// Indented detail lines (parameters, link parameters, payload preview).
    public var details: [String]
    /// The same information as a JSON object.
    public var json: JSONValue
    /// True for frames whose checksums verified; false for dropped bytes.
    public var isValid: Bool

    /// Summary and details joined, each detail line indented.
    public func text(indent: String = "    ") -> String {
        ([summary] + details.map { indent + $0 }).joined(separator: "\n")
    }
}

/// Whether iAP1 packets carry transaction ids.
public enum TransactionIDMode: String, Sendable, CaseIterable {
    /// Off until an accessory starts IDPS (StartIDPS with a transaction id), then on.
    case auto
    /// Every iAP1 packet carries a transaction id (after StartIDPS).
    case on
    /// No iAP1 packet carries one (an accessory identified with IdentifyDeviceLingoes).
    case off
}

/// Turns frames found by a ``FrameScanner`` into ``FrameReport``s.
///
/// It keeps what a reader of a stream learns along the way: the link session table from SYN
/// packets (so EA session data and control messages are told apart), and whether iAP1 packets
/// carry transaction ids.
public struct FrameInspector: Sendable {
    /// How iAP1 transaction ids are recognised.
    public var transactionIDMode: TransactionIDMode
    /// The link sessions learned from SYN packets, by id.
    public private(set) var sessionTypes: [UInt8: LinkSessionType] = [:]
    /// Most payload bytes shown in a hex preview.
    public var previewLimit: Int
    private var transactionIDsSeen = false
    /// Reads accessories' certificates into the reports (see ``CertificateReading``); nil shows
    /// them as bytes.
    public var certificateReader: (@Sendable ([UInt8]) -> CertificateReading)?
    /// Checks each authentication response in the stream against the challenge and the
    /// certificate before it (see ``AuthenticationChecking``); nil checks nothing.
    public var authenticationChecker: (@Sendable (AuthenticationEvidence) -> AuthenticationChecking)?
    /// iAP1 certificate sections collected so far.
    var iap1CertificateSections: [UInt8] = []
    /// The offset of the first section collected.
    var iap1CertificateOffset = 0
    /// The certificate and the challenge seen last.
    var authenticationTrail = AuthenticationTrail()
    /// A control message spread over several link packets (PROTOCOL.md §7.7), while its parts
    /// come: its bytes so far, the length its header declares, its parts, where it began.
    var partialControl: PartialControl?

    /// An inspector that knows no link sessions yet; `previewLimit` is the most payload bytes shown
    /// in a hex preview.
    public init(transactionIDMode: TransactionIDMode = .auto, previewLimit: Int = 32) {
        self.transactionIDMode = transactionIDMode
        self.previewLimit = previewLimit
    }

    private var transactionIDs: Bool {
        switch transactionIDMode {
        case .on: return true
        case .off: return false
        case .auto: return transactionIDsSeen
        }
    }

    // MARK: Frames

    /// Describes a frame; `bytes` is the span the frame's ranges refer to.
    public mutating func inspect(_ frame: ScannedFrame, in bytes: RawSpan) -> FrameReport {
        let packet = bytes.extracting(frame.range)
        var common: [(String, JSONValue)] = [("offset", .int(frame.streamOffset)), ("length", .int(frame.range.count))]
        switch frame.kind {
        case .detect:
            common.insert(("kind", .string("detect")), at: 0)
            common.append(("bytes", .string(HexInput.format(copy(packet), separator: ""))))
            return FrameReport(summary: "detect  \(HexInput.format(copy(packet)))  (iAP2 detect sequence)", details: [],
                               json: .object(common), isValid: true)
        case let .iap2(header):
            let checksums = (packet.byte(at: 8), header.payloadLength > 0 ? packet.byte(at: header.packetLength - 1) : nil)
            return inspectIAP2(header, payload: bytes.extracting(frame.payload), checksums: checksums, common: common, streamOffset: frame.streamOffset)
        case let .iap1(framing):
            return inspectIAP1(framing, packet: packet, common: common, offset: frame.streamOffset)
        }
    }

    /// The most bytes from a drop's first byte on that ``inspect(_:following:isEndOfStream:)``
    /// reads: the longest frame a candidate can claim (an iAP1 packet in the large form).
    public static let dropLookahead = IAP1Packet.maxEncodedLength

    /// Describes bytes a scanner dropped. When `stream` holds the input (from its first byte), a
    /// candidate whose checksum failed is decoded as far as it goes so a person sees which field
    /// is wrong; only the ``dropLookahead`` bytes from the drop on are looked at.
    public func inspect(_ drop: ScanDrop, stream: [UInt8]? = nil) -> FrameReport {
        guard let stream, drop.streamOffset < stream.count else { return report(drop, details: [], fields: []) }
        let end = min(stream.count, drop.streamOffset + Self.dropLookahead)
        // A view of the bytes concerned, never a copy of the rest of the stream.
        let following = stream.span.bytes.extracting(drop.streamOffset..<end)
        return inspect(drop, following: following, isEndOfStream: true)
            ?? report(drop, details: [], fields: [])
    }

    /// Describes bytes a scanner dropped, from the stream as far as it is known: `following`
    /// starts at the drop's first byte (``ScanDrop/streamOffset``) and holds what came after it
    /// so far. A candidate whose checksum failed is decoded as far as it goes so a person sees
    /// which field is wrong; at most ``dropLookahead`` bytes are read.
    ///
    /// - Returns: the report, or nil when more of the stream could change it (`following` is
    ///   shorter than the preview, or ends inside the candidate) and `isEndOfStream` is false:
    ///   ask again when more bytes have come.
    public func inspect(_ drop: ScanDrop, following bytes: RawSpan, isEndOfStream: Bool) -> FrameReport? {
        let shownCount = Self.previewCount(of: drop, limit: previewLimit)
        if !isEndOfStream, bytes.byteCount < shownCount { return nil }
        var fields: [(String, JSONValue)] = []
        var details: [String] = []
        if let error = Self.diagnosis(of: drop.reason, in: bytes) {
            if !isEndOfStream, bytes.byteCount < Self.dropLookahead, case .truncated = error { return nil }
            details.append(error.description)
            fields.append(("error", .string(error.description)))
        }
        let shown = bytes.extracting(0..<min(shownCount, bytes.byteCount))
        details.append("bytes: " + HexInput.format(copy(shown)) + (shown.byteCount < drop.byteCount ? " …" : ""))
        return report(drop, details: details, fields: fields)
    }

    /// How many bytes from its first the report of `drop` shows: the run itself up to `limit`,
    /// or 16 for a single byte (so a person sees the candidate it started).
    static func previewCount(of drop: ScanDrop, limit: Int) -> Int {
        min(drop.byteCount == 1 ? 16 : drop.byteCount, limit)
    }

    /// Whether the report of a drop for `reason` decodes the candidate (and so may need the
    /// bytes after the preview); garbage and unexpected iAP1 show their bytes only.
    static func decodesCandidate(_ reason: ScanDropReason) -> Bool {
        switch reason {
        case .badHeaderChecksum, .badPayloadChecksum, .invalidLength, .frameTooLong, .badIAP1Checksum: return true
        case .garbage, .unexpectedIAP1, .partialFrameAbandoned: return false
        }
    }

    /// Why the candidate at the start of `bytes` failed, decoded as a receiver would.
    private static func diagnosis(of reason: ScanDropReason, in bytes: RawSpan) -> WireError? {
        switch reason {
        case .badHeaderChecksum, .badPayloadChecksum, .invalidLength, .frameTooLong:
            if bytes.byteCount > 1, bytes.byte(at: 0) == 0xFF, bytes.byte(at: 1) == 0x5A {
                return failure { () throws(WireError) in _ = try LinkPacket.decode(bytes) }
            }
            return failure { () throws(WireError) in _ = try IAP1Framing.decode(bytes) }
        case .badIAP1Checksum:
            return failure { () throws(WireError) in _ = try IAP1Framing.decode(bytes) }
        case .garbage, .unexpectedIAP1, .partialFrameAbandoned:
            return nil
        }
    }

    private func report(_ drop: ScanDrop, details: [String], fields extra: [(String, JSONValue)]) -> FrameReport {
        let fields: [(String, JSONValue)] = [
            ("kind", .string("dropped")), ("offset", .int(drop.streamOffset)), ("length", .int(drop.byteCount)),
            ("reason", .string(drop.reason.description)),
        ] + extra
        let summary = "dropped \(drop.byteCount) byte\(drop.byteCount == 1 ? "" : "s"): \(drop.reason)"
        return FrameReport(summary: summary, details: details, json: .object(fields), isValid: false)
    }

    private static func failure(_ body: () throws(WireError) -> Void) -> WireError? {
        if case let .failure(error) = Result2.catching(body) { return error }
        return nil
    }

    // MARK: iAP2

    private mutating func inspectIAP2(
        _ header: LinkPacketHeader, payload: RawSpan, checksums: (header: UInt8, payload: UInt8?), common: [(String, JSONValue)], streamOffset: Int
    ) -> FrameReport {
        var fields: [(String, JSONValue)] = [("kind", .string("iap2"))] + common + [
            ("control", .string(header.control.description)), ("seq", .int(Int(header.sequence))),
            ("ack", .int(Int(header.acknowledgement))), ("session", .int(Int(header.sessionID))),
        ]
        let sessionType = sessionTypes[header.sessionID]
        if let sessionType { fields.append(("sessionType", .string(sessionType.description))) }
        fields.append(("payloadLength", .int(header.payloadLength)))
        fields.append(("headerChecksum", .int(Int(checksums.header))))
        if let payloadChecksum = checksums.payload { fields.append(("payloadChecksum", .int(Int(payloadChecksum)))) }
        fields.append(("checksums", .string("ok")))
        var summary = "iAP2 \(header.control) seq=0x\(hex(header.sequence)) ack=0x\(hex(header.acknowledgement)) sid=\(header.sessionID)"
        if let sessionType { summary += " (\(sessionType))" }
        summary += "  \(header.packetLength) bytes, payload \(header.payloadLength), checksums ok (header 0x\(hex(checksums.header))"
        summary += checksums.payload.map { ", payload 0x\(hex($0)))" } ?? ")"
        var details: [String] = []

        if header.control.contains(.syn) {
            do {
                let parameters = try LinkParameters.decode(payload)
                for session in parameters.sessions { sessionTypes[session.id] = session.type }
                // A new link: a message half joined on the old one is not coming.
                partialControl = nil
                details += Self.describe(parameters)
                fields.append(("linkParameters", Self.json(parameters)))
            } catch {
                details.append("SYN payload: \(error)")
                fields.append(("error", .string(error.description)))
            }
        } else if header.control.contains(.eak) {
            let listed = copy(payload)
            details.append("received out of order: " + (listed.isEmpty ? "none" : listed.map { "0x" + hex($0) }.joined(separator: ", ")))
            let missing = ExtendedAcknowledgement.missing(after: header.acknowledgement, received: listed)
            if !missing.isEmpty { details.append("missing (to resend): " + missing.map { "0x" + hex($0) }.joined(separator: ", ")) }
            fields.append(("outOfOrder", .array(listed.map { .int(Int($0)) })))
            fields.append(("missing", .array(missing.map { .int(Int($0)) })))
        } else if payload.byteCount > 0 {
            let looksLikeControl = payload.byteCount >= 6 && payload.byte(at: 0) == 0x40 && payload.byte(at: 1) == 0x40
            if sessionType == .externalAccessory || (sessionType == nil && !looksLikeControl) {
                if sessionType == .externalAccessory, let (id, data) = try? EASessionData.decode(payload) {
                    let bytes = copy(payload.extracting(data))
                    details.append("EA session \(id): \(bytes.count) bytes: \(preview(bytes))")
                    fields.append(("eaSession", .int(Int(id))))
                    fields.append(("eaLength", .int(bytes.count)))
                    fields.append(("eaData", .string(HexInput.format(bytes.prefix(previewLimit), separator: ""))))
                } else {
                    let bytes = copy(payload)
                    details.append("payload: \(preview(bytes))")
                    fields.append(("payload", .string(HexInput.format(bytes.prefix(previewLimit), separator: ""))))
                }
            } else if let joined = continueControlMessage(payload, sequence: header.sequence, details: &details, fields: &fields) {
                if let message = joined {
                    details += Self.describe(message)
                    fields.append(("messages", .array([Self.json(message)])))
                    noteCertificate(in: message, details: &details, fields: &fields)
                    noteAuthentication(message, at: partialControl?.offset ?? streamOffset, details: &details, fields: &fields)
                    partialControl = nil
                }
            } else {
                var messages: [JSONValue] = []
                var offset = 0
                while offset < payload.byteCount {
                    do {
                        let (message, length) = try ControlMessage.decode(prefixOf: payload.extracting(offset..<payload.byteCount))
                        details += Self.describe(message)
                        messages.append(Self.json(message))
                        noteCertificate(in: message, details: &details, fields: &fields)
                        noteAuthentication(message, at: streamOffset, details: &details, fields: &fields)
                        offset += length
                    } catch {
                        if offset == 0, startControlMessage(payload, sequence: header.sequence, streamOffset: streamOffset, details: &details,
                                                            fields: &fields) { break }
                        details.append("control message at payload offset \(offset): \(error)")
                        messages.append(.object([("error", .string(error.description))]))
                        break
                    }
                }
                fields.append(("messages", .array(messages)))
            }
        }
        return FrameReport(summary: summary, details: details, json: .object(fields), isValid: true)
    }

    static func describe(_ parameters: LinkParameters) -> [String] {
        var lines = [
            "link parameters: version \(parameters.version), max outstanding \(parameters.maxOutstandingPackets), "
                + "max packet length \(parameters.maxPacketLength), retransmission timeout \(parameters.retransmissionTimeout) ms, "
                + "cumulative ACK timeout \(parameters.cumulativeAckTimeout) ms, max retransmissions \(parameters.maxRetransmissions), "
                + "max cumulative ACKs \(parameters.maxCumulativeAcks)",
        ]
        for session in parameters.sessions {
            lines.append("session \(session.id): \(session.type) v\(session.version)")
        }
        for violation in parameters.violations() {
            lines.append("invalid: \(violation)")
        }
        return lines
    }

    static func json(_ parameters: LinkParameters) -> JSONValue {
        .object([
            ("version", .int(Int(parameters.version))),
            ("maxOutstandingPackets", .int(Int(parameters.maxOutstandingPackets))),
            ("maxPacketLength", .int(Int(parameters.maxPacketLength))),
            ("retransmissionTimeout", .int(Int(parameters.retransmissionTimeout))),
            ("cumulativeAckTimeout", .int(Int(parameters.cumulativeAckTimeout))),
            ("maxRetransmissions", .int(Int(parameters.maxRetransmissions))),
            ("maxCumulativeAcks", .int(Int(parameters.maxCumulativeAcks))),
            ("sessions", .array(parameters.sessions.map {
                .object([("id", .int(Int($0.id))), ("type", .string($0.type.description)), ("version", .int(Int($0.version)))])
            })),
            ("violations", .array(parameters.violations().map { .string($0.description) })),
        ])
    }

    // MARK: Control messages

    /// Lines describing a control message and its parameters, by the catalogue.
    public static func describe(_ message: ControlMessage) -> [String] {
        let info = MessageCatalogue.info(for: message.id)
        var title = "\(info?.name ?? "unknown message") (0x\(hex16(message.id.rawValue)))"
        if let info { title += " from \(info.sender.rawValue)" } else if let family = MessageCatalogue.family(of: message.id) {
            title += " in the \(family) family"
        }
        title += message.parameters.isEmpty ? "" : ", \(message.parameters.count) parameter\(message.parameters.count == 1 ? "" : "s")"
        var lines = [title]
        describe(message.parameters, table: info?.parameters ?? [:], indent: "  ", into: &lines)
        return lines
    }

    private static func describe(_ parameters: [Parameter], table: [UInt16: ParameterInfo], indent: String, into lines: inout [String]) {
        for parameter in parameters {
            let info = table[parameter.id]
            let name = info?.name ?? "unknown"
            let type = info?.type ?? .blob
            if case let .group(subtable) = type {
                lines.append("\(indent)[\(parameter.id)] \(name):")
                do {
                    describe(try parameter.group(), table: subtable, indent: indent + "  ", into: &lines)
                } catch {
                    lines.append("\(indent)  invalid group: \(error)")
                }
            } else {
                lines.append("\(indent)[\(parameter.id)] \(name): \(value(parameter, as: type))")
            }
        }
    }

    /// A parameter's value as text, read as `type`; a value that does not fit its type is shown
    /// as bytes with the reason. Strings are escaped for a terminal (`escapedForTerminal`).
    static func value(_ parameter: Parameter, as type: ParameterType) -> String {
        do {
            switch type {
            case .flag:
                return parameter.isFlag ? "(flag)" : "(flag with \(parameter.data.count) unexpected bytes: \(HexInput.format(parameter.data)))"
            case .utf8: return "\"" + (try parameter.string()).escapedForTerminal + "\""
            case .uint8: let v = try parameter.uint8(); return "\(v) (0x\(hex(v)))"
            case .uint16: let v = try parameter.uint16(); return "\(v) (0x\(hex16(v)))"
            case .uint32: return String(try parameter.uint32())
            case .uint64: return String(try parameter.uint64())
            case .bool: return try parameter.bool() ? "true" : "false"
            case let .enumeration(names):
                let v = try parameter.uint8()
                return "\(v) \(names[v] ?? "(unknown value)")"
            case .messageIDList:
                return try parameter.uint16List().map { "0x\(hex16($0)) \(MessageCatalogue.info(for: MessageID($0))?.name ?? "?")" }
                    .joined(separator: ", ")
            case .blob, .group:
                return "\(parameter.data.count) bytes: \(HexInput.format(parameter.data.prefix(32)))\(parameter.data.count > 32 ? " …" : "")"
            }
        } catch {
            return "\(HexInput.format(parameter.data)) (\(error))"
        }
    }

    /// A control message as JSON: id, name, and each parameter with its value.
    public static func json(_ message: ControlMessage) -> JSONValue {
        let info = MessageCatalogue.info(for: message.id)
        return .object([
            ("id", .int(Int(message.id.rawValue))),
            ("name", info.map { .string($0.name) } ?? .null),
            ("parameters", json(message.parameters, table: info?.parameters ?? [:])),
        ])
    }

    private static func json(_ parameters: [Parameter], table: [UInt16: ParameterInfo]) -> JSONValue {
        .array(parameters.map { parameter in
            let info = table[parameter.id]
            var fields: [(String, JSONValue)] = [("id", .int(Int(parameter.id))), ("name", info.map { .string($0.name) } ?? .null)]
            let type = info?.type ?? .blob
            switch type {
            case let .group(subtable):
                if let group = try? parameter.group() {
                    fields.append(("group", json(group, table: subtable)))
                } else {
                    fields.append(("data", .string(HexInput.format(parameter.data, separator: ""))))
                    fields.append(("error", .string("invalid group")))
                }
            case .utf8:
                if let string = try? parameter.string() { fields.append(("value", .string(string))) } else { fields.append(("data", .string(HexInput.format(parameter.data, separator: "")))) }
            case .uint8, .enumeration:
                if let v = try? parameter.uint8() { fields.append(("value", .int(Int(v)))) } else { fields.append(("data", .string(HexInput.format(parameter.data, separator: "")))) }
            case .uint16:
                if let v = try? parameter.uint16() { fields.append(("value", .int(Int(v)))) } else { fields.append(("data", .string(HexInput.format(parameter.data, separator: "")))) }
            case .uint32:
                if let v = try? parameter.uint32() { fields.append(("value", .int(Int(v)))) } else { fields.append(("data", .string(HexInput.format(parameter.data, separator: "")))) }
            case .bool:
                if let v = try? parameter.bool() { fields.append(("value", .bool(v))) } else { fields.append(("data", .string(HexInput.format(parameter.data, separator: "")))) }
            case .flag:
                fields.append(("value", .bool(true)))
            case .messageIDList:
                if let ids = try? parameter.uint16List() { fields.append(("value", .array(ids.map { .int(Int($0)) }))) } else { fields.append(("data", .string(HexInput.format(parameter.data, separator: "")))) }
            case .uint64, .blob:
                fields.append(("data", .string(HexInput.format(parameter.data, separator: ""))))
            }
            return .object(fields)
        })
    }

    // MARK: iAP1

    private mutating func inspectIAP1(_ framing: IAP1Framing, packet: RawSpan, common: [(String, JSONValue)], offset: Int) -> FrameReport {
        let body = packet.extracting(framing.body)
        // StartIDPS with a transaction id turns them on for the rest of the stream.
        if transactionIDMode == .auto, !transactionIDsSeen, body.byteCount == 4, body.byte(at: 0) == 0x00, body.byte(at: 1) == 0x38 {
            transactionIDsSeen = true
        }
        // IdentifyDeviceLingoes without a transaction id (14 bytes) turns them off again.
        if transactionIDMode == .auto, transactionIDsSeen, body.byteCount == 14, body.byte(at: 0) == 0x00, body.byte(at: 1) == 0x13 {
            transactionIDsSeen = false
        }
        var fields: [(String, JSONValue)] = [("kind", .string("iap1"))] + common + [
            ("sync", .bool(framing.hasSync)), ("form", .string(framing.isLargeForm ? "large" : "small")),
        ]
        let packetValue: IAP1Packet
        do {
            packetValue = try IAP1Packet.decode(body: body, transactionIDs: transactionIDs)
        } catch {
            fields.append(("error", .string(error.description)))
            return FrameReport(summary: "iAP1 packet, \(framing.packetLength) bytes, checksum ok: \(error)", details: [],
                               json: .object(fields), isValid: true)
        }
        let lingoName = IAP1Catalogue.lingoes[packetValue.lingo] ?? "unknown lingo"
        let commandName = IAP1Catalogue.commandName(lingo: packetValue.lingo, command: packetValue.command) ?? "unknown command"
        let commandText = IAP1Packet.commandWidth(lingo: packetValue.lingo) == 2 ? "0x" + hex16(packetValue.command) : "0x" + hex(UInt8(packetValue.command))
        fields += [
            ("lingo", .int(Int(packetValue.lingo))), ("lingoName", .string(lingoName)),
            ("command", .int(Int(packetValue.command))), ("commandName", .string(commandName)),
            ("transactionID", packetValue.transactionID.map { .int(Int($0)) } ?? .null),
            ("payloadLength", .int(packetValue.payload.count)), ("checksum", .string("ok")),
            ("payload", .string(HexInput.format(packetValue.payload.prefix(previewLimit), separator: ""))),
        ]
        var summary = "iAP1 \(lingoName) (0x\(hex(packetValue.lingo))) \(commandName) (\(commandText))"
        if let id = packetValue.transactionID { summary += " trans=0x\(hex16(id))" }
        summary += "  \(framing.packetLength) bytes, payload \(packetValue.payload.count), checksum ok"
        var details = IAP1Details.describe(packetValue)
        noteCertificateSection(packetValue, offset: offset, details: &details, fields: &fields)
        noteAuthentication(iap1: packetValue, at: offset, details: &details, fields: &fields)
        if IAP2Detect.isIAP1Reply(packetValue) { details.append("this is the iAP1 answer to the iAP2 detect: the peer does not speak iAP2") }
        if details.isEmpty, !packetValue.payload.isEmpty { details.append("payload: \(preview(packetValue.payload))") }
        return FrameReport(summary: summary, details: details, json: .object(fields), isValid: true)
    }

    private func preview(_ bytes: [UInt8]) -> String {
        HexInput.format(bytes.prefix(previewLimit)) + (bytes.count > previewLimit ? " … (\(bytes.count) bytes)" : "")
    }
}

/// Details of the iAP1 General-lingo packets people most often need to read.
enum IAP1Details {
    static func describe(_ packet: IAP1Packet) -> [String] {
        guard packet.lingo == 0x00 else { return [] }
        let p = packet.payload
        func u16(_ i: Int) -> UInt16 { UInt16(p[i]) << 8 | UInt16(p[i + 1]) }
        func u32(_ i: Int) -> UInt32 { UInt32(u16(i)) << 16 | UInt32(u16(i + 2)) }
        switch packet.command {
        case 0x02 where p.count >= 2:
            let status = IAP1Catalogue.ackStatuses[p[0]] ?? "unknown status"
            let command = IAP1Catalogue.generalCommands[p[1]] ?? "unknown command"
            return ["status 0x\(hex(p[0])) \(status) for command 0x\(hex(p[1])) \(command)"]
        case 0x41 where p.count >= 2:
            let status = IAP1Catalogue.ackStatuses[p[0]] ?? "unknown status"
            return ["status 0x\(hex(p[0])) \(status) for command 0x\(hex(p[1])) \(IAP1Catalogue.generalCommands[p[1]] ?? "unknown command")"]
        case 0x13 where p.count >= 12:
            let lingoes = (0..<32).filter { u32(0) & (1 << UInt32($0)) != 0 }.map { IAP1Catalogue.lingoes[UInt8($0)] ?? "lingo \($0)" }
            return ["lingoes: " + lingoes.joined(separator: ", "), "options 0x\(hex32(u32(4))), device id 0x\(hex32(u32(8)))"]
        case 0x3B where p.count >= 1:
            let names = [0: "done", 1: "reset IDPS", 2: "abort", 3: "identifying on another transport"]
            return ["status \(p[0]) \(names[Int(p[0])] ?? "unknown")"]
        case 0x3C where p.count >= 1:
            let names = [0: "ok", 1: "required token rejected", 2: "required token missing", 3: "both", 4: "reset", 5: "timed out",
                         6: "aborted", 7: "failed (other transport)"]
            return ["status \(p[0]) \(names[Int(p[0])] ?? "unknown")"]
        case 0x3F where p.count >= 3:
            return ["session \(u16(0)), protocol index \(p[2])"]
        case 0x40 where p.count >= 2:
            return ["session \(u16(0))"]
        case 0x42 where p.count >= 2, 0x43 where p.count >= 2:
            return ["session \(u16(0)), \(p.count - 2) data bytes: " + HexInput.format(p.dropFirst(2).prefix(32))]
        case 0x12 where p.count >= 2:
            return ["max payload \(u16(0)) bytes"]
        case 0x39:
            do {
                let tokens = try FIDToken.decodeList(p)
                return ["\(tokens.count) token\(tokens.count == 1 ? "" : "s")"] + tokens.map(describe)
            } catch {
                return ["malformed token list: \(error)"]
            }
        case 0x3A:
            let acks: [FIDTokenAck]
            do { acks = try FIDTokenAck.decodeList(p) } catch { return ["malformed ack list: \(error)"] }
            let statuses = [0: "accepted", 1: "required token failed", 2: "optional token failed", 3: "not supported", 4: "lingo busy",
                            5: "max connections"]
            return ["\(acks.count) ack\(acks.count == 1 ? "" : "s")"] + acks.map { ack in
                let name = IAP1Catalogue.tokenName(UInt16(ack.type) << 8 | UInt16(ack.subtype))
                let extra = ack.extra.isEmpty ? "" : " (\(HexInput.format(ack.extra)))"
                return "\(name)\(extra): \(statuses[Int(ack.status)] ?? "status \(ack.status)")"
            }
        case 0x15 where p.count >= 4:
            return ["authentication \(p[0]).\(p[1]), certificate section \(p[2]) of 0…\(p[3]), \(p.count - 4) bytes"]
        case 0x16 where p.count >= 1, 0x19 where p.count >= 1:
            return ["status 0x\(hex(p[0])) \(IAP1Catalogue.ackStatuses[p[0]] ?? "unknown status")"]
        case 0x17 where p.count >= 1:
            return ["challenge \(p.count - 1) bytes, retry counter \(p[p.count - 1])"]
        case 0x18:
            return ["signature \(p.count) bytes"]
        case 0x0F where p.count >= 1, 0x4B where p.count >= 1:
            return ["lingo 0x\(hex(p[0])) \(IAP1Catalogue.lingoes[p[0]] ?? "unknown lingo")"]
        default:
            return []
        }
    }

    /// One FID token with its contents.
    static func describe(_ token: FIDToken) -> String {
        let name = "token \(hex(token.type)):\(hex(token.subtype)) \(IAP1Catalogue.tokenName(token.kind))"
        let d = token.data
        func text(_ bytes: ArraySlice<UInt8>) -> String {
            "\"" + String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self).escapedForTerminal + "\""
        }
        switch token.kind {
        case FIDToken.identify where d.count >= 1 && d.count >= 1 + Int(d[0]) + 8:
            let count = Int(d[0])
            let lingoes = d[1..<(1 + count)].map { IAP1Catalogue.lingoes[$0] ?? "lingo \($0)" }
            return "\(name): lingoes \(lingoes.joined(separator: ", ")), options 0x\(HexInput.format(Array(d[(1 + count)..<(5 + count)]), separator: ""))"
        case FIDToken.accessoryInfo where d.count >= 1:
            let types: [UInt8: String] = [1: "name", 4: "firmware version", 5: "hardware version", 6: "manufacturer",
                                          7: "model number", 8: "serial number", 9: "max incoming payload"]
            let value: String
            switch d[0] {
            case 1, 6, 7, 8: value = text(d.dropFirst())
            case 4 where d.count >= 4, 5 where d.count >= 4: value = d[1...3].map(String.init).joined(separator: ".")
            case 9 where d.count >= 3: value = "\(Int(d[1]) << 8 | Int(d[2])) bytes"
            default: value = HexInput.format(Array(d.dropFirst().prefix(16)))
            }
            return "\(name): \(types[d[0]] ?? "info type \(d[0])") \(value)"
        case FIDToken.eaProtocol where d.count >= 1:
            return "\(name): protocol \(d[0]) \(text(d.dropFirst()))"
        case FIDToken.bundleSeedIDPref:
            return "\(name): \(text(d[...]))"
        default:
            return "\(name), \(d.count) data bytes"
        }
    }
}

func hex(_ byte: UInt8) -> String { HexInput.format([byte]) }
func hex16(_ value: UInt16) -> String { HexInput.format([UInt8(value >> 8), UInt8(value & 0xFF)], separator: "") }
func hex32(_ value: UInt32) -> String { hex16(UInt16(value >> 16)) + hex16(UInt16(value & 0xFFFF)) }
func copy(_ span: RawSpan) -> [UInt8] { span.withUnsafeBytes { Array($0) } }

extension RawSpan {
    func byte(at offset: Int) -> UInt8 { unsafeLoad(fromByteOffset: offset, as: UInt8.self) }
}
