import IAPInspect
import IAPWire
import TestSupport
import Testing

/// Feeds `stream` to a decoder in pieces of the given sizes (cycled), collecting every report.
func decodeInPieces(_ stream: [UInt8], sizes: [Int], transactionIDs: TransactionIDMode = .auto)
    -> (reports: [FrameReport], decoder: CaptureDecoder) {
    var decoder = CaptureDecoder(transactionIDs: transactionIDs)
    var reports: [FrameReport] = []
    var offset = 0
    var turn = 0
    while offset < stream.count {
        let end = min(stream.count, offset + sizes[turn % sizes.count])
        stream.withUnsafeBytes { all in
            let piece = Array(all[offset..<end])
            decoder.feed(piece.span.bytes) { reports.append($0) }
        }
        offset = end
        turn += 1
    }
    decoder.finish { reports.append($0) }
    return (reports, decoder)
}

/// What a person and a program see of the reports.
func rendered(_ reports: [FrameReport]) -> [String] {
    reports.map { $0.text() + "\n" + $0.json.serialized() }
}

@Suite("Decoding a stream as it comes")
struct StreamingDecodeTests {
    /// Frames of every kind, garbage, candidates that fail each way, and a frame cut off at the end.
    static func capture() throws -> [UInt8] {
        var stream: [UInt8] = []
        stream += [0x01, 0x02, 0x03]
        stream += IAP2Detect.bytes
        stream += try LinkPacket.encode(control: .syn, sequence: 1, acknowledgement: 0, sessionID: 0,
                                        payload: bytes("01 05 04 00 13 88 00 FF 1E 03 01 00 01 02 02 01"))
        stream += [UInt8](repeating: 0x00, count: 300) // one run of garbage, whatever the pieces
        stream += bytes("FF 5A 00 10 40 41 01 01 15") // bad header checksum
        var badPayload = bytes("FF 5A 00 10 40 41 01 01 14 40 40 00 06 1D 00 5D")
        badPayload[15] = 0x5E
        stream += badPayload
        stream += try LinkPacket.encode(control: .ack, sequence: 2, acknowledgement: 0, sessionID: 2,
                                        payload: [0x00, 0x07] + Array("hello".utf8))
        stream += bytes("55 04 00 38 00 00 C5") // bad iAP1 checksum
        stream += bytes("55 04 00 38 00 00 C4") // StartIDPS
        stream += try IAP1Packet(lingo: 0, command: 0x3B, transactionID: 1, payload: [0]).encoded()
        stream += [0x55, 0x01, 0x42] // an invalid iAP1 length
        stream += Array("garbage, then a frame cut off".utf8)
        stream += bytes("FF 5A 00 10 40 41 01 01 14 40 40")
        return stream
    }

    @Test("the same reports whatever the pieces", arguments: [[1], [2], [3], [7], [64], [1_000_000], [1, 9, 2, 30, 4]])
    func sameReportsWhateverThePieces(sizes: [Int]) throws {
        let stream = try Self.capture()
        let whole = CaptureDecoder.decode(stream)
        #expect(whole.reports.count > 12)
        #expect(whole.incompleteBytes == 11)
        let (reports, decoder) = decodeInPieces(stream, sizes: sizes)
        #expect(rendered(reports) == rendered(whole.reports))
        #expect(decoder.statistics.frames == whole.frames)
        #expect(decoder.statistics.droppedBytes == whole.droppedBytes)
        #expect(decoder.statistics.incompleteBytes == whole.incompleteBytes)
        #expect(decoder.statistics.reports == reports.count)
    }

    @Test("random bytes: the same reports whatever the pieces", arguments: [1, 2, 3])
    func randomBytes(seed: UInt64) {
        var generator = SplitMix64(seed: seed)
        var stream = generator.bytes(20_000)
        // Sprinkle frame starts so that candidates of every kind fail here and there.
        for index in stride(from: 17, to: stream.count - 4, by: 211) {
            stream.replaceSubrange(index..<(index + 2), with: index % 2 == 0 ? [0xFF, 0x5A] : [0xFF, 0x55])
        }
        let whole = decodeInPieces(stream, sizes: [stream.count]).reports
        for sizes in [[1], [5], [97], [4_096], [3, 1_000, 1]] {
            #expect(rendered(decodeInPieces(stream, sizes: sizes).reports) == rendered(whole), "pieces \(sizes)")
        }
    }

