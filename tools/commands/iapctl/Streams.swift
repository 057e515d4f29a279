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

/// A listening Unix stream socket for `open --socket`, removed again by ``close()`` (only if it
/// is still the one this listener made).
///
/// The socket file is readable and writable by its owner only (0600), whatever the umask: the
/// mode is set on the socket before `bind` creates the file, which Linux creates with the
/// socket's mode less the umask, so there is no moment at which another user could connect (a
/// `chmod` after `bind`, or a umask changed for the whole process while other threads create
/// files, would each leave one). The mode is checked after `bind`, and the socket refused if it
/// is wider.
final class UnixListener {
    let path: String
    private var descriptor: Int32
    /// The socket file this listener bound, to remove only that one.
    private var identity: (device: UInt, inode: UInt)?
    /// Turns away the clients that come while one is served (``refuseFurtherClients(onRefused:)``).
    private var refuser: ClientRefuser?

    static var maxPathLength: Int { MemoryLayout.size(ofValue: sockaddr_un().sun_path) - 1 }

    /// Refuses a path that is too long for a socket address, or where something other than a
    /// socket already is (exit 73, EX_CANTCREAT).
    static func check(_ path: String) throws {
        guard !path.isEmpty, path.utf8.count <= maxPathLength else {
            throw ToolError(description: "the socket path '\(path)' is empty or longer than \(maxPathLength) bytes; pick a shorter one",
                            exitCode: .cannotCreate)
        }
        var status = stat()
        if lstat(path, &status) == 0, status.st_mode & S_IFMT != S_IFSOCK {
            throw ToolError(description: "'\(path)' exists and is not a socket; remove it or pick another path", exitCode: .cannotCreate)
        }
    }

