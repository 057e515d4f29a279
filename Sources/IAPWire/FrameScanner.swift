/// Which kinds of frame a ``FrameScanner`` looks for.
public struct FrameKinds: OptionSet, Hashable, Sendable {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    /// iAP2 link packets (`FF 5A …`).
    public static let iap2 = FrameKinds(rawValue: 1 << 0)
    /// iAP1 packets (`[FF] 55 …`), other than the detect.
    public static let iap1 = FrameKinds(rawValue: 1 << 1)
    /// The iAP2 detect sequence `FF 55 02 00 EE 10`.
    public static let detect = FrameKinds(rawValue: 1 << 2)
    /// Everything: what a receiver needs before it knows which protocol the peer speaks.
    public static let all: FrameKinds = [.iap2, .iap1, .detect]
}

/// A frame found by a ``FrameScanner``: what it is and where its bytes lie in the span handed
/// to the callback alongside it.
public struct ScannedFrame: Hashable, Sendable {
    /// What the frame is.
    public enum Kind: Hashable, Sendable {
        /// An iAP2 link packet whose header and payload checksums verified.
        case iap2(LinkPacketHeader)
        /// An iAP1 packet whose checksum verified.
        case iap1(IAP1Framing)
        /// The iAP2 detect sequence (with or without its `FF`).
        case detect
    }

    /// What the frame is.
    public var kind: Kind
    /// The whole frame within the span.
    public var range: Range<Int>
    /// The payload within the span: the link payload of an iAP2 packet, the body (lingo through
    /// payload) of an iAP1 packet, empty for the detect.
    public var payload: Range<Int>
    /// True when the frame straddled two chunks and the scanner reassembled it (one copy into
    /// its own buffer). False means the span is the caller's chunk: no byte was copied.
    public var isReassembled: Bool
    /// Where the frame starts in the whole stream fed to the scanner (0 = its first byte).
    public var streamOffset: Int
}

/// Why a ``FrameScanner`` dropped bytes.
public enum ScanDropReason: Hashable, Sendable, CustomStringConvertible {
    /// Bytes that cannot start any frame of the kinds looked for.
    case garbage
    /// An `FF 5A` whose header checksum did not verify.
    case badHeaderChecksum
    /// An iAP2 packet whose payload checksum did not verify.
    case badPayloadChecksum
    /// An iAP1 packet whose checksum did not verify.
    case badIAP1Checksum
    /// A length field no frame may have (iAP2 below 9 or equal to 10, iAP1 below 2).
    case invalidLength(Int)
    /// A length field longer than the scanner accepts: its ``FrameScanner/maxFrameLength``, or
    /// the lower limit its owner set for the state it is in (``FrameScanner/iap2LengthLimit``,
    /// ``FrameScanner/iap1LengthLimit``).
    case frameTooLong(Int)
    /// A valid iAP1 packet while the scanner does not look for iAP1 (the detect only).
    case unexpectedIAP1
    /// A partial frame given up on because no byte came for the inter-byte gap its owner
    /// allows (``FrameScanner/abandonPartialFrame(onFrame:onDrop:)``).
    case partialFrameAbandoned

    /// A reason without its length: what ``ScanDropCounts`` counts by.
    public enum Kind: Hashable, Sendable, CaseIterable {
        /// ``ScanDropReason/garbage``.
        case garbage
        /// ``ScanDropReason/badHeaderChecksum``.
        case badHeaderChecksum
        /// ``ScanDropReason/badPayloadChecksum``.
        case badPayloadChecksum
        /// ``ScanDropReason/badIAP1Checksum``.
        case badIAP1Checksum
        /// ``ScanDropReason/invalidLength(_:)``, any length.
        case invalidLength
        /// ``ScanDropReason/frameTooLong(_:)``, any length.
        case frameTooLong
        /// ``ScanDropReason/unexpectedIAP1``.
        case unexpectedIAP1
        /// ``ScanDropReason/partialFrameAbandoned``.
        case partialFrameAbandoned
    }

    /// The reason without its length.
    public var kind: Kind {
        switch self {
        case .garbage: return .garbage
        case .badHeaderChecksum: return .badHeaderChecksum
        case .badPayloadChecksum: return .badPayloadChecksum
        case .badIAP1Checksum: return .badIAP1Checksum
        case .invalidLength: return .invalidLength
        case .frameTooLong: return .frameTooLong
        case .unexpectedIAP1: return .unexpectedIAP1
        case .partialFrameAbandoned: return .partialFrameAbandoned
        }
    }

