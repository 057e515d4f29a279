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

/// Writes all of `bytes` to a file descriptor, retrying on EINTR and partial writes. Sockets
/// are written with `MSG_NOSIGNAL`, so a client that went away is an error, not SIGPIPE.
func writeFully(_ fd: Int32, _ bytes: [UInt8], isSocket: Bool = false) -> Bool {
    var offset = 0
    while offset < bytes.count {
        let result = bytes[offset...].withUnsafeBytes { buffer in
            SystemCall.retrying {
                isSocket ? Glibc.send(fd, buffer.baseAddress, buffer.count, Int32(MSG_NOSIGNAL)) : Glibc.write(fd, buffer.baseAddress, buffer.count)
            }
        }
        guard case .success(let written) = result, written > 0 else { return false }
        offset += written
    }
    return true
}

enum OpenCommand {
    static func run(_ command: ParsedCommand) throws -> ExitCode {
        let protocolString = command.positional("protocol") ?? ""
        let socketPath = command.value("socket")
        if let socketPath { try UnixListener.check(socketPath) } // before any accessory is touched
        let session = try HostContext(command, supportedProtocols: [protocolString])
        defer { session.shutdown() }
        let accessory = try chooseAccessory(session, command: command, protocolString: protocolString)
        let departure = DepartureWatch(session.manager, accessory)
        let stream = try openSession(accessory, protocolString)
        session.logger.info("opened \(protocolString) on \(accessory.name)")
        let idle = Double(command.value("idle") ?? "1") ?? 1
        guard let socketPath else {
            try bridge(stream, accessory: accessory, departure: departure, input: 0, output: 1, isSocket: false, idle: idle)
            return .success
        }
        let listener: UnixListener
        do { listener = try UnixListener(path: socketPath) } catch {
            stream.close()
            throw error
        }
        defer { listener.close() }
        StandardOutput.write("listening on \(socketPath)\n") // unbuffered: a script can wait for this line
        let client: Int32
        do { client = try listener.acceptOne(while: { accessory.isConnected }) } catch {
            stream.close()
            throw error
        }
        defer {
            // Wakes an output thread still blocked in send() before the number can be reused.
            Glibc.shutdown(client, Int32(SHUT_RDWR))
            Glibc.close(client)
        }
        session.logger.info("a client connected to \(socketPath)")
        // One client at a time: another one is told so and closed, rather than connected to a
        // session that never reads it.
        let logger = session.logger
        listener.refuseFurtherClients {
            logger.warning("refused another client on \(socketPath): the session serves one client at a time")
        }
        try bridge(stream, accessory: accessory, departure: departure, input: client, output: client, isSocket: true, idle: idle)
        return .success
    }

    /// Copies `input` to the session and the session to `output` with back-pressure both ways
    /// until input ends and the accessory has been quiet for `idle` seconds, then closes the
    /// session. Throws (exit 74) when the accessory went away or a session call failed.
    static func bridge(_ stream: AccessorySession, accessory: Accessory, departure: DepartureWatch, input: Int32, output: Int32,
                       isSocket: Bool, idle: Double) throws {
        let failure = Mutex<ToolError?>(nil)
        let activity = DispatchSemaphore(value: 0)
        let outputDone = DispatchSemaphore(value: 0)
        // While a write to a slow reader is under way the session is not idle: ending it then
        // would drop what the accessory sent.
        let writing = Atomic<Bool>(false)
        // The session's end (the accessory went, or a read failed) ends the input side too: a
        // terminal or a pipe that stays open would otherwise hold `open` until it ends. The
        // output side writes a byte here; the input side polls it beside its input.
        var ended: [Int32] = [-1, -1]
        guard pipe(&ended) == 0 else { throw ToolError(description: "cannot make a pipe: \(SystemError(errno))", exitCode: .osError) }
        let (endedRead, endedWrite) = (ended[0], ended[1])
        // The write end is the output side's; the read end is closed once the output side is
        // done (left open otherwise: a late byte must not reach a reused descriptor or raise SIGPIPE).
        var outputFinished = false
        defer { if outputFinished { Glibc.close(endedRead) } }
        // Accessory → output. A slow reader slows the accessory (we read only after writing).
        DispatchQueue.global().async {
            defer {
                var byte: UInt8 = 1
                _ = Glibc.write(endedWrite, &byte, 1)
                Glibc.close(endedWrite)
                outputDone.signal()
            }
            while true {
                let chunk: [UInt8]?
                do { chunk = try blockingAwait { try await stream.read() } } catch {
                    failure.withLock { $0 = ToolError(description: "\(error)", exitCode: .ioError) }
                    return
                }
                guard let chunk else {
                    if !accessory.isConnected {
                        // Why it went (it left the bus, its link failed…), as the manager said.
                        let why = departure.reason(waitingUpTo: .seconds(1)).map { ": \($0)" } ?? ""
                        failure.withLock { $0 = $0 ?? ToolError(description: "the accessory disconnected\(why)", exitCode: .ioError) }
                    }
                    return
                }
                writing.store(true, ordering: .releasing)
                activity.signal()
                let written = writeFully(output, chunk, isSocket: isSocket)
                writing.store(false, ordering: .releasing)
                activity.signal()
                guard written else { return }
            }
        }
        // Input → accessory, with back-pressure: the next read waits for the write.
        var buffer = [UInt8](repeating: 0, count: 64 * 1_024)
        while true {
            var ready = [pollfd(fd: input, events: Int16(POLLIN), revents: 0), pollfd(fd: endedRead, events: Int16(POLLIN), revents: 0)]
            guard case .success = SystemCall.poll(&ready), ready[1].revents == 0 else { break }
            let result = buffer.withUnsafeMutableBytes { SystemCall.read(input, into: $0) }
            guard case .success(let count) = result, count > 0 else { break }
            let chunk = Array(buffer[0..<count])
            do { try blockingAwait { try await stream.write(chunk) } } catch {
                stream.close()
                throw ToolError(description: "\(error)", exitCode: .ioError)
            }
        }
        // Input ended: what was written must be acknowledged, within a progress timeout (an
        // accessory that keeps its link alive without acknowledging held `open` here for ever).
        do { try blockingAwait { try await stream.drain(progressTimeout: sendProgressTimeout) } } catch {
            // The session's end is the output side's to report; a timeout is this side's.
            if case AccessoryError.timedOut = error {
                failure.withLock { $0 = $0 ?? ToolError(description: "\(error)", exitCode: .ioError) }
            }
        }
        // Keep copying output until the accessory has been quiet for --idle seconds after the
        // last write finished.
        while activity.wait(timeout: .now() + .milliseconds(Int(idle * 1_000))) == .success
                || writing.load(ordering: .acquiring) {}
        stream.close()
        outputFinished = outputDone.wait(timeout: .now() + .seconds(2)) == .success
        if let error = failure.withLock({ $0 }) { throw error }
    }
}
