internal import AccessoryLogging
internal import ByteRing
internal import Dispatch
internal import Glibc
internal import IAPDaemonProtocol
internal import IAPLink
internal import IAPTransport
internal import SystemCalls
internal import USBDescriptors

/// Why the accessory daemon (`iapd`) cannot be used, with what to do about it.
public struct DaemonConnectionError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What kind of problem.
    public enum Kind: Sendable, Hashable {
        /// Nothing listens on the socket (the daemon is not running, or a stale socket file).
        case notRunning
        /// This user may not connect (not root, not a member of the socket's group).
        case permission
        /// The daemon speaks another protocol version.
        case version
        /// Anything else.
        case failed
    }

    /// What kind of problem.
    public var kind: Kind
    /// The problem in a sentence, with the command that fixes it.
    public var description: String

    init(_ kind: Kind, _ description: String) {
        self.kind = kind
        self.description = description
    }

    /// Connects to the daemon's socket at `path`: the descriptor (non-blocking), or why not
    /// (`iapctl stats` connects with it too).
    package static func connect(path: String) throws(DaemonConnectionError) -> Int32 {
        switch UnixSocket.connect(path: path) {
        case .success(let descriptor):
            return descriptor
        case .failure(let error):
            switch error.code {
            case ENOENT, ECONNREFUSED:
                throw DaemonConnectionError(.notRunning,
                    "iapd is not running (nothing listens on \(path)): start it with `sudo systemctl start iapd`, or use the accessories directly (iapctl --direct)")
            case EACCES, EPERM:
                var info = stat()
                let group = stat(path, &info) == 0 ? UserDatabase.groupName(of: info.st_gid) ?? "\(info.st_gid)" : "iapd"
                throw DaemonConnectionError(.permission,
                    "permission denied on \(path): only root and members of the group '\(group)' may use iapd; add yourself with `sudo usermod -aG \(group) $USER`, then log in again")
            default:
                throw DaemonConnectionError(.failed, "cannot connect to iapd at \(path): \(error)")
            }
        }
    }
}

/// An accessory another process (`iapd`) owns, as a ``Connection`` serves it: its identity,
/// and how to open a session on it (the daemon answers on the manager's queue with a socket).
struct RemoteAccessory: Sendable {
    var identity: AccessoryIdentity
    var open: @Sendable (_ protocolString: String, _ complete: @escaping @Sendable (Result<any ByteChannel, AccessoryError>) -> Void) -> Void
}

/// The stand-in transport of an accessory the daemon owns: where and how it is attached, as
/// the daemon said; nothing runs on it here.
final class DaemonAccessoryTransport: Transport {
    let description: String
    let kind: TransportKind
    private let usbDevice: USBDeviceInfo?
    private let bluetoothPeer: BluetoothPeer?

    init(record: AccessoryRecord) {
        description = record.location
        kind = TransportKind(rawValue: record.transportKind) ?? .memory
        bluetoothPeer = record.bluetoothAddress.flatMap { BluetoothAddress($0) }.map { BluetoothPeer(address: $0, devicePath: "") }
        usbDevice = record.usb.map { usb in
            var info = USBDeviceInfo(bus: usb.bus, address: usb.address, portPath: usb.portPath,
                                     descriptor: USBDeviceDescriptor(vendorID: usb.vendorID, productID: usb.productID, release: usb.release))
            info.manufacturer = usb.manufacturer
            info.product = usb.product
            info.serialNumber = usb.serialNumber
            return info
        }
    }

    func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) {}
    func send(_ frame: [UInt8]) {}
    func cancel() {}
    func capability<Value>(_ type: Value.Type) -> Value? {
        if type == USBDeviceInfo.self { return usbDevice as? Value }
        if type == BluetoothPeer.self { return bluetoothPeer as? Value }
        return nil
    }
}

/// The manager's connection to `iapd`: hello, the accessories it announces (each a
/// ``Connection`` with a ``RemoteAccessory``), session opens, and reconnection after the daemon
/// restarts (its accessories disconnect meanwhile, and come back as new ones).
///
/// Confinement: every stored `var` is touched on `queue` only (the manager's queue).
final class DaemonClient: @unchecked Sendable {
    typealias Attach = (AccessoryRecord, RemoteAccessory) -> Connection?
    /// Passes on a transport failure the daemon reported (location, reason).
    typealias Failed = (String, String) -> Void

