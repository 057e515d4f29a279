public import IAPWire

/// Decodes the iAP traffic of a pcap or pcapng capture, fed in pieces of any size: what
/// `iapctl decode --pcap` prints.
///
/// Two kinds of capture are understood:
/// - traces of this project (``CaptureLinkType/iap``): each packet is one frame (or a run of
///   dropped bytes, or native-transport data) with its direction and wire;
/// - Linux usbmon captures (``CaptureLinkType/usbLinux``, ``CaptureLinkType/usbLinuxMemoryMapped``):
///   the bulk data of each endpoint of an iAP2 interface (FF/F0/00, learned from the
///   configuration descriptors the capture shows; without them, of each bulk endpoint whose
///   first bytes look like iAP) is one stream, reassembled across transfers and decoded as
///   `iapctl decode` decodes a byte stream. Native-transport endpoints (FF/F0/01) are shown as
///   data. Other devices and endpoints are left out.
///
/// Each report's JSON gains `record` (the capture's packet number, as Wireshark numbers frames),
/// `timestamp`, `direction` ("out": host to accessory, "in") and where it was: `interface` and
/// `transport`, or `usb` (bus, device, endpoint).
public struct PcapDecoder: Sendable {
    private enum StreamKey: Hashable {
        case trace(interface: Int, direction: CaptureDirection)
        case usb(bus: UInt16, device: UInt8, endpoint: UInt8)
    }

    /// Where and which way a stream's reports were, for ``annotate(_:_:number:stamp:)``.
    private struct Note {
        var direction: CaptureDirection
        var place: String
        var fields: [(String, JSONValue)]
    }

    private struct Stream {
        var decoder: CaptureDecoder
        var note: Note
        /// The link both directions share: what one direction teaches (the SYN's session table,
        /// StartIDPS turning transaction ids on) holds for the other.
        var link: [Int]
    }

    /// What a decoder found.
    public struct Statistics: Sendable, Hashable {
        /// Packets read from the capture.
        public var packets = 0
        /// Packets of link types other than the ones above (left out).
        public var otherPackets = 0
        /// USB transfers left out (other devices and endpoints).
        public var otherTransfers = 0
        /// The streams' statistics added up (frames, dropped and incomplete bytes…).
        public var frames = CaptureDecoder.Statistics()

        /// Creates zeroed statistics.
        public init() {}
    }

    private let kinds: FrameKinds
    private let transactionIDs: TransactionIDMode
    private var reader = PcapReader()
    private var streams: [StreamKey: Stream] = [:]
    private var order: [StreamKey] = []
    private var usb = USBInterfaceMap()
    /// Streams of undescribed devices judged by their first bytes: true when they look like iAP.
    private var judged: [StreamKey: Bool] = [:]
    private var setups: [UInt64: [UInt8]] = [:]
    /// The inspector of each link (a trace interface, or a USB device), shared by its streams.
    private var inspectors: [[Int]: FrameInspector] = [:]
    private var firstStamp: (Int64, Int)?
    /// Reports of drops and unreadable records not made by a stream (counted here).
    private var direct = CaptureDecoder.Statistics()
    private var finished: [CaptureDecoder.Statistics] = []
    /// Counters.
    public private(set) var statistics = Statistics()
    /// Reads the certificates accessories send into the reports (see ``CertificateReading``);
    /// nil leaves them as bytes.
    public var certificateReader: (@Sendable ([UInt8]) -> CertificateReading)?
    /// Checks each authentication response against the challenge and certificate before it on
    /// the same link (see ``FrameInspector/authenticationChecker``); nil checks nothing.
    public var authenticationChecker: (@Sendable (AuthenticationEvidence) -> AuthenticationChecking)?
    private static let maxStreams = 1024
    private static let maxSetups = 1024

    /// Creates a decoder for one capture file.
    public init(kinds: FrameKinds = .all, transactionIDs: TransactionIDMode = .auto) {
        self.kinds = kinds
        self.transactionIDs = transactionIDs
    }

    /// True when every byte of every stream belonged to a valid frame.
    public var isClean: Bool { statistics.frames.droppedBytes == 0 && statistics.frames.incompleteBytes == 0 }

