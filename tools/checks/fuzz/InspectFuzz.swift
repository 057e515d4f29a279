// libFuzzer target: what `iapctl decode` runs on a capture: hex parsing of arbitrary text and the
// whole decode-and-describe path on arbitrary bytes. Checks: no crash; reports account for every
// frame; JSON output is produced for each report; text and bytes fed in two pieces (cut where the
// input's first byte says) give what they give whole.

import IAPInspect
import IAPWire

@_cdecl("LLVMFuzzerTestOneInput")
public func inspectFuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    let cut = size > 0 ? Int(input[0]) % (size + 1) : 0
    if let text = String(validating: input, as: UTF8.self) {
        let whole = try? HexInput.parse(text)
        var parser = HexInput.Parser()
        var pieces: [UInt8] = []
        var failed = false
        do throws(HexInput.ParseError) {
            try parser.parse(input.span.bytes.extracting(0..<cut), into: &pieces)
            try parser.parse(input.span.bytes.extracting(cut..<size), into: &pieces)
            try parser.finish()
        } catch {
            failed = true
        }
        precondition(failed == (whole == nil) && (whole == nil || whole == pieces), "hex in two pieces differs")
    }
    let result = CaptureDecoder.decode(input)
    precondition(result.reports.count >= result.frames, "a frame has no report")
    for report in result.reports {
        precondition(!report.json.serialized().isEmpty, "empty JSON")
        _ = report.text()
    }
    var decoder = CaptureDecoder()
    var reports: [FrameReport] = []
    decoder.feed(input.span.bytes.extracting(0..<cut)) { reports.append($0) }
    decoder.feed(input.span.bytes.extracting(cut..<size)) { reports.append($0) }
    decoder.finish { reports.append($0) }
    precondition(reports.map { $0.text() + $0.json.serialized() } == result.reports.map { $0.text() + $0.json.serialized() },
                 "a capture in two pieces is reported differently")
    return 0
}
