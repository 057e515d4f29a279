internal import AccessoryLogging
internal import Dispatch
internal import IAPLink
internal import IAPTransport
internal import IAPWire
internal import Synchronization

/// One transport and the device-role endpoint running over it, plus the sessions handed out.
///
/// Every session, on the link or on a native transport, is one ``SessionState`` around a
/// ``SessionStream``: readers, writers, flushers and stream events are served the same way for
/// both, by ``service(_:_:)``.
///
/// Confinement: every stored `var` is touched on `queue` only (the manager's serial queue, which
/// also runs the driver), which is what makes the class Sendable.
final class Connection: @unchecked Sendable {
    /// What an opening session comes to, called on the queue.
    typealias OpenCompletion = @Sendable (Result<AccessorySession, AccessoryError>) -> Void
    struct Reader {
        var maxBytes: Int
        var continuation: CheckedContinuation<[UInt8]?, any Error>
        /// Finds it when its task is cancelled.
        var id: Int
    }
    struct Writer {
        var remaining: ArraySlice<UInt8>
        var continuation: CheckedContinuation<Void, any Error>
        var id: Int
    }
    struct Flusher {
        var continuation: CheckedContinuation<Void, any Error>
        var id: Int
    }
    /// How long a wait for the accessory's acknowledgements may last.
    enum WaitLimit {
        /// Until the acknowledged count stands still for this long.
        case progress(Duration)
        /// This long in all.
        case total(Duration)
    }
    /// Waiting for the accessory to acknowledge `target` bytes.
    struct Drainer {
        var target: Int
        var continuation: CheckedContinuation<Void, any Error>
        /// Nil: as long as the accessory takes.
        var limit: WaitLimit?
        /// What the error says the wait was for (e.g. "closing 'com.acme.echo'").
        var step: String
        var id: Int
        /// The acknowledged count last seen, and since when (link time) it stands.
        var acknowledged: Int
        var since: LinkTime
    }
    /// One open session, whichever way its bytes travel.
    struct SessionState {
        /// The protocol (the session object itself is the application's: held here, it would
        /// keep the connection alive after the accessory went away if the application never
        /// closed it; its deinit closes it instead).
        var protocolString: String
        var stream: any SessionStream
        var readers: [Reader] = []
        var writers: [Writer] = []
        var flushers: [Flusher] = []
        /// Waiting for the accessory to acknowledge bytes.
        var drainers: [Drainer] = []
        /// Bytes the session took from the application so far.
        var written = 0
        var handler: StreamEventHandler?
        /// Bytes the accessory acknowledged (kept after the stream ended).
        var acknowledged = 0
        /// Set when the stream ended: nil reason = closed normally.
        var ended: AccessoryError?
        var isEnded = false
    }

    let queue: DispatchQueue
    /// The id of this transport's connection (an accessory that re-identifies on it gets a new
    /// ``Accessory/connectionID`` from `makeConnectionID`).
    let connectionID: Int
    private let makeConnectionID: () -> Int
    let transport: any Transport
    let driver: EndpointDriver<IAPEndpoint>
    private let supportedProtocols: Set<String>
    private let logger: Logger
    private let onConnected: (Accessory) -> Void
    private let onDisconnected: (Accessory, String) -> Void
    private let onClosed: (_ everIdentified: Bool, String) -> Void
    private let onAppLaunchRequested: (Accessory, AppLaunchRequest) -> Void
    /// Control messages already logged as ignored (the first of each kind at notice level, the
    /// rest at debug: an accessory that repeats one does not fill the log).
    private var unhandledLogged: Set<MessageID> = []
    /// The same for iAP1 commands, by lingo and command.
    private var unhandledIAP1Logged: Set<UInt32> = []
    private var everIdentified = false
    /// The last identification the host rejected, said again if the accessory never sends a
    /// corrected one (more use to a person than "did not answer").
    private var lastRejection: IdentificationRejection?
    /// Set for an accessory another process owns (`iapd`): no link runs here, every session is
    /// a socket the daemon hands over.
    private let remote: RemoteAccessory?

    private(set) var accessory: Accessory?
    /// Resets a device whose accessory's link never comes up (set by the manager; LinkRecovery.swift).
    var linkRecovery: StuckLinkRecovery?
    /// The sessions handed out, by their key (``AccessorySession/key``).
    private var sessions: [Int: SessionState] = [:]
    /// The key of each link session, by its EA session id.
    private var linkKeys: [UInt16: Int] = [:]
    private var nextKey = 1
    /// Numbers the waiters (readers, writers, flushers, drainers), so that a timer or a
    /// cancelled task finds its own; taken off the queue, before the hop.
    private let waiterIDs = Atomic<Int>(0)
    /// Native sessions being opened, by protocol name (one session per protocol).
    private var pendingNativeOpens: Set<String> = []
    private var pendingOpens: [UInt16: (name: String, complete: OpenCompletion)] = [:]
    /// Closes waiting for the accessory's link to acknowledge their session's stop, by EA session id.
    private var pendingStops: [UInt16: (name: String, continuation: CheckedContinuation<Void, any Error>)] = [:]
    private var downReason: String?
    /// The array the endpoint's events are taken into, kept across updates.
    private var eventScratch = ReusableArray<EndpointEvent>()
    /// The session keys, in the order the sessions were handed out (iterated without holding the
    /// table, which serving changes).
    private var sessionKeys: [Int] = []

