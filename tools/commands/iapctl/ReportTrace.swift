// iapctl report: the pcapng trace it records in memory, the frames read back out of it, and the
// redaction of serial numbers and certificate bytes before the trace is embedded.

import AccessoryHost
import USBDescriptors
import AccessoryLogging
import CLIKit
import Glibc
import IAPInspect
import IAPTransport
import IAPWire
import Synchronization
import USBHost

/// The whole exchange in pcapng, kept in memory: iapctl's trace format (`PcapngTraceRecorder`,
/// one interface per transport), so that the embedded copy is what `--trace-file FILE.pcapng`
/// would have written and `iapctl decode --pcap` reads it.
///
/// The blocks are kept as the recorder writes them (one block per call), which lets the report
/// read each frame back and overwrite fields in place without parsing the file again.
final class ReportTrace: Sendable {
    /// What the report needs to know of a traced transport.
    struct Wire: Sendable {
        /// `transport.description` (what `Accessory.location` and failure events name).
        var location: String
        /// The transport's kind.
        var kind: TransportKind
        /// The USB device, on USB (its descriptors and strings as read at open).
        var usb: USBDevice?
    }

    /// The blocks, shared with the recorder's writes.
    private final class Blocks: Sendable {
        let list = Mutex<[[UInt8]]>([])
    }

    private let blocks = Blocks()
    private let wires = Mutex<[Wire]>([])
    private let recorder: PcapngTraceRecorder
    /// Whether the interface names may carry serial numbers (`--full`).
    private let full: Bool

    init(full: Bool) {
        self.full = full
        let blocks = self.blocks
        recorder = PcapngTraceRecorder(application: "iapctl \(toolVersion()) report", clock: { wallNanoseconds() },
                                       write: { block in blocks.list.withLock { $0.append(block) } })
    }

    /// `transport`, recorded as an interface of its own (the manager's transport tap).
    func tap(_ transport: any Transport) -> any Transport {
        let usb = transport.capability(USBDeviceInfo.self).map(USBDevice.init)
        let wire = CaptureTransport(transport.kind)
        let interface = wires.withLock { wires -> Int in
            wires.append(Wire(location: transport.description, kind: transport.kind, usb: usb))
            // Without --full the interface is named without the USB serial number the
            // description carries.
            let name = full ? transport.description : "\(wire.name) accessory \(wires.count)"
            let place = usb.map { "usb \($0.location) \($0.usbID)" } ?? wire.name
            return self.recorder.addInterface(name: name, description: "iAP accessory on " + (full ? transport.description : place),
                                         transport: wire)
        }
        let sink = recorder
        return TracingTransport(transport) { direction, bytes in
            sink.record(direction == .out ? .hostToAccessory : .accessoryToHost, bytes, on: interface)
        }
    }

    /// The timing the link of the transport at `location` runs with, in seconds: the host's last
    /// SYN|ACK (which repeats the accessory's timing), nil before there is one.
    func linkTiming(of location: String) -> (cumulativeAck: Double, retransmission: Double)? {
        guard let interface = tracedWires.lastIndex(where: { $0.location == location }) else { return nil }
        let analysis = TraceAnalysis(blocks: recordedBlocks, full: true)
        guard let syn = analysis.frames(on: interface).last(where: { !$0.fromAccessory && $0.syn != nil })?.syn else { return nil }
        return (Double(syn.cumulativeAckTimeout) / 1000, Double(syn.retransmissionTimeout) / 1000)
    }

    /// The transports traced so far, by interface number.
    var tracedWires: [Wire] { wires.withLock { $0 } }

    /// The blocks recorded so far, in file order.
    var recordedBlocks: [[UInt8]] { blocks.list.withLock { $0 } }
}

/// The real-time clock in nanoseconds since the epoch (what pcapng and log records are stamped with).
func wallNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_REALTIME, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

