public import AccessoryLogging
public import Dispatch
public import IAPLink
public import IAPTransport
internal import Glibc
internal import IAPDaemonProtocol
internal import ProjectVersion
internal import QueueConfinement
internal import Synchronization

/// Something that happened to the set of connected accessories.
public enum AccessoryEvent: Sendable {
    /// An accessory was authenticated and identified.
    case connected(Accessory)
    /// An accessory went away; its sessions ended. The reason says why.
    case disconnected(Accessory, reason: String)
    /// A transport failed before any accessory on it was identified.
    case failed(location: String, reason: String)
    /// An accessory asked for an application to be launched (RequestAppLaunch), as accessories
    /// do after identification: an iPhone offers to open the app; on Linux, start your program or
    /// tell the user. Nothing else follows from it.
    case appLaunchRequested(Accessory, AppLaunchRequest)
}

/// Finds accessories on the transports it is given, runs the protocol with each, and hands out
/// ``Accessory`` objects and their sessions: the ExternalAccessory framework's
/// EAAccessoryManager for Linux.
///
/// One serial Dispatch queue per manager owns all protocol state; transports and timers deliver
/// on it; your code is called back on queues you choose (or through async sequences).
///
/// Thread safety: every method and property may be used from any thread or task, concurrently,
/// including ``stop()`` while tasks iterate ``events`` or wait in a session's read (they end:
/// the events finish, reads return nil). ``stop()`` waits (at most 5 s) for USB to be released:
/// from a Swift task prefer ``shutdown()``, which suspends instead of blocking a thread.
public final class AccessoryManager: Sendable {
    /// How a manager behaves.
    public struct Configuration: Sendable {
        /// The protocol strings your application speaks. Accessories declaring none of them are
        /// still listed, marked with ``Accessory/supportsConfiguredProtocols`` false. Empty means
        /// every accessory is supported.
        public var supportedProtocols: [String]
        /// The link limits and defaults of the host side.
        public var link: LinkConfiguration
        /// How long the host waits for each answer during authentication and identification.
        public var answerTimeout: Duration
        /// Most bytes buffered per session and direction. The host advertises packets no larger
        /// than this (plus framing), so an accessory that keeps to that never makes a session
        /// hold more; one that sends larger packets anyway gets at most one packet more.
        public var sessionBufferLimit: Int
        /// Decides on the accessory's authentication. By default `AcceptingAuthentication`:
        /// every accessory is accepted and reported as not checked. IAPAuthentication's
        /// `VerifyingAuthentication` (in record mode: verified with OpenSSL, reported in
        /// ``Accessory/authentication``, accepted whatever the result) is what iapctl, iapd and
        /// the ExternalAccessory facade use; the core leaves it to you so that a program that
        /// does not verify links no libcrypto.
        public var authentication: any AuthenticationPolicy
        /// Where the manager says what happens (identification, failures, disconnects at info and
        /// above; link and session details at debug). Silent by default.
        public var logger: Logger
        /// Wraps every transport the manager runs, USB ones included (e.g. a `TracingTransport`
        /// for `--trace`); nil runs them as they are.
        public var transportTap: (@Sendable (any Transport) -> any Transport)?
        /// Whether a source that can share its accessories (AccessoryHostUSB's `startUSB`) goes
        /// through the accessory daemon (`iapd`) when its socket exists: `.automatic` by
        /// default, `.never` to open devices in this process (what the daemon itself does;
        /// `iapctl --direct`).
        public var daemon: DaemonUse = .automatic
        /// Where the daemon listens: `IAPD_SOCKET` from the environment, else
        /// `/run/iapd/iapd.sock`.
        public var daemonSocketPath: String = AccessoryManager.defaultDaemonSocketPath
        /// The time the manager and its connections run on: links, answer timeouts, drain and
        /// close limits, waits. The system's clock; a test passes a `ManualLinkClock` to decide
        /// when each of them comes due.
        public var clock: any LinkClock = SystemLinkClock()