    /// Decodes the next piece of the file. Throws a ``CaptureFormatError`` when the file is not a
    /// capture or is damaged (the reports before the damage have been handed out), or what
    /// `emit` throws.
    public mutating func feed(_ piece: RawSpan, emit: (FrameReport) throws -> Void) throws {
        reader.append(piece)
        while let packet = try reader.next() {
            statistics.packets += 1
            try take(packet, emit: emit)
        }
        updateStatistics()
    }

    /// Ends the file: hands out what the streams still hold (an incomplete frame at the end of a
    /// stream is reported), then throws if the file stopped inside a block.
    public mutating func finish(emit: (FrameReport) throws -> Void) throws {
        for key in order {
            guard var stream = streams[key] else { continue }
            let note = stream.note
            try stream.decoder.finish { try emit(annotate($0, note, number: nil, stamp: nil)) }
            streams[key] = stream
        }
        updateStatistics()
        try reader.finish()
    }

    private mutating func updateStatistics() {
        var total = direct
        for stream in streams.values.map(\.decoder.statistics) + finished {
            total.bytesFed += stream.bytesFed
            total.frames += stream.frames
            total.droppedBytes += stream.droppedBytes
            total.incompleteBytes += stream.incompleteBytes
            total.reports += stream.reports
            total.bytesCopied += stream.bytesCopied
            total.peakRetainedBytes = max(total.peakRetainedBytes, stream.peakRetainedBytes)
        }
        statistics.frames = total
    }

    // MARK: Packets

    private mutating func take(_ packet: PcapReader.Packet, emit: (FrameReport) throws -> Void) throws {
        if firstStamp == nil { firstStamp = (packet.seconds, packet.nanoseconds) }
        switch packet.linkType {
        case CaptureLinkType.iap:
            try takeTrace(packet, emit: emit)
        case CaptureLinkType.usbLinux, CaptureLinkType.usbLinuxMemoryMapped:
            let record: USBMonRecord
            do {
                record = try USBMonRecord.decode(packet.data, memoryMapped: packet.linkType == CaptureLinkType.usbLinuxMemoryMapped,
                                                 bigEndian: packet.isBigEndian)
            } catch {
                try unreadable(packet, error, emit: emit)
                return
            }
            try takeUSB(record, packet, emit: emit)
        default:
            statistics.otherPackets += 1
        }
    }

    private mutating func unreadable(_ packet: PcapReader.Packet, _ error: CaptureFormatError, emit: (FrameReport) throws -> Void) throws {
        direct.droppedBytes += packet.data.count
        direct.reports += 1
        try emit(FrameReport(
            summary: "[record \(packet.number)] unreadable record: \(error)", details: [],
            json: .object([("kind", .string("unreadable")), ("record", .int(packet.number)), ("timestamp", .string(stamp(packet))),
                           ("length", .int(packet.data.count)), ("error", .string(error.description))]),
            isValid: false))
    }

    private mutating func takeTrace(_ packet: PcapReader.Packet, emit: (FrameReport) throws -> Void) throws {
        let header: IAPCaptureHeader
        do {
            header = try IAPCaptureHeader.decode(packet.data)
        } catch {
            try unreadable(packet, error, emit: emit)
            return
        }
        let interface = reader.interfaces.indices.contains(packet.interface) ? reader.interfaces[packet.interface] : nil
        let place = "if \(packet.interface)"
        let fields: [(String, JSONValue)] = [
            ("interface", .int(packet.interface)), ("interfaceName", interface?.name.map { .string($0) } ?? .null),
            ("transport", .string(header.transport.name)),
        ]
        let payload = Array(packet.data.dropFirst(IAPCaptureHeader.size))
        switch header.content {
        case .frame:
            let key = StreamKey.trace(interface: packet.interface, direction: header.direction)
            let note = Note(direction: header.direction, place: place, fields: fields)
            guard var stream = stream(for: key, note: note, link: [packet.interface]) else { return }
            lend(&stream)
            try stream.decoder.feed(payload.span.bytes) { try emit(annotate($0, note, number: packet.number, stamp: packet)) }
            keep(stream)
            streams[key] = stream
        case .dropped:
            let code = Int(header.dropReason)
            let reason = code >= 1 && code <= IAPCaptureHeader.dropReasonNames.count ? IAPCaptureHeader.dropReasonNames[code - 1] : "reason \(code)"
            let length = max(payload.count, packet.originalLength - IAPCaptureHeader.size)
            direct.droppedBytes += length
            direct.reports += 1
            let note = Note(direction: header.direction, place: place, fields: fields)
            try emit(annotate(FrameReport(
                summary: "dropped \(length) byte\(length == 1 ? "" : "s"): \(reason)",
                details: payload.isEmpty ? [] : ["bytes: " + HexInput.format(payload.prefix(32)) + (payload.count > 32 ? " …" : "")],
                json: .object([("kind", .string("dropped")), ("length", .int(length)), ("reason", .string(reason))]),
                isValid: false), note, number: packet.number, stamp: packet))
        case .nativeData:
            let note = Note(direction: header.direction, place: place, fields: fields)
            try emit(annotate(Self.native(payload), note, number: packet.number, stamp: packet))
        }
    }