/// One frame of the trace, read back. Plain stored fields rather than an enum with payloads:
/// Swift 6.3.1's optimizer crashed (an ownership verification failure in CopyPropagation) on
/// `ReportRun.steps` matching such an enum in release builds.
struct TracedFrame {
    /// What the frame is.
    enum Kind {
        /// The iAP2 detect sequence.
        case detect
        /// An iAP2 link packet (``header`` and the fields after it say more).
        case iap2
        /// An iAP1 packet (``note`` is the inspector's summary).
        case iap1
        /// Bytes the receiver dropped (``note`` is the reason, ``length`` the count).
        case dropped
        /// Raw bytes of a native-transport pipe.
        case native
    }

    /// The pcapng interface (index in ``ReportTrace/tracedWires``).
    var interface: Int
    /// Nanoseconds since the epoch.
    var time: UInt64
    /// Which way it went.
    var direction: CaptureDirection
    /// What it is.
    var kind: Kind
    /// Its length on the wire (for dropped bytes, how many).
    var length: Int
    /// An iAP2 packet's header.
    var header: LinkPacketHeader?
    /// A SYN's parameters.
    var syn: LinkParameters?
    /// The control message an iAP2 packet carries.
    var message: ControlMessage? {
        didSet { messageID = message?.id }
    }
    /// Its id (stored: see the note above).
    private(set) var messageID: MessageID?
    /// The EA session an iAP2 packet carries data for, and how many bytes.
    var eaSession: UInt16?
    var eaBytes = 0
    /// A part of a control message spread over several packets (the message itself is on
    /// the part that completes it).
    var part: ControlPart?
    /// An EAK's list of the packets received out of order.
    var outOfOrder: [UInt8] = []
    /// Bytes on a link session that is not the control or an EA session (a file-transfer
    /// session, or one the SYN did not declare), said as such.
    var otherSession: String?
    /// An iAP1 packet's summary, or why bytes were dropped.
    var note = ""

    /// Whether the accessory sent it.
    var fromAccessory: Bool { direction == .accessoryToHost }

    /// Whether it is the iAP2 detect.
    var isDetect: Bool { kind == .detect }

    /// The bytes dropped, for a run of dropped bytes; 0 for frames.
    var droppedCount: Int { kind == .dropped ? length : 0 }

    /// One line for people (the accessory's strings in it escaped).
    var summary: String {
        switch kind {
        case .detect: return "iAP2 detect"
        case .iap2:
            guard let header else { return "iAP2" }
            var text = "\(header.control)"
            if let syn { text += " " + ReportText.parameters(syn) }
            if let part, message == nil {
                text += "  \(part.messageID) part \(part.index): \(part.received) of \(part.declared) bytes"
            }
            if let message {
                text += "  \(message.id) (\(message.encodedLength) bytes" + (part.map { "; the last of \($0.index) packets" } ?? "") + ")"
            }
            if let otherSession { text += "  \(otherSession)" }
            if let eaSession { text += "  EA data, session \(eaSession): \(eaBytes) byte\(eaBytes == 1 ? "" : "s")" }
            return text + "  seq \(header.sequence) ack \(header.acknowledgement)"
        case .iap1: return note.escapedForTerminal
        case .dropped: return "dropped \(length) byte\(length == 1 ? "" : "s"): \(note)"
        case .native: return "native transport: \(length) bytes"
        }
    }
}

/// One link packet of a control message spread over several (PROTOCOL.md §7.7).
struct ControlPart {
    /// The message's id, from its first part.
    var messageID: MessageID
    /// 1 for the packet with the message's header.
    var index: Int
    /// Bytes of the message received so far, and the length its header declares.
    var received: Int
    var declared: Int
    /// Whether this part completes it.
    var isLast: Bool { received >= declared }
}

/// What the report knows of one traced link while reading it: the link sessions its SYN
/// declared, and a control message each way that is still coming in parts.
struct WireReading {
    /// One direction's message in parts: what came so far and where its parts are in the trace.
    struct Partial {
        /// One part: its sequence number, its bytes, and where its payload is in the trace (the
        /// block's index among the blocks as rewritten, the payload's offset in it).
        struct Part {
            var sequence: UInt8
            var bytes: [UInt8]
            var block: Int
            var payload: Int
        }
        var messageID: MessageID
        var declared: Int
        var parts: [Part]
        /// Bytes received so far (a part sent again counted once).
        var received: Int { parts.reduce(0) { $0 + $1.bytes.count } }

