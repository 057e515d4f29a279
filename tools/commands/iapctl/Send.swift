import AccessoryHost
import AccessoryGadget
import AccessoryLogging
import AccessorySimulator
import BluetoothTransport
import CLIKit
import Dispatch
import Glibc
import IAPInspect
import IAPTransport
import Synchronization
import SystemCalls
import USBHost

/// How long `open` waits for the accessory's acknowledged count to move before it gives up
/// (`send` takes `--stall-timeout`).
let sendProgressTimeout: Duration = .seconds(10)

/// Opens `protocolString` on `accessory`: a refusal or a departure is 69 or 74, not 1.
func openSession(_ accessory: Accessory, _ protocolString: String) throws -> AccessorySession {
    do {
        return try blockingAwait { try await accessory.openSession(for: protocolString) }
    } catch let error as AccessoryError {
        switch error {
        case .disconnected, .sessionClosed, .timedOut: throw ToolError(description: "\(error)", exitCode: .ioError)
        default: throw ToolError(description: "\(error)", exitCode: .unavailable)
        }
    }
}

enum SendCommand {
    static func run(_ command: ParsedCommand) throws -> ExitCode {
        let protocolString = command.positional("protocol") ?? ""
        let path = command.positional("file") ?? ""
        let verify = command.flag("verify-echo")
        let jsonOutput = command.flag("json")
        if verify, path == "-" {
            throw UsageError("--verify-echo reads the file a second time to compare the echo; standard input cannot be read twice: "
                                + "give a file", usage: command.path.joined(separator: " ") + " [<options>] <protocol> <file>",
                             commandPath: command.path)
        }
        // Checked before any accessory is touched; the file is streamed, never read whole.
        let input: ChunkedInput
        do { input = try ChunkedInput(path: path) } catch {
            throw ToolError(description: "cannot read '\(path)': \(error)", exitCode: .noInput)
        }
        let total = input.regularFileSize
        let chunkSize = try command.integer("chunk", in: 1...(16 << 20)) ?? 64 * 1_024
        let stallTimeout = Duration.milliseconds(Int((Double(command.value("stall-timeout") ?? "10") ?? 10) * 1_000))
        let session = try HostContext(command, supportedProtocols: [protocolString])
        defer { session.shutdown() }
        let accessory = try chooseAccessory(session, command: command, protocolString: protocolString)
        let stream = try openSession(accessory, protocolString)
        let progress = jsonOutput || !Terminal.isTTY(2) ? nil : ProgressLine(total: total)
        let start = ContinuousClock.now

        // What the accessory sends back is always read: compared with the file read a second
        // time (--verify-echo), or dropped. An echo nobody reads fills the session's buffer, and
        // its flow control then holds the accessory, and so the transfer, for ever.
        let reader = Task { () -> (matches: Bool, received: Int) in
            verify ? try await compareEcho(stream, path: path, total: total ?? 0) : (true, try await discard(stream))
        }
        // Ctrl-C and the stall watchdog end the session; the send loop then reports.
        let stop = Mutex<StopReason?>(nil)
        Glibc.signal(SIGINT, SIG_IGN)
        let interrupt = DispatchSource.makeSignalSource(signal: SIGINT, queue: .global())
        interrupt.setEventHandler {
            if stop.withLock({ reason in defer { reason = reason ?? .interrupted }; return reason == nil }) { stream.close() }
        }
        interrupt.resume()
        defer { interrupt.cancel() }
        let watchdog = StallWatchdog(stream: stream, timeout: stallTimeout) {
            if stop.withLock({ reason in defer { reason = reason ?? .stalled }; return reason == nil }) { stream.close() }
        }
        defer { watchdog.cancel() }
        session.logger.info("sending \(path) on \(protocolString) to \(accessory.name)")

        var sent = 0
        var buffer = [UInt8](repeating: 0, count: chunkSize)
        do {
            while true {
                let count: Int
                do { count = try input.readFully(into: &buffer) } catch {
                    stream.close()
                    throw ToolError(description: "cannot read '\(path)' after \(sent) bytes: \(error)", exitCode: .noInput)
                }
                if count == 0 { break }
                let chunk = Array(buffer[0..<count])
                try blockingAwait { try await stream.write(chunk) }
                sent += count
                watchdog.expect(sent)
                progress?.draw(sent: sent, since: start)
            }
            try blockingAwait { try await stream.flush() }
            // Success means acknowledged by the accessory, not handed to the link.
            try blockingAwait { try await stream.drain() }
        } catch let error as ToolError {
            progress?.finish()
            throw error
        } catch {
            progress?.finish()
            // Nothing is resent: the script decides, knowing what is sure to have arrived.
            let acknowledged = stream.bytesAcknowledged
            let why = stop.withLock { $0 }
            let reason: String
            switch why {
            case .interrupted?: reason = "interrupted"
            case .stalled?: reason = "the accessory acknowledged nothing for \(stallTimeout) (the link is alive, the data does not move)"
            case nil: reason = "\(error)"
            }
            let size = total.map { " of \($0)" } ?? ""
            let summary = "transfer \(why == .interrupted ? "interrupted" : "broke"): the accessory acknowledged \(acknowledged)\(size) bytes "
                + "(\(sent) had been written to the session; nothing was resent)" + (why == .interrupted ? "" : ": \(reason)")
            if jsonOutput {
                StandardOutput.write(JSONOutput.line([
                    ("ok", .bool(false)), ("protocol", .string(protocolString)), ("accessory", json(accessory)),
                    ("bytes", total.map { .int($0) } ?? .null), ("bytesHanded", .int(sent)), ("bytesAcknowledged", .int(acknowledged)),
                    ("seconds", .number(seconds(ContinuousClock.now - start))), ("error", .string(reason)),
                ]))
            }
            throw ToolError(description: summary, exitCode: why == .interrupted ? .interrupted : .ioError)
        }
        let elapsed = seconds(ContinuousClock.now - start)
        var verified: Bool?
        if verify {
            // The echo of the last bytes may still be on its way: up to the stall timeout.
            let outcome = try blockingAwait { try await reader.value }
            verified = outcome.matches && outcome.received == sent
        } else {
            reader.cancel()
        }
        progress?.draw(sent: sent, since: start, force: true)
        progress?.finish()
        stream.close()
        let rate = elapsed > 0 ? Double(sent) / elapsed : 0
        if jsonOutput {
            var fields: [(String, JSONValue)] = [
                ("ok", .bool(verified ?? true)), ("protocol", .string(protocolString)), ("accessory", json(accessory)),
                ("bytes", .int(sent)), ("bytesAcknowledged", .int(stream.bytesAcknowledged)),
                ("seconds", .number(elapsed)), ("bytesPerSecond", .number(rate)),
            ]
            if let verified { fields.append(("verified", .bool(verified))) }
            StandardOutput.write(JSONOutput.line(fields))
        } else {
            var line = "sent \(sent) bytes to \(accessory.name.escapedForTerminal) (\(protocolString.escapedForTerminal)) in \(formatSeconds(elapsed)) s, \(formatRate(rate))"
            if let verified { line += verified ? "; the echo matches byte for byte" : "; THE ECHO DIFFERS" }
            StandardOutput.write(line + "\n")
        }
        return verified == false ? .dataError : .success
    }