        /// A configuration; every parameter has the default an application usually wants.
        public init(supportedProtocols: [String] = [], link: LinkConfiguration = .device, answerTimeout: Duration = .seconds(10),
                    sessionBufferLimit: Int = 1 << 20, authentication: any AuthenticationPolicy = AcceptingAuthentication(),
                    logger: Logger = Logger(label: "AccessoryHost", handler: NullLogHandler())) {
            self.logger = logger
            self.supportedProtocols = supportedProtocols
            self.link = link
            self.answerTimeout = answerTimeout
            self.sessionBufferLimit = sessionBufferLimit
            self.authentication = authentication
        }
    }

    /// Whether a manager uses the accessory daemon.
    public enum DaemonUse: Sendable, Hashable {
        /// Through the daemon when its socket exists, else directly.
        case automatic
        /// Always directly (the devices are opened in this process).
        case never
    }

    /// `IAPD_SOCKET` from the environment, else `/run/iapd/iapd.sock`.
    public static var defaultDaemonSocketPath: String {
        if let value = getenv(DaemonProtocol.socketEnvironmentVariable), let path = String(validatingCString: value), !path.isEmpty {
            return path
        }
        return DaemonProtocol.defaultSocketPath
    }

    struct State {
        var nextConnectionID = 1
        var nextAccessoryID = 1
        var connections: [Int: Connection] = [:]
        var accessories: [Accessory] = []
        var subscribers: [Int: AsyncStream<AccessoryEvent>.Continuation] = [:]
        var callbacks: [Int: (DispatchQueue, @Sendable (AccessoryEvent) -> Void)] = [:]
        var nextSubscriber = 0
        var stopped = false
        /// The sources of accessories added (USB, Bluetooth…), in the order they came.
        var sources: [any AccessorySource] = []
        /// Accessories a source is opening (not yet attached): the manager is not settled.
        var opening = 0
        /// The connection to the daemon, when accessories come through it.
        var daemon: DaemonClient?
        /// Connected to the daemon, its list not in yet: the manager is not settled.
        var daemonPending = false
        /// Waits for the manager to settle, called on the queue when the daemon's list is in
        /// (which need not announce anything).
        var settleWatchers: [Int: @Sendable () -> Void] = [:]
    }

    /// How the manager was made to behave (fixed for its life).
    public let configuration: Configuration
    /// The queue that owns all protocol state.
    public let queue: DispatchQueue
    private let state = Mutex(State())

    /// Runs `body` with the manager's state locked (for the sources' bookkeeping in
    /// AccessorySource.swift).
    func withState<Result>(_ body: (inout State) -> Result) -> Result { state.withLock { body(&$0) } }

    /// A task executor on ``queue``. A task that prefers it
    /// (`withTaskExecutorPreference(manager.taskExecutor) { … }`) has its session calls resume
    /// without a hop to another thread: the lowest latency for request/response loops. Its code
    /// runs on the manager's queue between awaits and holds up every accessory's protocol work
    /// while it runs: keep that short and never block in it.
    public let taskExecutor: any TaskExecutor

    /// A manager that runs nothing yet: give it transports with ``attach(_:)`` and sources of
    /// accessories with ``addSource(_:)`` (AccessoryHostUSB's `startUSB`, AccessoryHostBluetooth's
    /// `startBluetooth`); ``stop()`` ends it.
    public init(configuration: Configuration = Configuration()) {
        self.configuration = configuration
        let queue = DispatchQueue(label: "AccessoryHost.manager")
        self.queue = queue
        self.taskExecutor = QueueTaskExecutor(queue: queue)
        QueueMark.mark(queue)
    }

    /// The version of AccessoryHost this program runs on (`0.3.0`), the same that `iapctl
    /// --version` prints.
    public static var version: String { AccessoryHostVersion.string }

    /// The accessories connected now.
    public var connectedAccessories: [Accessory] { state.withLock { $0.accessories } }

    /// The kinds of the transports still working towards their first identified accessory: the
    /// accessories connecting (iapd's metrics). On ``queue``.
    package func connectingTransportKinds() -> [TransportKind] {
        dispatchPrecondition(condition: .onQueue(queue))
        let connections = state.withLock { Array($0.connections.values) }
        return connections.filter(\.isPending).map(\.transport.kind)
    }

    /// Event callbacks registered now (tests: a finished wait must not leave one behind).
    var callbackCount: Int { state.withLock { $0.callbacks.count } }

