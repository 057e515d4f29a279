import CLIKit
import IAPInspect
import IAPWire

/// Errors of `iapctl decode` that are the input's fault, with the exit status scripts expect.
struct InputError: Error, ExitCodeProviding, CustomStringConvertible {
    var description: String
    var exitCode: ExitCode
}

enum DecodeCommand {
    static func run(_ command: ParsedCommand) throws -> ExitCode {
        let path = command.positional("input") ?? "-"
        let data: [UInt8]
        do {
            data = try FileInput.readAll(path: path)
        } catch {
            throw InputError(description: "cannot read \(path == "-" ? "standard input" : "'\(path)'"): \(error)", exitCode: .noInput)
        }
        let bytes: [UInt8]
        switch command.value("format") ?? "auto" {
        case "raw":
            bytes = data
        case "hex":
            bytes = try parseHex(data, path: path)
        default:
            bytes = HexInput.looksLikeText(data) ? try parseHex(data, path: path) : data
        }
        let kinds = try parseKinds(command.value("kinds") ?? "iap2,iap1,detect", command: command)
        let mode = TransactionIDMode(rawValue: command.value("transaction-ids") ?? "auto") ?? .auto
        let json = command.flag("json")
        let result = CaptureDecoder.decode(bytes, kinds: kinds, transactionIDs: mode)
        var out = ""
        for (index, report) in result.reports.enumerated() {
            if json {
                out += report.json.serialized() + "\n"
            } else {
                out += "#\(index + 1) " + report.text() + "\n"
            }
        }
        if !json {
            out += "\(result.frames) frame\(result.frames == 1 ? "" : "s"), \(result.droppedBytes) byte\(result.droppedBytes == 1 ? "" : "s") dropped"
            out += result.incompleteBytes > 0 ? ", \(result.incompleteBytes) bytes of an incomplete frame at the end\n" : "\n"
        }
        StandardOutput.write(out)
        return result.isClean ? .success : .dataError
    }

    static func parseHex(_ data: [UInt8], path: String) throws -> [UInt8] {
        guard let text = String(validating: data, as: UTF8.self) else {
            throw InputError(description: "\(path == "-" ? "standard input" : path) is not text; use --format raw for binary input",
                             exitCode: .dataError)
        }
        do {
            return try HexInput.parse(text)
        } catch {
            throw InputError(description: "\(path == "-" ? "standard input" : path), \(error)", exitCode: .dataError)
        }
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