    let path: String
    private let queue: DispatchQueue
    private let logger: Logger
    private let attach: Attach
    private let failed: Failed
    /// Called on the queue each time the daemon's first answer (its accessories) is in.
    private let welcomed: () -> Void
    private var descriptor: Int32 = -1
    private var watch: DescriptorWatch?
    private var output: [UInt8] = []
    private var framer = MessageFramer(limit: DaemonProtocol.maximumReplyLength)
    private var scratch = [UInt8](repeating: 0, count: 64 * 1024)
    /// Descriptors received and not yet claimed by an `opened` reply, oldest first.
    private var descriptors: [Int32] = []
    private var nextID: UInt32 = 1
    private var pending: [UInt32: (DaemonReply, [Int32]) -> Void] = [:]
    private var connections: [Int: Connection] = [:]
    private var stopped = false
    private var retryDelay: Duration = .milliseconds(100)
    /// The reconnection delays run on it.
    private let clock: any LinkClock

    init(path: String, queue: DispatchQueue, logger: Logger, clock: any LinkClock = SystemLinkClock(), attach: @escaping Attach,
         failed: @escaping Failed = { _, _ in }, welcomed: @escaping () -> Void) {
        self.clock = clock
        self.failed = failed
        self.path = path
        self.queue = queue
        self.logger = logger
        self.attach = attach
        self.welcomed = welcomed
    }

    /// Starts on a connected socket: says hello. On the queue.
    func start(descriptor: Int32) {
        dispatchPrecondition(condition: .onQueue(queue))
        guard !stopped else { return _ = close(descriptor) }
        self.descriptor = descriptor
        retryDelay = .milliseconds(100)
        watch = DescriptorWatch(descriptor: descriptor, queue: queue,
                                readable: { [weak self] in self?.receive() }, writable: { [weak self] in self?.flushOutput() })
        request(.hello(version: DaemonProtocol.version, client: UserDatabase.commandLine(of: getpid(), limit: 128))) { [weak self] reply, _ in
            self?.hello(reply)
        }
    }

    /// Closes the connection for good (the manager stopped). On the queue.
    func stop() {
        stopped = true
        drop(reason: "the manager stopped", reconnect: false)
    }

    // MARK: Requests

    /// Opens a session on the daemon's accessory `accessoryID`. On the queue.
    func open(accessoryID: Int, protocolString: String, available: [String],
              complete: @escaping @Sendable (Result<any ByteChannel, AccessoryError>) -> Void) {
        guard descriptor >= 0 else { return complete(.failure(.disconnected("iapd is not reachable"))) }
        request(.open(accessory: accessoryID, protocolString: protocolString)) { reply, passed in
            switch reply {
            case .opened:
                guard passed.count == 2 else {
                    for descriptor in passed { _ = close(descriptor) }
                    return complete(.failure(.sessionRefused("iapd answered the open without the session's socket and shared memory")))
                }
                let attached = SharedRingMemory.attach(descriptor: passed[1])
                _ = close(passed[1]) // the mapping keeps the memory
                switch attached {
                case let .failure(failure):
                    _ = close(passed[0]) // iapd sees the session closed
                    complete(.failure(.sessionRefused("iapd's session cannot be used: \(failure)")))
                case let .success(memory):
                    complete(.success(SharedRingChannel(memory: memory, socket: passed[0], role: .client, description: "iapd session '\(protocolString)'")))
                }
            case let .failure(failure):
                complete(.failure(Self.accessoryError(failure, protocolString: protocolString, available: available)))
            default:
                complete(.failure(.sessionRefused("iapd answered the open with something else")))
            }
        }
    }

    static func accessoryError(_ failure: DaemonFailure, protocolString: String, available: [String]) -> AccessoryError {
        switch failure.code {
        case .protocolInUse:
            return .protocolHeldElsewhere(protocolString, holder: failure.holder?.description ?? "another process")
        case .unsupportedProtocol:
            return .unsupportedProtocol(protocolString, available: available)
        case .noSuchAccessory:
            return .disconnected(failure.message)
        case .badRequest, .version, .permission, .refused, .tooManySessions, .failed:
            return .sessionRefused(failure.message)
        }
    }

    private func request(_ request: ClientRequest, reply: @escaping (DaemonReply, [Int32]) -> Void) {
        let id = nextID
        nextID &+= 1
        pending[id] = reply
        send(MessageFramer.encode(ClientMessage(id: id, request: request)))
    }

    private func send(_ bytes: [UInt8]) {
        guard descriptor >= 0 else { return }
        output.append(contentsOf: bytes)
        flushOutput()
    }

    private func flushOutput() {
        while !output.isEmpty {
            let result = output.withUnsafeBytes { UnixSocket.send(descriptor, $0) }
            switch result {
            case .success(let count):
                output.removeFirst(count)
            case .failure(let error) where error.kind == .wouldBlock:
                watch?.watchWritable()
                return
            case .failure(let error):
                return drop(reason: "writing to iapd failed: \(error)", reconnect: true)
            }
        }
        watch?.stopWatchingWritable()
    }