    public var description: String {
        switch self {
        case .garbage: return "garbage"
        case .badHeaderChecksum: return "bad iAP2 header checksum"
        case .badPayloadChecksum: return "bad iAP2 payload checksum"
        case .badIAP1Checksum: return "bad iAP1 checksum"
        case let .invalidLength(length): return "invalid length \(length)"
        case let .frameTooLong(length): return "frame of \(length) bytes is longer than allowed"
        case .unexpectedIAP1: return "iAP1 packet while iAP1 is off"
        case .partialFrameAbandoned: return "partial frame abandoned: the line fell silent before it was complete"
        }
    }
}

/// Bytes a ``FrameScanner`` dropped, and why.
public struct ScanDrop: Hashable, Sendable, CustomStringConvertible {
    /// Why the bytes were dropped: garbage, a bad checksum, a length that cannot be right, a
    /// partial frame the line fell silent in.
    public var reason: ScanDropReason
    /// How many consecutive bytes were dropped (a run of garbage is one drop, however many
    /// chunks it spans).
    public var byteCount: Int
    /// Where the dropped bytes start in the whole stream fed to the scanner.
    public var streamOffset: Int

    /// A report of `byteCount` bytes dropped for `reason`, starting `streamOffset` bytes into the
    /// stream (the scanner makes these; tests and replays build them to compare).
    public init(reason: ScanDropReason, byteCount: Int, streamOffset: Int) {
        self.reason = reason
        self.byteCount = byteCount
        self.streamOffset = streamOffset
    }

    public var description: String { "dropped \(byteCount) byte\(byteCount == 1 ? "" : "s"): \(reason)" }
}

/// Counters kept by a ``FrameScanner``.
public struct ScanStatistics: Hashable, Sendable {
    /// Bytes fed to the scanner.
    public var bytesScanned = 0
    /// Frames delivered.
    public var frames = 0
    /// Bytes in delivered frames.
    public var frameBytes = 0
    /// Frames that straddled chunks and were reassembled by one copy.
    public var reassembledFrames = 0
    /// Bytes dropped, for any reason.
    public var droppedBytes = 0
    /// Drop events by kind of reason (each drop's own length field, where it has one, is in its
    /// ``ScanDrop``). Fixed counters, not a dictionary: garbage with lying lengths makes one
    /// drop per candidate, and hashing each reason cost more than scanning.
    public var dropsByKind = ScanDropCounts()

    /// Counters at zero, as a new scanner starts.
    public init() {}
}

/// Drop events counted by ``ScanDropReason/Kind``.
public struct ScanDropCounts: Hashable, Sendable {
    // One stored count per kind: no storage to allocate or copy on write.
    private var garbage = 0
    private var badHeaderChecksum = 0
    private var badPayloadChecksum = 0
    private var badIAP1Checksum = 0
    private var invalidLength = 0
    private var frameTooLong = 0
    private var unexpectedIAP1 = 0
    private var partialFrameAbandoned = 0

    /// No drops yet.
    public init() {}

    /// The drops of one kind.
    public subscript(kind: ScanDropReason.Kind) -> Int {
        get {
            switch kind {
            case .garbage: return garbage
            case .badHeaderChecksum: return badHeaderChecksum
            case .badPayloadChecksum: return badPayloadChecksum
            case .badIAP1Checksum: return badIAP1Checksum
            case .invalidLength: return invalidLength
            case .frameTooLong: return frameTooLong
            case .unexpectedIAP1: return unexpectedIAP1
            case .partialFrameAbandoned: return partialFrameAbandoned
            }
        }
        set {
            switch kind {
            case .garbage: garbage = newValue
            case .badHeaderChecksum: badHeaderChecksum = newValue
            case .badPayloadChecksum: badPayloadChecksum = newValue
            case .badIAP1Checksum: badIAP1Checksum = newValue
            case .invalidLength: invalidLength = newValue
            case .frameTooLong: frameTooLong = newValue
            case .unexpectedIAP1: unexpectedIAP1 = newValue
            case .partialFrameAbandoned: partialFrameAbandoned = newValue
            }
        }
    }

    /// Every drop counted.
    public var total: Int { ScanDropReason.Kind.allCases.reduce(0) { $0 + self[$1] } }
}

