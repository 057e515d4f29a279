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