    init(connectionID: Int, makeConnectionID: @escaping () -> Int, transport: any Transport, queue: DispatchQueue,
         supportedProtocols: Set<String>, logger: Logger, endpoint: IAPEndpoint, onConnected: @escaping (Accessory) -> Void,
         onDisconnected: @escaping (Accessory, String) -> Void, onClosed: @escaping (_ everIdentified: Bool, String) -> Void,
         onAppLaunchRequested: @escaping (Accessory, AppLaunchRequest) -> Void = { _, _ in }, remote: RemoteAccessory? = nil,
         clock: any LinkClock = SystemLinkClock()) {
        self.onAppLaunchRequested = onAppLaunchRequested
        self.remote = remote
        self.connectionID = connectionID
        self.makeConnectionID = makeConnectionID
        self.transport = transport
        self.queue = queue
        self.supportedProtocols = supportedProtocols
        var logger = logger
        logger.metadata["transport"] = transport.description
        self.logger = logger
        self.onConnected = onConnected
        self.onDisconnected = onDisconnected
        self.onClosed = onClosed
        self.driver = EndpointDriver(machine: endpoint, transport: transport, queue: queue, clock: clock)
        QueueMark.mark(queue)
    }

    /// Runs `body` on the queue from any thread (``QueueMark/run(on:_:)``).
    func onQueue<Result>(_ body: () throws -> Result) rethrows -> Result {
        try QueueMark.run(on: queue, body)
    }

    /// Starts the link (for a remote accessory: announces it). On the queue.
    func start() {
        if let remote {
            let accessory = Accessory(connectionID: makeConnectionID(), identity: remote.identity, transport: transport,
                                      supportsConfiguredProtocols: supportedProtocols.isEmpty
                                          || remote.identity.protocols.contains { supportedProtocols.contains($0.name) },
                                      connection: self)
            self.accessory = accessory
            everIdentified = true
            return onConnected(accessory)
        }
        driver.start(update: { [unowned self] machine, now in self.update(&machine, now: now) },
                     closed: { [weak self] error in self?.transportClosed(error) })
        linkRecovery?.start()
    }

    /// A remote accessory's RequestAppLaunch, as the daemon reported it. On the queue.
    func relayAppLaunch(_ request: AppLaunchRequest) {
        if let accessory { onAppLaunchRequested(accessory, request) }
    }

    /// Stops the link and ends everything. On the queue.
    func stop(reason: String) {
        driver.stop()
        down(reason: reason)
        driver.perform { machine, _ in self.serviceAll(&machine) }
    }

    /// The endpoint's count of session bytes moved and copied. Off the queue.
    func dataPlaneStatistics() -> DataPlaneStatistics {
        onQueue { driver.perform { machine, _ in machine.dataPlane } }
    }

    /// The iAP2 link's counters, nil on iAP1. Off the queue.
    func linkStatistics() -> LinkStatistics? {
        guard remote == nil else { return nil }
        return onQueue { driver.perform { machine, _ in machine.linkStatistics } }
    }

    /// Whether this connection is still working towards its first identified accessory.
    var isPending: Bool { !everIdentified && downReason == nil }

    // MARK: Events from the endpoint