/// Finds iAP2 link packets, iAP1 packets and the iAP2 detect in a byte stream fed in arbitrary
/// chunks.
///
/// Feed chunks with ``scan(_:onFrame:onDrop:)-(RawSpan,_,_)`` (or its array twin); each frame
/// is handed to the callback with the span it lies in. A frame that lies inside one chunk is a view into that chunk (no copy); a
/// frame that straddles chunks is reassembled by one copy into a buffer the scanner allocates
/// once, at creation. Malformed input never traps: the scanner drops the first byte of a bad
/// candidate and looks again from the next byte, so a lying length or a corrupted packet costs
/// at most that packet, and the next good frame is still found. Every byte fed ends up in
/// exactly one place: a delivered frame, a ``ScanDrop``, or the partial frame held for the next
/// chunk (``pendingByteCount``), which never exceeds ``maxFrameLength``.
///
/// A receiver that knows more than the wire format tells the scanner what can be right in its
/// state: ``iap2LengthLimit`` and ``iap1LengthLimit`` (before an iAP2 link is up, nothing longer
/// than a SYN can be), so that a length field that cannot be right is dropped at once instead
/// of being waited for; and ``abandonPartialFrame(onFrame:onDrop:)`` when its line fell silent
/// in the middle of a frame, so that bytes a lying length swallowed are scanned again.
///
/// The scanner holds no reference to the chunks it is fed; the spans handed to the callbacks are
/// valid only during the call.
public struct FrameScanner: Sendable {
    /// The kinds looked for. A receiver that has settled on iAP2 can turn iAP1 off, so that a
    /// stray `55` byte in garbage does not make it wait for a long iAP1 candidate.
    public var kinds: FrameKinds
    /// The longest frame the scanner can take: the most bytes it holds for a partial frame, and
    /// the ceiling of ``iap2LengthLimit`` and ``iap1LengthLimit``.
    public let maxFrameLength: Int
    /// What the scanner has seen since it was made: bytes, frames, reassemblies, drops by kind.
    public private(set) var statistics = ScanStatistics()

    /// The longest iAP2 link packet accepted now, between 9 and ``maxFrameLength`` (values
    /// outside are brought within); ``maxFrameLength`` until set. A longer length field is
    /// dropped at once as ``ScanDropReason/frameTooLong(_:)``, whether or not its bytes are
    /// there. A partial frame already held is judged by the new limit when the next chunk comes.
    public var iap2LengthLimit: Int {
        get { iap2Limit }
        set { iap2Limit = Self.clamped(newValue, maxFrameLength) }
    }

    /// The longest iAP1 packet (the detect included) accepted now, between 9 (room for the
    /// detect in any of its forms) and ``maxFrameLength``; ``maxFrameLength`` until set. As
    /// ``iap2LengthLimit``, for iAP1 packets.
    public var iap1LengthLimit: Int {
        get { iap1Limit }
        set { iap1Limit = Self.clamped(newValue, maxFrameLength) }
    }

    private var iap2Limit: Int
    private var iap1Limit: Int
    private var pending: [UInt8]
    /// Stream offset of `pending[0]`.
    private var pendingOffset = 0
    private var garbageRun = 0
    private var garbageOffset = 0

    /// The default frame limit: the longest iAP1 packet (the longest iAP2 packet is shorter).
    public static let defaultMaxFrameLength = IAP1Packet.maxEncodedLength

    /// Creates a scanner.
    ///
    /// - Parameters:
    ///   - kinds: the frame kinds to look for.
    ///   - maxFrameLength: the longest frame accepted, at least 9; a link would pass its own
    ///     negotiated maximum receive length here.
    public init(kinds: FrameKinds = .all, maxFrameLength: Int = FrameScanner.defaultMaxFrameLength) {
        precondition(maxFrameLength >= LinkPacketHeader.size, "maxFrameLength must be at least 9")
        self.kinds = kinds
        self.maxFrameLength = maxFrameLength
        self.iap2Limit = maxFrameLength
        self.iap1Limit = maxFrameLength
        self.pending = []
        self.pending.reserveCapacity(maxFrameLength)
    }

    private static func clamped(_ limit: Int, _ ceiling: Int) -> Int {
        min(max(limit, LinkPacketHeader.size), ceiling)
    }

    /// Bytes held for a frame that has not been completed yet.
    public var pendingByteCount: Int { pending.count }

    /// Hands over the bytes held for a partial frame, without counting them as dropped: for a
    /// receiver that passes the stream on to another (the host switching to iAP1).
    public mutating func takePendingBytes() -> [UInt8] {
        defer { pending.removeAll(keepingCapacity: true) }
        return pending
    }

