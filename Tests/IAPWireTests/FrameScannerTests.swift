import TestSupport
import IAPWire
import Testing

@Suite("Frame scanner")
struct FrameScannerTests {
    static let syn = bytes("FF 5A 00 1A 80 01 10 00 FC 01 05 04 00 13 88 00 FF 1E 03 01 00 01 02 02 01 34")
    static let ack = bytes("FF 5A 00 09 40 01 40 00 1D")
    static let startIdentification = bytes("FF 5A 00 10 40 41 01 01 14 40 40 00 06 1D 00 5D")
    static let startIDPS = bytes("FF 55 04 00 38 00 00 C4")
    static let iap1Reply = IAP2Detect.iap1Reply

    /// Every kind of frame, back to back, as a receiver may see before it knows the protocol.
    static var mixed: [UInt8] {
        IAP2Detect.bytes + syn + ack + startIDPS + startIdentification + iap1Reply + bytes("55 04 00 11 00 01 EA")
    }

    static func expectedKinds() -> [String] {
        ["detect", "iap2", "iap2", "iap1", "iap2", "iap1", "iap1"]
    }

    static func kindName(_ kind: ScannedFrame.Kind) -> String {
        switch kind {
        case .detect: return "detect"
        case .iap1: return "iap1"
        case .iap2: return "iap2"
        }
    }

    @Test("finds every frame whatever the chunking", arguments: [[1], [2], [3], [5], [7], [64], [100_000], [1, 9, 2, 30, 4]])
    func chunking(chunkSizes: [Int]) {
        let (result, scanner) = scanAll(Self.mixed, chunkSizes: chunkSizes)
        #expect(result.frames.map { Self.kindName($0.kind) } == Self.expectedKinds())
        #expect(result.frames.flatMap(\.bytes) == Self.mixed)
        #expect(result.tiles(upTo: Self.mixed.count))
        #expect(result.drops.isEmpty)
        #expect(scanner.pendingByteCount == 0)
        #expect(scanner.statistics.frames == 7)
        #expect(scanner.statistics.bytesScanned == Self.mixed.count)
    }

    @Test func framesInsideOneChunkAreViewsNotCopies() {
        var scanner = FrameScanner()
        let stream = Self.mixed
        var reassembled: [Bool] = []
        var spanSizes: Set<Int> = []
        scanner.scan(stream) { frame, span in
            reassembled.append(frame.isReassembled)
            spanSizes.insert(span.byteCount)
        }
        #expect(reassembled == Array(repeating: false, count: 7))
        #expect(spanSizes == [stream.count]) // every frame was handed out in the caller's chunk
        #expect(scanner.statistics.reassembledFrames == 0)
    }

    @Test func aFrameStraddlingChunksIsReassembledOnce() {
        var scanner = FrameScanner()
        var seen: [SeenFrame] = []
        var flags: [Bool] = []
        let stream = Self.startIdentification + Self.ack
        for chunk in [Array(stream[0..<5]), Array(stream[5...])] {
            scanner.scan(chunk) { frame, span in
                flags.append(frame.isReassembled)
                seen.append(SeenFrame(kind: frame.kind, bytes: copy(span, frame.range), payload: copy(span, frame.payload)))
            }
        }
        #expect(flags == [true, false])
        #expect(seen.map(\.bytes) == [Self.startIdentification, Self.ack])
        #expect(seen[0].payload == bytes("40 40 00 06 1D 00"))
        #expect(scanner.statistics.reassembledFrames == 1)
    }

    @Test func garbageIsReportedOnceAndResynchronised() {
        let garbage: [UInt8] = [0x00, 0x13, 0x37, 0xFF, 0x00, 0x5A, 0x42]
        let (result, _) = scanAll(garbage + Self.ack + garbage + Self.syn, chunkSizes: [1_000])
        #expect(result.frames.map(\.bytes) == [Self.ack, Self.syn])
        #expect(result.drops == [ScanDrop(reason: .garbage, byteCount: 7, streamOffset: 0), ScanDrop(reason: .garbage, byteCount: 7, streamOffset: 16)])
    }