    private func update(_ machine: inout IAPEndpoint, now: LinkTime) {
        var events = eventScratch.take()
        machine.takeEvents(into: &events)
        defer { eventScratch.putBack(&events) }
        for event in events {
            linkRecovery?.observe(event)
            switch event {
            case let .identified(identity):
                guard accessory == nil, downReason == nil else { continue }
                logger.info("identified \(identity.name) (\(identity.manufacturer) \(identity.modelIdentifier), serial \(identity.serialNumber)); protocols: \(identity.protocols.map(\.name).joined(separator: ", "))")
                let supported = supportedProtocols.isEmpty || identity.protocols.contains { supportedProtocols.contains($0.name) }
                let accessory = Accessory(connectionID: makeConnectionID(), identity: identity, transport: transport,
                                          supportsConfiguredProtocols: supported, connection: self)
                self.accessory = accessory
                everIdentified = true
                onConnected(accessory)
            case let .controlFailed(failure):
                logger.warning("\(failure)")
                if case .noAnswer = failure, let rejection = lastRejection, accessory == nil {
                    linkLost("\(rejection); the accessory did not answer with a corrected identification in time", machine: &machine)
                } else {
                    linkLost("\(failure)", machine: &machine)
                }
            case let .link(.stateChanged(.failed(failure))):
                logger.warning("link failed: \(failure)")
                linkLost(failure.description, machine: &machine)
            case .link(.stateChanged(.negotiating)) where accessory != nil:
                // The accessory started over (a detect or SYN on a live link): this accessory is
                // gone; the next identification announces a new one.
                announceGone("the accessory restarted its link")
            case let .accessoryRestarted(reason) where accessory != nil:
                announceGone(reason)
            case let .protocolSwitched(version):
                logger.info(version == .iap1 ? "the accessory speaks iAP1: continuing in iAP1" : "the accessory started over in iAP2")
            case let .unhandledIAP1Command(lingo, command):
                let first = unhandledIAP1Logged.insert(UInt32(lingo) << 16 | UInt32(command)).inserted
                logger.log(level: first ? .notice : .debug,
                           "ignored iAP1 command 0x\(String(command, radix: 16)) on lingo 0x\(String(lingo, radix: 16)), which the host does not use (answered BadParameter)")
            case let .sessionOpened(id, name):
                if let pending = pendingOpens.removeValue(forKey: id), let accessory {
                    let session = add(LinkSessionStream(id: id), protocolString: name, accessory: accessory)
                    linkKeys[id] = session.key
                    pending.complete(.success(session))
                }
            case let .sessionConfirmed(id):
                logger.debug("session \(id): the accessory confirmed it (StatusExternalAccessoryProtocolSession 0)")
            case let .appLaunchRequested(request):
                logger.info("the accessory asks for the application \(request.description) to be launched")
                if let accessory { onAppLaunchRequested(accessory, request) }
            case let .tolerated(what):
                logger.notice("tolerated: \(what)")
            case let .sessionStopAcknowledged(id):
                pendingStops.removeValue(forKey: id)?.continuation.resume()
            case let .sessionStopTimedOut(id, name, after):
                if let pending = pendingStops.removeValue(forKey: id) {
                    logger.warning("'\(name)': the accessory did not acknowledge the session's stop within \(after)")
                    pending.continuation.resume(throwing: AccessoryError.timedOut(
                        "closing '\(name)': the accessory did not acknowledge StopExternalAccessoryProtocolSession within \(after); the session is closed on this side"))
                }
            case let .sessionClosed(id, reason):
                if let pending = pendingOpens.removeValue(forKey: id) {
                    pending.complete(.failure(.sessionRefused(reason ?? "closed")))
                } else if let key = linkKeys[id] {
                    end(key, error: reason.map { AccessoryError.disconnected($0) })
                }
            case let .identificationRejected(rejection):
                logger.warning("\(rejection)")
                lastRejection = rejection
            case let .unhandledMessage(id):
                // Ignored, as an iPhone ignores what it does not use: said once per message.
                logger.log(level: unhandledLogged.insert(id).inserted ? .notice : .debug,
                           "ignored control message \(id), which the host does not use")
            case let .malformedMessage(reason):
                logger.notice("malformed control message: \(reason)")
            case let .link(.negotiated(parameters)):
                logger.debug("link up: \(parameters.maxOutstandingPackets) packets of \(parameters.maxPacketLength) bytes in flight, retransmission after \(parameters.retransmissionTimeout) ms")
            case let .link(.dropped(drop)):
                logger.debug("\(drop)")
            case let .link(.oversizedPacketTaken(length, advertised)):
                logger.notice("the accessory sends packets longer than the \(advertised) bytes this host advertised (\(length) bytes); taken all the same, as an iPhone advertises 65535")
            case let .link(.protocolViolation(what)):
                logger.notice("\(what)")
            case let .authenticated(_, outcome):
                logger.log(level: outcome.isVerified || outcome.status == .notChecked ? .debug : .info, "authentication: \(outcome)")
            case .bytesAvailable, .spaceAvailable, .link, .powerUpdate, .accessoryRestarted:
                break
            }
        }
        serviceAll(&machine)
    }

    /// Hands out a new session over `stream`.
    private func add(_ stream: any SessionStream, protocolString: String, accessory: Accessory) -> AccessorySession {
        let key = nextKey
        nextKey += 1
        let session = AccessorySession(protocolString: protocolString, accessory: accessory, key: key,
                                       usesNativeTransport: stream.isNative && remote == nil, connection: self)
        sessions[key] = SessionState(protocolString: protocolString, stream: stream)
        sessionKeys.append(key)
        return session
    }

    /// Serves every session.
    private func serviceAll(_ machine: inout IAPEndpoint) {
        for key in sessionKeys { service(key, &machine) }
    }