    /// Gives up on the partial frame held for the next chunk: for a receiver whose line fell
    /// silent in the middle of a frame for longer than it allows between two bytes of one frame.
    /// A lying length field (noise, a header that lost bytes) would otherwise swallow the next
    /// frames that come, until as many bytes as it claimed arrived.
    ///
    /// The held frame's first byte is dropped (``ScanDropReason/partialFrameAbandoned``) and the
    /// bytes after it are scanned again as bytes nothing will follow: frames among them are
    /// delivered (``ScannedFrame/isReassembled`` true, `onFrame`'s span is a copy), and a
    /// candidate among them that would need more bytes is dropped the same way instead of being
    /// held. Afterwards nothing is held. Does nothing when nothing is held.
    public mutating func abandonPartialFrame(
        onFrame: (ScannedFrame, RawSpan) throws -> Void,
        onDrop: (ScanDrop) throws -> Void
    ) rethrows {
        guard !pending.isEmpty else { return }
        // A copy, on this rare path, so that `pending` keeps its storage for the next frame.
        let held = Array(pending)
        let base = pendingOffset
        pending.removeAll(keepingCapacity: true)
        try flushGarbage(onDrop)
        try record(ScanDrop(reason: .partialFrameAbandoned, byteCount: 1, streamOffset: base), onDrop: onDrop)
        try scanBody(held.span.bytes, base: base, from: 1, reassembled: true, final: true, onFrame: onFrame, onDrop: onDrop)
        try flushGarbage(onDrop)
    }

    /// Forgets a partial frame (for instance after a link reset), counting it as dropped.
    public mutating func reset() {
        if !pending.isEmpty {
            record(ScanDrop(reason: .garbage, byteCount: pending.count, streamOffset: pendingOffset), onDrop: { _ in })
            pending.removeAll(keepingCapacity: true)
        }
        garbageRun = 0
    }

    /// Scans `chunk`, calling `onFrame` for each complete frame and `onDrop` for dropped bytes.
    ///
    /// - Parameters:
    ///   - chunk: the next bytes of the stream.
    ///   - onFrame: called with each frame and the span its ranges refer to: `chunk` itself, or
    ///     the scanner's reassembly buffer when ``ScannedFrame/isReassembled`` is true.
    ///   - onDrop: called for bytes that are dropped; consecutive garbage is reported once.
    public mutating func scan(
        _ chunk: RawSpan,
        onFrame: (ScannedFrame, RawSpan) throws -> Void,
        onDrop: (ScanDrop) throws -> Void
    ) rethrows {
        let base = statistics.bytesScanned
        statistics.bytesScanned += chunk.byteCount
        var offset = 0
        if try completePending(chunk, base: base, offset: &offset, onFrame: onFrame, onDrop: onDrop) {
            try scanBody(chunk, base: base, from: offset, reassembled: false, final: false, onFrame: onFrame, onDrop: onDrop)
        }
        try flushGarbage(onDrop)
    }

    /// Completes (or refutes) a frame held from earlier chunks, taking bytes from `chunk` at
    /// `offset`. Returns false when `chunk` ran out before the held frame was decided.
    private mutating func completePending(
        _ chunk: RawSpan, base: Int, offset: inout Int,
        onFrame: (ScannedFrame, RawSpan) throws -> Void,
        onDrop: (ScanDrop) throws -> Void
    ) rethrows -> Bool {
        while !pending.isEmpty {
            switch Self.step(pending.span.bytes, at: 0, kinds: kinds, iap2Limit: iap2Limit, iap1Limit: iap1Limit) {
            case let .needMore(total):
                // Take exactly what the candidate needs, so `pending` never holds a byte past it.
                let take = min(total - pending.count, chunk.byteCount - offset)
                if take > 0 {
                    chunk.extracting(offset..<(offset + take)).withUnsafeBytes { pending.append(contentsOf: $0) }
                    offset += take
                }
                if pending.count < total { return false }
            case let .frame(frame):
                var delivered = frame
                delivered.isReassembled = true
                delivered.streamOffset = pendingOffset
                try flushGarbage(onDrop)
                statistics.frames += 1
                statistics.frameBytes += frame.range.count
                statistics.reassembledFrames += 1
                try onFrame(delivered, pending.span.bytes)
                pending.removeAll(keepingCapacity: true)
            case let .drop(reason, count), let .skip(reason, count):
                // The bytes after the dropped ones must be scanned again from their start; this
                // copy happens on the error path only.
                let rest = Array(pending[count...])
                let restOffset = pendingOffset + count
                let dropOffset = pendingOffset
                pending.removeAll(keepingCapacity: true)
                if reason == .garbage {
                    addGarbage(count, at: dropOffset)
                } else {
                    try flushGarbage(onDrop)
                    try record(ScanDrop(reason: reason, byteCount: count, streamOffset: dropOffset), onDrop: onDrop)
                }
                try scanBody(rest.span.bytes, base: restOffset, from: 0, reassembled: true, final: false, onFrame: onFrame, onDrop: onDrop)
            }
        }
        return true
    }