    // MARK: Replies and events

    private func receive() {
        while descriptor >= 0 {
            let result = scratch.withUnsafeMutableBytes { UnixSocket.receive(descriptor, into: $0, descriptors: &descriptors) }
            switch result {
            case .success(0):
                return drop(reason: "iapd closed the connection", reconnect: true)
            case .success(let count):
                framer.append(scratch.prefix(count))
                do {
                    while let message = try framer.next(DaemonMessage.self) {
                        handle(message)
                        guard descriptor >= 0 else { return }
                    }
                } catch {
                    return drop(reason: "iapd sent \(error)", reconnect: true)
                }
            case .failure(let error) where error.kind == .wouldBlock:
                return
            case .failure(let error):
                return drop(reason: "reading from iapd failed: \(error)", reconnect: true)
            }
        }
    }

    private func handle(_ message: DaemonMessage) {
        if let id = message.id {
            // An opened session's socket and memory came with the reply's first bytes.
            var passed: [Int32] = []
            if case .opened = message.reply {
                passed = Array(descriptors.prefix(2))
                descriptors.removeFirst(passed.count)
            }
            guard let reply = pending.removeValue(forKey: id) else {
                for descriptor in passed { _ = close(descriptor) }
                return
            }
            return reply(message.reply, passed)
        }
        switch message.reply {
        case let .connected(record):
            add(record)
        case let .disconnected(accessory, reason):
            connections.removeValue(forKey: accessory)?.stop(reason: reason)
        case let .transportFailed(location, reason):
            failed(location, reason)
        case let .appLaunchRequested(accessory, bundleIdentifier):
            connections[accessory]?.relayAppLaunch(AppLaunchRequest(bundleIdentifier: bundleIdentifier))
        case let .failure(failure):
            logger.error("iapd: \(failure.message)")
            drop(reason: failure.message, reconnect: failure.code != .permission && failure.code != .version)
        default:
            logger.debug("iapd: an unexpected event, ignored")
        }
    }

    private func hello(_ reply: DaemonReply) {
        switch reply {
        case let .welcome(version, daemon, accessories):
            logger.info("connected to iapd (\(daemon), protocol \(version)) at \(path): \(accessories.count) accessories")
            for record in accessories { add(record) }
            welcomed()
        case let .failure(failure):
            logger.error("iapd refused this client: \(failure.message)")
            drop(reason: failure.message, reconnect: false)
            welcomed()
        default:
            drop(reason: "iapd did not answer hello", reconnect: true)
        }
    }

    private func add(_ record: AccessoryRecord) {
        guard connections[record.id] == nil else { return }
        let accessoryID = record.id
        let available = record.identity.protocols.map(\.name)
        let remote = RemoteAccessory(identity: record.identity) { [weak self] protocolString, complete in
            guard let self else { return complete(.failure(.disconnected("the manager stopped"))) }
            open(accessoryID: accessoryID, protocolString: protocolString, available: available, complete: complete)
        }
        if let connection = attach(record, remote) { connections[record.id] = connection }
    }

    // MARK: Losing the daemon

    /// Closes the socket; the accessories disconnect, waiting opens fail; then, unless stopped,
    /// tries to connect again (0.1 s, doubling up to 2 s between tries).
    private func drop(reason: String, reconnect: Bool) {
        if descriptor >= 0 {
            watch?.cancel()
            watch = nil
            descriptor = -1
            if !stopped { logger.warning("lost iapd: \(reason)") }
        }
        output.removeAll()
        framer = MessageFramer(limit: DaemonProtocol.maximumReplyLength)
        for passed in descriptors { _ = close(passed) }
        descriptors.removeAll()
        let waiting = pending
        pending.removeAll()
        for (_, reply) in waiting { reply(.failure(DaemonFailure(.noSuchAccessory, "iapd went away: \(reason)")), []) }
        let gone = connections
        connections.removeAll()
        for (_, connection) in gone { connection.stop(reason: stopped ? reason : "iapd went away: \(reason)") }
        guard reconnect, !stopped else { return }
        scheduleReconnect()
    }

    private func scheduleReconnect() {
        let delay = retryDelay
        retryDelay = min(.seconds(2), retryDelay * 2)
        clock.after(delay, on: queue) { [weak self] in
            guard let self, !self.stopped, self.descriptor < 0 else { return }
            do {
                let descriptor = try DaemonConnectionError.connect(path: self.path)
                self.start(descriptor: descriptor)
            } catch {
                self.scheduleReconnect()
            }
        }
    }
}