    /// Garbage full of candidates that claim long frames, fed in 64 KiB pieces: every piece
    /// brings out reports at once (nothing waits for the end), and the decoder never holds more
    /// than its documented bound, however long the input.
    @Test func memoryIsBoundedAndReportsComeAsTheInputDoes() {
        var generator = SplitMix64(seed: 7)
        let pieceSize = 1 << 16
        var decoder = CaptureDecoder()
        var reported = 0
        var fed = 0
        for turn in 0..<24 {
            var piece = generator.bytes(pieceSize)
            // Lying lengths: an iAP2 header with a good checksum claiming 65535 bytes, a large
            // iAP1 packet claiming 65535.
            var liar: [UInt8] = [0xFF, 0x5A, 0xFF, 0xFF, 0x40, 0x05, 0x06, 0x01]
            liar.append(Checksum.of(liar))
            // (The scanner waits for the bytes a liar claims: the first ones come after 30000 bytes
            // of reports.)
            for index in stride(from: 30_000, to: pieceSize - 16, by: 8_192) {
                piece.replaceSubrange(index..<(index + 9), with: turn % 2 == 0 ? liar : [0x55, 0x00, 0xFF, 0xFF, 1, 2, 3, 4, 5])
            }
            let before = reported
            decoder.feed(piece.span.bytes) { _ in reported += 1 }
            fed += pieceSize
            #expect(reported > before, "piece \(turn) brought out no report")
            #expect(decoder.statistics.peakRetainedBytes <= CaptureDecoder.retainedByteLimit(pieceSize: pieceSize))
        }
        decoder.finish { _ in reported += 1 }
        #expect(decoder.statistics.bytesFed == fed)
        #expect(decoder.statistics.peakRetainedBytes <= CaptureDecoder.retainedByteLimit(pieceSize: pieceSize))
        // Far less than the input: it is not held.
        #expect(decoder.statistics.peakRetainedBytes < fed / 4)
        #expect(decoder.statistics.droppedBytes > fed / 2)
    }

    /// Every byte a dropped candidate: the old decoder copied the rest of the input for each
    /// drop (quadratic). Now no byte is copied more than twice, whatever the number of drops.
    @Test func eachByteIsCopiedAtMostTwice() {
        // `FF 5A` with a bad header checksum, again and again: a drop report per `FF`.
        let stream = [UInt8]((0..<40_000).flatMap { _ in [0xFF, 0x5A, 0x00, 0x10, 0x40] })
        let (reports, decoder) = decodeInPieces(stream, sizes: [4_096, 1, 333])
        #expect(reports.count >= 40_000)
        #expect(reports.first?.details.first?.hasPrefix("iAP2 link header checksum is wrong") == true)
        #expect(decoder.statistics.bytesCopied <= 2 * stream.count)
        #expect(decoder.statistics.peakRetainedBytes <= CaptureDecoder.retainedByteLimit(pieceSize: 4_096))
    }

    /// A run of garbage longer than any piece is one report, and held as its first bytes only.
    @Test func aLongRunOfGarbageIsOneReport() {
        let stream = [UInt8](repeating: 0x00, count: 1 << 20) + IAP2Detect.bytes
        let (reports, decoder) = decodeInPieces(stream, sizes: [1 << 16])
        #expect(reports.map(\.summary) == ["dropped 1048576 bytes: garbage", "detect  FF 55 02 00 EE 10  (iAP2 detect sequence)"])
        #expect(decoder.statistics.peakRetainedBytes <= (1 << 16) + 64)
    }
}