    /// Connect and disconnect events from now on, as an async sequence (one per call). It
    /// finishes when the manager stops (at once when it has stopped already). It keeps the
    /// newest 1,024 events a slow consumer has not taken yet.
    public var events: AsyncStream<AccessoryEvent> {
        let (stream, continuation) = AsyncStream<AccessoryEvent>.makeStream(bufferingPolicy: .bufferingNewest(1_024))
        let key = state.withLock { state -> Int? in
            guard !state.stopped else { return nil }
            state.nextSubscriber += 1
            state.subscribers[state.nextSubscriber] = continuation
            return state.nextSubscriber
        }
        guard let key else {
            continuation.finish()
            return stream
        }
        // Registered after the lock was let go: termination (a cancelled consumer) takes it.
        continuation.onTermination = { [weak self] _ in _ = self?.state.withLock { $0.subscribers.removeValue(forKey: key) } }
        return stream
    }

    /// Delivers events to `handler` on `queue` until the returned token's `cancel()` (or the
    /// token goes away). Events are delivered in order; a manager that stopped delivers none.
    /// Handlers on one serial queue hear each event in the order they subscribed. A handler on
    /// ``queue`` that records failures and subscribed before a wait began
    /// (``waitUntilSettled(timeout:)``) has recorded the failure that ended the wait by the time
    /// the wait returns.
    @discardableResult
    public func onEvent(queue: DispatchQueue, _ handler: @escaping @Sendable (AccessoryEvent) -> Void) -> EventSubscription {
        let key = state.withLock { state -> Int in
            state.nextSubscriber += 1
            state.callbacks[state.nextSubscriber] = (queue, handler)
            return state.nextSubscriber
        }
        return EventSubscription { [weak self] in _ = self?.state.withLock { $0.callbacks.removeValue(forKey: key) } }
    }

    /// Runs the host side of the protocol over `transport`: the accessory on it is announced
    /// with ``AccessoryEvent/connected(_:)`` once identified.
    public func attach(_ transport: any Transport) {
        queue.async { self.attachOnQueue(transport) }
    }

    /// The link configuration for one transport: on a serial line, the packets the host
    /// advertises it can receive are kept short enough to cross the line in about a quarter of a
    /// second (`baud / 40` bytes, at least 128), so an accessory that sends packets as large as
    /// the host allows is not retransmitting them before they have arrived; and a partial frame
    /// is given up on after a silence suited to the baud rate
    /// (``LinkConfiguration/interByteGap(baudRate:)``, unless the configuration asks for longer).
    static func link(_ configuration: LinkConfiguration, over transport: any Transport) -> LinkConfiguration {
        if transport.capability(BluetoothPeer.self) != nil {
            // RFCOMM over the air pauses longer than USB inside one frame (retransmissions at
            // the baseband, another link's turn on a shared controller).
            var adjusted = configuration
            adjusted.interByteGap = max(configuration.interByteGap, bluetoothInterByteGap)
            return adjusted
        }
        guard let baudRate = transport.capability(SerialPortSpec.self)?.baudRate, baudRate > 0 else { return configuration }
        var adjusted = configuration
        let fitting = UInt16(clamping: max(128, baudRate / 40))
        adjusted.parameters.maxPacketLength = min(configuration.parameters.maxPacketLength, fitting)
        adjusted.interByteGap = max(configuration.interByteGap, LinkConfiguration.interByteGap(baudRate: baudRate))
        return adjusted
    }

    /// The inter-byte gap on Bluetooth: 500 ms.
    static let bluetoothInterByteGap: Duration = .milliseconds(500)

    /// The next accessory's connection id (one counter for every transport, native or remote).
    private func takeAccessoryID() -> Int {
        state.withLock { state -> Int in
            defer { state.nextAccessoryID += 1 }
            return state.nextAccessoryID
        }
    }

