package import AccessoryHost
package import AccessoryLogging
internal import ByteRing
internal import Dispatch
internal import Glibc
package import IAPDaemonProtocol
internal import IAPLink
internal import IAPTransport
internal import Synchronization
internal import SystemCalls

/// The heart of `iapd`: serves the accessories of one ``AccessoryManager`` to client processes
/// over Unix stream sockets, in the client protocol of `IAPDaemonProtocol`.
///
/// - Every client hears every connect and disconnect once it said hello.
/// - One session per protocol per accessory, system-wide: a second opener is refused with
///   the holder's pid and command line (from `SO_PEERCRED`).
/// - A session is handed over as two descriptors (`SCM_RIGHTS`): its shared rings (a sealed
///   memfd) and a socket of its own for wake-ups and its lifetime; iapd relays it in the link's
///   service, with back-pressure both ways and the accessory's acknowledgements published to
///   the client (`SessionBridge`).
/// - A client that goes away releases its sessions at once.
/// - A request that is malformed or breaks a limit gets an error and the client is dropped;
///   others are not affected. Memory per client is bounded (requests, queued replies, sessions).
///
/// It counts what it does (clients, sessions, bytes each way, failures) and reads the
/// accessories' link counters for ``statistics(_:)``: what `iapctl stats` asks for and
/// ``MetricsExporter`` writes for Prometheus.
///
/// Everything runs on the manager's queue. Thread safety: the methods may be called from any
/// thread; they hop to that queue.
package final class DaemonServer: Sendable {
    /// Limits and policy.
    package struct Options: Sendable {
        /// A client must be root, the daemon's own user, or a member of this group (nil: the
        /// socket file's permissions decide alone).
        package var group: UInt32?
        /// Clients served at once; more are refused.
        package var maximumClients: Int = 1_024
        /// Sessions one client may hold at once.
        package var maximumSessionsPerClient: Int = 64
        /// Bytes of replies and events queued for a client that does not read them; past it
        /// the client is dropped.
        package var maximumQueuedOutput: Int = 4 * 1024 * 1024
        /// The daemon's name and version, sent in the welcome.
        package var name: String = "iapd"
        /// Bytes of each of a session's two shared rings (rounded up to a power of two): what a
        /// client may write ahead of the accessory, and what the accessory may send ahead of
        /// the client's reads. Pages are resident only once used. 4 MiB, the direct path's
        /// session buffer: with 1 MiB the echo through iapd ran at about 0.55× direct, with
        /// 4 MiB about 0.8× (docs/2026-12-03-daemon-rings.md).
        package var sessionRingCapacity: Int = 4 << 20

        /// Options with the defaults.
        package init(group: UInt32? = nil) {
            self.group = group
        }
    }

    /// The manager whose accessories are served.
    package let manager: AccessoryManager
    /// How it serves them.
    package let options: Options
    private let logger: Logger
    private let core: Core

    /// A server for `manager`'s accessories; it serves nothing until given a listening socket
    /// (``listen(descriptor:)``) or a connected one (``serve(descriptor:)``).
    package init(manager: AccessoryManager, options: Options = Options(), logger: Logger) {
        self.manager = manager
        self.options = options
        self.logger = logger
        self.core = Core(manager: manager, options: options, logger: logger)
        let core = self.core
        // On the queue, where accessories come and go: those identified before are counted
        // once, and every later one is heard of.
        manager.queue.async {
            for accessory in manager.connectedAccessories { core.book.accessoryIdentified(accessory) }
            core.subscription = manager.onEvent(queue: manager.queue) { event in core.accessoryEvent(event) }
        }
    }

    /// Accepts clients on `descriptor`, a listening Unix stream socket (the server owns it).
    package func listen(descriptor: Int32) {
        let core = self.core
        manager.queue.async { core.listen(descriptor) }
    }

    /// Serves one already connected client socket (a socket pair's end in tests).
    package func serve(descriptor: Int32) {
        let core = self.core
        manager.queue.async { core.accepted(descriptor) }
    }

    /// How many clients are connected now.
    package var clientCount: Int { QueueRun.sync(manager.queue) { core.clients.count } }

    /// How many sessions clients hold now.
    package var sessionCount: Int { QueueRun.sync(manager.queue) { core.clients.values.reduce(0) { $0 + $1.bridges.count } } }

    /// The daemon's counters and gauges now. Waits for the manager's queue: from a Swift task,
    /// use ``currentStatistics()``, which suspends instead.
    package var statistics: DaemonStatistics { QueueRun.sync(manager.queue) { core.statistics() } }

    /// Reads the counters and gauges on the manager's queue and hands them to `deliver` there
    /// (keep it short: every accessory waits for it). Accessories' link counters are read then.
    package func statistics(_ deliver: @escaping @Sendable (DaemonStatistics) -> Void) {
        let core = self.core
        manager.queue.async { deliver(core.statistics()) }
    }

    /// The daemon's counters and gauges now, read on the manager's queue without blocking a thread.
    package func currentStatistics() async -> DaemonStatistics {
        await withCheckedContinuation { continuation in statistics { continuation.resume(returning: $0) } }
    }

    /// Stops accepting and drops every client (their sessions close); the manager runs on.
    package func stop() {
        let core = self.core
        QueueRun.sync(manager.queue) { core.stop() }
    }
}