    /// Serves the waiting readers, writers and flushers of one session, and tells its handler
    /// what it may do next. The state is taken out of the table while it is served and put back,
    /// so its arrays are mutated in place.
    private func service(_ key: Int, _ machine: inout IAPEndpoint) {
        guard var state = sessions.removeValue(forKey: key) else { return }
        defer { sessions[key] = state }
        let stream = state.stream
        state.acknowledged = max(state.acknowledged, stream.acknowledged(&machine))
        var readable = stream.readable(&machine) > 0
        while readable, !state.readers.isEmpty {
            let reader = state.readers.removeFirst()
            reader.continuation.resume(returning: stream.read(&machine, maxBytes: reader.maxBytes))
            readable = stream.readable(&machine) > 0
        }
        if state.isEnded, !readable {
            for reader in state.readers { reader.continuation.resume(returning: nil) }
            state.readers.removeAll()
        }
        var wroteAll = true
        while let first = state.writers.first {
            guard !state.isEnded else {
                state.writers.removeFirst().continuation.resume(throwing: state.ended ?? AccessoryError.sessionClosed)
                continue
            }
            let taken = stream.write(&machine, first.remaining, now: driver.now)
            state.written += taken
            state.writers[0].remaining = first.remaining.dropFirst(taken)
            if state.writers[0].remaining.isEmpty {
                state.writers.removeFirst().continuation.resume()
            } else {
                wroteAll = false
                break
            }
        }
        let unsent = stream.unsent(&machine)
        if state.writers.isEmpty, unsent == 0 || state.isEnded {
            for flusher in state.flushers {
                if state.isEnded, unsent > 0 {
                    flusher.continuation.resume(throwing: state.ended ?? AccessoryError.sessionClosed)
                } else {
                    flusher.continuation.resume()
                }
            }
            state.flushers.removeAll()
        }
        if !state.drainers.isEmpty {
            let acknowledged = state.acknowledged
            let ended = state.isEnded
            state.drainers.removeAll { drainer in
                if acknowledged >= drainer.target {
                    drainer.continuation.resume()
                } else if ended {
                    drainer.continuation.resume(throwing: state.ended ?? AccessoryError.sessionClosed)
                } else {
                    return false
                }
                return true
            }
        }
        if let handler = state.handler {
            if readable { handler.post(.hasBytesAvailable) }
            if wroteAll, !state.isEnded, stream.hasSpace(&machine) { handler.post(.hasSpaceAvailable) }
        }
    }

    /// Ends a session's stream (bytes already received stay readable); the next service tells
    /// its readers, writers and flushers.
    private func end(_ key: Int, error: AccessoryError?) {
        guard let state = sessions[key], !state.isEnded else { return }
        sessions[key]!.isEnded = true
        sessions[key]!.ended = error
        if let handler = state.handler {
            if let error { handler.queue.async { handler.handler(.errorOccurred(error)) } }
            handler.queue.async { handler.handler(.endEncountered) }
        }
    }

    /// Called from inside the driver's update, which holds the machine: serve it directly.
    private func linkLost(_ reason: String, machine: inout IAPEndpoint) {
        driver.stop()
        down(reason: reason)
        serviceAll(&machine)
    }

    private func transportClosed(_ error: TransportError?) {
        down(reason: error?.description ?? "the transport was closed")
        // Readers may still drain what was received; writers fail.
        driver.perform { machine, _ in self.serviceAll(&machine) }
    }

    private func announceGone(_ reason: String) {
        let gone = accessory
        accessory = nil
        for (id, pending) in pendingOpens {
            pending.complete(.failure(.disconnected(reason)))
            pendingOpens[id] = nil
        }
        for (id, pending) in pendingStops {
            pending.continuation.resume(throwing: AccessoryError.disconnected(reason))
            pendingStops[id] = nil
        }
        for (key, state) in sessions where !state.isEnded {
            end(key, error: .disconnected(reason))
            state.stream.abandon()
        }
        pendingNativeOpens.removeAll() // their completions see the accessory gone and refuse
        if let gone {
            gone.markDisconnected()
            onDisconnected(gone, reason)
        }
    }

    private func down(reason: String) {
        guard downReason == nil else { return }
        downReason = reason
        linkRecovery?.stop()
        logger.info("connection closed: \(reason)")
        announceGone(reason)
        onClosed(everIdentified, reason)
    }

    // MARK: Calls from sessions and accessories (hop to the queue first)

    func openSession(accessory: Accessory, protocolString: String) async throws -> AccessorySession {
        try await withCheckedThrowingContinuation { continuation in
            openSession(accessory: accessory, protocolString: protocolString) { continuation.resume(with: $0) }
        }
    }