    /// Binds and listens at `path`. A socket file already there is replaced only when nothing
    /// listens on it (left by a process that died); a live one is refused.
    init(path: String) throws {
        try Self.check(path)
        self.path = path
        descriptor = -1
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: path.utf8)
            raw[path.utf8.count] = 0
        }
        func withAddress<T>(_ body: (UnsafePointer<sockaddr>, socklen_t) -> T) -> T {
            withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }
        }
        var existing = stat()
        if lstat(path, &existing) == 0 {
            let probe = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            let live = probe >= 0 && withAddress { connect(probe, $0, $1) } == 0
            if probe >= 0 { Glibc.close(probe) }
            guard !live else {
                throw ToolError(description: "another process is listening on '\(path)'; stop it or pick another path", exitCode: .cannotCreate)
            }
            unlink(path)
        }
        descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else {
            throw ToolError(description: "cannot create a Unix socket: \(SystemError.last.text)", exitCode: .cannotCreate)
        }
        // Before bind: the file bind creates takes this mode (less the umask), so it is never
        // open to others, not even for a moment.
        guard fchmod(descriptor, 0o600) == 0 else {
            let message = SystemError.last.text
            Glibc.close(descriptor)
            descriptor = -1
            throw ToolError(description: "cannot restrict the socket for '\(path)' to its owner: \(message)", exitCode: .cannotCreate)
        }
        guard withAddress({ bind(descriptor, $0, $1) }) == 0 else {
            let message = SystemError.last.text
            Glibc.close(descriptor)
            descriptor = -1
            throw ToolError(description: "cannot listen on '\(path)': \(message)", exitCode: .cannotCreate)
        }
        var bound = stat()
        guard lstat(path, &bound) == 0, bound.st_mode & 0o077 == 0 else {
            // A kernel that does not give the file the socket's mode: refuse rather than serve
            // a session to anyone who can reach the path.
            Glibc.close(descriptor)
            descriptor = -1
            unlink(path)
            throw ToolError(description: "the socket '\(path)' was created open to other users (mode \(String(bound.st_mode & 0o777, radix: 8))); "
                                + "use a path in a directory only you can enter", exitCode: .cannotCreate)
        }
        identity = (UInt(bound.st_dev), UInt(bound.st_ino))
        guard listen(descriptor, 1) == 0 else {
            let message = SystemError.last.text
            close()
            throw ToolError(description: "cannot listen on '\(path)': \(message)", exitCode: .cannotCreate)
        }
    }

    /// From now on, accepts every further client only to write it one line saying that the
    /// socket already serves a client, and closes it; `onRefused` is called for each (to log
    /// it). Runs on a worker until ``close()``.
    func refuseFurtherClients(onRefused: @escaping @Sendable () -> Void) {
        guard descriptor >= 0, refuser == nil else { return }
        let refuser = ClientRefuser(descriptor: descriptor,
                                    message: "iapctl: '\(path)' already serves a client, one at a time; connect again once it is done\n")
        self.refuser = refuser
        DispatchQueue.global().async { refuser.run(onRefused: onRefused) }
    }

    /// Waits for the first client and returns its connection; gives up (exit 74) as soon as
    /// `stillWanted` turns false (checked twice a second: the accessory went away).
    func acceptOne(while stillWanted: () -> Bool) throws -> Int32 {
        while true {
            var poller = [pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)]
            let ready: Int32
            switch SystemCall.poll(&poller, timeout: 500, retry: { false }) {
            case .success(let count): ready = count
            case .failure(let error) where error.kind == .interrupted: ready = 0
            case .failure(let error):
                throw ToolError(description: "waiting for a client on '\(path)' failed: \(error)", exitCode: .ioError)
            }
            if ready <= 0 {
                guard stillWanted() else {
                    throw ToolError(description: "the accessory disconnected before a client connected to '\(path)'", exitCode: .ioError)
                }
                continue
            }
            switch SystemCall.retrying({ accept(descriptor, nil, nil) }) {
            case .success(let client):
                _ = fcntl(client, F_SETFD, FD_CLOEXEC)
                return client
            case .failure(let error) where error.kind == .wouldBlock || error.code == ECONNABORTED:
                continue
            case .failure(let error):
                throw ToolError(description: "accepting a client on '\(path)' failed: \(error)", exitCode: .ioError)
            }
        }
    }

    /// Stops listening and removes the socket file, unless another process replaced it since.
    func close() {
        guard descriptor >= 0 else { return }
        // The refuser polls the descriptor: it stops before the number can be reused.
        refuser?.stop()
        refuser = nil
        Glibc.close(descriptor)
        descriptor = -1
        var status = stat()
        if let identity, lstat(path, &status) == 0, UInt(status.st_dev) == identity.device, UInt(status.st_ino) == identity.inode {
            unlink(path)
        }
    }

    deinit { close() }
}

/// Accepts clients on a listening socket only to turn them away with a one-line message, until
/// stopped; for ``UnixListener/refuseFurtherClients(onRefused:)``.
final class ClientRefuser: Sendable {
    private let descriptor: Int32
    private let message: [UInt8]
    private let stopped = Atomic<Bool>(false)
    private let finished = DispatchSemaphore(value: 0)

    init(descriptor: Int32, message: String) {
        self.descriptor = descriptor
        self.message = Array(message.utf8)
    }

    /// Turns clients away until ``stop()``; checks for it five times a second.
    func run(onRefused: @Sendable () -> Void) {
        defer { finished.signal() }
        while !stopped.load(ordering: .acquiring) {
            var poller = [pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)]
            guard case .success(let ready) = SystemCall.poll(&poller, timeout: 200, retry: { false }), ready > 0 else { continue }
            guard case .success(let client) = SystemCall.retrying({ accept(descriptor, nil, nil) }) else { continue }
            _ = fcntl(client, F_SETFD, FD_CLOEXEC)
            _ = message.withUnsafeBytes { Glibc.send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT)) }
            // What the client sent already is read and dropped, so that closing does not reset
            // the connection before it has read the message.
            var scratch = [UInt8](repeating: 0, count: 4_096)
            for _ in 0..<16 {
                let count = scratch.withUnsafeMutableBytes { Glibc.recv(client, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
                if count <= 0 { break }
            }
            Glibc.shutdown(client, Int32(SHUT_RDWR))
            Glibc.close(client)
            onRefused()
        }
    }

    /// Stops turning clients away; returns once the worker no longer touches the descriptor.
    func stop() {
        stopped.store(true, ordering: .releasing)
        finished.wait()
    }
}

