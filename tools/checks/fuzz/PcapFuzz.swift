// libFuzzer target: what `iapctl decode --pcap` runs on a capture file: the pcap/pcapng reader,
// usbmon records and iapctl trace headers, and the per-stream decoding. Checks: no crash, hang
// or unbounded memory; damage is a CaptureFormatError; the file fed in two pieces (cut where
// its first byte says) gives the same reports and the same outcome as fed whole.

import IAPInspect
import IAPWire

func decodePcap(_ input: [UInt8], cut: Int) -> (reports: [String], failed: Bool) {
    var decoder = PcapDecoder()
    var reports: [String] = []
    var failed = false
    do {
        for range in [0..<cut, cut..<input.count] {
            try decoder.feed(input.span.bytes.extracting(range)) { reports.append($0.text() + $0.json.serialized()) }
        }
        try decoder.finish { reports.append($0.text() + $0.json.serialized()) }
    } catch is CaptureFormatError {
        failed = true
    } catch {
        preconditionFailure("an error that is not a CaptureFormatError: \(error)")
    }
    return (reports, failed)
}

@_cdecl("LLVMFuzzerTestOneInput")
public func pcapFuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    let cut = size > 0 ? Int(input[0]) % (size + 1) : 0
    let whole = decodePcap(input, cut: size)
    let pieces = decodePcap(input, cut: cut)
    precondition(whole.failed == pieces.failed && whole.reports == pieces.reports, "a capture in two pieces is decoded differently")
    _ = try? USBMonRecord.decode(input, memoryMapped: size % 2 == 0, bigEndian: size % 3 == 0)
    _ = try? IAPCaptureHeader.decode(input)
    return 0
}