    func attachOnQueue(_ plain: any Transport) {
        dispatchPrecondition(condition: .onQueue(queue))
        let transport = configuration.transportTap?(plain) ?? plain
        let (id, stopped) = self.state.withLock { state -> (Int, Bool) in
            defer { state.nextConnectionID += 1 }
            return (state.nextConnectionID, state.stopped)
        }
        guard !stopped else {
            transport.cancel()
            return
        }
        var random = SystemRandomNumberGenerator()
        var endpoint = IAPEndpoint(device: Self.link(self.configuration.link, over: plain), policy: self.configuration.authentication,
                                   sessionBufferLimit: self.configuration.sessionBufferLimit,
                                   initialSequence: UInt8.random(in: 0...255, using: &random), randomSeed: random.next())
        endpoint.answerTimeout = self.configuration.answerTimeout
        if let peer = transport.capability(BluetoothPeer.self) { endpoint.peerBluetoothAddress = peer.address.bytes }
        let connection = Connection(
            connectionID: id,
            makeConnectionID: { [weak self] in self?.takeAccessoryID() ?? Int.max },
            transport: transport, queue: self.queue, supportedProtocols: Set(self.configuration.supportedProtocols),
            logger: self.configuration.logger,
            endpoint: endpoint,
            onConnected: { [weak self] accessory in self?.connected(accessory) },
            onDisconnected: { [weak self] accessory, reason in self?.disconnected(accessory, reason: reason) },
            onClosed: { [weak self] everIdentified, reason in
                self?.closed(connectionID: id, location: transport.description, everIdentified: everIdentified, reason: reason)
            },
            onAppLaunchRequested: { [weak self] accessory, request in self?.publish(.appLaunchRequested(accessory, request)) },
            clock: configuration.clock)
        connection.linkRecovery = StuckLinkRecovery(
            transport: transport, queue: queue, logger: configuration.logger, clock: configuration.clock,
            announce: { [weak self] reason in self?.publish(.failed(location: transport.description, reason: reason)) },
            giveUp: { [weak connection] reason in connection?.stop(reason: reason) })
        self.state.withLock { $0.connections[id] = connection }
        connection.start()
    }

    /// Takes accessories from the accessory daemon (`iapd`) listening at `socketPath` (by
    /// default ``Configuration/daemonSocketPath``) instead of opening devices: every accessory
    /// the daemon owns (USB and serial) is announced like a local one, and sessions are opened
    /// through it, one per protocol per accessory system-wide. When the daemon restarts, its
    /// accessories disconnect and come back once it is up again (the manager reconnects).
    ///
    /// - Throws: ``DaemonConnectionError`` when the daemon cannot be reached now (not running,
    ///   not allowed: the message names the group to join).
    public func connectToDaemon(socketPath: String? = nil) throws(DaemonConnectionError) {
        let path = socketPath ?? configuration.daemonSocketPath
        let descriptor = try DaemonConnectionError.connect(path: path)
        let client = DaemonClient(path: path, queue: queue, logger: configuration.logger, clock: configuration.clock,
                                  attach: { [weak self] record, remote in self?.attachRemote(record, remote) },
                                  failed: { [weak self] location, reason in self?.publish(.failed(location: location, reason: reason)) },
                                  welcomed: { [weak self] in
                                      self?.state.withLock { $0.daemonPending = false }
                                      self?.wakeSettleWatchers()
                                  })
        let stopped = state.withLock { state -> Bool in
            guard !state.stopped else { return true }
            state.daemon = client
            state.daemonPending = true
            return false
        }
        guard !stopped else { return _ = close(descriptor) }
        queue.async { client.start(descriptor: descriptor) }
    }

    /// The daemon's socket when accessories come through the daemon; nil when this process
    /// opens them itself.
    public var daemonSocketInUse: String? { state.withLock { $0.daemon?.path } }

    /// Announces an accessory the daemon owns. On the queue.
    private func attachRemote(_ record: AccessoryRecord, _ remote: RemoteAccessory) -> Connection? {
        dispatchPrecondition(condition: .onQueue(queue))
        let transport = DaemonAccessoryTransport(record: record)
        let (id, stopped) = state.withLock { state -> (Int, Bool) in
            defer { state.nextConnectionID += 1 }
            return (state.nextConnectionID, state.stopped)
        }
        guard !stopped else { return nil }
        let endpoint = IAPEndpoint(device: configuration.link, policy: AcceptingAuthentication(), sessionBufferLimit: configuration.sessionBufferLimit,
                                   initialSequence: 0, randomSeed: 0)
        let connection = Connection(
            connectionID: id,
            makeConnectionID: { [weak self] in self?.takeAccessoryID() ?? Int.max },
            transport: transport, queue: queue, supportedProtocols: Set(configuration.supportedProtocols),
            logger: configuration.logger, endpoint: endpoint,
            onConnected: { [weak self] accessory in self?.connected(accessory) },
            onDisconnected: { [weak self] accessory, reason in self?.disconnected(accessory, reason: reason) },
            onClosed: { [weak self] _, _ in _ = self?.state.withLock { $0.connections.removeValue(forKey: id) } },
            onAppLaunchRequested: { [weak self] accessory, request in self?.publish(.appLaunchRequested(accessory, request)) },
            remote: remote, clock: configuration.clock)
        state.withLock { $0.connections[id] = connection }
        connection.start()
        return connection
    }