    /// Opens a session and calls `complete` on the queue with it or the reason it did not open.
    /// From any thread (it hops to the queue).
    func openSession(accessory: Accessory, protocolString: String, complete: @escaping OpenCompletion) {
        queue.async {
            guard self.downReason == nil, self.accessory === accessory else {
                return complete(.failure(.disconnected(self.downReason ?? "the accessory reconnected")))
            }
            if let remote = self.remote {
                return self.openRemote(remote, accessory: accessory, protocolString: protocolString, complete: complete)
            }
            if let declared = accessory.identity.protocols.first(where: { $0.name == protocolString }),
               declared.nativeTransportComponentIdentifier != nil {
                return self.openNative(accessory: accessory, protocolString: protocolString, complete: complete)
            }
            self.driver.perform { machine, now in
                do {
                    let id = try machine.openSession(protocolName: protocolString, now: now)
                    self.pendingOpens[id] = (protocolString, complete)
                } catch EndpointError.protocolInUse(let name) {
                    complete(.failure(.protocolInUse(name)))
                } catch EndpointError.unsupportedProtocol(let name) {
                    complete(.failure(.unsupportedProtocol(name, available: accessory.protocolStrings)))
                } catch {
                    complete(.failure(.disconnected("\(error)")))
                }
            }
        }
    }

    /// Opens a protocol the accessory binds to a native transport: its channel (for USB, the
    /// FF/F0/01 interface in alternate setting 1), no StartExternalAccessoryProtocolSession.
    private func openNative(accessory: Accessory, protocolString: String, complete: @escaping OpenCompletion) {
        let inUse = pendingNativeOpens.contains(protocolString)
            || sessions.values.contains { $0.stream.isNative && $0.protocolString == protocolString }
        guard !inUse else { return complete(.failure(.protocolInUse(protocolString))) }
        guard let provider = transport.nativeTransports else {
            return complete(.failure(.sessionRefused(
                "the accessory carries '\(protocolString)' on a native USB interface of its own, and \(transport.description) has none; connect the accessory by USB to open it")))
        }
        pendingNativeOpens.insert(protocolString)
        logger.debug("opening '\(protocolString)' on its native transport")
        provider.openNativeChannel(for: protocolString, queue: queue) { [self] result in
            channelOpened(result.mapError { .sessionRefused($0.description) }, accessory: accessory, protocolString: protocolString,
                          complete: complete)
        }
    }

    /// A channel for an opening session came (native transport or iapd's socket), or why not:
    /// the session is handed out over it unless the accessory went away meanwhile. On the queue.
    private func channelOpened(_ result: Result<any ByteChannel, AccessoryError>, accessory: Accessory, protocolString: String,
                               complete: @escaping OpenCompletion) {
        pendingNativeOpens.remove(protocolString)
        switch result {
        case let .failure(error):
            complete(.failure(error))
        case let .success(channel):
            guard downReason == nil, self.accessory === accessory else {
                channel.close()
                return complete(.failure(.disconnected(downReason ?? "the accessory reconnected")))
            }
            let session = add(NativeSessionStream(channel: channel), protocolString: protocolString, accessory: accessory)
            let key = session.key
            channel.activate(queue: queue) { [weak self] event in self?.nativeEvent(key, event) }
            logger.info("session '\(protocolString)' open on \(channel.description)")
            complete(.success(session))
        }
    }

    /// Opens a session on an accessory the daemon owns: the daemon checks and opens it, and
    /// hands over a socket carrying its bytes, served like a native channel.
    private func openRemote(_ remote: RemoteAccessory, accessory: Accessory, protocolString: String, complete: @escaping OpenCompletion) {
        let inUse = pendingNativeOpens.contains(protocolString) || sessions.values.contains { $0.protocolString == protocolString }
        guard !inUse else { return complete(.failure(.protocolInUse(protocolString))) }
        pendingNativeOpens.insert(protocolString)
        remote.open(protocolString) { [self] result in
            channelOpened(result, accessory: accessory, protocolString: protocolString, complete: complete)
        }
    }

    private func nativeEvent(_ key: Int, _ event: ByteChannelEvent) {
        if case let .closed(error) = event {
            // The stream ended under the session: the accessory closed it, or it went away.
            end(key, error: error.map { AccessoryError.disconnected($0.description) })
        }
        withSession(key) { _, _ in }
    }

    /// Runs `body` with the endpoint, then serves the session: what a call changed (a partial
    /// read or write, a new reader) shows in the next events at once.
    @discardableResult
    private func withSession<Result>(_ key: Int, _ body: (inout IAPEndpoint, LinkTime) throws -> Result) rethrows -> Result {
        try driver.perform { machine, now in
            let result = try body(&machine, now)
            service(key, &machine)
            return result
        }
    }

