// libFuzzer target: the frame scanner on arbitrary bytes, fed in chunk sizes the input itself
// chooses, with length limits below its capacity and partial frames abandoned between chunks when
// the input says so (as a link does by state and after an inter-byte gap). Checks, on every input:
// no crash; every byte is in a frame, a drop or the held partial frame, with offsets that tile the
// stream; the held partial frame never exceeds the limit; no frame is longer than its kind's limit;
// every frame delivered re-decodes with the standalone decoders and re-encodes to the same bytes.

import IAPWire

@_cdecl("LLVMFuzzerTestOneInput")
public func scannerFuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    guard input.count >= 2 else { return 0 }
    let control = input[0]
    let shaping = input[1]
    let stream = Array(input.dropFirst(2))
    let chunk = Int(control & 0x3F) + 1
    let kinds = FrameKinds(rawValue: (control >> 6) == 0 ? 7 : (control >> 6) | 1) // always includes iAP2
    let limit = 64 + Int(control) * 40
    var scanner = FrameScanner(kinds: kinds, maxFrameLength: limit)
    // Low bits: limits below the capacity (the longest SYN, or a few hundred bytes); high bits:
    // abandon the partial frame after every chunk, or every fourth.
    if shaping & 1 != 0 { scanner.iap2LengthLimit = LinkParameters.maxSYNPacketLength }
    if shaping & 2 != 0 { scanner.iap2LengthLimit = 9 + Int(shaping >> 2) * 4 }
    if shaping & 4 != 0 { scanner.iap1LengthLimit = 9 + Int(shaping >> 3) * 2 }
    let abandonEvery = shaping & 0x80 != 0 ? 1 : (shaping & 0x40 != 0 ? 4 : 0)
    let iap2Limit = scanner.iap2LengthLimit
    let iap1Limit = scanner.iap1LengthLimit
    var pieces: [(Int, Int)] = []
    var offset = 0
    var turn = 0
    func check(_ frame: ScannedFrame, _ span: RawSpan) {
        pieces.append((frame.streamOffset, frame.range.count))
        let bytes = span.extracting(frame.range).withUnsafeBytes { Array($0) }
        precondition(Array(stream[frame.streamOffset..<(frame.streamOffset + bytes.count)]) == bytes, "frame bytes differ from the stream")
        precondition(bytes.count <= limit, "frame longer than the limit")
        switch frame.kind {
        case .iap2: precondition(bytes.count <= iap2Limit, "iAP2 frame longer than its limit")
        case .iap1, .detect: precondition(bytes.count <= iap1Limit, "iAP1 frame longer than its limit")
        }
    }
    while offset < stream.count {
        let end = min(stream.count, offset + chunk)
        turn += 1
        defer {
            if abandonEvery > 0, turn % abandonEvery == 0 {
                scanner.abandonPartialFrame(onFrame: check, onDrop: { drop in
                    precondition(drop.byteCount > 0, "empty drop")
                    pieces.append((drop.streamOffset, drop.byteCount))
                })
                precondition(scanner.pendingByteCount == 0, "a partial frame survived being abandoned")
            }
        }
        scanner.scan(Array(stream[offset..<end]).span.bytes, onFrame: { frame, span in
            check(frame, span)
            let bytes = span.extracting(frame.range).withUnsafeBytes { Array($0) }
            switch frame.kind {
            case let .iap2(header):
                guard let decoded = try? LinkPacket.decode(bytes) else { preconditionFailure("scanner frame does not re-decode") }
                precondition(decoded.header == header, "header differs")
                let again = try? LinkPacket.encode(control: header.control, sequence: header.sequence,
                                                   acknowledgement: header.acknowledgement, sessionID: header.sessionID,
                                                   payload: decoded.payload)
                precondition(again == bytes, "re-encoding differs")
            case let .iap1(framing):
                guard let again = try? IAP1Framing.decode(bytes.span.bytes) else { preconditionFailure("iAP1 frame does not re-decode") }
                precondition(again == framing, "iAP1 framing differs")
                _ = try? IAP1Packet.decode(body: bytes.span.bytes.extracting(framing.body), transactionIDs: control & 1 == 1)
            case .detect:
                // Any iAP1 framing of the body 00 EE (small or large form, with or without FF).
                guard let framing = try? IAP1Framing.decode(bytes.span.bytes) else { preconditionFailure("detect does not re-decode") }
                precondition(IAP2Detect.isDetect(body: bytes.span.bytes.extracting(framing.body)), "detect is not the detect")
            }
        }, onDrop: { drop in
            precondition(drop.byteCount > 0, "empty drop")
            pieces.append((drop.streamOffset, drop.byteCount))
        })
        precondition(scanner.pendingByteCount <= limit, "holds more than the limit")
        offset = end
    }
    pieces.sort { $0.0 < $1.0 }
    var position = 0
    for (start, length) in pieces {
        precondition(start == position, "frames and drops do not tile the stream")
        position += length
    }
    precondition(position + scanner.pendingByteCount == stream.count, "bytes lost")
    return 0
}