    /// Stops every connection and source; accessories disconnect, sessions end. A source's
    /// devices are released once their transfers are back; returns once the sources have let
    /// go of what they hold (USB: its libusb context; at most 5 s in all; called on ``queue``
    /// itself, from a task on ``taskExecutor``, it cannot wait for that and returns at once).
    public func stop() {
        // The sources are taken out, so that a second stop() stops none of them again.
        let (sources, daemon) = state.withLock { state -> ([any AccessorySource], DaemonClient?) in
            state.stopped = true
            defer { state.sources.removeAll() }
            return (state.sources, state.daemon)
        }
        let onQueue = QueueMark.isCurrent(queue)
        QueueMark.run(on: queue) {
            daemon?.stop()
            // Read on the queue: a connection attached in a turn before this one is in the table,
            // and one attached after it sees `stopped`.
            let connections = state.withLock { Array($0.connections.values) }
            for connection in connections { connection.stop(reason: "the manager stopped") }
            for source in sources { source.stop() }
        }
        // Return once the sources have let go (USB: libusb's context is gone, so that a manager
        // made next does not overlap it), at most 5 s in all. The teardown runs on the queue:
        // from the queue itself there is nothing to wait for.
        if !onQueue {
            let deadline = DispatchTime.now() + 5
            for source in sources { source.waitUntilReleased(deadline: deadline) }
        }
        // Finished outside the lock: finishing runs the stream's onTermination, which takes it.
        let subscribers = state.withLock { state in
            defer { state.subscribers.removeAll() }
            return Array(state.subscribers.values)
        }
        for continuation in subscribers { continuation.finish() }
    }