    @Test("a corrupted byte anywhere costs that frame only", arguments: 0..<26)
    func corruptionAnywhere(position: Int) {
        var bad = Self.syn
        bad[position] ^= 0x01
        let stream = Self.ack + bad + Self.startIdentification
        for chunkSizes in [[1], [1_000], [3, 11]] {
            let (result, scanner) = scanAll(stream, chunkSizes: chunkSizes)
            #expect(result.frames.map(\.bytes) == [Self.ack, Self.startIdentification], "position \(position) chunks \(chunkSizes)")
            #expect(result.droppedBytes == bad.count)
            #expect(result.tiles(upTo: stream.count))
            #expect(scanner.pendingByteCount == 0)
        }
    }

    @Test func reasonsAreTyped() {
        var badHeader = Self.ack
        badHeader[8] ^= 0xFF
        #expect(scanAll(badHeader, chunkSizes: [100]).0.drops.first == ScanDrop(reason: .badHeaderChecksum, byteCount: 1, streamOffset: 0))

        var badPayload = Self.startIdentification
        badPayload[15] ^= 0xFF
        #expect(scanAll(badPayload, chunkSizes: [100]).0.drops.first == ScanDrop(reason: .badPayloadChecksum, byteCount: 1, streamOffset: 0))

        var badIAP1 = Self.startIDPS
        badIAP1[7] ^= 0xFF
        #expect(scanAll(badIAP1, chunkSizes: [100]).0.drops.first == ScanDrop(reason: .badIAP1Checksum, byteCount: 1, streamOffset: 0))
    }

    /// A header that checks out but lies about the length: the payload checksum refutes it and
    /// the frames hidden behind the lie are still found.
    ///
    /// An 8-bit sum cannot refute every lie: whole valid packets sum to zero, so a lie that
    /// encloses exactly whole packets plus zero bytes would pass. That is the protocol's limit;
    /// the filler here is non-zero so each lie is refutable.
    @Test("lying lengths", arguments: [0, 1, 8, 10, 12, 200, 65_535])
    func lyingLength(length: Int) {
        var liar: [UInt8] = [0xFF, 0x5A, UInt8(length >> 8), UInt8(length & 0xFF), 0x40, 0x05, 0x06, 0x01]
        liar.append(Checksum.of(liar))
        let stream = liar + Self.ack + Self.startIdentification + Self.syn
        for chunkSizes in [[1], [4_096], [13]] {
            var scanner = FrameScanner(maxFrameLength: 1_024)
            var result = scanAll(stream, chunkSizes: chunkSizes, scanner: &scanner)
            // A lie longer than what is buffered keeps the scanner waiting; the link's next bytes
            // (or a reset) decide. Feed filler to force a decision.
            if scanner.pendingByteCount > 0 {
                let more = scanAll([UInt8](repeating: 0x01, count: 1_024), chunkSizes: [1_024], scanner: &scanner)
                result.frames += more.frames
                result.drops += more.drops
            }
            #expect(result.frames.map(\.bytes).suffix(3) == [Self.ack, Self.startIdentification, Self.syn], "length \(length)")
            #expect(scanner.pendingByteCount <= 1_024)
        }
    }

    /// Garbage full of candidates that claim the longest frames, fed in pieces: the scanner never
    /// holds more than one frame, and every byte is accounted for after every piece.
    @Test func garbageWithLyingLengthsHoldsAtMostOneFrame() {
        var generator = SplitMix64(seed: 16)
        var liar: [UInt8] = [0xFF, 0x5A, 0xFF, 0xFF, 0x40, 0x05, 0x06, 0x01]
        liar.append(Checksum.of(liar))
        var scanner = FrameScanner()
        var delivered = 0
        var dropped = 0
        for turn in 0..<40 {
            var piece = (0..<10_000).map { _ in UInt8.random(in: 0...255, using: &generator) }
            let lie: [UInt8] = turn % 2 == 0 ? liar : [0x55, 0x00, 0xFF, 0xFF]
            piece.replaceSubrange(37..<(37 + lie.count), with: lie)
            scanner.scan(piece, onFrame: { frame, _ in delivered += frame.range.count }, onDrop: { dropped += $0.byteCount })
            #expect(scanner.pendingByteCount <= scanner.maxFrameLength)
            #expect(delivered + dropped + scanner.pendingByteCount == (turn + 1) * piece.count)
        }
        #expect(dropped > 300_000)
    }