    /// Scans `chunk`, ignoring drops (they are still counted in ``statistics``).
    public mutating func scan(_ chunk: RawSpan, onFrame: (ScannedFrame, RawSpan) throws -> Void) rethrows {
        try scan(chunk, onFrame: onFrame, onDrop: { _ in })
    }

    /// Scans bytes held in an array. See ``scan(_:onFrame:onDrop:)``.
    public mutating func scan(
        _ chunk: [UInt8],
        onFrame: (ScannedFrame, RawSpan) throws -> Void,
        onDrop: (ScanDrop) throws -> Void
    ) rethrows {
        try scan(chunk.span.bytes, onFrame: onFrame, onDrop: onDrop)
    }

    /// Scans bytes held in an array, ignoring drops.
    public mutating func scan(_ chunk: [UInt8], onFrame: (ScannedFrame, RawSpan) throws -> Void) rethrows {
        try scan(chunk.span.bytes, onFrame: onFrame, onDrop: { _ in })
    }

    /// Scans `bytes` from `start`. A candidate that needs more bytes than there are is held for
    /// the next chunk, or dropped when `final` (nothing follows these bytes).
    private mutating func scanBody(
        _ bytes: RawSpan, base: Int, from start: Int, reassembled: Bool, final: Bool,
        onFrame: (ScannedFrame, RawSpan) throws -> Void,
        onDrop: (ScanDrop) throws -> Void
    ) rethrows {
        var offset = start
        while offset < bytes.byteCount {
            switch Self.step(bytes, at: offset, kinds: kinds, iap2Limit: iap2Limit, iap1Limit: iap1Limit) {
            case let .frame(frame):
                var delivered = frame
                delivered.isReassembled = reassembled
                delivered.streamOffset = base + frame.range.lowerBound
                try flushGarbage(onDrop)
                statistics.frames += 1
                statistics.frameBytes += frame.range.count
                if reassembled { statistics.reassembledFrames += 1 }
                try onFrame(delivered, bytes)
                offset = frame.range.upperBound
            case let .skip(_, count):
                addGarbage(count, at: base + offset)
                offset += count
            case let .drop(reason, count):
                try flushGarbage(onDrop)
                try record(ScanDrop(reason: reason, byteCount: count, streamOffset: base + offset), onDrop: onDrop)
                offset += count
            case .needMore where final:
                try flushGarbage(onDrop)
                try record(ScanDrop(reason: .partialFrameAbandoned, byteCount: 1, streamOffset: base + offset), onDrop: onDrop)
                offset += 1
            case .needMore:
                // Keep the partial frame; `pending` is empty here and has room for a whole frame.
                pendingOffset = base + offset
                bytes.extracting(offset..<bytes.byteCount).withUnsafeBytes { pending.append(contentsOf: $0) }
                return
            }
        }
    }

    private mutating func addGarbage(_ count: Int, at streamOffset: Int) {
        if garbageRun == 0 { garbageOffset = streamOffset }
        garbageRun += count
    }

    private mutating func flushGarbage(_ onDrop: (ScanDrop) throws -> Void) rethrows {
        guard garbageRun > 0 else { return }
        let count = garbageRun
        garbageRun = 0
        try record(ScanDrop(reason: .garbage, byteCount: count, streamOffset: garbageOffset), onDrop: onDrop)
    }

    private mutating func record(_ drop: ScanDrop, onDrop: (ScanDrop) throws -> Void) rethrows {
        statistics.droppedBytes += drop.byteCount
        statistics.dropsByKind[drop.reason.kind] += 1
        try onDrop(drop)
    }

    /// What the bytes at one offset are.
    @usableFromInline
    enum Step {
        /// A verified frame; its ranges are relative to the scanned span.
        case frame(ScannedFrame)
        /// Bytes that cannot start a frame (reason is `.garbage`); may be coalesced.
        case skip(ScanDropReason, Int)
        /// A failed candidate: drop this many bytes (always 1) and look again.
        case drop(ScanDropReason, Int)
        /// A candidate that needs this many bytes from the offset to be decided.
        case needMore(Int)
    }