/// Why an accessory went away, as its manager announced it (`AccessoryEvent.disconnected`).
final class DepartureWatch: Sendable {
    private final class Seen: Sendable {
        let reason = Mutex<String?>(nil)
        let signal = DispatchSemaphore(value: 0)
    }
    private let seen = Seen()
    private let subscription: EventSubscription

    init(_ manager: AccessoryManager, _ accessory: Accessory) {
        let seen = self.seen
        subscription = manager.onEvent(queue: DispatchQueue(label: "iapctl.departure")) { event in
            guard case let .disconnected(gone, reason) = event, gone === accessory else { return }
            seen.reason.withLock { $0 = reason }
            seen.signal.signal()
        }
    }

    /// The reason, waiting at most `limit` for the announcement (it follows the session's end).
    func reason(waitingUpTo limit: Duration) -> String? {
        if let reason = seen.reason.withLock({ $0 }) { return reason }
        _ = seen.signal.wait(timeout: .now() + limit.dispatchInterval)
        return seen.reason.withLock { $0 }
    }

    deinit { subscription.cancel() }
}

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

/// Closes a send's session when the accessory's acknowledged count has not moved for `timeout`
/// while bytes are outstanding: an accessory that keeps the link alive (bare ACKs) but
/// acknowledges none of the data would otherwise hold the transfer for ever.
final class StallWatchdog {
    /// What the timer compares, shared with its handler.
    private final class Progress: Sendable {
        let state = Mutex((acknowledged: 0, written: 0, since: ContinuousClock.now))
    }
    private let timer: any DispatchSourceTimer
    private let progress = Progress()

    init(stream: AccessorySession, timeout: Duration, onStall: @escaping @Sendable () -> Void) {
        timer = DispatchSource.makeTimerSource(queue: DispatchQueue(label: "iapctl.send.watchdog"))
        let progress = self.progress
        let tick = min(1.0, max(0.05, seconds(timeout) / 4))
        timer.schedule(deadline: .now() + tick, repeating: tick)
        timer.setEventHandler {
            let acknowledged = stream.bytesAcknowledged
            let stalled = progress.state.withLock { state -> Bool in
                if acknowledged != state.acknowledged || acknowledged >= state.written {
                    state.acknowledged = acknowledged
                    state.since = .now
                    return false
                }
                return ContinuousClock.now - state.since >= timeout
            }
            if stalled { onStall() }
        }
        timer.resume()
    }

    /// `written` bytes have been handed to the session.
    func expect(_ written: Int) {
        progress.state.withLock { state in
            if state.acknowledged >= state.written { state.since = .now } // it was idle, not stalled
            state.written = written
        }
    }

    func cancel() { timer.cancel() }
}

/// `send`'s progress on a terminal (standard error): a bar, the bytes sent, the rate, the time
/// so far and the time left, redrawn at most ten times a second.
final class ProgressLine {
    let total: Int?
    private var lastDraw: ContinuousClock.Instant?
    private var drawn = false

    init(total: Int?) { self.total = total }

    func draw(sent: Int, since start: ContinuousClock.Instant, force: Bool = false) {
        let now = ContinuousClock.now
        if !force, let lastDraw, now - lastDraw < .milliseconds(100) { return }
        lastDraw = now
        drawn = true
        let elapsed = seconds(now - start)
        let rate = elapsed > 0 ? Double(sent) / elapsed : 0
        var line = ""
        if let total {
            let fraction = total == 0 ? 1 : min(1, Double(sent) / Double(total))
            let width = max(10, min(30, Terminal.columns(2) - 70))
            let filled = Int(fraction * Double(width))
            line += "[" + String(repeating: "#", count: filled) + String(repeating: " ", count: width - filled) + "] "
            line += "\(Int(fraction * 100))%  \(formatBytes(sent)) of \(formatBytes(total))"
        } else {
            line += formatBytes(sent)
        }
        line += "  \(formatRate(rate))  \(formatClock(elapsed)) elapsed"
        if let total, rate > 0, sent < total {
            line += ", \(formatClock(Double(total - sent) / rate)) left"
        }
        StandardError.write("\r" + line + "\u{1b}[K")
    }

