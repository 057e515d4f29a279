internal import AccessoryLogging
internal import Dispatch
internal import IAPLink
internal import IAPTransport
internal import IAPWire
internal import QueueConfinement
internal import Synchronization

/// One transport and the device-role endpoint running over it, plus the sessions handed out.
///
/// Every session, on the link or on a native transport, is one ``SessionState`` around a
/// ``SessionStream``: readers, writers, flushers and stream events are served the same way for
/// both, by ``SessionState/serve(_:now:)``. Opening sessions is in ConnectionOpening.swift, the
/// sessions' calls in SessionCalls.swift.
///
/// Confinement: every stored `var`, and every ``SessionState`` in the table, is touched on
/// `queue` only (the manager's serial queue, which also runs the driver), which is what makes the
/// class Sendable.
final class Connection: @unchecked Sendable {
    /// What an opening session comes to, called on the queue.
    typealias OpenCompletion = @Sendable (Result<AccessorySession, AccessoryError>) -> Void
    let queue: DispatchQueue
    /// The id of this transport's connection (an accessory that re-identifies on it gets a new
    /// ``Accessory/connectionID`` from `makeConnectionID`).
    let connectionID: Int
    private let makeConnectionID: () -> Int
    let transport: any Transport
    let driver: EndpointDriver<IAPEndpoint>
    private let supportedProtocols: Set<String>
    let logger: Logger
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
    let remote: RemoteAccessory?

    private(set) var accessory: Accessory?
    /// Resets a device whose accessory's link never comes up (set by the manager; LinkRecovery.swift).
    var linkRecovery: StuckLinkRecovery?
    /// The sessions handed out, by their key (``AccessorySession/key``).
    var sessions: [Int: SessionState] = [:]
    /// The key of each link session, by its EA session id.
    var linkKeys: [UInt16: Int] = [:]
    private var nextKey = 1
    /// Numbers the waiters (readers, writers, flushers, drainers), so that a timer or a
    /// cancelled task finds its own; taken off the queue, before the hop.
    let waiterIDs = Atomic<Int>(0)
    /// Native sessions being opened, by protocol name (one session per protocol).
    var pendingNativeOpens: Set<String> = []
    var pendingOpens: [UInt16: (name: String, complete: OpenCompletion)] = [:]
    /// Closes waiting for the accessory's link to acknowledge their session's stop, by EA session id.
    var pendingStops: [UInt16: (name: String, continuation: CheckedContinuation<Void, any Error>)] = [:]
    var downReason: String?
    /// The array the endpoint's events are taken into, kept across updates.
    private var eventScratch = ReusableArray<EndpointEvent>()
    /// The session keys, in the order the sessions were handed out (iterated without holding the
    /// table, which serving changes).
    var sessionKeys: [Int] = []

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
        driver.perform { machine, now in self.serviceAll(&machine, now: now) }
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

    /// The iAP2 link's counters, nil on iAP1, read without sending or rescheduling anything. On
    /// the queue.
    func linkStatisticsOnQueue() -> LinkStatistics? {
        dispatchPrecondition(condition: .onQueue(queue))
        guard remote == nil else { return nil }
        return driver.inspect { machine in machine.linkStatistics }
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
                    linkLost("\(rejection); the accessory did not answer with a corrected identification in time", machine: &machine, now: now)
                } else {
                    linkLost("\(failure)", machine: &machine, now: now)
                }
            case let .link(.stateChanged(.failed(failure))):
                logger.warning("link failed: \(failure)")
                linkLost(failure.description, machine: &machine, now: now)
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
        serviceAll(&machine, now: now)
    }

    /// Hands out a new session over `stream`.
    func add(_ stream: any SessionStream, protocolString: String, accessory: Accessory) -> AccessorySession {
        let key = nextKey
        nextKey += 1
        let session = AccessorySession(protocolString: protocolString, accessory: accessory, key: key,
                                       usesNativeTransport: stream.isNative && remote == nil, connection: self)
        sessions[key] = SessionState(protocolString: protocolString, stream: stream, readWait: session.readWait)
        sessionKeys.append(key)
        return session
    }

    /// Serves every session.
    private func serviceAll(_ machine: inout IAPEndpoint, now: LinkTime) {
        for key in sessionKeys { service(key, &machine, now: now) }
    }

    /// Serves one session (``SessionState/serve(_:now:)``) at `now`, the time of the turn (read
    /// once per turn: on some machines a clock read is a system call, under emulation a slow one).
    func service(_ key: Int, _ machine: inout IAPEndpoint, now: LinkTime) {
        sessions[key]?.serve(&machine, now: now)
    }

    /// Ends a session's stream (bytes already received stay readable); the next service tells
    /// its readers, writers and flushers.
    func end(_ key: Int, error: AccessoryError?) {
        guard let state = sessions[key], !state.isEnded else { return }
        state.isEnded = true
        state.ended = error
        if let relay = state.relay { queue.async { relay.ended() } }
        if let handler = state.handler {
            if let error { handler.queue.async { handler.handler(.errorOccurred(error)) } }
            handler.queue.async { handler.handler(.endEncountered) }
        }
    }

    /// Called from inside the driver's update, which holds the machine: serve it directly.
    private func linkLost(_ reason: String, machine: inout IAPEndpoint, now: LinkTime) {
        driver.stop()
        down(reason: reason)
        serviceAll(&machine, now: now)
    }

    private func transportClosed(_ error: TransportError?) {
        down(reason: error?.description ?? "the transport was closed")
        // Readers may still drain what was received; writers fail.
        driver.perform { machine, now in self.serviceAll(&machine, now: now) }
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
}