/// Runs a block on a queue and waits for it, or inline when already on it.
enum QueueRun {
    static let key = DispatchSpecificKey<ObjectIdentifier>()

    /// Marks `queue` so that ``sync(_:_:)`` knows it is on it.
    static func mark(_ queue: DispatchQueue) {
        queue.setSpecific(key: key, value: ObjectIdentifier(queue))
    }

    static func sync<Result>(_ queue: DispatchQueue, _ body: () -> Result) -> Result {
        if DispatchQueue.getSpecific(key: key) == ObjectIdentifier(queue) { return body() }
        return queue.sync(execute: body)
    }
}

/// The server's state, confined to the manager's queue.
final class Core: @unchecked Sendable {
    let manager: AccessoryManager
    let options: DaemonServer.Options
    let logger: Logger
    var subscription: EventSubscription?
    var listener: (descriptor: Int32, source: any DispatchSourceRead)?
    var clients: [Int: Client] = [:]
    var nextClientID = 1
    var nextSessionID = 1
    /// Who holds each protocol of each accessory, by accessory id and protocol string.
    var holders: [HolderKey: Int] = [:]
    /// The bridge of each held protocol, once open.
    var bridgesByKey: [HolderKey: SessionBridge] = [:]
    /// Opens waiting for a session their client closed to finish closing, by protocol.
    var waitingOpens: [HolderKey: [() -> Void]] = [:]
    var stopped = false
    /// What is counted for the statistics.
    var book: StatisticsBook

    struct HolderKey: Hashable {
        var accessory: Int
        var protocolString: String
    }

    init(manager: AccessoryManager, options: DaemonServer.Options, logger: Logger) {
        self.manager = manager
        self.options = options
        self.logger = logger
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        book = StatisticsBook(daemon: options.name, startTime: Double(now.tv_sec) + Double(now.tv_nsec) / 1e9)
        QueueRun.mark(manager.queue)
    }

    /// The statistics now. On the queue.
    func statistics() -> DaemonStatistics {
        book.reading(accessories: manager.connectedAccessories, connecting: manager.connectingTransportKinds(),
                     sessions: clients.values.flatMap { $0.bridges.values }, clients: clients.count)
    }

    var queue: DispatchQueue { manager.queue }

    func listen(_ descriptor: Int32) {
        guard !stopped else { return _ = close(descriptor) }
        UnixSocket.setNonBlocking(descriptor)
        let source = DispatchSource.makeReadSource(fileDescriptor: descriptor, queue: queue)
        source.setEventHandler { [weak self] in self?.acceptAll() }
        source.setCancelHandler { _ = close(descriptor) }
        listener = (descriptor, source)
        source.resume()
    }

    private func acceptAll() {
        guard let listener else { return }
        while true {
            switch UnixSocket.accept(listener.descriptor) {
            case .success(let descriptor):
                accepted(descriptor)
            case .failure(let error) where error.kind == .wouldBlock:
                return
            case .failure(let error):
                // EMFILE and the like: logged; the next client wakes the source again.
                book.failure(.accept)
                logger.error("cannot accept a client: \(error)")
                return
            }
        }
    }

    func accepted(_ descriptor: Int32) {
        guard !stopped else { return _ = close(descriptor) }
        let credentials = (try? UnixSocket.peerCredentials(descriptor).get()) ?? PeerCredentials(pid: 0, uid: UInt32.max, gid: UInt32.max)
        let holder = SessionHolder(pid: credentials.pid, uid: credentials.uid, command: UserDatabase.commandLine(of: credentials.pid))
        let id = nextClientID
        nextClientID += 1
        let client = Client(id: id, descriptor: descriptor, holder: holder, core: self)
        guard clients.count < options.maximumClients else {
            book.clientRefused(.tooManyClients)
            logger.warning("refused \(holder): already \(options.maximumClients) clients")
            client.refuse(DaemonFailure(.failed, "iapd serves at most \(options.maximumClients) clients at once; close some and try again"))
            return
        }
        if let failure = permission(credentials) {
            book.clientRefused(.permission)
            logger.notice("refused \(holder): \(failure.message)")
            client.refuse(failure)
            return
        }
        clients[id] = client
        book.clientAccepted()
        client.start()
        logger.debug("client \(id): \(holder) connected")
    }