        /// The parts in the order of their sequence numbers from the first part's (a part sent
        /// again after an EAK goes back in its place), each with its offset in the message.
        var ordered: [(part: Part, offset: Int)] {
            let first = parts[0].sequence
            var offset = 0
            return parts.sorted { ($0.sequence &- first) < ($1.sequence &- first) }.map { part in
                defer { offset += part.bytes.count }
                return (part, offset)
            }
        }

        /// The message's bytes, its parts joined in order (at most the declared length).
        var joined: [UInt8] { Array(ordered.flatMap(\.part.bytes).prefix(declared)) }
    }

    var sessions: [UInt8: LinkSessionType] = [:]
    var controlSession: UInt8?
    var partial: [Bool: Partial] = [:]
    var inspector = FrameInspector()
}

/// The trace read back: every frame with its time and direction; what it says about the serial
/// numbers and the certificate; and the trace again with those overwritten.
struct TraceAnalysis {
    /// Every frame, in file order (which is time order).
    var frames: [TracedFrame] = []
    /// The serial numbers found in the frames (IdentificationInformation's SerialNumber, the
    /// coprocessor's AccessoryAuthenticationSerialNumber).
    var serialNumbers: [String] = []
    /// The certificate the accessory sent (DER, as sent), per interface: the last one.
    var certificates: [Int: [UInt8]] = [:]
    /// The IdentificationInformation the accessory sent last, per interface.
    var identifications: [Int: ControlMessage] = [:]
    /// Interfaces on which the accessory spoke iAP1 (their serials and certificate are not
    /// taken out of the trace: see ``redactedTrace``).
    var iap1Interfaces: Set<Int> = []
    /// Control messages the accessory began in parts and never completed, per interface: the
    /// message, the bytes that came of those declared, the packets, and when the first came.
    var incompleteMessages: [Int: [(id: MessageID, received: Int, declared: Int, parts: Int, time: UInt64)]] = [:]
    /// The trace to embed: EA session data cut to ``keptDataBytes`` per packet (the packets
    /// encoded again, checksums and all), and without `full` the serial numbers and certificate
    /// bytes overwritten in place (lengths and checksums kept), so that it decodes as cleanly as
    /// the original.
    var embeddedTrace: [UInt8] = []
    /// How many frames had serials or certificate bytes overwritten in ``embeddedTrace``.
    var redactedFrames = 0
    /// Messages in parts to overwrite: each part's place, the ranges of the message to
    /// overwrite, and whether they are text (X's) or bytes (zeros).
    var pendingPartRedactions: [PartRedaction] = []
    /// One message in parts to overwrite: each part's block, payload offset, byte count and
    /// offset in the message; the message's ranges to overwrite; text (X's) or bytes (zeros).
    typealias PartRedaction = ([(block: Int, payload: Int, count: Int, offset: Int)], [Range<Int>], Bool)
    /// How many packets of session data were cut in ``embeddedTrace``, and the bytes left out.
    var cutPackets = 0
    var cutBytes = 0

    /// The session bytes kept of each packet in the embedded trace.
    static let keptDataBytes = 64

    /// Control messages whose parameters are overwritten: the parameter id and how.
    static let redactions: [UInt16: (parameter: UInt16, keepsText: Bool)] = [
        MessageID.identificationInformation.rawValue: (IdentificationParameter.serialNumber, true),
        MessageID.identificationInformationUpdate.rawValue: (IdentificationParameter.serialNumber, true),
        MessageID.authenticationCertificate.rawValue: (0, false),
        MessageID.accessoryAuthenticationSerialNumber.rawValue: (0, true),
    ]

