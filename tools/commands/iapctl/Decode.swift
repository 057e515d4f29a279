import AccessoryLogging
import CLIKit
import IAPAuthentication
import IAPInspect
import IAPWire
import Synchronization

/// Errors of `iapctl decode` that are the input's fault, with the exit status scripts expect.
struct InputError: Error, ExitCodeProviding, CustomStringConvertible {
    var description: String
    var exitCode: ExitCode
}

enum DecodeCommand {
    /// How many bytes are read at a time: the input is decoded piece by piece, never held whole.
    static let pieceSize = 1 << 16

    static func run(_ command: ParsedCommand) throws -> ExitCode {
        let path = command.positional("input") ?? "-"
        let name = path == "-" ? "standard input" : path
        let kinds = try parseKinds(command.value("kinds") ?? "iap2,iap1,detect", command: command)
        let mode = TransactionIDMode(rawValue: command.value("transaction-ids") ?? "auto") ?? .auto
        var output = ReportOutput(json: command.flag("json"))
        let input: ChunkedInput
        do {
            input = try ChunkedInput(path: path)
        } catch {
            throw InputError(description: "cannot read \(path == "-" ? name : "'\(path)'"): \(error)", exitCode: .noInput)
        }
        let checks = try AuthenticationTally(command)
        var format = command.value("format") ?? "auto"
        if command.flag("pcap") || format == "pcap" {
            return try DecodePcap.run(input, name: name, first: [], kinds: kinds, mode: mode, checks: checks, output: &output)
        }
        var decoder = CaptureDecoder(kinds: kinds, transactionIDs: mode)
        decoder.certificateReader = readCertificate
        decoder.authenticationChecker = checks.checker
        var hex = HexInput.Parser()
        var piece = [UInt8](repeating: 0, count: pieceSize)
        var parsed: [UInt8] = []
        while true {
            let count: Int
            do {
                count = try input.read(into: &piece)
            } catch {
                try output.flush()
                throw InputError(description: "cannot read \(path == "-" ? name : "'\(path)'"): \(error)", exitCode: .noInput)
            }
            if count == 0 { break }
            // The first piece decides: a pcap or pcapng capture, hex text, or raw bytes.
            if format == "auto", PcapReader.looksLikeCapture(Array(piece.prefix(min(count, 12)))) {
                return try DecodePcap.run(input, name: name, first: Array(piece[0..<count]), kinds: kinds, mode: mode, checks: checks,
                                          output: &output)
            }
            if format == "auto" { format = HexInput.looksLikeText(Array(piece[0..<count]), isPrefix: true) ? "hex" : "raw" }
            if format == "raw" {
                try decoder.feed(piece.span.bytes.extracting(0..<count)) { try output.write($0) }
            } else {
                parsed.removeAll(keepingCapacity: true)
                var failure: HexInput.ParseError?
                do { try hex.parse(piece.span.bytes.extracting(0..<count), into: &parsed) } catch { failure = error }
                // What came before a mistake is decoded and shown, then the mistake.
                try decoder.feed(parsed.span.bytes) { try output.write($0) }
                if let failure {
                    try output.flush()
                    throw InputError(description: "\(name), \(failure)", exitCode: .dataError)
                }
            }
            try output.flush()
        }
        if format == "hex" {
            do {
                try hex.finish()
            } catch {
                try output.flush()
                throw InputError(description: "\(name), \(error)", exitCode: .dataError)
            }
        }
        try decoder.finish { try output.write($0) }
        try output.summarize(decoder.statistics, extra: checks.summary)
        try output.flush()
        return decoder.isClean ? .success : .dataError
    }

    static func parseKinds(_ text: String, command: ParsedCommand) throws -> FrameKinds {
        var kinds: FrameKinds = []
        for word in text.split(separator: ",") {
            switch word.lowercased() {
            case "iap2": kinds.insert(.iap2)
            case "iap1": kinds.insert(.iap1)
            case "detect": kinds.insert(.detect)
            case "all": kinds = .all
            default:
                throw UsageError("unknown frame kind '\(word)' in --kinds; use iap2, iap1, detect or all",
                                 usage: "iapctl decode --kinds iap2,iap1,detect", commandPath: command.path)
            }
        }
        return kinds
    }
}

