import CLIKit
import IAPInspect
import IAPWire

/// `iapctl decode --pcap`: the iAP traffic of a pcap or pcapng capture (a Linux usbmon capture,
/// or a trace of `--trace-file FILE.pcapng`), read in pieces and printed as it is decoded.
enum DecodePcap {
    static func run(_ input: borrowing ChunkedInput, name: String, first: [UInt8], kinds: FrameKinds, mode: TransactionIDMode,
                    checks: AuthenticationTally, output: inout ReportOutput) throws -> ExitCode {
        var decoder = PcapDecoder(kinds: kinds, transactionIDs: mode)
        decoder.certificateReader = readCertificate
        decoder.authenticationChecker = checks.checker
        var piece = first
        var buffer = [UInt8](repeating: 0, count: DecodeCommand.pieceSize)
        do {
            while true {
                if !piece.isEmpty {
                    try decoder.feed(piece.span.bytes) { try output.write($0) }
                    try output.flush()
                }
                let count: Int
                do {
                    count = try input.read(into: &buffer)
                } catch {
                    throw InputError(description: "cannot read \(name): \(error)", exitCode: .noInput)
                }
                if count == 0 { break }
                piece = Array(buffer[0..<count])
            }
            try decoder.finish { try output.write($0) }
        } catch let error as CaptureFormatError {
            try output.flush()
            throw InputError(description: "\(name), \(error)", exitCode: .dataError)
        }
        let statistics = decoder.statistics
        var extra = "\(statistics.packets) packet\(statistics.packets == 1 ? "" : "s") read"
        if statistics.otherPackets > 0 { extra += ", \(statistics.otherPackets) of other link types left out" }
        if statistics.otherTransfers > 0 { extra += ", \(statistics.otherTransfers) USB transfers of other devices or endpoints left out" }
        try output.summarize(statistics.frames, extra: checks.summary + extra + "; ")
        try output.flush()
        return decoder.isClean ? .success : .dataError
    }
}