    @Test func lengthsBeyondTheLimitAreDroppedAtOnce() {
        var header: [UInt8] = [0xFF, 0x5A, 0x10, 0x00, 0x40, 0x05, 0x06, 0x01]
        header.append(Checksum.of(header))
        var scanner = FrameScanner(maxFrameLength: 2_048)
        let result = scanAll(header + Self.ack, chunkSizes: [1], scanner: &scanner)
        #expect(result.drops.first == ScanDrop(reason: .frameTooLong(4_096), byteCount: 1, streamOffset: 0))
        #expect(result.frames.map(\.bytes) == [Self.ack])
        #expect(scanner.pendingByteCount == 0)
    }

    @Test func iap1CanBeTurnedOff() {
        // Once a link has settled on iAP2, a 55 in the stream does not start an iAP1 candidate.
        let stream = [0x55, 0x00, 0xFF, 0xFF] + Self.ack
        let (result, scanner) = scanAll(stream, chunkSizes: [1], kinds: [.iap2])
        #expect(result.frames.map(\.bytes) == [Self.ack])
        #expect(result.drops.allSatisfy { $0.reason == .garbage })
        #expect(result.droppedBytes == 4)
        #expect(scanner.pendingByteCount == 0)

        let (withIAP1, waiting) = scanAll(stream, chunkSizes: [1], kinds: .all)
        #expect(withIAP1.frames.isEmpty) // waits for a 65535-byte iAP1 candidate
        #expect(waiting.pendingByteCount == stream.count)
    }

    @Test func detectOnlyDropsOtherIAP1Packets() {
        let (result, _) = scanAll(Self.startIDPS + IAP2Detect.bytes, chunkSizes: [100], kinds: [.iap2, .detect])
        #expect(result.frames.map(\.bytes) == [IAP2Detect.bytes])
        #expect(result.drops.first == ScanDrop(reason: .unexpectedIAP1, byteCount: 1, streamOffset: 0))
        #expect(result.droppedBytes == Self.startIDPS.count)
    }

    /// An iAP2 header claiming `length` bytes whose header checksum verifies.
    static func liar(_ length: Int) -> [UInt8] {
        var header: [UInt8] = [0xFF, 0x5A, UInt8(length >> 8), UInt8(length & 0xFF), 0x40, 0x05, 0x06, 0x01]
        header.append(Checksum.of(header))
        return header
    }

    @Test("a length beyond the limit set for the state is dropped at once, in any chunking", arguments: [[1], [5], [4_096]])
    func stateLimitDropsAtOnce(chunkSizes: [Int]) {
        var scanner = FrameScanner(maxFrameLength: 65_535)
        scanner.iap2LengthLimit = Self.syn.count
        scanner.iap1LengthLimit = 16
        let long1 = bytes("FF 55 00 FF F0 00 13")
        let stream = Self.liar(65_535) + IAP2Detect.bytes + long1 + Self.syn + Self.liar(Self.syn.count + 1) + Self.startIDPS
        let result = scanAll(stream, chunkSizes: chunkSizes, scanner: &scanner)
        #expect(result.frames.map(\.bytes) == [IAP2Detect.bytes, Self.syn, Self.startIDPS])
        #expect(result.drops.contains(ScanDrop(reason: .frameTooLong(65_535), byteCount: 1, streamOffset: 0)))
        #expect(result.drops.contains { $0.reason == .frameTooLong(0xFFF0 + 6) })
        #expect(result.drops.contains { $0.reason == .frameTooLong(Self.syn.count + 1) })
        #expect(scanner.pendingByteCount == 0)
        #expect(result.tiles(upTo: stream.count))
    }