    enum StopReason: Equatable { case interrupted, stalled }

    /// Reads the echo and compares it with the file, read again from disk at the same offsets
    /// (bounded memory whatever the size). Ends when `total` bytes came back or the session did.
    static func compareEcho(_ stream: AccessorySession, path: String, total: Int) async throws -> (matches: Bool, received: Int) {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return (false, 0) }
        defer { close(fd) }
        var expected = [UInt8](repeating: 0, count: 1 << 16)
        var received = 0
        var matches = true
        while received < total, let chunk = try await stream.read() {
            var offset = 0
            while matches, offset < chunk.count {
                let want = min(chunk.count - offset, expected.count)
                let got = expected.withUnsafeMutableBytes { pread(fd, $0.baseAddress, want, off_t(received + offset)) }
                guard got > 0 else { matches = false; break } // longer than the file
                if !chunk[offset..<(offset + got)].elementsEqual(expected[0..<got]) { matches = false }
                offset += got
            }
            received += chunk.count
        }
        return (matches, received)
    }

    /// Reads and drops what the accessory sends until the session ends; returns the count.
    static func discard(_ stream: AccessorySession) async throws -> Int {
        var received = 0
        do {
            while let chunk = try await stream.read() { received += chunk.count }
        } catch AccessoryError.sessionClosed {}
        return received
    }
}