    init(blocks: [[UInt8]], full: Bool) {
        var readings: [Int: WireReading] = [:]
        var rewrittenBlocks: [[UInt8]] = []
        rewrittenBlocks.reserveCapacity(blocks.count)
        for block in blocks {
            var rewritten = block
            if block.count >= 36, Self.uint32(block, 0) == 6 {
                let interface = Int(Self.uint32(block, 8))
                let time = UInt64(Self.uint32(block, 12)) << 32 | UInt64(Self.uint32(block, 16))
                let captured = Int(Self.uint32(block, 20))
                if captured >= IAPCaptureHeader.size, 28 + captured <= block.count,
                   let direction = CaptureDirection(rawValue: block[29]) {
                    let content = block[31]
                    let frameStart = 28 + IAPCaptureHeader.size, frameEnd = 28 + captured
                    let bytes = Array(block[frameStart..<frameEnd])
                    switch content {
                    case CaptureContent.frame.rawValue:
                        var reading = readings[interface] ?? WireReading()
                        let place = (block: rewrittenBlocks.count, frame: frameStart)
                        if let frame = read(bytes, interface: interface, time: time, direction: direction, reading: &reading,
                                            place: place, full: full) {
                            frames.append(frame)
                            if frame.kind == .iap1, frame.fromAccessory { iap1Interfaces.insert(interface) }
                            if let header = frame.header, frame.eaSession != nil, frame.eaBytes > Self.keptDataBytes {
                                let eaBytes = frame.eaBytes
                                let kept = LinkPacketHeader.size + EASessionData.headerSize + Self.keptDataBytes
                                if let shorter = try? LinkPacket.encode(control: header.control, sequence: header.sequence,
                                                                        acknowledgement: header.acknowledgement, sessionID: header.sessionID,
                                                                        payload: Array(bytes[LinkPacketHeader.size..<kept])) {
                                    rewritten = PcapngWriter.enhancedPacket(interface: UInt32(interface), nanoseconds: time,
                                                                            packet: Array(block[28..<frameStart]) + shorter,
                                                                            inbound: direction == .accessoryToHost)
                                    cutPackets += 1
                                    cutBytes += eaBytes - Self.keptDataBytes
                                }
                            }
                            if !full, frame.part == nil, rewritten.count == block.count,
                               Self.redact(&rewritten, frameAt: frameStart, end: frameEnd, controlSession: reading.controlSession) {
                                redactedFrames += 1
                            }
                        }
                        readings[interface] = reading
                    case CaptureContent.dropped.rawValue:
                        let code = Int(block[32])
                        let reason = code > 0 && code <= IAPCaptureHeader.dropReasonNames.count ? IAPCaptureHeader.dropReasonNames[code - 1] : "dropped"
                        let original = Int(Self.uint32(block, 24)) - IAPCaptureHeader.size
                        frames.append(TracedFrame(interface: interface, time: time, direction: direction, kind: .dropped,
                                                  length: original, note: reason))
                    default:
                        frames.append(TracedFrame(interface: interface, time: time, direction: direction, kind: .native,
                                                  length: bytes.count))
                        if bytes.count > Self.keptDataBytes {
                            rewritten = PcapngWriter.enhancedPacket(interface: UInt32(interface), nanoseconds: time,
                                                                    packet: Array(block[28..<(frameStart + Self.keptDataBytes)]),
                                                                    inbound: direction == .accessoryToHost)
                            cutPackets += 1
                            cutBytes += bytes.count - Self.keptDataBytes
                        }
                    }
                }
            }
            rewrittenBlocks.append(rewritten)
        }
        for (interface, reading) in readings {
            for (fromAccessory, partial) in reading.partial {
                if !full { redactParts(partial, message: nil) }
                guard fromAccessory else { continue }
                let first = frames.first { $0.interface == interface && $0.fromAccessory && $0.part?.index == 1 && $0.part?.messageID == partial.messageID }
                incompleteMessages[interface, default: []].append((partial.messageID, partial.received, partial.declared, partial.parts.count,
                                                                   first?.time ?? 0))
            }
        }
        Self.applyPartRedactions(pendingPartRedactions, to: &rewrittenBlocks)
        embeddedTrace = rewrittenBlocks.flatMap { $0 }
    }

