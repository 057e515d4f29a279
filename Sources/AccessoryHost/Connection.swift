internal import AccessoryLogging
internal import Dispatch
internal import IAPLink
internal import IAPTransport

/// One transport and the device-role endpoint running over it, plus the sessions handed out.
///
/// Confinement: every stored `var` is touched on `queue` only (the manager's serial queue, which
/// also runs the driver), which is what makes the class Sendable.
final class Connection: @unchecked Sendable {
    struct Reader {
        var maxBytes: Int
        var continuation: CheckedContinuation<[UInt8]?, any Error>
    }
    struct Writer {
        var remaining: ArraySlice<UInt8>
        var continuation: CheckedContinuation<Void, any Error>
    }
    struct SessionState {
        var session: AccessorySession
        var readers: [Reader] = []
        var writers: [Writer] = []
        var flushers: [CheckedContinuation<Void, any Error>] = []
        var handler: (queue: DispatchQueue, handler: @Sendable (SessionStreamEvent) -> Void)?
        /// Bytes the accessory's link acknowledged (kept after the link went down).
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
    let driver: EndpointDriver<IAP2Endpoint>
    private let supportedProtocols: Set<String>
    private let logger: Logger
    private let onConnected: (Accessory) -> Void
    private let onDisconnected: (Accessory, String) -> Void
    private let onClosed: (_ everIdentified: Bool, String) -> Void
    private var everIdentified = false

    private(set) var accessory: Accessory?
    private var sessions: [UInt16: SessionState] = [:]
    private var pendingOpens: [UInt16: (name: String, continuation: CheckedContinuation<AccessorySession, any Error>)] = [:]
    private var downReason: String?

    init(connectionID: Int, makeConnectionID: @escaping () -> Int, transport: any Transport, queue: DispatchQueue,
         supportedProtocols: Set<String>, logger: Logger, endpoint: IAP2Endpoint, onConnected: @escaping (Accessory) -> Void,
         onDisconnected: @escaping (Accessory, String) -> Void, onClosed: @escaping (_ everIdentified: Bool, String) -> Void) {
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
        self.driver = EndpointDriver(machine: endpoint, transport: transport, queue: queue)
    }

    /// Starts the link. On the queue.
    func start() {
        driver.start(update: { [unowned self] machine, now in self.update(&machine, now: now) },
                     closed: { [weak self] error in self?.transportClosed(error) })
    }

    /// Stops the link and ends everything. On the queue.
    func stop(reason: String) {
        driver.stop()
        down(reason: reason)
        driver.perform { machine, _ in self.service(&machine) }
    }

    /// Whether this connection is still working towards its first identified accessory.
    var isPending: Bool { !everIdentified && downReason == nil }

    // MARK: Events from the endpoint

    private func update(_ machine: inout IAP2Endpoint, now: LinkTime) {
        for event in machine.takeEvents() {
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
                linkLost("\(failure)", machine: &machine)
            case let .link(.stateChanged(.failed(failure))):
                logger.warning("link failed: \(failure)")
                linkLost(failure.description, machine: &machine)
            case .link(.stateChanged(.negotiating)) where accessory != nil:
                // The accessory started over (a detect or SYN on a live link): this accessory is
                // gone; the next identification announces a new one.
                announceGone("the accessory restarted its link")
            case let .sessionOpened(id, name):
                if let pending = pendingOpens.removeValue(forKey: id), let accessory {
                    let session = AccessorySession(protocolString: name, accessory: accessory, sessionID: id, connection: self)
                    sessions[id] = SessionState(session: session)
                    pending.continuation.resume(returning: session)
                }
            case let .sessionClosed(id, reason):
                if let pending = pendingOpens.removeValue(forKey: id) {
                    pending.continuation.resume(throwing: AccessoryError.sessionRefused(reason ?? "closed"))
                } else {
                    end(id, error: reason.map { AccessoryError.disconnected($0) }, machine: &machine)
                }
            case let .identificationRejected(rejection):
                logger.warning("\(rejection)")
            case let .unhandledMessage(id):
                logger.debug("unhandled control message \(id)")
            case let .malformedMessage(reason):
                logger.notice("malformed control message: \(reason)")
            case let .link(.negotiated(parameters)):
                logger.debug("link up: \(parameters.maxOutstandingPackets) packets of \(parameters.maxPacketLength) bytes in flight, retransmission after \(parameters.retransmissionTimeout) ms")
            case let .link(.dropped(drop)):
                logger.debug("\(drop)")
            case .authenticated:
                logger.debug("authenticated")
            case .bytesAvailable, .spaceAvailable, .link, .powerUpdate:
                break
            }
        }
        service(&machine)
    }

