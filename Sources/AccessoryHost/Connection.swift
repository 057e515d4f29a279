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
    let driver: EndpointDriver<IAPEndpoint>
    private let supportedProtocols: Set<String>
    private let logger: Logger
    private let onConnected: (Accessory) -> Void
    private let onDisconnected: (Accessory, String) -> Void
    private let onClosed: (_ everIdentified: Bool, String) -> Void
    private var everIdentified = false

    /// A session whose bytes travel raw on a native-transport channel (PROTOCOL.md §4.3).
    struct NativeSessionState {
        var session: AccessorySession
        var channel: any ByteChannel
        var readers: [Reader] = []
        var writers: [Writer] = []
        var flushers: [CheckedContinuation<Void, any Error>] = []
        var handler: (queue: DispatchQueue, handler: @Sendable (SessionStreamEvent) -> Void)?
        var delivered = 0
        var ended: AccessoryError?
        var isEnded = false
    }

    private(set) var accessory: Accessory?
    private var sessions: [UInt16: SessionState] = [:]
    private var nativeSessions: [Int: NativeSessionState] = [:]
    /// Native sessions being opened, by protocol name (one session per protocol).
    private var pendingNativeOpens: Set<String> = []
    private var nextNativeKey = 1
    private var pendingOpens: [UInt16: (name: String, continuation: CheckedContinuation<AccessorySession, any Error>)] = [:]
    private var downReason: String?

    init(connectionID: Int, makeConnectionID: @escaping () -> Int, transport: any Transport, queue: DispatchQueue,
         supportedProtocols: Set<String>, logger: Logger, endpoint: IAPEndpoint, onConnected: @escaping (Accessory) -> Void,
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

    /// The endpoint's count of session bytes moved and copied. Off the queue.
    func dataPlaneStatistics() -> DataPlaneStatistics {
        queue.sync { driver.perform { machine, _ in machine.dataPlane } }
    }

    /// Whether this connection is still working towards its first identified accessory.
    var isPending: Bool { !everIdentified && downReason == nil }

    // MARK: Events from the endpoint

    private func update(_ machine: inout IAPEndpoint, now: LinkTime) {
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
            case let .accessoryRestarted(reason) where accessory != nil:
                announceGone(reason)
            case let .protocolSwitched(version):
                logger.info(version == .iap1 ? "the accessory speaks iAP1: continuing in iAP1" : "the accessory started over in iAP2")
            case let .unhandledIAP1Command(lingo, command):
                logger.debug("unhandled iAP1 command 0x\(String(command, radix: 16)) on lingo 0x\(String(lingo, radix: 16)), answered BadParameter")
            case let .sessionOpened(id, name):
                if let pending = pendingOpens.removeValue(forKey: id), let accessory {
                    let session = AccessorySession(protocolString: name, accessory: accessory, route: .link(id), connection: self)
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
            case .bytesAvailable, .spaceAvailable, .link, .powerUpdate, .accessoryRestarted:
                break
            }
        }
        service(&machine)
    }

    /// Serves waiting readers, writers and flushers of every session.
    private func service(_ machine: inout IAPEndpoint) {
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

    private func end(_ id: UInt16, error: AccessoryError?, machine: inout IAPEndpoint) {
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
    private func linkLost(_ reason: String, machine: inout IAPEndpoint) {
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
        for key in nativeSessions.keys {
            endNative(key, error: .disconnected(reason))
            nativeSessions[key]?.channel.close()
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
                if let declared = accessory.identity.protocols.first(where: { $0.name == protocolString }),
                   declared.nativeTransportComponentIdentifier != nil {
                    return self.openNative(accessory: accessory, protocolString: protocolString, continuation: continuation)
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

    /// The transport's native-transport interfaces, if it has any (USB).
    private var nativeProvider: (any NativeTransportProvider)? {
        let base = (transport as? TracingTransport)?.base ?? transport
        if let memory = base as? MemoryTransport { return memory.nativeTransports }
        return base as? any NativeTransportProvider
    }

    /// Opens a protocol the accessory binds to a native transport: its channel (for USB, the
    /// FF/F0/01 interface in alternate setting 1), no StartExternalAccessoryProtocolSession.
    private func openNative(accessory: Accessory, protocolString: String,
                            continuation: CheckedContinuation<AccessorySession, any Error>) {
        let inUse = pendingNativeOpens.contains(protocolString)
            || nativeSessions.values.contains { $0.session.protocolString == protocolString }
        guard !inUse else { return continuation.resume(throwing: AccessoryError.protocolInUse(protocolString)) }
        guard let provider = nativeProvider else {
            return continuation.resume(throwing: AccessoryError.sessionRefused(
                "the accessory carries '\(protocolString)' on a native USB interface of its own, and \(transport.description) has none; connect the accessory by USB to open it"))
        }
        pendingNativeOpens.insert(protocolString)
        logger.debug("opening '\(protocolString)' on its native transport")
        provider.openNativeChannel(for: protocolString, queue: queue) { [self] result in
            pendingNativeOpens.remove(protocolString)
            switch result {
            case let .failure(error):
                continuation.resume(throwing: AccessoryError.sessionRefused(error.description))
            case let .success(channel):
                guard downReason == nil, self.accessory === accessory else {
                    channel.close()
                    return continuation.resume(throwing: AccessoryError.disconnected(downReason ?? "the accessory reconnected"))
                }
                let key = nextNativeKey
                nextNativeKey += 1
                let session = AccessorySession(protocolString: protocolString, accessory: accessory, route: .native(key), connection: self)
                nativeSessions[key] = NativeSessionState(session: session, channel: channel)
                channel.activate(queue: queue) { [weak self] event in self?.nativeEvent(key, event) }
                logger.info("session '\(protocolString)' open on \(channel.description)")
                continuation.resume(returning: session)
            }
        }
    }

    private func nativeEvent(_ key: Int, _ event: ByteChannelEvent) {
        switch event {
        case .readable, .writable: break
        case let .closed(error):
            // The stream ended under the session: the accessory closed it, or it went away.
            endNative(key, error: error.map { AccessoryError.disconnected($0.description) })
        }
        serviceNative(key)
    }

    private func endNative(_ key: Int, error: AccessoryError?) {
        guard var state = nativeSessions[key], !state.isEnded else { return }
        state.isEnded = true
        state.ended = error
        state.delivered = max(state.delivered, state.channel.bytesDelivered)
        if let handler = state.handler {
            if let error { handler.queue.async { handler.handler(.errorOccurred(error)) } }
            handler.queue.async { handler.handler(.endEncountered) }
        }
        nativeSessions[key] = state
        serviceNative(key)
    }

    /// Reads up to `maxBytes` from a channel, across its chunks.
    private static func take(from channel: any ByteChannel, maxBytes: Int) -> [UInt8] {
        var bytes: [UInt8] = []
        while bytes.count < maxBytes {
            let room = maxBytes - bytes.count
            let took: Int? = channel.withReadableBytes { span in
                let count = min(room, span.byteCount)
                span.withUnsafeBytes { bytes.append(contentsOf: UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
                return (count, count)
            }
            guard let took, took > 0 else { break }
        }
        return bytes
    }

    /// Serves a native session after the current call: a partial non-blocking read or write
    /// changes what the next event should say (bytes still available, room again), as the
    /// link's settle does for link sessions.
    private func serviceNativeSoon(_ key: Int) {
        queue.async { [weak self] in self?.serviceNative(key) }
    }

    /// Serves the waiting readers, writers and flushers of a native session.
    private func serviceNative(_ key: Int) {
        guard var state = nativeSessions[key] else { return }
        let channel = state.channel
        while channel.readableByteCount > 0, !state.readers.isEmpty {
            let reader = state.readers.removeFirst()
            reader.continuation.resume(returning: Self.take(from: channel, maxBytes: reader.maxBytes))
        }
        let readable = channel.readableByteCount > 0
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
            let taken = channel.write(first.remaining)
            state.writers[0].remaining = first.remaining.dropFirst(taken)
            if state.writers[0].remaining.isEmpty {
                state.writers.removeFirst().continuation.resume()
            } else {
                wroteAll = false
                break
            }
        }
        if state.writers.isEmpty, channel.unsentByteCount == 0 || state.isEnded {
            for flusher in state.flushers {
                if state.isEnded, channel.unsentByteCount > 0 {
                    flusher.resume(throwing: state.ended ?? AccessoryError.sessionClosed)
                } else {
                    flusher.resume()
                }
            }
            state.flushers.removeAll()
        }
        if !state.isEnded { state.delivered = max(state.delivered, channel.bytesDelivered) }
        if let handler = state.handler {
            if readable { handler.queue.async { handler.handler(.hasBytesAvailable) } }
            if wroteAll, !state.isEnded, channel.isWritable { handler.queue.async { handler.handler(.hasSpaceAvailable) } }
        }
        nativeSessions[key] = state
    }

    func write(_ session: AccessorySession, _ bytes: [UInt8]) async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            queue.async {
                let writer = Writer(remaining: bytes[...], continuation: continuation)
                switch session.route {
                case let .link(id):
                    guard var state = self.sessions[id] else {
                        continuation.resume(throwing: AccessoryError.sessionClosed)
                        return
                    }
                    state.writers.append(writer)
                    self.sessions[id] = state
                    self.driver.perform { machine, _ in self.service(&machine) }
                case let .native(key):
                    guard self.nativeSessions[key] != nil else {
                        continuation.resume(throwing: AccessoryError.sessionClosed)
                        return
                    }
                    self.nativeSessions[key]?.writers.append(writer)
                    self.serviceNative(key)
                }
            }
        }
    }

    func read(_ session: AccessorySession, maxBytes: Int) async throws -> [UInt8]? {
        try await withCheckedThrowingContinuation { continuation in
            queue.async {
                let reader = Reader(maxBytes: max(1, maxBytes), continuation: continuation)
                switch session.route {
                case let .link(id):
                    guard var state = self.sessions[id] else {
                        continuation.resume(returning: nil)
                        return
                    }
                    state.readers.append(reader)
                    self.sessions[id] = state
                    self.driver.perform { machine, _ in self.service(&machine) }
                case let .native(key):
                    guard self.nativeSessions[key] != nil else {
                        continuation.resume(returning: nil)
                        return
                    }
                    self.nativeSessions[key]?.readers.append(reader)
                    self.serviceNative(key)
                }
            }
        }
    }

    func flush(_ session: AccessorySession) async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            queue.async {
                switch session.route {
                case let .link(id):
                    guard var state = self.sessions[id] else {
                        continuation.resume(throwing: AccessoryError.sessionClosed)
                        return
                    }
                    state.flushers.append(continuation)
                    self.sessions[id] = state
                    self.driver.perform { machine, _ in self.service(&machine) }
                case let .native(key):
                    guard self.nativeSessions[key] != nil else {
                        continuation.resume(throwing: AccessoryError.sessionClosed)
                        return
                    }
                    self.nativeSessions[key]?.flushers.append(continuation)
                    self.serviceNative(key)
                }
            }
        }
    }

    func readNow(_ session: AccessorySession, maxBytes: Int) -> [UInt8] {
        switch session.route {
        case let .link(id):
            return driver.perform { machine, _ in machine.read(id, maxBytes: maxBytes) }
        case let .native(key):
            guard let channel = nativeSessions[key]?.channel else { return [] }
            defer { serviceNativeSoon(key) }
            return Self.take(from: channel, maxBytes: max(0, maxBytes))
        }
    }

    func borrow<Result>(_ session: AccessorySession, _ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        switch session.route {
        case let .link(id):
            return try driver.perform { machine, _ in try machine.borrow(id, body) }
        case let .native(key):
            defer { serviceNativeSoon(key) }
            return try nativeSessions[key]?.channel.withReadableBytes(body)
        }
    }

    func writeNow(_ session: AccessorySession, _ bytes: [UInt8]) throws -> Int {
        switch session.route {
        case let .link(id):
            guard let state = sessions[id], !state.isEnded else {
                throw sessions[id]?.ended ?? AccessoryError.sessionClosed
            }
            return driver.perform { machine, now in (try? machine.write(id, bytes, now: now)) ?? 0 }
        case let .native(key):
            guard let state = nativeSessions[key], !state.isEnded, state.writers.isEmpty else {
                if let state = nativeSessions[key], !state.isEnded { return 0 } // earlier writes wait first
                throw nativeSessions[key]?.ended ?? AccessoryError.sessionClosed
            }
            defer { serviceNativeSoon(key) }
            return state.channel.write(bytes[...])
        }
    }

    func acknowledged(_ session: AccessorySession) -> Int {
        switch session.route {
        case let .link(id):
            guard var state = sessions[id] else { return 0 }
            if downReason == nil {
                state.acknowledged = max(state.acknowledged, driver.perform { machine, _ in machine.bytesAcknowledged(id) })
                sessions[id] = state
            }
            return state.acknowledged
        case let .native(key):
            guard var state = nativeSessions[key] else { return 0 }
            if !state.isEnded { state.delivered = max(state.delivered, state.channel.bytesDelivered) }
            nativeSessions[key] = state
            return state.delivered
        }
    }

    func bytesAvailable(_ session: AccessorySession) -> Int {
        switch session.route {
        case let .link(id): driver.perform { machine, _ in machine.bytesAvailable(id) }
        case let .native(key): nativeSessions[key]?.channel.readableByteCount ?? 0
        }
    }

    func spaceAvailable(_ session: AccessorySession) -> Int {
        switch session.route {
        case let .link(id): return driver.perform { machine, _ in machine.spaceAvailable(id) }
        case let .native(key):
            guard let state = nativeSessions[key], !state.isEnded, state.channel.isWritable else { return 0 }
            return 1
        }
    }

    func setEventHandler(_ session: AccessorySession, queue handlerQueue: DispatchQueue,
                         handler: @escaping @Sendable (SessionStreamEvent) -> Void) {
        switch session.route {
        case let .link(id):
            guard var state = sessions[id] else {
                handlerQueue.async { handler(.endEncountered) }
                return
            }
            state.handler = (handlerQueue, handler)
            sessions[id] = state
            handlerQueue.async { handler(.openCompleted) }
            driver.perform { machine, _ in self.service(&machine) }
        case let .native(key):
            guard nativeSessions[key] != nil else {
                handlerQueue.async { handler(.endEncountered) }
                return
            }
            nativeSessions[key]?.handler = (handlerQueue, handler)
            handlerQueue.async { handler(.openCompleted) }
            serviceNative(key)
        }
    }

    func close(_ session: AccessorySession) {
        switch session.route {
        case let .link(id):
            guard var state = sessions.removeValue(forKey: id) else { return }
            for reader in state.readers { reader.continuation.resume(returning: nil) }
            for writer in state.writers { writer.continuation.resume(throwing: AccessoryError.sessionClosed) }
            for flusher in state.flushers { flusher.resume(throwing: AccessoryError.sessionClosed) }
            state.readers.removeAll()
            if downReason == nil {
                driver.perform { machine, now in machine.closeSession(id, now: now) }
            }
        case let .native(key):
            guard let state = nativeSessions.removeValue(forKey: key) else { return }
            for reader in state.readers { reader.continuation.resume(returning: nil) }
            for writer in state.writers { writer.continuation.resume(throwing: AccessoryError.sessionClosed) }
            for flusher in state.flushers { flusher.resume(throwing: AccessoryError.sessionClosed) }
            state.channel.close()
            logger.debug("session '\(session.protocolString)' closed on \(state.channel.description)")
        }
    }
}