    /// Reads one frame with what is known of its link (its session table, a message coming in
    /// parts): a control-session packet is a control message, or a part of one; an EA
    /// session's, EA data; another session's, said as such.
    private mutating func read(_ bytes: [UInt8], interface: Int, time: UInt64, direction: CaptureDirection, reading: inout WireReading,
                               place: (block: Int, frame: Int), full: Bool) -> TracedFrame? {
        var scanner = FrameScanner()
        var found: TracedFrame?
        var inspector = reading.inspector
        defer { reading.inspector = inspector }
        scanner.scan(bytes.span.bytes) { frame, span in
            guard found == nil else { return }
            var traced = TracedFrame(interface: interface, time: time, direction: direction, kind: .detect, length: frame.range.count)
            switch frame.kind {
            case .detect:
                break
            case .iap1:
                traced.kind = .iap1
                traced.note = inspector.inspect(frame, in: span).summary
            case let .iap2(header):
                traced.kind = .iap2
                traced.header = header
                let payload = Array(bytes[frame.payload])
                if header.control.contains(.eak) {
                    traced.outOfOrder = payload
                } else if header.control.contains(.syn), let parameters = try? LinkParameters.decode(payload) {
                    traced.syn = parameters
                    reading.sessions = Dictionary(parameters.sessions.map { ($0.id, $0.type) }, uniquingKeysWith: { first, _ in first })
                    // A new link: a message half joined on the old one is not coming.
                    for partial in reading.partial.values where !full { redactParts(partial, message: nil) }
                    reading.partial = [:]
                    reading.controlSession = parameters.session(ofType: .control)?.id
                } else if !payload.isEmpty {
                    readPayload(payload, of: &traced, header: header, reading: &reading,
                                place: (place.block, place.frame + frame.payload.lowerBound), full: full)
                }
            }
            found = traced
        }
        return found
    }

    /// The payload of an iAP2 packet that is not a SYN, by its session's type.
    private mutating func readPayload(_ payload: [UInt8], of traced: inout TracedFrame, header: LinkPacketHeader, reading: inout WireReading,
                                      place: (block: Int, payload: Int), full: Bool) {
        let type = reading.sessions[header.sessionID]
        let looksLikeControl = payload.starts(with: [0x40, 0x40])
        let fromAccessory = traced.fromAccessory
        if type == .control || (type == nil && reading.sessions.isEmpty && looksLikeControl) {
            if var partial = reading.partial[fromAccessory] {
                // A packet of whole messages ends a message that was waiting for parts (its
                // header lied); anything else is its next part.
                if looksLikeControl, Self.isWholeMessages(payload) {
                    reading.partial[fromAccessory] = nil
                    if !full { redactParts(partial, message: nil) }
                } else if partial.parts.contains(where: { $0.sequence == header.sequence }) {
                    traced.otherSession = "\(partial.messageID): a part sent again (already taken)"
                    return
                } else {
                    let taken = min(payload.count, partial.declared - partial.received)
                    partial.parts.append(.init(sequence: header.sequence, bytes: Array(payload.prefix(taken)), block: place.block,
                                               payload: place.payload))
                    traced.part = ControlPart(messageID: partial.messageID, index: partial.parts.count, received: partial.received,
                                              declared: partial.declared)
                    if partial.received >= partial.declared {
                        reading.partial[fromAccessory] = nil
                        let message = try? ControlMessage.decode(partial.joined)
                        if let message {
                            traced.message = message
                            if fromAccessory { note(message, interface: traced.interface) }
                        }
                        if !full { redactParts(partial, message: message) }
                    } else {
                        reading.partial[fromAccessory] = partial
                    }
                    return
                }
            }
            if let message = try? ControlMessage.decode(prefixOf: payload.span.bytes).message {
                traced.message = message
                if fromAccessory { note(message, interface: traced.interface) }
            } else if looksLikeControl, payload.count >= ControlMessage.headerSize, let declared = try? ControlMessage.declaredLength(in: payload.span.bytes),
                      declared > payload.count {
                let id = MessageID(UInt16(payload[4]) << 8 | UInt16(payload[5]))
                reading.partial[fromAccessory] = WireReading.Partial(
                    messageID: id, declared: declared,
                    parts: [.init(sequence: header.sequence, bytes: payload, block: place.block, payload: place.payload)])
                traced.part = ControlPart(messageID: id, index: 1, received: payload.count, declared: declared)
            } else {
                traced.otherSession = "control session \(header.sessionID): \(payload.count) bytes that are no control message"
            }
        } else if type == .externalAccessory || (type == nil && reading.sessions.isEmpty), payload.count >= EASessionData.headerSize {
            traced.eaSession = UInt16(payload[0]) << 8 | UInt16(payload[1])
            traced.eaBytes = payload.count - EASessionData.headerSize
        } else if let type {
            traced.otherSession = "\(type) session \(header.sessionID): \(payload.count) bytes"
        } else {
            traced.otherSession = "session \(header.sessionID), which the SYN did not declare: \(payload.count) bytes"
        }
    }