    private mutating func takeUSB(_ record: USBMonRecord, _ packet: PcapReader.Packet, emit: (FrameReport) throws -> Void) throws {
        if record.transferType == .control {
            learnDescriptors(record)
            return
        }
        guard record.transferType == .bulk else { statistics.otherTransfers += 1; return }
        // OUT data travels with the submission, IN data with the completion.
        guard !record.data.isEmpty, record.event == (record.isIn ? .completion : .submission) else { return }
        let key = StreamKey.usb(bus: record.bus, device: record.device, endpoint: record.endpoint)
        let endpointText = "0x" + hex(record.endpoint)
        let place = "usb \(record.bus).\(record.device) ep \(endpointText)"
        let fields: [(String, JSONValue)] = [
            ("usb", .object([("bus", .int(Int(record.bus))), ("device", .int(Int(record.device))), ("endpoint", .int(Int(record.endpoint)))])),
            ("transport", .string(CaptureTransport.usb.name)),
        ]
        let direction: CaptureDirection = record.isIn ? .accessoryToHost : .hostToAccessory
        let note = Note(direction: direction, place: place, fields: fields)
        switch usb.role(bus: record.bus, device: record.device, endpoint: record.endpoint) {
        case .iap?:
            break
        case .native?:
            try emit(annotate(Self.native(record.data), note, number: packet.number, stamp: packet))
            return
        case .other?:
            statistics.otherTransfers += 1
            return
        case nil:
            // A device whose enumeration the capture missed: judged by the first bytes it sent.
            if judged[key] == nil, judged.count < Self.maxStreams {
                let head = Array(record.data.prefix(2))
                judged[key] = head == [0xFF, 0x5A] || head == [0xFF, 0x55] || (head.first == 0x55 && kinds.contains(.iap1))
            }
            guard judged[key] == true else { statistics.otherTransfers += 1; return }
        }
        guard var stream = stream(for: key, note: note, link: [-1, Int(record.bus), Int(record.device)]) else { return }
        lend(&stream)
        try stream.decoder.feed(record.data.span.bytes) { try emit(annotate($0, note, number: packet.number, stamp: packet)) }
        keep(stream)
        if record.missingByteCount > 0 {
            // The capture left bytes out: what follows in this stream cannot be trusted to line up.
            try stream.decoder.finish { try emit(annotate($0, note, number: packet.number, stamp: packet)) }
            finished.append(stream.decoder.statistics)
            direct.droppedBytes += record.missingByteCount
            direct.reports += 1
            try emit(annotate(FrameReport(
                summary: "\(record.missingByteCount) bytes of this transfer are not in the capture (snapshot length too small): the stream starts over",
                details: [], json: .object([("kind", .string("missing")), ("length", .int(record.missingByteCount))]), isValid: false),
                note, number: packet.number, stamp: packet))
            stream.decoder = CaptureDecoder(kinds: kinds, transactionIDs: transactionIDs)
            stream.decoder.certificateReader = certificateReader
            stream.decoder.authenticationChecker = authenticationChecker
        }
        streams[key] = stream
    }