    private func permission(_ credentials: PeerCredentials) -> DaemonFailure? {
        guard let group = options.group else { return nil }
        if credentials.uid == 0 || credentials.uid == getuid() { return nil }
        if UserDatabase.user(credentials.uid, primaryGroup: credentials.gid, isIn: group) { return nil }
        let name = UserDatabase.groupName(of: group) ?? "\(group)"
        return DaemonFailure(.permission,
            "only root and members of the group '\(name)' may use iapd; add the user with `sudo usermod -aG \(name) USER`, then log in again")
    }

    func removed(_ client: Client) {
        clients[client.id] = nil
    }

    func stop() {
        stopped = true
        subscription?.cancel()
        subscription = nil
        listener?.source.cancel()
        listener = nil
        for client in Array(clients.values) { client.drop(reason: nil) }
        clients.removeAll()
    }

    // MARK: Accessories

    func accessoryEvent(_ event: AccessoryEvent) {
        let message: DaemonReply
        // The protocol version that knows the event (older clients are not sent it).
        var minimumVersion = DaemonProtocol.oldestVersion
        switch event {
        case let .connected(accessory):
            book.accessoryIdentified(accessory)
            message = .connected(Self.record(accessory))
        case let .disconnected(accessory, reason):
            book.accessoryDisconnected(accessory, live: manager.connectedAccessories)
            message = .disconnected(accessory: accessory.connectionID, reason: reason)
        case let .appLaunchRequested(accessory, request):
            message = .appLaunchRequested(accessory: accessory.connectionID, bundleIdentifier: request.bundleIdentifier)
            minimumVersion = 2
        case let .failed(location, reason):
            book.failure(.transport)
            message = .transportFailed(location: location, reason: reason)
            minimumVersion = 2
        }
        let bytes = MessageFramer.encode(DaemonMessage(id: nil, reply: message))
        for client in clients.values where client.welcomed && client.version >= minimumVersion { client.send(bytes) }
    }

    var records: [AccessoryRecord] { manager.connectedAccessories.map(Self.record) }

    static func record(_ accessory: Accessory) -> AccessoryRecord {
        AccessoryRecord(id: accessory.connectionID, identity: accessory.identity, transportKind: accessory.transportKind.rawValue,
                        location: accessory.location,
                        usb: accessory.usbDevice.map { usb in
                            USBDeviceRecord(bus: usb.bus, address: usb.address, portPath: usb.portPath, vendorID: usb.vendorID,
                                            productID: usb.productID, release: usb.release,
                                            manufacturer: usb.manufacturer, product: usb.product, serialNumber: usb.serialNumber)
                        },
                        bluetoothAddress: accessory.bluetoothAddress?.description)
    }

    // MARK: Sessions