@Suite("Hex text read in pieces")
struct HexPiecesTests {
    static func parseInPieces(_ text: String, size: Int) throws(HexInput.ParseError) -> [UInt8] {
        var parser = HexInput.Parser()
        var output: [UInt8] = []
        let utf8 = Array(text.utf8)
        var offset = 0
        while offset < utf8.count {
            let piece = Array(utf8[offset..<min(utf8.count, offset + size)])
            try parser.parse(piece.span.bytes, into: &output)
            offset += size
        }
        try parser.finish()
        return output
    }

    static func outcome(_ text: String, size: Int) -> Result<[UInt8], HexInput.ParseError> {
        do throws(HexInput.ParseError) {
            return .success(try parseInPieces(text, size: size))
        } catch {
            return .failure(error)
        }
    }

    @Test("pairs, prefixes, comments and characters cut between pieces", arguments: [1, 2, 3, 5])
    func cutAnywhere(size: Int) {
        let texts = [
            "FF 5A 00 09", "ff5a\n0009", "0xFF, 0x5A,0x00 0X09", "ff:5a-00\t09\r\n", "# a comment 12\nFF // another 34\n5A",
            "# Zürich 東京 🎤\nAB", "00 0x00 000x0a", "",
            // Mistakes: the same error, at the same place, however the text is cut.
            "FF\n5A z", "FF 5 A0", "FF 5A 0", "FF / 5A", "FF /", "FF 0", "AB é", "AB\u{0}",
        ]
        for text in texts {
            let whole: Result<[UInt8], HexInput.ParseError>
            do throws(HexInput.ParseError) { whole = .success(try HexInput.parse(text)) } catch { whole = .failure(error) }
            #expect(Self.outcome(text, size: size) == whole, "\(text.debugDescription) in pieces of \(size)")
        }
        #expect(Self.outcome("0xFF, 0x5A,0x00 0X09", size: size) == .success([0xFF, 0x5A, 0x00, 0x09]))
        #expect(Self.outcome("FF / 5A", size: size) == .failure(HexInput.ParseError(line: 1, column: 4, reason: "'/' is not a hex digit")))
    }

    @Test func bytesThatAreNotUTF8AreRefusedWhereTheyAre() {
        var parser = HexInput.Parser()
        var output: [UInt8] = []
        let notText: [UInt8] = [0x41, 0x42, 0x0A, 0x43, 0x44, 0x20, 0xFF]
        let cutShort: [UInt8] = [0x41, 0x42, 0x20, 0xC3]
        #expect(throws: HexInput.ParseError(line: 2, column: 4,
                                            reason: "byte 0xFF is not UTF-8 text; use --format raw for binary input")) {
            try parser.parse(notText.span.bytes, into: &output)
        }
        #expect(output == [0xAB, 0xCD])
        var cut = HexInput.Parser()
        try? cut.parse(cutShort.span.bytes, into: &output)
        let reason = "the text ends inside a UTF-8 character; it is cut short, or binary (use --format raw)"
        #expect(throws: HexInput.ParseError(line: 1, column: 4, reason: reason)) { try cut.finish() }
    }

    @Test func aLongLineHoldsNothing() throws {
        // 1 MiB of hex on one line, in 4 KiB pieces: what comes out of each piece is what it spells.
        var parser = HexInput.Parser()
        let piece = Array(String(repeating: "0a1B", count: 1_024).utf8)
        for _ in 0..<256 {
            var output: [UInt8] = []
            try parser.parse(piece.span.bytes, into: &output)
            #expect(output.count == 2_048)
        }
        try parser.finish()
    }

    @Test func looksLikeTextAllowsACharacterCutAtTheEndOfAPrefix() {
        let text = Array("# Zürich\nFF".utf8)
        let cut = Array(text[0..<4]) // "# Z" and the first byte of "ü"
        #expect(!HexInput.looksLikeText(cut))
        #expect(HexInput.looksLikeText(cut, isPrefix: true))
        #expect(!HexInput.looksLikeText([0xFF, 0x5A], isPrefix: true))
        #expect(!HexInput.looksLikeText([0x46, 0x46, 0x0A, 0xF0, 0x9F, 0x8E, 0xA4, 0x80], isPrefix: true))
    }
}