    /// What the bytes at `offset` are, for iAP2 packets of at most `iap2Limit` bytes and iAP1
    /// packets of at most `iap1Limit`.
    @usableFromInline
    static func step(_ bytes: RawSpan, at offset: Int, kinds: FrameKinds, iap2Limit: Int, iap1Limit: Int) -> Step {
        let available = bytes.byteCount - offset
        let first = bytes.byte(at: offset)
        let lookForIAP1 = !kinds.isDisjoint(with: [.iap1, .detect])
        if first == 0xFF {
            guard available >= 2 else { return .needMore(2) }
            let second = bytes.byte(at: offset + 1)
            if second == 0x5A, kinds.contains(.iap2) {
                return stepIAP2(bytes, at: offset, limit: iap2Limit)
            }
            if second == 0x55, lookForIAP1 {
                return stepIAP1(bytes, at: offset, kinds: kinds, limit: iap1Limit)
            }
            return .skip(.garbage, 1)
        }
        if first == 0x55, lookForIAP1 {
            return stepIAP1(bytes, at: offset, kinds: kinds, limit: iap1Limit)
        }
        // Skip a run of bytes that cannot start a frame.
        var end = offset + 1
        while end < bytes.byteCount {
            let byte = bytes.byte(at: end)
            if byte == 0xFF || (byte == 0x55 && lookForIAP1) { break }
            end += 1
        }
        return .skip(.garbage, end - offset)
    }

    @usableFromInline
    static func stepIAP2(_ bytes: RawSpan, at offset: Int, limit: Int) -> Step {
        let available = bytes.byteCount - offset
        guard available >= LinkPacketHeader.size else { return .needMore(LinkPacketHeader.size) }
        guard Checksum.verifies(bytes.extracting(offset..<(offset + LinkPacketHeader.size))) else {
            return .drop(.badHeaderChecksum, 1)
        }
        let length = Int(bytes.uint16BE(at: offset + 2))
        guard length == LinkPacketHeader.size || length > LinkPacketHeader.overhead else {
            return .drop(.invalidLength(length), 1)
        }
        guard length <= limit else { return .drop(.frameTooLong(length), 1) }
        guard available >= length else { return .needMore(length) }
        let header = LinkPacketHeader(
            control: LinkControl(rawValue: bytes.byte(at: offset + 4)), sequence: bytes.byte(at: offset + 5),
            acknowledgement: bytes.byte(at: offset + 6), sessionID: bytes.byte(at: offset + 7), packetLength: length)
        let payloadStart = offset + LinkPacketHeader.size
        let payloadEnd = payloadStart + header.payloadLength
        if header.payloadLength > 0, !Checksum.verifies(bytes.extracting(payloadStart..<(payloadEnd + 1))) {
            return .drop(.badPayloadChecksum, 1)
        }
        return .frame(ScannedFrame(kind: .iap2(header), range: offset..<(offset + length),
                                   payload: payloadStart..<payloadEnd, isReassembled: false, streamOffset: 0))
    }

    @usableFromInline
    static func stepIAP1(_ bytes: RawSpan, at offset: Int, kinds: FrameKinds, limit: Int) -> Step {
        let rest = bytes.extracting(offset..<bytes.byteCount)
        switch IAP1Framing.probe(rest) {
        case .notAPacket:
            return .skip(.garbage, 1)
        case let .needMore(count):
            return .needMore(count)
        case let .invalidLength(length):
            return .drop(.invalidLength(length), 1)
        case let .framing(framing):
            guard framing.packetLength <= limit else { return .drop(.frameTooLong(framing.packetLength), 1) }
            guard rest.byteCount >= framing.packetLength else { return .needMore(framing.packetLength) }
            guard framing.checksumVerifies(in: rest) else { return .drop(.badIAP1Checksum, 1) }
            let range = offset..<(offset + framing.packetLength)
            let body = (offset + framing.body.lowerBound)..<(offset + framing.body.upperBound)
            if kinds.contains(.detect), IAP2Detect.isDetect(body: bytes.extracting(body)) {
                return .frame(ScannedFrame(kind: .detect, range: range, payload: body.upperBound..<body.upperBound,
                                           isReassembled: false, streamOffset: 0))
            }
            guard kinds.contains(.iap1) else { return .drop(.unexpectedIAP1, 1) }
            return .frame(ScannedFrame(kind: .iap1(framing), range: range, payload: body, isReassembled: false, streamOffset: 0))
        }
    }
}