    /// Ends the line (once something was drawn).
    func finish() {
        if drawn { StandardError.write("\n") }
        drawn = false
    }
}

func formatSeconds(_ seconds: Double) -> String {
    String(Double(Int(seconds * 1_000)) / 1_000)
}

func formatRate(_ bytesPerSecond: Double) -> String {
    if bytesPerSecond >= 1e6 { return String(Double(Int(bytesPerSecond / 1e4)) / 100) + " MB/s" }
    return String(Double(Int(bytesPerSecond / 10)) / 100) + " kB/s"
}

/// `12.34 MB`, `512 B`.
func formatBytes(_ bytes: Int) -> String {
    if bytes >= 1_000_000 { return String(Double(bytes / 10_000) / 100) + " MB" }
    if bytes >= 1_000 { return String(Double(bytes / 10) / 100) + " kB" }
    return "\(bytes) B"
}

/// `0:07`, `1:02:03`.
func formatClock(_ seconds: Double) -> String {
    let whole = Int(seconds.rounded())
    let (h, m, s) = (whole / 3_600, whole / 60 % 60, whole % 60)
    let two = { (n: Int) in n < 10 ? "0\(n)" : "\(n)" }
    return h > 0 ? "\(h):\(two(m)):\(two(s))" : "\(m):\(two(s))"
}

enum SimulateCommand {
    static let gadgetUsage = "iapctl simulate --gadget [--udc NAME] [--usb-id VID:PID] [--usb-layout NAME] [--sticks-until-reset] [--profile NAME|PATH]"

    static func run(_ command: ParsedCommand) throws -> ExitCode {
        let profile = try loadProfile(command.value("profile") ?? "multi-sensor")
        if command.flag("gadget") {
            if command.value("port") != nil {
                throw UsageError("--gadget and --port exclude each other: the accessory is either a USB device or on a serial line",
                                 usage: gadgetUsage, commandPath: command.path)
            }
            return try runGadget(command, profile: profile)
        }
        for option in ["udc", "usb-id", "usb-layout", "sticks-until-reset"] where command.count(option) > 0 {
            throw UsageError("--\(option) needs --gadget", usage: gadgetUsage, commandPath: command.path)
        }
        if let channel = command.value("bluetooth-advertise") {
            for option in ["bluetooth", "bluetooth-from", "port"] where command.count(option) > 0 {
                throw UsageError("--bluetooth-advertise and --\(option) exclude each other: the accessory waits for the host to connect",
                                 usage: advertiseUsage, commandPath: command.path)
            }
            return try runBluetoothAdvertising(command, channel: channel, profile: profile)
        }
        if let target = command.value("bluetooth") {
            return try runBluetooth(command, target: target, profile: profile)
        }
        if command.value("bluetooth-from") != nil {
            throw UsageError("--bluetooth-from needs --bluetooth", usage: bluetoothUsage, commandPath: command.path)
        }
        let transport: any Transport
        var pty: PseudoTerminal?
        if let port = command.value("port") {
            do { transport = try SerialTransport(spec: try SerialPortSpec(parsing: port)) } catch {
                throw ToolError(description: "\(error)", exitCode: .unavailable)
            }
        } else {
            do {
                let terminal = try PseudoTerminal()
                transport = try terminal.makeMasterTransport()
                pty = terminal
            } catch {
                throw ToolError(description: "cannot create a pseudo-terminal: \(error)", exitCode: .osError)
            }
        }
        let runner: SimulatorRunner
        do { runner = try SimulatorRunner(profile: profile, attachment: .transport(transport)) } catch {
            throw ToolError(description: "\(error)", exitCode: .dataError)
        }
        runner.start(events: eventPrinter(command))
        if let pty {
            StandardOutput.write(pty.slavePath + "\n")
            StandardError.write("simulating '\(profile.identity().name.escapedForTerminal)' on \(pty.slavePath); connect with: iapctl --serial \(pty.slavePath) list\n"
                + "press Ctrl-C to stop\n")
        }
        let interrupt = Interrupt()
        interrupt.wait()
        runner.stop()
        withExtendedLifetime(pty) {}
        return .success
    }