    /// Serves waiting readers, writers and flushers of every session.
    private func service(_ machine: inout IAP2Endpoint) {
        for id in sessions.keys {
            guard var state = sessions[id] else { continue }
            state.acknowledged = max(state.acknowledged, machine.bytesAcknowledged(id))
            var readable = machine.bytesAvailable(id) > 0
            while readable, !state.readers.isEmpty {
                let reader = state.readers.removeFirst()
                reader.continuation.resume(returning: machine.read(id, maxBytes: reader.maxBytes))
                readable = machine.bytesAvailable(id) > 0
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
                let taken = (try? machine.write(id, first.remaining, now: driver.now)) ?? 0
                state.writers[0].remaining = first.remaining.dropFirst(taken)
                if state.writers[0].remaining.isEmpty {
                    state.writers.removeFirst().continuation.resume()
                } else {
                    wroteAll = false
                    break
                }
            }
            if state.writers.isEmpty, machine.bytesPending(id) == 0 || state.isEnded {
                for flusher in state.flushers {
                    if state.isEnded, machine.bytesPending(id) > 0 {
                        flusher.resume(throwing: state.ended ?? AccessoryError.sessionClosed)
                    } else {
                        flusher.resume()
                    }
                }
                state.flushers.removeAll()
            }
            if let handler = state.handler {
                if readable { handler.queue.async { handler.handler(.hasBytesAvailable) } }
                if wroteAll, !state.isEnded, machine.spaceAvailable(id) > 0 { handler.queue.async { handler.handler(.hasSpaceAvailable) } }
            }
            sessions[id] = state
        }
    }

    private func end(_ id: UInt16, error: AccessoryError?, machine: inout IAP2Endpoint) {
        guard var state = sessions[id], !state.isEnded else { return }
        state.isEnded = true
        state.ended = error
        if let handler = state.handler {
            if let error { handler.queue.async { handler.handler(.errorOccurred(error)) } }
            handler.queue.async { handler.handler(.endEncountered) }
        }
        sessions[id] = state
    }

    /// Called from inside the driver's update, which holds the machine: serve it directly.
    private func linkLost(_ reason: String, machine: inout IAP2Endpoint) {
        driver.stop()
        down(reason: reason)
        service(&machine)
    }

    private func transportClosed(_ error: TransportError?) {
        down(reason: error?.description ?? "the transport was closed")
        // Readers may still drain what was received; writers fail.
        driver.perform { machine, _ in self.service(&machine) }
    }

    private func announceGone(_ reason: String) {
        let gone = accessory
        accessory = nil
        for (id, pending) in pendingOpens {
            pending.continuation.resume(throwing: AccessoryError.disconnected(reason))
            pendingOpens[id] = nil
        }
        for id in sessions.keys { endWithoutMachine(id, error: .disconnected(reason)) }
        if let gone {
            gone.markDisconnected()
            onDisconnected(gone, reason)
        }
    }

    private func down(reason: String) {
        guard downReason == nil else { return }
        downReason = reason
        logger.info("connection closed: \(reason)")
        announceGone(reason)
        onClosed(everIdentified, reason)
    }

    private func endWithoutMachine(_ id: UInt16, error: AccessoryError) {
        guard var state = sessions[id], !state.isEnded else { return }
        state.isEnded = true
        state.ended = error
        if let handler = state.handler {
            handler.queue.async { handler.handler(.errorOccurred(error)) }
            handler.queue.async { handler.handler(.endEncountered) }
        }
        sessions[id] = state
    }

    // MARK: Calls from sessions and accessories (hop to the queue first)