    /// Queues a waiter on a session and serves it, or resumes it with `gone` when the session
    /// is closed.
    private func enqueue(_ session: AccessorySession, gone: () -> Void, _ add: (inout SessionState) -> Void) {
        guard sessions[session.key] != nil else { return gone() }
        add(&sessions[session.key]!)
        withSession(session.key) { _, _ in }
    }

    // The async calls queue their waiter and serve it on the caller's thread (`onQueue`): a write
    // whose bytes all fit, a read of bytes already there, a flush with nothing pending resume
    // their continuation before the task suspends, so it goes on without a hop to another
    // thread. Only a wait for the accessory costs a hop back.

    func write(_ session: AccessorySession, _ bytes: [UInt8]) async throws {
        try await wait(on: session) { (id, continuation: CheckedContinuation<Void, any Error>) in
            self.enqueue(session, gone: { continuation.resume(throwing: AccessoryError.sessionClosed) }) {
                $0.writers.append(Writer(remaining: bytes[...], continuation: continuation, id: id))
            }
        }
    }

    func read(_ session: AccessorySession, maxBytes: Int) async throws -> [UInt8]? {
        try await wait(on: session) { id, continuation in
            self.enqueue(session, gone: { continuation.resume(returning: nil) }) {
                $0.readers.append(Reader(maxBytes: max(1, maxBytes), continuation: continuation, id: id))
            }
        }
    }

