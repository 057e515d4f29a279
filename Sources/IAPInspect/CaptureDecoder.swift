public import IAPWire

/// Decodes a capture (the bytes of one stream) into reports, in stream order, as the bytes
/// come: what `iapctl decode` prints.
///
/// Feed the stream in pieces of any size with ``feed(_:emit:)`` and end it with
/// ``finish(emit:)``; each report is handed to `emit` as soon as it is decided, so a long capture
/// or a live pipe shows its frames at once. The reports do not depend on how the stream was cut:
/// runs of garbage are reported whole, and a dropped candidate is described with the bytes that
/// follow it even when they come in a later piece.
///
/// Time is linear in the input (no piece is copied more than once into the decoder's buffer,
/// and no drop looks at more than ``FrameInspector/dropLookahead`` bytes), and memory is
/// bounded: the decoder holds the scanner's partial frame, the bytes a dropped candidate still
/// needs described, and the piece being fed, never more than
/// ``retainedByteLimit(pieceSize:)`` bytes (``Statistics/peakRetainedBytes`` says how many it
/// held).
public struct CaptureDecoder: Sendable {
    /// Everything found in a capture.
    public struct Result: Sendable {
        /// One report per frame, per run of dropped bytes, and one for an incomplete tail.
        public var reports: [FrameReport] = []
        /// Valid frames found.
        public var frames = 0
        /// Bytes that belonged to no valid frame.
        public var droppedBytes = 0
        /// Bytes at the end that start a frame the capture does not complete.
        public var incompleteBytes = 0

        /// True when every byte belonged to a valid frame.
        public var isClean: Bool { droppedBytes == 0 && incompleteBytes == 0 }
    }

    /// What a decoder found and what it cost.
    public struct Statistics: Hashable, Sendable {
        /// Bytes fed.
        public var bytesFed = 0
        /// Valid frames found.
        public var frames = 0
        /// Bytes that belonged to no valid frame.
        public var droppedBytes = 0
        /// Bytes at the end that start a frame the stream does not complete (known at the end).
        public var incompleteBytes = 0
        /// Reports handed to `emit`.
        public var reports = 0
        /// Bytes of the stream copied into the decoder's buffer, its compaction included: at most
        /// twice ``bytesFed``.
        public var bytesCopied = 0
        /// The most bytes held at once: the decoder's buffer and the scanner's partial frame.
        public var peakRetainedBytes = 0

        /// Creates zeroed statistics.
        public init() {}
    }

    /// A report not handed out yet, in stream order.
    private enum Waiting: Sendable {
        /// A frame's report: ready.
        case report(FrameReport)
        /// A dropped candidate, described from ``window`` once it holds enough after it.
        case candidate(ScanDrop)
        /// A run of garbage (or an unexpected iAP1 packet), with the first bytes from its start:
        /// all its report shows. A run that ends the bytes seen so far may still grow.
        case run(ScanDrop, head: [UInt8])
        /// Handed out already (its slot goes at the next compaction of the queue).
        case handedOut
    }

    /// The scanner, taken out while it scans (so its callbacks may change the rest of `self`).
    private var scanner: FrameScanner?
    /// What the stream taught so far (link sessions, iAP1 transaction ids); ``PcapDecoder``
    /// shares one between the two directions of a link.
    var inspector: FrameInspector
    /// Stream bytes from ``windowOffset`` on, starting at index ``windowStart``; the bytes before
    /// that index are dead and go at the next compaction.
    private var window: [UInt8] = []
    private var windowStart = 0
    private var windowOffset = 0
    private var waiting: [Waiting] = []
    private var waitingHead = 0
    private var ended = false
    /// What the decoder has done so far: bytes fed, frames found, reports handed out.
    public private(set) var statistics = Statistics()

    /// The most bytes a decoder holds when fed pieces of at most `pieceSize` bytes: the scanner's
    /// partial frame (at most one frame), the bytes a dropped candidate is described from (at most
    /// ``FrameInspector/dropLookahead``, with as many again not yet compacted away) and the piece.
    public static func retainedByteLimit(pieceSize: Int) -> Int {
        FrameScanner.defaultMaxFrameLength + 2 * FrameInspector.dropLookahead + pieceSize
    }