    /// ``stop()`` for async code: the same, without blocking a thread of Swift's cooperative
    /// pool while USB is released (the wait runs on a Dispatch queue).
    public func shutdown() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            DispatchQueue(label: "AccessoryHost.shutdown").async {
                self.stop()
                continuation.resume()
            }
        }
    }

    /// Waits for an accessory matching `predicate` (one already connected counts), up to
    /// `timeout`; nil when none came.
    public func waitForAccessory(timeout: Duration, where predicate: @escaping @Sendable (Accessory) -> Bool = { _ in true }) async -> Accessory? {
        await firstOutcome(timeout: timeout, onTimeout: nil) { [self] finish in
            let subscription = onEvent(queue: queue) { event in
                if case let .connected(accessory) = event, predicate(accessory) { finish(accessory) }
            }
            if let found = connectedAccessories.first(where: predicate) { finish(found) }
            return subscription
        }
    }

    /// Waits until no connected accessory matches `predicate` (at once when none does now), up to
    /// `timeout`. Returns whether that happened in time: what a script waits for when an
    /// accessory is about to reboot or be unplugged.
    public func waitUntilNoAccessory(timeout: Duration, where predicate: @escaping @Sendable (Accessory) -> Bool = { _ in true }) async -> Bool {
        await firstOutcome(timeout: timeout, onTimeout: false) { [self] finish in
            // Judged on the queue, after the list changed: a disconnection is removed from the
            // list before it is published.
            let subscription = onEvent(queue: queue) { [weak self] event in
                if case .disconnected = event, !(self?.connectedAccessories.contains(where: predicate) ?? false) { finish(true) }
            }
            queue.async { [weak self] in
                if !(self?.connectedAccessories.contains(where: predicate) ?? false) { finish(true) }
            }
            return subscription
        }
    }

    /// Waits until every attached transport has either an identified accessory or has failed,
    /// up to `timeout`. Returns whether that happened in time.
    public func waitUntilSettled(timeout: Duration) async -> Bool {
        await firstOutcome(timeout: timeout, onTimeout: false) { [self] finish in
            let subscription = onEvent(queue: queue) { [weak self] _ in
                if self?.isSettled ?? true { finish(true) }
            }
            let key = state.withLock { state -> Int in
                state.nextSubscriber += 1
                state.settleWatchers[state.nextSubscriber] = { [weak self] in
                    if self?.isSettled ?? true { finish(true) }
                }
                return state.nextSubscriber
            }
            queue.async { [weak self] in
                if self?.isSettled ?? true { finish(true) }
            }
            return EventSubscription { [weak self] in
                subscription.cancel()
                _ = self?.state.withLock { $0.settleWatchers.removeValue(forKey: key) }
            }
        }
    }

    /// The value of the first `finish` call that `start` arranges (watching events through the
    /// subscription it returns), or `onTimeout` after `timeout`; later calls are ignored.
    private func firstOutcome<Value: Sendable>(
        timeout: Duration, onTimeout: Value,
        _ start: (_ finish: @escaping @Sendable (Value) -> Void) -> EventSubscription
    ) async -> Value {
        await withCheckedContinuation { (continuation: CheckedContinuation<Value, Never>) in
            // The first outcome resumes the caller and stops the watching, so a finished wait
            // does not keep running on every event until its timeout (which may be hours). The
            // timer itself stays scheduled, holding only this small state, and does nothing.
            let pending = Mutex(PendingWait(continuation: continuation))
            let finish: @Sendable (Value) -> Void = { value in
                let (continuation, subscription) = pending.withLock { state in
                    defer { state = PendingWait(finished: true) }
                    return (state.continuation, state.subscription)
                }
                subscription?.cancel()
                continuation?.resume(returning: value)
            }
            let subscription = start(finish)
            let alreadyFinished = pending.withLock { state -> Bool in
                guard !state.finished else { return true }
                state.subscription = subscription
                return false
            }
            if alreadyFinished {
                subscription.cancel()
                return
            }
            configuration.clock.after(timeout, on: queue) { finish(onTimeout) }
        }
    }

    /// On the queue: no connection is still working towards an identified accessory.
    private var isSettled: Bool {
        let (connections, opening, daemonPending) = state.withLock { ($0.connections.values.map { $0 }, $0.opening, $0.daemonPending) }
        return opening == 0 && !daemonPending && connections.allSatisfy { !$0.isPending }
    }

    private func connected(_ accessory: Accessory) {
        state.withLock { $0.accessories.append(accessory) }
        publish(.connected(accessory))
    }

    private func disconnected(_ accessory: Accessory, reason: String) {
        state.withLock { $0.accessories.removeAll { $0 === accessory } }
        publish(.disconnected(accessory, reason: reason))
    }

    private func closed(connectionID: Int, location: String, everIdentified: Bool, reason: String) {
        state.withLock { _ = $0.connections.removeValue(forKey: connectionID) }
        if !everIdentified { publish(.failed(location: location, reason: reason)) }
    }

    /// Tells the settle waits to look again, for a change that publishes no event (the daemon's
    /// list in, an opening dropped). On the queue.
    func wakeSettleWatchers() {
        let watchers = state.withLock { Array($0.settleWatchers.values) }
        for watcher in watchers { watcher() }
    }

    func publish(_ event: AccessoryEvent) {
        // In subscription order (a dictionary's own order varies from process to process).
        let (subscribers, callbacks) = state.withLock { state in
            (state.subscribers.values.map { $0 }, state.callbacks.sorted { $0.key < $1.key }.map(\.value))
        }
        for continuation in subscribers { continuation.yield(event) }
        for (queue, handler) in callbacks { queue.async { handler(event) } }
    }
}

/// Cancels an event subscription.
public final class EventSubscription: Sendable {
    private let cancellation: Mutex<(@Sendable () -> Void)?>
    init(_ cancel: @escaping @Sendable () -> Void) { cancellation = Mutex(cancel) }
    /// Stops the deliveries.
    public func cancel() {
        let cancel = cancellation.withLock { current -> (@Sendable () -> Void)? in
            defer { current = nil }
            return current
        }
        cancel?()
    }
    deinit { cancel() }
}

/// A wait of ``AccessoryManager`` until its first outcome.
private struct PendingWait<Value: Sendable>: Sendable {
    var continuation: CheckedContinuation<Value, Never>?
    var subscription: EventSubscription?
    var finished = false
}