    func openSession(accessory: Accessory, protocolString: String) async throws -> AccessorySession {
        try await withCheckedThrowingContinuation { continuation in
            queue.async {
                guard self.downReason == nil, self.accessory === accessory else {
                    continuation.resume(throwing: AccessoryError.disconnected(self.downReason ?? "the accessory reconnected"))
                    return
                }
                self.driver.perform { machine, now in
                    do {
                        let id = try machine.openSession(protocolName: protocolString, now: now)
                        self.pendingOpens[id] = (protocolString, continuation)
                    } catch EndpointError.protocolInUse(let name) {
                        continuation.resume(throwing: AccessoryError.protocolInUse(name))
                    } catch EndpointError.unsupportedProtocol(let name) {
                        continuation.resume(throwing: AccessoryError.unsupportedProtocol(name, available: accessory.protocolStrings))
                    } catch {
                        continuation.resume(throwing: AccessoryError.disconnected("\(error)"))
                    }
                }
            }
        }
    }

    func write(_ session: AccessorySession, _ bytes: [UInt8]) async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            queue.async {
                guard var state = self.sessions[session.sessionID] else {
                    continuation.resume(throwing: AccessoryError.sessionClosed)
                    return
                }
                state.writers.append(Writer(remaining: bytes[...], continuation: continuation))
                self.sessions[session.sessionID] = state
                self.driver.perform { machine, _ in self.service(&machine) }
            }
        }
    }

    func read(_ session: AccessorySession, maxBytes: Int) async throws -> [UInt8]? {
        try await withCheckedThrowingContinuation { continuation in
            queue.async {
                guard var state = self.sessions[session.sessionID] else {
                    continuation.resume(returning: nil)
                    return
                }
                state.readers.append(Reader(maxBytes: max(1, maxBytes), continuation: continuation))
                self.sessions[session.sessionID] = state
                self.driver.perform { machine, _ in self.service(&machine) }
            }
        }
    }

    func flush(_ session: AccessorySession) async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            queue.async {
                guard var state = self.sessions[session.sessionID] else {
                    continuation.resume(throwing: AccessoryError.sessionClosed)
                    return
                }
                state.flushers.append(continuation)
                self.sessions[session.sessionID] = state
                self.driver.perform { machine, _ in self.service(&machine) }
            }
        }
    }

    func readNow(_ session: AccessorySession, maxBytes: Int) -> [UInt8] {
        driver.perform { machine, _ in machine.read(session.sessionID, maxBytes: maxBytes) }
    }

    func borrow<Result>(_ session: AccessorySession, _ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        try driver.perform { machine, _ in try machine.borrow(session.sessionID, body) }
    }

    func writeNow(_ session: AccessorySession, _ bytes: [UInt8]) throws -> Int {
        guard let state = sessions[session.sessionID], !state.isEnded else {
            throw sessions[session.sessionID]?.ended ?? AccessoryError.sessionClosed
        }
        return driver.perform { machine, now in (try? machine.write(session.sessionID, bytes, now: now)) ?? 0 }
    }

    func acknowledged(_ session: AccessorySession) -> Int {
        guard var state = sessions[session.sessionID] else { return 0 }
        if downReason == nil {
            state.acknowledged = max(state.acknowledged, driver.perform { machine, _ in machine.bytesAcknowledged(session.sessionID) })
            sessions[session.sessionID] = state
        }
        return state.acknowledged
    }

    func bytesAvailable(_ session: AccessorySession) -> Int {
        driver.perform { machine, _ in machine.bytesAvailable(session.sessionID) }
    }

    func spaceAvailable(_ session: AccessorySession) -> Int {
        driver.perform { machine, _ in machine.spaceAvailable(session.sessionID) }
    }

    func setEventHandler(_ session: AccessorySession, queue handlerQueue: DispatchQueue,
                         handler: @escaping @Sendable (SessionStreamEvent) -> Void) {
        guard var state = sessions[session.sessionID] else {
            handlerQueue.async { handler(.endEncountered) }
            return
        }
        state.handler = (handlerQueue, handler)
        sessions[session.sessionID] = state
        handlerQueue.async { handler(.openCompleted) }
        driver.perform { machine, _ in self.service(&machine) }
    }

    func close(_ session: AccessorySession) {
        guard var state = sessions.removeValue(forKey: session.sessionID) else { return }
        for reader in state.readers { reader.continuation.resume(returning: nil) }
        for writer in state.writers { writer.continuation.resume(throwing: AccessoryError.sessionClosed) }
        for flusher in state.flushers { flusher.resume(throwing: AccessoryError.sessionClosed) }
        state.readers.removeAll()
        if downReason == nil {
            driver.perform { machine, now in machine.closeSession(session.sessionID, now: now) }
        }
    }
}