    /// Creates a decoder for one stream.
    public init(kinds: FrameKinds = .all, transactionIDs: TransactionIDMode = .auto) {
        scanner = FrameScanner(kinds: kinds)
        inspector = FrameInspector(transactionIDMode: transactionIDs)
    }

    /// True when every byte so far belonged to a valid frame (and, after ``finish(emit:)``, none
    /// was left in an incomplete one).
    public var isClean: Bool { statistics.droppedBytes == 0 && statistics.incompleteBytes == 0 }

    /// Decodes the next piece of the stream, handing each report that is decided to `emit`.
    /// When `emit` throws, the error ends the decoding: feed this decoder no more.
    public mutating func feed(_ piece: RawSpan, emit: (FrameReport) throws -> Void) rethrows {
        precondition(!ended, "CaptureDecoder.feed after finish: make a new decoder for a new stream")
        guard piece.byteCount > 0 else { return }
        compact()
        piece.withUnsafeBytes { window.append(contentsOf: $0) }
        statistics.bytesCopied += piece.byteCount
        statistics.bytesFed += piece.byteCount
        growHeads()
        var scanner = self.scanner.take()!
        defer { self.scanner = scanner }
        noteRetained(scanner)
        try scanner.scan(piece, onFrame: { frame, span in
            statistics.frames += 1
            waiting.append(.report(inspector.inspect(frame, in: span)))
            try handOut(emit)
        }, onDrop: { drop in
            statistics.droppedBytes += drop.byteCount
            take(drop)
            try handOut(emit)
        })
        noteRetained(scanner)
        try handOut(emit)
        trim(keepingFrom: statistics.bytesFed - scanner.pendingByteCount)
    }

    private mutating func noteRetained(_ scanner: FrameScanner) {
        statistics.peakRetainedBytes = max(statistics.peakRetainedBytes, window.count + scanner.pendingByteCount)
    }

    /// Ends the stream: hands out every report still waiting, then the report of an incomplete
    /// frame at the end, if there is one.
    public mutating func finish(emit: (FrameReport) throws -> Void) rethrows {
        guard !ended else { return }
        ended = true
        try handOut(emit)
        let pending = scanner?.pendingByteCount ?? 0
        statistics.incompleteBytes = pending
        guard pending > 0 else { return }
        let start = statistics.bytesFed - pending
        let tail = Array(window[known(from: start)])
        let shown = tail.prefix(32)
        var details = ["bytes: " + HexInput.format(shown) + (shown.count < pending ? " …" : "")]
        if case let .failure(error) = Result2.catching({ () throws(WireError) in
            if tail.count > 1, tail[0] == 0xFF, tail[1] == 0x5A {
                _ = try LinkPacket.decode(tail.span.bytes)
            } else {
                _ = try IAP1Framing.decode(tail.span.bytes)
            }
        }) {
            details.insert(error.description, at: 0)
        }
        statistics.reports += 1
        try emit(FrameReport(
            summary: "incomplete: the input ends inside a frame (\(pending) bytes)",
            details: details,
            json: .object([("kind", .string("incomplete")), ("offset", .int(start)), ("length", .int(pending))]),
            isValid: false))
    }

    /// Scans `bytes` as one whole stream and describes every frame and drop.
    public static func decode(_ bytes: [UInt8], kinds: FrameKinds = .all, transactionIDs: TransactionIDMode = .auto) -> Result {
        var decoder = CaptureDecoder(kinds: kinds, transactionIDs: transactionIDs)
        var result = Result()
        let all = bytes.span.bytes
        var offset = 0
        while offset < bytes.count {
            let end = min(bytes.count, offset + 1 << 16)
            decoder.feed(all.extracting(offset..<end)) { result.reports.append($0) }
            offset = end
        }
        decoder.finish { result.reports.append($0) }
        result.frames = decoder.statistics.frames
        result.droppedBytes = decoder.statistics.droppedBytes
        result.incompleteBytes = decoder.statistics.incompleteBytes
        return result
    }