    /// `--gadget`: the simulator as a USB device through configfs and FunctionFS, bound to a UDC,
    /// until SIGINT or SIGTERM; the gadget is removed again on the way out.
    static func runGadget(_ command: ParsedCommand, profile: SimulatorProfile) throws -> ExitCode {
        // Signals first: an interrupt while the gadget is being built must still remove it.
        let interrupt = Interrupt()
        var configuration = USBGadgetConfiguration(profile: profile)
        if let text = command.value("usb-id") {
            guard let id = USBID(parsing: text) else {
                throw UsageError("invalid value '\(text)' for --usb-id: expected VID:PID in hex, e.g. 1209:0001",
                                 usage: gadgetUsage, commandPath: command.path)
            }
            configuration.vendorID = id.vendorID
            configuration.productID = id.productID
        }
        if let name = command.value("usb-layout") {
            guard let layout = USBDescriptorLayout(named: name) else {
                throw UsageError("invalid value '\(name)' for --usb-layout: use one of \(USBDescriptorLayout.names.joined(separator: ", "))",
                                 usage: gadgetUsage, commandPath: command.path)
            }
            if let ids = layout.usbID, command.count("usb-id") > 0, let text = command.value("usb-id"),
               USBID(parsing: text) != USBID(vendorID: ids.vendorID, productID: ids.productID) {
                throw UsageError("--usb-layout \(name) presents the ids \(USBID(vendorID: ids.vendorID, productID: ids.productID)) of its own; "
                                 + "drop --usb-id \(text) or choose another layout", usage: gadgetUsage, commandPath: command.path)
            }
            configuration.layout = layout
        }
        let udc: String
        if let name = command.value("udc") {
            let known = USBGadget.availableUDCs()
            guard known.contains(name) else {
                throw ToolError(description: "no USB device controller named '\(name)'; "
                                    + (known.isEmpty ? "there is none: modprobe dummy_hcd for a virtual one"
                                                     : "available: \(known.joined(separator: ", "))"),
                                exitCode: .unavailable)
            }
            udc = name
            // One gadget per controller: several simulators at once (a fleet on dummy_hcd num=8)
            // each get a configfs directory and a FunctionFS instance of their own (instance
            // names are global to the kernel): iapsim-UDC and iap2-UDC.
            configuration.name = "iapsim-\(name)"
            configuration.functionInstance = "iap2-\(name)"
        } else {
            do { udc = try USBGadget.defaultUDC() } catch { throw gadgetFailure(error) }
        }
        let gadget: USBGadget
        do { gadget = try USBGadget(configuration: configuration) } catch { throw gadgetFailure(error) }
        let runner: SimulatorRunner
        let wire: any Transport = command.flag("sticks-until-reset") ? StickingWire(gadget.transport) : gadget.transport
        do { runner = try SimulatorRunner(profile: profile, attachment: .transport(wire)) } catch {
            try? gadget.remove()
            throw ToolError(description: "\(error)", exitCode: .dataError)
        }
        if command.count("verbose") > 0 {
            gadget.transport.onConnectionChange { StandardError.write("gadget: \($0.rawValue)\n") }
        }
        // The transport wrote the descriptors when the gadget was built, so the UDC can bind now.
        runner.start(events: eventPrinter(command))
        do {
            try gadget.bind(udc: udc)
        } catch {
            runner.stop()
            try? gadget.remove()
            throw gadgetFailure(error)
        }
        StandardOutput.write("usb gadget \(configuration.usbID) on \(udc)\n")
        StandardError.write("simulating '\(profile.identity().name.escapedForTerminal)' as USB device \(configuration.usbID) on \(udc); "
            + "connect with: iapctl list\npress Ctrl-C to stop\n")
        interrupt.wait()
        try? gadget.unbind()
        runner.stop()
        do { try gadget.remove() } catch {
            throw ToolError(description: "the gadget was not removed completely: \(error)", exitCode: gadgetFailure(error).exitCode)
        }
        return .success
    }