    /// Learns the iAP endpoints from GET_DESCRIPTOR(configuration) answers.
    private mutating func learnDescriptors(_ record: USBMonRecord) {
        switch record.event {
        case .submission:
            guard let setup = record.setup else { return }
            if setups.count >= Self.maxSetups { setups.removeAll() }
            setups[record.urbID] = setup
        case .completion, .error:
            guard let setup = setups.removeValue(forKey: record.urbID), record.event == .completion, record.status == 0 else { return }
            // GET_DESCRIPTOR (standard, device to host), descriptor type 2: configuration.
            if setup[0] == 0x80, setup[1] == 6, setup[3] == 2, record.data.count >= 9 {
                let total = Int(record.data[2]) | Int(record.data[3]) << 8
                // The first request asks for 9 bytes only; the full answer names the interfaces.
                guard record.data.count >= total else { return }
                for key in order {
                    if case let .usb(bus, device, _) = key, bus == record.bus, device == record.device { retire(key) }
                }
                usb.forget(bus: record.bus, device: record.device)
                inspectors[[-1, Int(record.bus), Int(record.device)]] = nil
                usb.learn(configuration: record.data, bus: record.bus, device: record.device)
            }
        }
    }

    private mutating func retire(_ key: StreamKey) {
        guard let stream = streams.removeValue(forKey: key) else { return }
        finished.append(stream.decoder.statistics)
        order.removeAll { $0 == key }
        judged[key] = nil
    }

    /// The stream of `key`, taken out of the table (put it back when done) so that feeding it
    /// does not copy its buffer.
    private mutating func stream(for key: StreamKey, note: Note, link: [Int]) -> Stream? {
        if let stream = streams.removeValue(forKey: key) { return stream }
        guard streams.count < Self.maxStreams else { return nil }
        var decoder = CaptureDecoder(kinds: kinds, transactionIDs: transactionIDs)
        decoder.certificateReader = certificateReader
        decoder.authenticationChecker = authenticationChecker
        let stream = Stream(decoder: decoder, note: note, link: link)
        order.append(key)
        return stream
    }

    /// Gives a stream its link's inspector before it is fed…
    private func lend(_ stream: inout Stream) {
        if let inspector = inspectors[stream.link] { stream.decoder.inspector = inspector }
    }

    /// …and keeps what the bytes taught it for the link's other stream.
    private mutating func keep(_ stream: Stream) {
        inspectors[stream.link] = stream.decoder.inspector
    }

    // MARK: Reports

    private static func native(_ data: [UInt8]) -> FrameReport {
        FrameReport(summary: "native transport data, \(data.count) bytes",
                    details: ["bytes: " + HexInput.format(data.prefix(32)) + (data.count > 32 ? " …" : "")],
                    json: .object([("kind", .string("native")), ("length", .int(data.count)),
                                   ("data", .string(HexInput.format(data.prefix(32), separator: "")))]),
                    isValid: true)
    }

    private func stamp(_ packet: PcapReader.Packet) -> String {
        "\(packet.seconds)." + String(String(packet.nanoseconds + 1_000_000_000).dropFirst())
    }

    /// The report with where and when: record number, time, direction, interface or endpoint.
    private func annotate(_ report: FrameReport, _ stream: Note, number: Int?, stamp packet: PcapReader.Packet?) -> FrameReport {
        var report = report
        var prefix = "[" + (number.map { "record \($0), " } ?? "end, ")
        if let packet, let first = firstStamp {
            // Seconds since the first packet; a damaged stamp far from it may not fit, and is left out.
            let (seconds, overflow) = packet.seconds.subtractingReportingOverflow(first.0)
            if !overflow, seconds.magnitude < 1 << 32 {
                let micros = (seconds * 1_000_000_000 + Int64(packet.nanoseconds - first.1)) / 1_000
                let sign = micros < 0 ? "-" : ""
                prefix += "\(sign)\(micros.magnitude / 1_000_000).\(String(String(1_000_000 + micros.magnitude % 1_000_000).dropFirst())) s, "
            }
        }
        prefix += "\(stream.place), \(stream.direction.arrow)] "
        report.summary = prefix + report.summary
        guard case var .object(pairs) = report.json else { return report }
        var extra: [(String, JSONValue)] = [("record", number.map { .int($0) } ?? .null)]
        if let packet { extra.append(("timestamp", .string(stamp(packet)))) }
        extra.append(("direction", .string(stream.direction.word)))
        extra += stream.fields
        pairs.insert(contentsOf: extra, at: min(1, pairs.count))
        report.json = .object(pairs)
        return report
    }
}