    func open(_ client: Client, request id: UInt32, accessoryID: Int, protocolString: String) {
        guard client.bridges.count + client.opening + client.waitingOpens < options.maximumSessionsPerClient else {
            return refuseOpen(client, id, DaemonFailure(.tooManySessions,
                "this client holds \(options.maximumSessionsPerClient) sessions, the most iapd allows one client; close one first"))
        }
        guard let accessory = manager.connectedAccessories.first(where: { $0.connectionID == accessoryID }) else {
            return refuseOpen(client, id, DaemonFailure(.noSuchAccessory,
                "no accessory \(accessoryID) is connected (it went away); list the accessories again"))
        }
        guard accessory.protocolStrings.contains(protocolString) else {
            return refuseOpen(client, id, DaemonFailure(.unsupportedProtocol,
                "the accessory does not declare '\(protocolString)'; it declares: \(accessory.protocolStrings.joined(separator: ", "))"))
        }
        let key = HolderKey(accessory: accessoryID, protocolString: protocolString)
        if let holderID = holders[key], holderID == client.id || bridgesByKey[key]?.isReleasing == true {
            // Closed by its client (or about to be: the library opens a protocol again only
            // after closing it) and still delivering its last bytes: this open goes next.
            // Counted against the client's sessions: a client cannot queue opens without bound.
            client.waitingOpens += 1
            waitingOpens[key, default: []].append { [weak self, weak client] in
                guard let self, let client else { return }
                client.waitingOpens -= 1
                guard !client.dropped else { return }
                self.open(client, request: id, accessoryID: accessoryID, protocolString: protocolString)
            }
            return
        }
        if let holderID = holders[key] {
            let holder = clients[holderID]?.holder
            return refuseOpen(client, id, DaemonFailure(.protocolInUse,
                "a session for '\(protocolString)' is already open on this accessory in \(holder?.description ?? "another client") (one per protocol); close it there first",
                holder: holder))
        }
        holders[key] = client.id
        client.opening += 1
        accessory.openSession(for: protocolString, queue: queue) { [weak self, weak client] result in
            guard let self else { return }
            client?.opening -= 1
            // The protocol was reserved for this client: nobody else took it meanwhile.
            let release = { self.release(key) }
            guard let client, !client.dropped else {
                if case let .success(session) = result { session.close() }
                self.release(key)
                return
            }
            switch result {
            case let .failure(error):
                release()
                self.refuseOpen(client, id, Self.failure(error))
            case let .success(session):
                switch (UnixSocket.pair(), SharedRingMemory.create(capacity: options.sessionRingCapacity, name: "iapd-session")) {
                case let (.failure(error), memory):
                    if case let .success((_, passed)) = memory { _ = close(passed) }
                    session.close()
                    release()
                    self.refuseOpen(client, id, DaemonFailure(.failed, "iapd cannot make the session's socket: \(error)"))
                case let (.success((mine, theirs)), .failure(failure)):
                    _ = close(mine)
                    _ = close(theirs)
                    session.close()
                    release()
                    self.refuseOpen(client, id, DaemonFailure(.failed, "iapd cannot make the session's shared memory: \(failure); check the memory limits of iapd's unit (MemoryMax)"))
                case let (.success((mine, theirs)), .success((memory, passed))):
                    let sessionID = nextSessionID
                    nextSessionID += 1
                    let logger = self.logger
                    let holder = client.holder
                    let bridge = SessionBridge(id: sessionID, session: session, memory: memory, socket: mine, queue: queue,
                                               log: { [weak self] in
                                                   self?.book.failure(.brokenRing)
                                                   logger.notice("\(holder): \($0)")
                                               }) { [weak self, weak client] bridge in
                        self?.book.sessionEnded(toAccessory: bridge.bytesToAccessory, toClient: bridge.bytesToClient)
                        client?.bridges[sessionID] = nil
                        self?.release(key)
                        logger.debug("session \(sessionID) '\(protocolString)' ended")
                    }
                    client.bridges[sessionID] = bridge
                    bridgesByKey[key] = bridge
                    book.sessionOpened()
                    bridge.start()
                    client.reply(id, .opened(accessory: accessoryID, protocolString: protocolString, session: sessionID), passing: [theirs, passed])
                    logger.info("\(client.holder) opened '\(protocolString)' on \(accessory.name)")
                }
            }
        }
    }

    /// An open failed: counted, and the client told.
    private func refuseOpen(_ client: Client, _ id: UInt32, _ failure: DaemonFailure) {
        book.openFailed(failure.code)
        client.reply(id, .failure(failure))
    }

    /// The protocol is free again: the next waiting open (if any) takes it.
    private func release(_ key: HolderKey) {
        holders[key] = nil
        bridgesByKey[key] = nil
        guard var waiting = waitingOpens.removeValue(forKey: key), !waiting.isEmpty else { return }
        let next = waiting.removeFirst()
        if !waiting.isEmpty { waitingOpens[key] = waiting }
        next()
        // The rest are answered now: in use by the one that went first (or free again).
        if let rest = waitingOpens.removeValue(forKey: key) { for open in rest { open() } }
    }

    static func failure(_ error: AccessoryError) -> DaemonFailure {
        switch error {
        case let .unsupportedProtocol(name, available):
            return DaemonFailure(.unsupportedProtocol, "the accessory does not declare '\(name)'; it declares: \(available.joined(separator: ", "))")
        case .protocolInUse, .protocolHeldElsewhere:
            return DaemonFailure(.protocolInUse, error.description)
        case .disconnected:
            return DaemonFailure(.noSuchAccessory, error.description)
        case .sessionClosed, .sessionRefused, .timedOut:
            return DaemonFailure(.refused, error.description)
        }
    }
}