    // MARK: Waiting reports

    /// Queues a drop: a run of garbage joins the run before it when they touch (the scanner
    /// reports a run once per piece; a person sees it once).
    private mutating func take(_ drop: ScanDrop) {
        if FrameInspector.decodesCandidate(drop.reason) {
            waiting.append(.candidate(drop))
            return
        }
        if drop.reason == .garbage, waiting.count > waitingHead, case .run(var run, let head) = waiting[waiting.count - 1],
           run.reason == .garbage, run.streamOffset + run.byteCount == drop.streamOffset {
            run.byteCount += drop.byteCount
            waiting[waiting.count - 1] = .run(run, head: head)
            return
        }
        let range = known(from: drop.streamOffset)
        let head = Array(window[range.prefix(inspector.previewLimit)])
        waiting.append(.run(drop, head: head))
    }

    /// Hands out the reports at the front that are decided, in order.
    private mutating func handOut(_ emit: (FrameReport) throws -> Void) rethrows {
        while waitingHead < waiting.count {
            guard let report = decided(waiting[waitingHead], isLast: waitingHead == waiting.count - 1) else { break }
            waiting[waitingHead] = .handedOut
            waitingHead += 1
            statistics.reports += 1
            try emit(report)
        }
        if waitingHead == waiting.count {
            waiting.removeAll(keepingCapacity: true)
            waitingHead = 0
        } else if waitingHead >= 64, waitingHead >= waiting.count - waitingHead {
            waiting.removeSubrange(0..<waitingHead)
            waitingHead = 0
        }
    }

    /// The report of a waiting entry, or nil while more of the stream could change it.
    private func decided(_ entry: Waiting, isLast: Bool) -> FrameReport? {
        switch entry {
        case let .report(report):
            return report
        case let .candidate(drop):
            return inspector.inspect(drop, following: window.span.bytes.extracting(known(from: drop.streamOffset)), isEndOfStream: ended)
        case let .run(drop, head):
            // The last run of garbage may still grow, until something follows it or the stream ends.
            if !ended, isLast, drop.reason == .garbage { return nil }
            return inspector.inspect(drop, following: head.span.bytes, isEndOfStream: ended || head.count >= inspector.previewLimit)
        case .handedOut:
            return nil
        }
    }

    /// Completes the first bytes of runs that began near the end of the bytes seen before.
    private mutating func growHeads() {
        let limit = inspector.previewLimit
        for index in waitingHead..<waiting.count {
            guard case let .run(drop, head) = waiting[index], head.count < limit else { continue }
            let more = known(from: drop.streamOffset + head.count).prefix(limit - head.count)
            waiting[index] = .run(drop, head: head + window[more])
        }
    }

    // MARK: The window

    /// Where in ``window`` the stream bytes known from `offset` on lie (empty when they are gone
    /// or have not come yet).
    private func known(from offset: Int) -> Range<Int> {
        let index = windowStart + (offset - windowOffset)
        guard offset >= windowOffset, index <= window.count else { return window.count..<window.count }
        return index..<window.count
    }

    /// Forgets the bytes before `offset`, unless a waiting candidate still needs them.
    private mutating func trim(keepingFrom offset: Int) {
        var keep = offset
        for index in waitingHead..<waiting.count {
            if case let .candidate(drop) = waiting[index] { keep = min(keep, drop.streamOffset); break }
        }
        guard keep > windowOffset else { return }
        let dead = min(keep - windowOffset, window.count - windowStart)
        windowStart += dead
        windowOffset += dead
    }

    /// Moves the live bytes to the front once the dead ones are at least as many, so each byte
    /// is moved at most once on average.
    private mutating func compact() {
        guard windowStart > 0, windowStart >= window.count - windowStart else { return }
        statistics.bytesCopied += window.count - windowStart
        window.removeSubrange(0..<windowStart)
        windowStart = 0
    }
}

enum Result2 {
    static func catching(_ body: () throws(WireError) -> Void) -> Result<Void, WireError> {
        do {
            try body()
            return .success(())
        } catch {
            return .failure(error)
        }
    }
}
