import IAPWire

/// Bytes from hex text such as "FF 5A 00 09"; spaces optional.
func bytes(_ hex: String) -> [UInt8] {
    let digits = hex.filter { $0.isHexDigit }
    precondition(digits.count % 2 == 0, "odd number of hex digits in test vector")
    var result: [UInt8] = []
    var index = digits.startIndex
    while index < digits.endIndex {
        let next = digits.index(index, offsetBy: 2)
        guard let byte = UInt8(digits[index..<next], radix: 16) else { preconditionFailure("bad hex in test vector") }
        result.append(byte)
        index = next
    }
    return result
}

/// A frame as a test sees it: its kind and its bytes, copied out of the span.
struct SeenFrame: Equatable, CustomStringConvertible {
    var kind: ScannedFrame.Kind
    var streamOffset = 0
    var bytes: [UInt8]
    var payload: [UInt8]
    var description: String { "\(kind) \(bytes.count) bytes" }
}

/// Everything a scan produced.
struct ScanResult: Equatable {
    var frames: [SeenFrame] = []
    var drops: [ScanDrop] = []
    var droppedBytes: Int { drops.reduce(0) { $0 + $1.byteCount } }

    /// Whether the frames and drops cover the stream from 0 to `end` without gap or overlap.
    func tiles(upTo end: Int) -> Bool {
        let pieces = (frames.map { ($0.streamOffset, $0.bytes.count) } + drops.map { ($0.streamOffset, $0.byteCount) })
            .sorted { $0.0 < $1.0 }
        var position = 0
        for (offset, length) in pieces {
            guard offset == position, length > 0 else { return false }
            position += length
        }
        return position == end
    }
}

/// Feeds `stream` to `scanner` in chunks of the given sizes (cycled) and collects what it finds.
func scanAll(_ stream: [UInt8], chunkSizes: [Int], scanner: inout FrameScanner) -> ScanResult {
    var result = ScanResult()
    var offset = 0
    var which = 0
    while offset < stream.count {
        let size = max(1, chunkSizes[which % chunkSizes.count])
        which += 1
        let end = min(stream.count, offset + size)
        let chunk = Array(stream[offset..<end])
        scanner.scan(chunk, onFrame: { frame, span in
            result.frames.append(SeenFrame(kind: frame.kind, streamOffset: frame.streamOffset, bytes: copy(span, frame.range),
                                           payload: copy(span, frame.payload)))
        }, onDrop: { result.drops.append($0) })
        offset = end
    }
    return result
}

func scanAll(_ stream: [UInt8], chunkSizes: [Int], kinds: FrameKinds = .all, maxFrameLength: Int = FrameScanner.defaultMaxFrameLength) -> (ScanResult, FrameScanner) {
    var scanner = FrameScanner(kinds: kinds, maxFrameLength: maxFrameLength)
    let result = scanAll(stream, chunkSizes: chunkSizes, scanner: &scanner)
    return (result, scanner)
}

func copy(_ span: RawSpan, _ range: Range<Int>) -> [UInt8] {
    span.extracting(range).withUnsafeBytes { Array($0) }
}