    /// A gadget error as the tool reports it: 77 permission, 69 missing support or in use, 71
    /// anything else.
    static func gadgetFailure(_ error: USBGadgetError) -> ToolError {
        let exitCode: ExitCode
        switch error.category {
        case .permission: exitCode = .noPermission
        case .missingSupport, .busy: exitCode = .unavailable
        case .failed: exitCode = .osError
        }
        return ToolError(description: "\(error)", exitCode: exitCode)
    }

    /// Prints the simulator's events with -v (all but the endpoint's own chatter).
    static func eventPrinter(_ command: ParsedCommand) -> @Sendable (SimulatorEvent) -> Void {
        let verbose = command.count("verbose") > 0
        return { event in
            guard verbose else { return }
            if let line = describe(event) { StandardError.write("simulator: \(line.escapedForTerminal)\n") }
        }
    }

    /// A simulator event in words (nil for the endpoint's own chatter).
    static func describe(_ event: SimulatorEvent) -> String? {
        func counts(_ statistics: SessionStatistics) -> String {
            "\(statistics.bytesIn) bytes in, \(statistics.bytesOut) out"
        }
        switch event {
        case let .identified(identity):
            return "identified as '\(identity.name)' (serial \(identity.serialNumber), firmware \(identity.firmwareVersion))"
        case let .sessionOpened(id, name): return "session \(id) opened: \(name)"
        case let .sessionClosed(id, name, reason, statistics):
            return "session \(id) closed: \(name), \(counts(statistics))" + (reason.map { " (\($0))" } ?? "")
        case let .nativeSessionOpened(id, name): return "native session \(id) opened: \(name)"
        case let .nativeSessionClosed(id, name, statistics): return "native session \(id) closed: \(name), \(counts(statistics))"
        case let .sourceFinished(id, bytes): return "session \(id) sent its last byte (\(bytes) bytes)"
        case let .firmwareUpdateBegan(id, version, size): return "session \(id): firmware update to \(version) began (\(size) bytes)"
        case let .firmwareUpdateFinished(id, status, crc):
            return "session \(id): firmware update finished: \(status) (CRC-32 0x\(String(crc, radix: 16)))"
        case let .firmwareUpdateError(id, code, message): return "session \(id): firmware update error \(code): \(message)"
        case let .readingStopped(bytes): return "stopped reading after \(bytes) bytes (fault)"
        case let .reboot(version): return "rebooting with firmware \(version)"
        case .vanish: return "vanished (fault)"
        case .endpoint: return nil
        }
    }

    /// SIGINT and SIGTERM, caught from creation on (they no longer end the process).
    final class Interrupt {
        private let stop = DispatchSemaphore(value: 0)
        private var sources: [any DispatchSourceSignal] = []

        init() {
            Glibc.signal(SIGINT, SIG_IGN)
            Glibc.signal(SIGTERM, SIG_IGN)
            let stop = self.stop
            sources = [SIGINT, SIGTERM].map { number -> any DispatchSourceSignal in
                let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
                source.setEventHandler { stop.signal() }
                source.resume()
                return source
            }
        }

        /// Waits for the first signal.
        func wait() {
            stop.wait()
            for source in sources { source.cancel() }
        }
    }
}