    /// Whether `payload` is one or more whole control messages.
    static func isWholeMessages(_ payload: [UInt8]) -> Bool {
        var offset = 0
        while offset < payload.count {
            guard let length = try? ControlMessage.decode(prefixOf: payload.span.bytes.extracting(offset..<payload.count)).length else { return false }
            offset += length
        }
        return offset > 0
    }

    /// Keeps what the report says about the accessory's serials and certificate.
    private mutating func note(_ message: ControlMessage, interface: Int) {
        switch message.id {
        case .identificationInformation, .identificationInformationUpdate:
            if message.id == .identificationInformation { identifications[interface] = message }
            if let serial = try? message.parameter(IdentificationParameter.serialNumber)?.string() { serialNumbers.append(serial) }
        case .authenticationCertificate:
            if let der = message.parameter(0)?.data { certificates[interface] = der }
        case .accessoryAuthenticationSerialNumber:
            if let serial = try? message.parameter(0)?.string() { serialNumbers.append(serial) }
        default:
            break
        }
    }


    /// The frames of one interface.
    func frames(on interface: Int) -> [TracedFrame] { frames.filter { $0.interface == interface } }

    static func uint32(_ bytes: [UInt8], _ offset: Int) -> UInt32 {
        UInt32(bytes[offset]) | UInt32(bytes[offset + 1]) << 8 | UInt32(bytes[offset + 2]) << 16 | UInt32(bytes[offset + 3]) << 24
    }
}

/// Base64 (RFC 4648, with padding), in lines of `width` characters, as `base64 -d` reads it.
func base64Lines(_ bytes: [UInt8], width: Int = 76) -> [String] {
    let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
    var out: [UInt8] = []
    out.reserveCapacity((bytes.count + 2) / 3 * 4)
    var index = 0
    while index < bytes.count {
        let count = min(3, bytes.count - index)
        let b0 = bytes[index], b1 = count > 1 ? bytes[index + 1] : 0, b2 = count > 2 ? bytes[index + 2] : 0
        out.append(alphabet[Int(b0 >> 2)])
        out.append(alphabet[Int((b0 & 0x03) << 4 | b1 >> 4)])
        out.append(count > 1 ? alphabet[Int((b1 & 0x0F) << 2 | b2 >> 6)] : UInt8(ascii: "="))
        out.append(count > 2 ? alphabet[Int(b2 & 0x3F)] : UInt8(ascii: "="))
        index += 3
    }
    var lines: [String] = []
    var start = 0
    while start < out.count {
        let end = min(out.count, start + width)
        lines.append(String(decoding: out[start..<end], as: UTF8.self))
        start = end
    }
    return lines
}