/// The authentication checks of one decode: the checker handed to the decoder (OpenSSL's, with
/// `--trust` and `--check-validity`), and what it found, for the closing line.
final class AuthenticationTally: Sendable {
    /// Responses checked, those valid, and the first few verdicts (bounded: a capture may hold
    /// any number of responses).
    private let verdicts = Mutex<(checked: Int, valid: Int, first: [String])>((0, 0, []))
    private let trust: TrustAnchors?
    private let checkValidity: Bool

    init(_ command: ParsedCommand) throws {
        checkValidity = command.flag("check-validity")
        if let path = command.value("trust") {
            do {
                trust = try TrustAnchors(path: path)
            } catch {
                throw ToolError(description: "--trust \(error)", exitCode: .noInput)
            }
        } else {
            trust = nil
        }
    }

    /// Checks one exchange with IAPAuthentication and keeps its verdict.
    var checker: @Sendable (AuthenticationEvidence) -> AuthenticationChecking {
        { [self] evidence in
            let check = CapturedAuthentication(certificate: evidence.certificate, challenge: evidence.challenge, response: evidence.response,
                                               trust: trust, checkValidity: checkValidity)
            let checking = AuthenticationChecking(verdict: check.verdict, isValid: check.firstFailure == nil, steps: check.lines.map {
                AuthenticationChecking.Step(name: $0.step.rawValue, result: $0.result.rawValue, detail: $0.detail)
            })
            verdicts.withLock { tally in
                tally.checked += 1
                if checking.isValid { tally.valid += 1 }
                if tally.first.count < 3 { tally.first.append("\(evidence.protocolName) \(checking.verdict)") }
            }
            return checking
        }
    }

    /// `authentication: 1 response checked: iAP1 valid (chain not checked); ` (empty when none).
    var summary: String {
        let tally = verdicts.withLock { $0 }
        guard tally.checked > 0 else { return "" }
        let shown = tally.first.joined(separator: "; ") + (tally.checked > tally.first.count ? "; …" : "")
        return "authentication: \(tally.checked) response\(tally.checked == 1 ? "" : "s") checked, \(tally.valid) valid: "
            + shown.escapedForTerminal + "\n"
    }
}

/// The reports as `iapctl decode` prints them: numbered text with a summary line, or one JSON
/// object per line. They go out in writes of about 64 KiB, and after each piece of input, so the
/// output keeps up with the input and nothing piles up.
struct ReportOutput {
    let json: Bool
    private var text = ""
    private var count = 0

    init(json: Bool) {
        self.json = json
    }

    mutating func write(_ report: FrameReport) throws {
        count += 1
        text += json ? JSONOutput.line(report.json) : "#\(count) " + report.text() + "\n"
        if text.utf8.count >= DecodeCommand.pieceSize { try flush() }
    }

    /// The closing line of the text output: frames, dropped bytes and an incomplete tail.
    mutating func summarize(_ statistics: CaptureDecoder.Statistics, extra: String = "") throws {
        guard !json else { return }
        text += extra
        let frames = statistics.frames, dropped = statistics.droppedBytes
        text += "\(frames) frame\(frames == 1 ? "" : "s"), \(dropped) byte\(dropped == 1 ? "" : "s") dropped"
        text += statistics.incompleteBytes > 0 ? ", \(statistics.incompleteBytes) bytes of an incomplete frame at the end\n" : "\n"
    }

    mutating func flush() throws {
        guard !text.isEmpty else { return }
        defer { text.removeAll(keepingCapacity: true) }
        guard StandardOutput.write(text) else {
            throw ToolError(description: "cannot write the decoded frames: standard output refused them; check that it is open and its disk has room",
                            exitCode: .ioError)
        }
    }
}
