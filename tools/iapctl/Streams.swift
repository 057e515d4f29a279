import AccessoryHost
import AccessoryGadget
import AccessoryLogging
import AccessorySimulator
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
        let accessory = try select(try discover(session, command: command) { $0.protocolStrings.contains(protocolString) },
                                   command.value("accessory"), protocolString: protocolString)
        let stream = try blockingAwait { try await accessory.openSession(for: protocolString) }
        session.logger.info("opened \(protocolString) on \(accessory.name)")
        let idle = Double(command.value("idle") ?? "1") ?? 1
        guard let socketPath else {
            try bridge(stream, accessory: accessory, input: 0, output: 1, isSocket: false, idle: idle)
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
        try bridge(stream, accessory: accessory, input: client, output: client, isSocket: true, idle: idle)
        return .success
    }

    /// Copies `input` to the session and the session to `output` with back-pressure both ways
    /// until input ends and the accessory has been quiet for `idle` seconds, then closes the
    /// session. Throws (exit 74) when the accessory went away or a session call failed.
    static func bridge(_ stream: AccessorySession, accessory: Accessory, input: Int32, output: Int32, isSocket: Bool,
                       idle: Double) throws {
        let failure = Mutex<ToolError?>(nil)
        let activity = DispatchSemaphore(value: 0)
        let outputDone = DispatchSemaphore(value: 0)
        // While a write to a slow reader is under way the session is not idle: ending it then
        // would drop what the accessory sent.
        let writing = Atomic<Bool>(false)
        // Accessory → output. A slow reader slows the accessory (we read only after writing).
        DispatchQueue.global().async {
            defer { outputDone.signal() }
            while true {
                let chunk: [UInt8]?
                do { chunk = try blockingAwait { try await stream.read() } } catch {
                    failure.withLock { $0 = ToolError(description: "\(error)", exitCode: .ioError) }
                    return
                }
                guard let chunk else {
                    if !accessory.isConnected {
                        failure.withLock { $0 = $0 ?? ToolError(description: "the accessory disconnected", exitCode: .ioError) }
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
        _ = outputDone.wait(timeout: .now() + .seconds(2))
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
            throw ToolError(description: "cannot create a Unix socket: \(String(cString: strerror(errno)))", exitCode: .cannotCreate)
        }
        // Before bind: the file bind creates takes this mode (less the umask), so it is never
        // open to others, not even for a moment.
        guard fchmod(descriptor, 0o600) == 0 else {
            let message = String(cString: strerror(errno))
            Glibc.close(descriptor)
            descriptor = -1
            throw ToolError(description: "cannot restrict the socket for '\(path)' to its owner: \(message)", exitCode: .cannotCreate)
        }
        guard withAddress({ bind(descriptor, $0, $1) }) == 0 else {
            let message = String(cString: strerror(errno))
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
            let message = String(cString: strerror(errno))
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

/// How long `send` waits for the accessory's acknowledged count to move before it gives up.
let sendProgressTimeout: Duration = .seconds(10)

enum SendCommand {
    static func run(_ command: ParsedCommand) throws -> ExitCode {
        let protocolString = command.positional("protocol") ?? ""
        let path = command.positional("file") ?? ""
        let data: [UInt8]
        do { data = try FileInput.readAll(path: path) } catch {
            throw ToolError(description: "cannot read '\(path)': \(error)", exitCode: .noInput)
        }
        let session = try HostContext(command, supportedProtocols: [protocolString])
        defer { session.shutdown() }
        let accessory = try select(try discover(session, command: command) { $0.protocolStrings.contains(protocolString) },
                                   command.value("accessory"), protocolString: protocolString)
        let stream = try blockingAwait { try await accessory.openSession(for: protocolString) }
        let verify = command.flag("verify-echo")
        let json = command.flag("json")
        let progress = !json && Terminal.isTTY(2)
        let chunkSize = try command.integer("chunk", in: 1...(16 << 20)) ?? 64 * 1_024
        let start = ContinuousClock.now
        let reader: Task<Bool, any Error>? = verify ? Task {
            var received = 0
            var matches = true
            while received < data.count, let chunk = try await stream.read() {
                if Array(data[received..<min(data.count, received + chunk.count)]) != chunk { matches = false }
                received += chunk.count
            }
            return matches && received == data.count
        } : nil
        var sent = 0
        var lastDraw = ContinuousClock.now
        // Progress watchdog: an accessory that keeps the link alive (bare ACKs) but acknowledges
        // none of the data would hold the transfer forever. No new acknowledgement for
        // `sendProgressTimeout` while bytes are outstanding ends the session, and the send fails.
        let stalled = Mutex(false)
        let watchdog = DispatchSource.makeTimerSource(queue: DispatchQueue(label: "iapctl.send.watchdog"))
        let progressState = Mutex((acknowledged: 0, since: ContinuousClock.now))
        let total = data.count
        watchdog.schedule(deadline: .now() + 1, repeating: 1)
        watchdog.setEventHandler {
            let acknowledged = stream.bytesAcknowledged
            let giveUp = progressState.withLock { state -> Bool in
                if acknowledged != state.acknowledged || acknowledged >= total {
                    state = (acknowledged, .now)
                    return false
                }
                return ContinuousClock.now - state.since >= sendProgressTimeout
            }
            if giveUp, stalled.withLock({ stalled in defer { stalled = true }; return !stalled }) { stream.close() }
        }
        watchdog.resume()
        defer { watchdog.cancel() }
        do {
            while sent < data.count {
                let end = min(data.count, sent + chunkSize)
                let chunk = Array(data[sent..<end])
                try blockingAwait { try await stream.write(chunk) }
                sent = end
                if progress, ContinuousClock.now - lastDraw > .milliseconds(100) {
                    lastDraw = .now
                    drawProgress(sent: sent, total: data.count, since: start)
                }
            }
            try blockingAwait { try await stream.flush() }
            // Success means acknowledged by the accessory, not handed to the link.
            try blockingAwait { try await stream.drain() }
        } catch {
            if progress { StandardError.write("\n") }
            // Nothing is resent: the script decides, knowing what is sure to have arrived.
            let acknowledged = stream.bytesAcknowledged
            let reason = stalled.withLock { $0 }
                ? "the accessory acknowledged nothing for \(sendProgressTimeout) (the link is alive, the data does not move)"
                : "\(error)"
            let summary = "transfer broke: the accessory acknowledged \(acknowledged) of \(data.count) bytes "
                + "(\(sent) had been written to the session; nothing was resent): \(reason)"
            if json {
                StandardOutput.write(JSONValue.object([("ok", .bool(false)), ("bytesAcknowledged", .int(acknowledged)),
                                                       ("bytesHanded", .int(sent)), ("bytes", .int(data.count)),
                                                       ("error", .string(reason))]).serialized() + "\n")
            }
            throw ToolError(description: summary, exitCode: .ioError)
        }
        var verified: Bool?
        if let reader {
            let outcome = try blockingAwait { try await reader.value }
            verified = outcome
        }
        let seconds = Double((ContinuousClock.now - start).components.attoseconds) / 1e18 + Double((ContinuousClock.now - start).components.seconds)
        let rate = seconds > 0 ? Double(data.count) / seconds : 0
        if progress { drawProgress(sent: sent, total: data.count, since: start); StandardError.write("\n") }
        stream.close()
        if json {
            var fields: [(String, JSONValue)] = [("ok", .bool(verified ?? true)), ("protocol", .string(protocolString)),
                                                 ("accessory", .int(accessory.connectionID)), ("bytes", .int(data.count)),
                                                 ("seconds", .string(String(seconds))), ("bytesPerSecond", .int(Int(rate)))]
            if let verified { fields.append(("verified", .bool(verified))) }
            StandardOutput.write(JSONValue.object(fields).serialized() + "\n")
        } else {
            var line = "sent \(data.count) bytes to \(accessory.name.escapedForTerminal) (\(protocolString.escapedForTerminal)) in \(formatSeconds(seconds)) s, \(formatRate(rate))"
            if let verified { line += verified ? "; the echo matches byte for byte" : "; THE ECHO DIFFERS" }
            StandardOutput.write(line + "\n")
        }
        return verified == false ? .dataError : .success
    }

    static func drawProgress(sent: Int, total: Int, since start: ContinuousClock.Instant) {
        let width = max(10, min(40, Terminal.columns(2) - 40))
        let fraction = total == 0 ? 1 : Double(sent) / Double(total)
        let filled = Int(fraction * Double(width))
        let elapsed = ContinuousClock.now - start
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        let rate = seconds > 0 ? Double(sent) / seconds : 0
        StandardError.write("\r[" + String(repeating: "#", count: filled) + String(repeating: " ", count: width - filled) + "] "
            + "\(Int(fraction * 100))%  \(formatRate(rate))   ")
    }
}

func formatSeconds(_ seconds: Double) -> String {
    String(Double(Int(seconds * 1_000)) / 1_000)
}

func formatRate(_ bytesPerSecond: Double) -> String {
    if bytesPerSecond >= 1e6 { return String(Double(Int(bytesPerSecond / 1e4)) / 100) + " MB/s" }
    return String(Double(Int(bytesPerSecond / 10)) / 100) + " kB/s"
}

enum SimulateCommand {
    static let gadgetUsage = "iapctl simulate --gadget [--udc NAME] [--usb-id VID:PID] [--profile NAME|PATH]"

    static func run(_ command: ParsedCommand) throws -> ExitCode {
        let profile = try loadProfile(command.value("profile") ?? "multi-sensor")
        if command.flag("gadget") {
            if command.value("port") != nil {
                throw UsageError("--gadget and --port exclude each other: the accessory is either a USB device or on a serial line",
                                 usage: gadgetUsage, commandPath: command.path)
            }
            return try runGadget(command, profile: profile)
        }
        for option in ["udc", "usb-id"] where command.count(option) > 0 {
            throw UsageError("--\(option) needs --gadget", usage: gadgetUsage, commandPath: command.path)
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
        } else {
            do { udc = try USBGadget.defaultUDC() } catch { throw gadgetFailure(error) }
        }
        let gadget: USBGadget
        do { gadget = try USBGadget(configuration: configuration) } catch { throw gadgetFailure(error) }
        let runner: SimulatorRunner
        do { runner = try SimulatorRunner(profile: profile, attachment: .transport(gadget.transport)) } catch {
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
            switch event {
            case .endpoint: break
            default: StandardError.write("simulator: \(String(describing: event).escapedForTerminal)\n")
            }
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

extension ExitCode {
    /// An operating-system error (EX_OSERR).
    static let osError = ExitCode(rawValue: 71)
    /// An output file cannot be created (EX_CANTCREAT).
    static let cannotCreate = ExitCode(rawValue: 73)
}