    @Test func theLimitsStayWithinTheScannersCapacity() {
        var scanner = FrameScanner(maxFrameLength: 2_048)
        #expect(scanner.iap2LengthLimit == 2_048 && scanner.iap1LengthLimit == 2_048)
        scanner.iap2LengthLimit = 100_000
        scanner.iap1LengthLimit = 0
        #expect(scanner.iap2LengthLimit == 2_048)
        #expect(scanner.iap1LengthLimit == LinkPacketHeader.size)
        // The detect in its longest form still fits the smallest limit.
        let (result, _) = scanAll(bytes("FF 55 00 00 02 00 EE 10"), chunkSizes: [100], kinds: .all, maxFrameLength: 9)
        #expect(result.frames.map(\.kind) == [.detect])
    }

    @Test func aLimitLoweredWhileAFrameIsHeldJudgesItWhenTheNextBytesCome() {
        var scanner = FrameScanner(maxFrameLength: 65_535)
        let result1 = scanAll(Self.liar(4_000) + [0x01, 0x02], chunkSizes: [100], scanner: &scanner)
        #expect(result1.frames.isEmpty && scanner.pendingByteCount == 11)
        scanner.iap2LengthLimit = 1_024
        let result2 = scanAll(Self.ack, chunkSizes: [100], scanner: &scanner)
        #expect(result2.drops.first == ScanDrop(reason: .frameTooLong(4_000), byteCount: 1, streamOffset: 0))
        #expect(result2.frames.map(\.bytes) == [Self.ack])
        #expect(scanner.pendingByteCount == 0)
    }

    /// A lie no longer than the limit swallows what follows until the line falls silent: then
    /// the held bytes after its first are scanned again, and what nothing will complete is
    /// dropped rather than held.
    @Test("a partial frame abandoned after a gap gives back the frames it swallowed", arguments: [[1], [7], [4_096]])
    func abandonedPartialFrame(chunkSizes: [Int]) {
        var scanner = FrameScanner(maxFrameLength: 1_024)
        // The liar claims 200 bytes; behind it a detect, a SYN, and a second liar that is cut short.
        let stream = Self.liar(200) + IAP2Detect.bytes + Self.syn + Self.liar(100) + [0x10, 0x20]
        var result = scanAll(stream, chunkSizes: chunkSizes, scanner: &scanner)
        #expect(result.frames.isEmpty)
        #expect(scanner.pendingByteCount == stream.count)
        scanner.abandonPartialFrame(onFrame: { frame, span in
            #expect(frame.isReassembled)
            result.frames.append(SeenFrame(kind: frame.kind, streamOffset: frame.streamOffset, bytes: copy(span, frame.range),
                                           payload: copy(span, frame.payload)))
        }, onDrop: { result.drops.append($0) })
        #expect(result.frames.map(\.bytes) == [IAP2Detect.bytes, Self.syn])
        #expect(result.frames.map(\.streamOffset) == [9, 9 + IAP2Detect.bytes.count])
        #expect(result.drops.first == ScanDrop(reason: .partialFrameAbandoned, byteCount: 1, streamOffset: 0))
        #expect(result.drops.filter { $0.reason == .partialFrameAbandoned }.count == 2)
        #expect(scanner.pendingByteCount == 0)
        #expect(scanner.statistics.dropsByKind[.partialFrameAbandoned] == 2)
        #expect(result.tiles(upTo: stream.count))
        // Nothing held: nothing happens.
        scanner.abandonPartialFrame(onFrame: { _, _ in Issue.record("a frame from nothing") }, onDrop: { _ in Issue.record("a drop from nothing") })
        // The stream goes on where it was.
        let after = scanAll(Self.ack, chunkSizes: [100], scanner: &scanner)
        #expect(after.frames.map(\.streamOffset) == [stream.count])
    }

    @Test func dropsAreCountedByKind() {
        var scanner = FrameScanner(maxFrameLength: 1_024)
        let stream = Self.liar(4_000) + [0x01, 0x02, 0x03] + Self.liar(2_000) + Self.ack
        let result = scanAll(stream, chunkSizes: [100], scanner: &scanner)
        #expect(scanner.statistics.dropsByKind[.frameTooLong] == 2)
        #expect(scanner.statistics.dropsByKind[.garbage] == 2)
        #expect(scanner.statistics.dropsByKind.total == result.drops.count)
        #expect(scanner.statistics.droppedBytes == result.droppedBytes)
    }