    /// Runs `enqueue` on the queue (on the caller's thread when it can, ``onQueue(_:)``) with a
    /// new waiter id and the continuation it queues; the task waits until the waiter is served.
    /// A task cancelled while it waits takes its waiter off the session, which throws
    /// `CancellationError` (what the session took of a write stays taken: ``AccessorySession/bytesWritten``
    /// counts it); one cancelled before it waits throws it at once.
    private func wait<Value>(on session: AccessorySession,
                             _ enqueue: @escaping (Int, CheckedContinuation<Value, any Error>) -> Void) async throws -> Value {
        let id = waiterIDs.wrappingAdd(1, ordering: .relaxed).newValue
        let key = session.key
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Value, any Error>) in
                onQueue {
                    if Task.isCancelled { return continuation.resume(throwing: CancellationError()) }
                    enqueue(id, continuation)
                }
            }
        } onCancel: {
            self.queue.async { self.cancelWaiter(id, key: key) }
        }
    }

    /// Resumes waiter `id` of session `key` with `CancellationError`, if it still waits. On the queue.
    private func cancelWaiter(_ id: Int, key: Int) {
        guard sessions[key] != nil else { return }
        let cancelled = CancellationError()
        if let index = sessions[key]!.readers.firstIndex(where: { $0.id == id }) {
            sessions[key]!.readers.remove(at: index).continuation.resume(throwing: cancelled)
        } else if let index = sessions[key]!.writers.firstIndex(where: { $0.id == id }) {
            sessions[key]!.writers.remove(at: index).continuation.resume(throwing: cancelled)
        } else if let index = sessions[key]!.flushers.firstIndex(where: { $0.id == id }) {
            sessions[key]!.flushers.remove(at: index).continuation.resume(throwing: cancelled)
        } else if let index = sessions[key]!.drainers.firstIndex(where: { $0.id == id }) {
            sessions[key]!.drainers.remove(at: index).continuation.resume(throwing: cancelled)
        }
    }

    func flush(_ session: AccessorySession) async throws {
        try await wait(on: session) { (id, continuation: CheckedContinuation<Void, any Error>) in
            self.enqueue(session, gone: { continuation.resume(throwing: AccessoryError.sessionClosed) }) {
                $0.flushers.append(Flusher(continuation: continuation, id: id))
            }
        }
    }

    /// Waits until the accessory acknowledged every byte written so far, within `limit` (nil:
    /// as long as it takes); past the limit, fails with ``AccessoryError/timedOut(_:)`` naming
    /// `step`.
    func drain(_ session: AccessorySession, limit: WaitLimit? = nil, step: String? = nil) async throws {
        try await wait(on: session) { (id, continuation: CheckedContinuation<Void, any Error>) in
            let now = self.driver.now
            let acknowledged = self.sessions[session.key].map { _ in self.acknowledged(session) } ?? 0
            self.enqueue(session, gone: { continuation.resume(throwing: AccessoryError.sessionClosed) }) {
                $0.drainers.append(Drainer(target: $0.written, continuation: continuation, limit: limit,
                                           step: step ?? "waiting for '\(session.protocolString)' to be acknowledged",
                                           id: id, acknowledged: acknowledged, since: now))
            }
            if let limit { self.scheduleCheck(of: id, session: session, limit: limit, since: now) }
        }
    }

    /// Looks at a bounded drainer again when its limit would be reached. On the queue.
    private func scheduleCheck(of id: Int, session: AccessorySession, limit: WaitLimit, since: LinkTime) {
        let wait: Duration
        switch limit {
        case let .progress(duration), let .total(duration): wait = duration
        }
        driver.clock.after(since + wait - driver.now, on: queue) { [weak self] in
            self?.checkDrainer(id, session: session)
        }
    }

    /// Fails a bounded drainer whose limit has passed; otherwise looks again later. On the queue.
    private func checkDrainer(_ id: Int, session: AccessorySession) {
        guard sessions[session.key]?.drainers.contains(where: { $0.id == id }) == true else { return }
        let acknowledged = acknowledged(session) // also serves the session: a drainer now done resumes
        guard let index = sessions[session.key]?.drainers.firstIndex(where: { $0.id == id }),
              var drainer = sessions[session.key]?.drainers[index], let limit = drainer.limit else { return }
        let now = driver.now
        let wait: Duration
        switch limit {
        case let .progress(duration):
            wait = duration
            if acknowledged != drainer.acknowledged {
                drainer.acknowledged = acknowledged
                drainer.since = now
                sessions[session.key]!.drainers[index] = drainer
            }
        case let .total(duration):
            wait = duration
        }
        guard now - drainer.since >= wait else {
            return scheduleCheck(of: id, session: session, limit: limit, since: drainer.since)
        }
        sessions[session.key]!.drainers.remove(at: index)
        let what: String
        switch limit {
        case .progress: what = "the accessory acknowledged nothing for \(wait) (the link is alive, the data does not move)"
        case .total: what = "the accessory did not acknowledge them within \(wait)"
        }
        logger.warning("\(drainer.step): \(what)")
        drainer.continuation.resume(throwing: AccessoryError.timedOut(
            "\(drainer.step): \(acknowledged) of the \(drainer.target) bytes written were acknowledged; \(what)"))
    }

    func readNow(_ session: AccessorySession, maxBytes: Int) -> [UInt8] {
        guard let stream = sessions[session.key]?.stream else { return [] }
        return withSession(session.key) { machine, _ in stream.read(&machine, maxBytes: max(0, maxBytes)) }
    }

    func borrow<Result>(_ session: AccessorySession, _ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        guard let stream = sessions[session.key]?.stream else { return nil }
        return try withSession(session.key) { machine, _ in try stream.borrow(&machine, body) }
    }

    func writeNow(_ session: AccessorySession, _ bytes: [UInt8]) throws -> Int {
        guard let state = sessions[session.key], !state.isEnded else {
            throw sessions[session.key]?.ended ?? AccessoryError.sessionClosed
        }
        guard state.writers.isEmpty else { return 0 } // earlier writes go first
        return withSession(session.key) { machine, now in
            let taken = state.stream.write(&machine, bytes[...], now: now)
            sessions[session.key]?.written += taken
            return taken
        }
    }

    func writeNow(_ session: AccessorySession, span bytes: RawSpan) throws -> Int {
        guard let state = sessions[session.key], !state.isEnded else {
            throw sessions[session.key]?.ended ?? AccessoryError.sessionClosed
        }
        guard state.writers.isEmpty else { return 0 } // earlier writes go first
        return withSession(session.key) { machine, now in
            let taken = state.stream.write(&machine, span: bytes, now: now)
            sessions[session.key]?.written += taken
            return taken
        }
    }

    func acknowledged(_ session: AccessorySession) -> Int {
        guard let state = sessions[session.key] else { return session.acknowledgedAtClose.withLock { $0 } ?? 0 }
        let now = driver.perform { machine, _ in state.stream.acknowledged(&machine) }
        sessions[session.key]!.acknowledged = max(state.acknowledged, now)
        return sessions[session.key]!.acknowledged
    }

    /// Bytes the session took from the application (the count at the close once closed).
    func written(_ session: AccessorySession) -> Int {
        sessions[session.key]?.written ?? session.writtenAtClose.withLock { $0 } ?? 0
    }

    func bytesAvailable(_ session: AccessorySession) -> Int {
        guard let stream = sessions[session.key]?.stream else { return 0 }
        return driver.perform { machine, _ in stream.readable(&machine) }
    }

    func spaceAvailable(_ session: AccessorySession) -> Int {
        guard let state = sessions[session.key], !state.isEnded else { return 0 }
        return driver.perform { machine, _ in state.stream.hasSpace(&machine) } ? 1 : 0
    }

    func setEventHandler(_ session: AccessorySession, queue handlerQueue: DispatchQueue,
                         handler: @escaping @Sendable (SessionStreamEvent) -> Void) {
        guard sessions[session.key] != nil else {
            handlerQueue.async { handler(.endEncountered) }
            return
        }
        let key = session.key
        sessions[key]!.handler = StreamEventHandler(queue: handlerQueue, handler: handler) { [weak self] event in
            guard let self else { return false }
            return self.onQueue {
                guard let state = self.sessions[key] else { return false }
                return self.driver.perform { machine, _ in
                    event == .hasBytesAvailable ? state.stream.readable(&machine) > 0 : !state.isEnded && state.stream.hasSpace(&machine)
                }
            }
        }
        handlerQueue.async { handler(.openCompleted) }
        withSession(session.key) { _, _ in }
    }

    /// Closes the session and waits, at most `timeout`, for the accessory's link to acknowledge
    /// its stop (iAP2 link sessions; others return at once). Off the queue.
    func closeAwaitingStop(_ session: AccessorySession, timeout: Duration) async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            queue.async {
                let id = self.sessions[session.key]?.stream.linkSessionID
                self.close(session)
                guard let id, self.downReason == nil, self.driver.perform({ machine, _ in machine.isStopPending(id) }) else {
                    return continuation.resume()
                }
                self.pendingStops[id] = (session.protocolString, continuation)
                self.driver.clock.after(timeout, on: self.queue) { [weak self] in
                    guard let pending = self?.pendingStops.removeValue(forKey: id) else { return }
                    pending.continuation.resume(throwing: AccessoryError.timedOut(
                        "closing '\(pending.name)': the accessory did not acknowledge StopExternalAccessoryProtocolSession within the close's \(timeout); the session is closed on this side"))
                }
            }
        }
    }

    func close(_ session: AccessorySession) {
        guard sessions[session.key] != nil else { return }
        let acknowledged = acknowledged(session)
        session.acknowledgedAtClose.withLock { $0 = acknowledged }
        session.writtenAtClose.withLock { $0 = written(session) }
        close(key: session.key)
    }

    /// Closes the session under `key` if it is still open (also what a session object that
    /// goes away without ``AccessorySession/close()`` comes to). On the queue.
    func close(key: Int) {
        guard let state = sessions.removeValue(forKey: key) else { return }
        sessionKeys.removeAll { $0 == key }
        for reader in state.readers { reader.continuation.resume(returning: nil) }
        for writer in state.writers { writer.continuation.resume(throwing: AccessoryError.sessionClosed) }
        for flusher in state.flushers { flusher.continuation.resume(throwing: AccessoryError.sessionClosed) }
        for drainer in state.drainers { drainer.continuation.resume(throwing: AccessoryError.sessionClosed) }
        if let id = state.stream.linkSessionID { linkKeys[id] = nil }
        let linkUp = downReason == nil
        driver.perform { machine, now in state.stream.close(&machine, now: now, linkUp: linkUp) }
        if state.stream.isNative { logger.debug("session '\(state.protocolString)' closed") }
    }
}

