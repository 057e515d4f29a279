// libFuzzer target: what `iapctl decode` runs on a capture: hex parsing of arbitrary text and the
// whole decode-and-describe path on arbitrary bytes. Checks: no crash; reports account for every
// frame; JSON output is produced for each report.

import IAPInspect
import IAPWire

@_cdecl("LLVMFuzzerTestOneInput")
public func inspectFuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    if let text = String(validating: input, as: UTF8.self) {
        _ = try? HexInput.parse(text)
    }
    let result = CaptureDecoder.decode(input)
    precondition(result.reports.count >= result.frames, "a frame has no report")
    for report in result.reports {
        precondition(!report.json.serialized().isEmpty, "empty JSON")
        _ = report.text()
    }
    return 0
}