    @Test func resetCountsTheHeldBytesAsDropped() {
        var scanner = FrameScanner()
        scanner.scan(Array(Self.syn.prefix(10))) { _, _ in }
        #expect(scanner.pendingByteCount == 10)
        scanner.reset()
        #expect(scanner.pendingByteCount == 0)
        #expect(scanner.statistics.droppedBytes == 10)
    }

    /// Random frames, random garbage, random corruption, random chunking: every byte is
    /// accounted for, every intact frame is found in order, and nothing is held beyond the limit.
    @Test("randomised streams", arguments: 1...40)
    func randomised(seed: UInt64) throws {
        var generator = SplitMix64(seed: seed)
        var stream: [UInt8] = []
        var intact: [[UInt8]] = []
        for _ in 0..<60 {
            switch Int.random(in: 0..<10, using: &generator) {
            case 0:
                stream += (0..<Int.random(in: 1...40, using: &generator)).map { _ in
                    UInt8.random(in: 0...255, using: &generator) & 0xFE  // no FF: cannot hide a frame start
                }.map { $0 == 0x55 ? 0x54 : $0 }
            case 1:
                // A corrupted frame: its bytes are dropped, never delivered.
                var frame = try LinkPacket.encode(control: .ack, sequence: 1, acknowledgement: 2, sessionID: 2,
                                                  payload: [1, 2, 3, 4, 5, 6, 7, 8])
                frame[Int.random(in: 9..<17, using: &generator)] &+= 1
                stream += frame
            case 2:
                let packet = try IAP1Packet(lingo: 0, command: 0x43, transactionID: 3,
                                            payload: (0..<Int.random(in: 0...300, using: &generator)).map { UInt8(truncatingIfNeeded: $0) })
                    .encoded(sync: Bool.random(using: &generator))
                stream += packet
                intact.append(packet)
            default:
                let payload = (0..<Int.random(in: 0...700, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
                let packet = try LinkPacket.encode(control: .ack, sequence: UInt8.random(in: 0...255, using: &generator),
                                                   acknowledgement: 0, sessionID: 2, payload: payload)
                stream += packet
                intact.append(packet)
            }
        }
        let chunks = (0..<16).map { _ in Int.random(in: 1...900, using: &generator) }
        var scanner = FrameScanner()
        let result = scanAll(stream, chunkSizes: chunks, scanner: &scanner)
        let delivered = result.frames.map(\.bytes)
        // Intact frames come out in order; a corrupted frame may not produce extra frames here
        // because its payload has no FF byte... except inside random payloads: check inclusion.
        var cursor = 0
        for frame in delivered where cursor < intact.count && frame == intact[cursor] { cursor += 1 }
        #expect(cursor == intact.count)
        let frameBytes = result.frames.reduce(0) { $0 + $1.bytes.count }
        #expect(frameBytes + result.droppedBytes + scanner.pendingByteCount == stream.count)
        #expect(result.tiles(upTo: stream.count - scanner.pendingByteCount))
        #expect(scanner.statistics.frameBytes == frameBytes)
        #expect(scanner.statistics.droppedBytes == result.droppedBytes)
    }
}

@Suite("Frame scanner edge cases found by fuzzing")
struct FrameScannerFuzzFindings {
    /// The detect is an iAP1 packet with body `00 EE`; a large-form encoding of it is the same
    /// packet and is reported as the detect (found by the scanner fuzz target, whose oracle
    /// wrongly expected the small form only).
    @Test func largeFormDetect() {
        let largeForm: [UInt8] = [0x55, 0x00, 0x00, 0x02, 0x00, 0xEE, 0x10]
        let (result, _) = scanAll(largeForm, chunkSizes: [3])
        #expect(result.frames.map(\.kind) == [.detect])
        #expect(result.drops.isEmpty)
    }
}