/// A session's stream-event handler and its queue. `hasBytesAvailable` and `hasSpaceAvailable`
/// are coalesced: at most one of each waits on the handler's queue (the next is posted once it
/// ran), so a handler queue that is slow or held up while the accessory keeps the connection
/// busy does not collect a block per packet. They are levels, checked again when they reach the
/// handler's queue: one whose bytes (or space) were taken meanwhile (by an earlier handler call,
/// or by an async read) is not delivered, so a handler never hears of bytes that are not there.
/// The others are posted as they happen.
final class StreamEventHandler: Sendable {
    let queue: DispatchQueue
    let handler: @Sendable (SessionStreamEvent) -> Void
    /// Whether a level event still holds (asked on the handler's queue, just before delivery).
    private let stillHolds: @Sendable (SessionStreamEvent) -> Bool
    /// Which level events wait on the queue now (``bytesBit``, ``spaceBit``).
    private let posted = Atomic<UInt8>(0)
    private static let bytesBit: UInt8 = 1
    private static let spaceBit: UInt8 = 2

    init(queue: DispatchQueue, handler: @escaping @Sendable (SessionStreamEvent) -> Void,
         stillHolds: @escaping @Sendable (SessionStreamEvent) -> Bool) {
        self.queue = queue
        self.handler = handler
        self.stillHolds = stillHolds
    }

    /// Posts `event` to the handler's queue, unless the same level event is already waiting there.
    func post(_ event: SessionStreamEvent) {
        let bit: UInt8
        switch event {
        case .hasBytesAvailable: bit = Self.bytesBit
        case .hasSpaceAvailable: bit = Self.spaceBit
        default:
            queue.async { self.handler(event) }
            return
        }
        guard posted.bitwiseOr(bit, ordering: .acquiringAndReleasing).oldValue & bit == 0 else { return }
        queue.async {
            // Cleared first: what happens while the handler runs posts the event again.
            self.posted.bitwiseAnd(~bit, ordering: .acquiringAndReleasing)
            if self.stillHolds(event) { self.handler(event) }
        }
    }
}
