public import IAPWire
public import ByteRing

/// The state of an EA session on an ``IAP2Endpoint``.
public enum EASessionState: Hashable, Sendable {
    /// iAP1 device: OpenDataSessionForProtocol sent, not yet acknowledged. (An iAP2 session is
    /// never in this state: it is open once StartExternalAccessoryProtocolSession is queued.)
    case opening
    /// Open: bytes flow both ways (iAP2 device: from the moment StartExternalAccessoryProtocolSession
    /// is sent, as on an iPhone; accessory: on StartExternalAccessoryProtocolSession).
    case open
    /// Closed, with the reason (nil for a normal close).
    case closed(String?)
}

/// Why the control session stopped the connection.
public enum ControlFailure: Hashable, Sendable, CustomStringConvertible {
    /// The accessory did not answer a request in time (the step is named).
    case noAnswer(String)
    /// The authentication policy refused the certificate or the response.
    case authenticationFailed(String)
    /// The device rejected identification (accessory role sees this).
    case identificationRejected([UInt16])
    /// The device said authentication failed (accessory role sees this).
    case authenticationRefusedByDevice
    /// The peer made this side queue more control replies than ``IAP2Endpoint/controlQueueLimit``
    /// without acknowledging them (a flood of requests on a link that does not move).
    case overwhelmed(queued: Int)

    public var description: String {
        switch self {
        case let .noAnswer(step): return "the accessory did not answer \(step) in time"
        case let .authenticationFailed(why): return "authentication failed: \(why)"
        case let .identificationRejected(ids): return "identification rejected (parameters \(ids.map(String.init).joined(separator: ", ")))"
        case .authenticationRefusedByDevice: return "the device refused the accessory's authentication"
        case let .overwhelmed(queued):
            return "the accessory sent requests faster than it acknowledged the \(queued) replies waiting for it; disconnected to bound memory"
        }
    }
}

/// What an ``IAP2Endpoint`` tells its owner.
public enum EndpointEvent: Hashable, Sendable {
    /// Something the link reported (state changes, negotiation, drops, protocol violations), passed on
    /// as it came.
    case link(LinkEvent)
    /// Device: the accessory passed authentication, or the policy let it in although it did
    /// not (its certificate is kept; the outcome says which).
    case authenticated(certificate: [UInt8], outcome: AuthenticationOutcome)
    /// Device: identification accepted. Accessory: the device accepted ours.
    case identified(AccessoryIdentity)
    /// Device: identification rejected, with the reasons; the accessory may try again.
    case identificationRejected(IdentificationRejection)
    /// The control session ended the connection (no answer in time, authentication refused, a flood
    /// of requests): the owner should close the transport.
    case controlFailed(ControlFailure)
    /// A control message nobody handles (counted, never fatal).
    case unhandledMessage(MessageID)
    /// A control message that could not be decoded.
    case malformedMessage(String)
    /// An EA session is open: iAP2 device, StartExternalAccessoryProtocolSession was queued (the
    /// accessory's StatusExternalAccessoryProtocolSession is not waited for: many accessories never
    /// send it); iAP1 device, the accessory acknowledged the open; accessory, the device started it.
    case sessionOpened(sessionID: UInt16, protocolName: String)
    /// Device (iAP2): the accessory confirmed an open session with StatusExternalAccessoryProtocolSession
    /// status 0. Informational: the session was usable before.
    case sessionConfirmed(sessionID: UInt16)
    /// Device: the accessory asked for an application to be launched (RequestAppLaunch, 0xEA02),
    /// as accessories do after identification.
    case appLaunchRequested(AppLaunchRequest)
    /// Device: something the accessory did that the host tolerated rather than refused, as an
    /// iPhone does (a message it did not declare, a session id that is not open, an identification
    /// detail). Said once per kind on a connection, for the log; nothing depends on it.
    case tolerated(String)
    /// An EA session ended: closed by either side (`reason` nil) or refused or broken (`reason` says
    /// how). Bytes it received stay readable.
    case sessionClosed(sessionID: UInt16, reason: String?)
    /// Device (iAP2): the accessory's link acknowledged the StopExternalAccessoryProtocolSession
    /// sent when the owner closed the session: the accessory has the news that it is over.
    case sessionStopAcknowledged(sessionID: UInt16)
    /// Device (iAP2): the StopExternalAccessoryProtocolSession sent when the owner closed the
    /// session was not acknowledged within ``IAP2Endpoint/answerTimeout``. The session is closed
    /// on this side all the same.
    case sessionStopTimedOut(sessionID: UInt16, protocolName: String, after: Duration)
    /// New bytes are readable on a session.
    case bytesAvailable(sessionID: UInt16)
    /// A session that was full can take writes again.
    case spaceAvailable(sessionID: UInt16)
    /// Accessory: the device's PowerUpdate (its parameters).
    case powerUpdate([Parameter])
    /// iAP1: a packet of a lingo or command this side does not handle (the device answered it
    /// with iPodAck BadParameter).
    case unhandledIAP1Command(lingo: UInt8, command: UInt16)
    /// Device: the identified accessory started identifying again: the accessory known so far
    /// is gone, and the next ``identified(_:)`` announces it anew.
    case accessoryRestarted(reason: String)
    /// Device: the connection now speaks this protocol (the accessory showed it speaks iAP1, or
    /// an iAP1 accessory started over with the iAP2 detect).
    case protocolSwitched(IAPProtocolVersion)
}

/// Errors of the session calls.
public enum EndpointError: Error, Hashable, Sendable, CustomStringConvertible {
    /// A session was asked for before the accessory was identified (or on the accessory side, which
    /// does not open sessions).
    case notIdentified
    /// The accessory does not declare the protocol.
    case unsupportedProtocol(String)
    /// A session for the protocol is already open or opening: one per protocol.
    case protocolInUse(String)
    /// No session has this id (never opened, or forgotten after it closed).
    case unknownSession(UInt16)
    /// The session exists but is not open (still opening, or closed).
    case sessionNotOpen(UInt16)
    /// The accessory's SYN declared no External Accessory link session, so no EA data can travel.
    case noExternalAccessoryLinkSession

    public var description: String {
        switch self {
        case .notIdentified: return "the accessory is not identified yet"
        case let .unsupportedProtocol(name): return "the accessory does not declare the protocol '\(name)'"
        case let .protocolInUse(name): return "a session for '\(name)' is already open on this accessory; close it first"
        case let .unknownSession(id): return "no session \(id)"
        case let .sessionNotOpen(id): return "session \(id) is not open"
        case .noExternalAccessoryLinkSession: return "the link has no External Accessory session (the accessory's SYN declared none)"
        }
    }
}

/// One side of an iAP2 connection: the link, the control session (authentication,
/// identification, power) and the EA session router, as one deterministic state machine.
///
/// The device role is what the host runs; the accessory role is what the simulator runs. Like
/// ``IAP2Link``, it does no I/O and reads no clock: the owner feeds bytes and time and takes
/// output and events.
public struct IAP2Endpoint: Sendable {
    /// The link under the endpoint: its state, negotiated parameters and statistics.
    public private(set) var link: IAP2Link
    private var upper: Upper
    /// The array the link's events are taken into, kept for the next time.
    private var linkEventScratch = ReusableArray<LinkEvent>()

    /// Most control messages this side keeps queued for the peer. Only a peer that keeps asking
    /// (StartPowerUpdates, identification…) while acknowledging nothing gets near it; past it the
    /// connection fails with ``ControlFailure/overwhelmed(queued:)``.
    public static let controlQueueLimit = 256

    /// How long the device waits for each answer of the accessory during authentication and
    /// identification, and for the link's
    /// acknowledgement of StopExternalAccessoryProtocolSession (then
    /// ``EndpointEvent/sessionStopTimedOut(sessionID:protocolName:after:)``).
    public var answerTimeout: Duration {
        get { upper.answerTimeout }
        set { upper.answerTimeout = newValue }
    }

    /// Device role, on a Bluetooth connection: the peer's address (six bytes, most significant
    /// first), which the accessory's BluetoothTransportComponent must declare (see
    /// ``AccessoryIdentity/validate(_:bluetoothAddress:)``). Nil elsewhere.
    public var peerBluetoothAddress: [UInt8]? {
        get { upper.peerBluetoothAddress }
        set { upper.peerBluetoothAddress = newValue }
    }

    /// Accessory role: the RequestAppLaunch (0xEA02) this side sends right after the device
    /// accepts its identification, when its identity lists 0xEA02 among the messages it sends
    /// (nil: none).
    public var appLaunchRequest: AppLaunchRequest? {
        get { upper.appLaunch }
        set { upper.appLaunch = newValue }
    }

    /// Accessory role: how long this side's coprocessor takes to answer the device's challenge
    /// (the TD300's needs about 100 ms, PROTOCOL.md §7.2); zero answers at once.
    public var challengeResponseDelay: Duration {
        get { upper.challengeDelay }
        set { upper.challengeDelay = newValue }
    }

    /// Creates the device side. `randomSeed` is not used: every authentication challenge is a
    /// fresh draw of the system's generator.
    public init(device configuration: LinkConfiguration = .device, policy: any AuthenticationPolicy = AcceptingAuthentication(),
                sessionBufferLimit: Int = 1 << 20, initialSequence: UInt8, randomSeed: UInt64) {
        // The packets this side says it takes fit a session's buffer whole, so the buffer's
        // limit holds for a peer that keeps to what it was told.
        var configuration = configuration
        let fitting = UInt16(clamping: max(128, sessionBufferLimit + LinkPacketHeader.overhead + EASessionData.headerSize))
        configuration.parameters.maxPacketLength = min(configuration.parameters.maxPacketLength, fitting)
        link = IAP2Link(role: .device, configuration: configuration, initialSequence: initialSequence)
        upper = Upper(role: .device, identity: nil, policy: policy, bufferLimit: sessionBufferLimit)
    }

    /// Creates the accessory side with the identity it will declare.
    ///
    /// - Parameters:
    ///   - identity: what it declares in IdentificationInformation.
    ///   - configuration: its link parameters.
    ///   - certificate: what it sends as its certificate when it has no `signer`.
    ///   - signer: its coprocessor: the certificate it sends and the signatures of the device's
    ///     challenges. Without one it answers with a stand-in no verifying host accepts.
    ///   - sessionBufferLimit: bytes held per session and direction.
    ///   - initialSequence: the link's first sequence number.
    ///   - randomSeed: not used (the accessory draws no challenges).
    public init(accessory identity: AccessoryIdentity, configuration: LinkConfiguration = .accessory,
                certificate: [UInt8] = [UInt8](repeating: 0x30, count: 608), signer: (any AuthenticationSigner)? = nil,
                sessionBufferLimit: Int = 1 << 20, initialSequence: UInt8, randomSeed: UInt64) {
        link = IAP2Link(role: .accessory, configuration: configuration, initialSequence: initialSequence)
        upper = Upper(role: .accessory, identity: identity, policy: AcceptingAuthentication(), bufferLimit: sessionBufferLimit)
        upper.certificate = signer?.certificate ?? certificate
        upper.signer = signer
    }

    // MARK: Driving

    /// Starts the link at `now` (an accessory sends its detect; see ``IAP2Link/start(now:)``).
    public mutating func start(now: LinkTime) {
        link.start(now: now)
        settle(now: now)
    }

    /// Feeds bytes received at `now`, in any chunks; what they cause is queued as output
    /// (``takeOutput()``) and events (``takeEvents()``). EA data in them is copied into the sessions'
    /// buffers; pass an array or a lease to keep it without a copy.
    public mutating func receive(_ bytes: RawSpan, now: LinkTime) {
        upper.now = now
        link.receive(bytes, now: now, sink: &upper)
        settle(now: now)
    }

    /// Feeds received bytes held in an array: EA data that lies whole in it is kept as a view of
    /// it (no copy) until read.
    public mutating func receive(_ bytes: [UInt8], now: LinkTime) {
        upper.now = now
        link.receive(bytes, now: now, sink: &upper)
        settle(now: now)
    }

    /// Feeds received bytes lent by the transport (a USB IN slot): EA data that lies whole in
    /// them is kept as a view of the lease (no copy) until read.
    public mutating func receive(lent lease: SlotLease, now: LinkTime) {
        upper.now = now
        link.receive(lent: lease, now: now, sink: &upper)
        settle(now: now)
    }

    /// Tells the link how far the transport has got with its output
    /// (``IAP2Link/noteOutputProgress(_:)``).
    public mutating func noteOutputProgress(_ progress: TransportOutputProgress) { link.noteOutputProgress(progress) }

    /// Lets time pass to `now`: link retransmissions and acknowledgements, partial frames given up,
    /// answer timeouts of the control session and of EA sessions.
    public mutating func advance(to now: LinkTime) {
        upper.now = now
        link.advance(to: now, sink: &upper)
        upper.advance(to: now)
        settle(now: now)
    }

    /// When ``advance(to:)`` is next needed: the earlier of the link's and the control session's
    /// deadlines; nil when nothing is pending.
    public var nextDeadline: LinkTime? {
        switch (link.nextDeadline, upper.nextDeadline) {
        case let (a?, b?): return min(a, b)
        case let (a, b): return a ?? b
        }
    }

    /// Packets to transmit, oldest first.
    public mutating func takeOutput() -> [[UInt8]] { link.takeOutput() }
    /// Appends the packets to transmit to `frames` (swapping storage when it is empty: a caller
    /// that empties and passes the same array each time allocates nothing).
    public mutating func takeOutput(into frames: inout [[UInt8]]) { link.takeOutput(into: &frames) }
    /// Appends the packets to transmit to `frames` as they lie (see ``IAP2Link/takeFrames(into:)``).
    public mutating func takeFrames(into frames: inout [LinkFrame]) { link.takeFrames(into: &frames) }
    /// Whether packets are waiting.
    public var hasOutput: Bool { link.hasOutput }
    /// Buffers the transport lends for outgoing packets (see ``IAP2Link/transmitBuffers``).
    public var transmitBuffers: PacketBufferPool? {
        get { link.transmitBuffers }
        set { link.transmitBuffers = newValue }
    }

    /// Events since the last call.
    public mutating func takeEvents() -> [EndpointEvent] {
        var taken: [EndpointEvent] = []
        takeEvents(into: &taken)
        return taken
    }

    /// Appends the events since the last call to `taken` (swapping storage when it is empty).
    public mutating func takeEvents(into taken: inout [EndpointEvent]) {
        IAP2Link.move(&upper.events, into: &taken)
    }

    /// The identity, once identification is accepted.
    public var identity: AccessoryIdentity? { upper.identified ? upper.identity : nil }

    /// Device: what the policy concluded about the accessory's authentication on this link so far
    /// (``AuthenticationOutcome/notChecked`` before the certificate arrives).
    public var authentication: AuthenticationOutcome { upper.authentication }

    /// Link events and upper-layer reactions to them, then moves queued control messages and EA
    /// data into the link as far as its window and queue allow.
    private mutating func settle(now: LinkTime) {
        // Acknowledgements first: ACKs that came with a reset or a failure (in the same batch)
        // still count before the link-down below forgets what was in flight.
        upper.noteAcknowledgements(link)
        var linkEvents = linkEventScratch.take()
        link.takeEvents(into: &linkEvents)
        defer { linkEventScratch.putBack(&linkEvents) }
        for event in linkEvents {
            upper.events.append(.link(event))
            switch event {
            case let .negotiated(parameters):
                upper.linkUp(parameters, now: now)
                // Control packets are numbered from here: the ones acknowledged so far are not ours.
                upper.controlAcknowledgedBase = upper.controlSessionID.flatMap { link.acknowledgedPackets[$0] } ?? 0
            case .stateChanged(.negotiating), .stateChanged(.failed), .stateChanged(.sleeping), .stateChanged(.detecting):
                upper.linkDown()
            default:
                break
            }
        }
        upper.noteStopAcknowledgements(link)
        guard link.state == .connected else { return }
        while let message = upper.controlOut.first {
            guard let controlSession = upper.controlSessionID, link.canSend else { break }
            if link.send(sessionID: controlSession, payload: message, now: now) {
                _ = upper.controlOut.popFirst()
            } else {
                break
            }
        }
        upper.pumpData(into: &link, now: now)
    }

    /// Queues a raw payload on link session `sessionID`, past the control session and the EA
    /// router: how a test plays an accessory using a link session the host does not (file
    /// transfer). False when the link does not take it now.
    mutating func sendLinkPayload(sessionID: UInt8, payload: [UInt8], now: LinkTime) -> Bool {
        link.send(sessionID: sessionID, payload: payload, now: now)
    }

    /// Hands over the received bytes of a partial frame (for the switch to iAP1).
    public mutating func takeUnscannedBytes() -> [UInt8] { link.takeUnscannedBytes() }

    /// Sends a control message as it is (for messages this layer does not originate itself, and
    /// for tests of a peer's robustness).
    public mutating func sendControlMessage(_ message: ControlMessage, now: LinkTime) {
        upper.send(message)
        settle(now: now)
    }

    /// Device: resets the link (RST). Open sessions end; the accessory renegotiates and is
    /// authenticated and identified again.
    public mutating func resetLink(now: LinkTime) {
        link.reset(now: now)
        settle(now: now)
    }

    /// Device: tells the accessory this side goes to sleep (SLP). Sessions end.
    public mutating func suspendLink(now: LinkTime) {
        link.suspend(now: now)
        settle(now: now)
    }

    /// Accessory: wakes after the device's SLP and starts over with the detect.
    public mutating func wake(now: LinkTime) {
        link.wake(now: now)
        settle(now: now)
    }

    // MARK: Sessions

    /// Device: opens an EA session for `protocolName`.
    ///
    /// The session is open at once, as on an iPhone: StartExternalAccessoryProtocolSession is
    /// queued, data written now follows it on the link, and the accessory's
    /// StatusExternalAccessoryProtocolSession is not waited for (docs/LENIENCY.md).
    ///
    /// - Returns: the new EA session id; ``EndpointEvent/sessionOpened(sessionID:protocolName:)``
    ///   is among the next events taken.
    public mutating func openSession(protocolName: String, now: LinkTime) throws(EndpointError) -> UInt16 {
        upper.now = now
        let id = try upper.openSession(protocolName: protocolName)
        settle(now: now)
        return id
    }

    /// Closes a session (the device tells the accessory; the accessory just forgets it). In the
    /// device role, ``EndpointEvent/sessionStopAcknowledged(sessionID:)`` follows once the
    /// accessory's link acknowledged the stop, or
    /// ``EndpointEvent/sessionStopTimedOut(sessionID:protocolName:after:)`` after ``answerTimeout``.
    public mutating func closeSession(_ sessionID: UInt16, now: LinkTime) {
        upper.now = now
        upper.closeSession(sessionID, reason: nil, notifyPeer: true)
        settle(now: now)
    }

    /// Device: whether the stop of a session closed by ``closeSession(_:now:)`` waits for the
    /// accessory's acknowledgement (false once acknowledged or given up on, and when no stop
    /// was sent: the session was not live, or the link is down).
    public func isStopPending(_ sessionID: UInt16) -> Bool {
        upper.stopsInFlight.contains { $0.id == sessionID }
    }

    /// Queues bytes for a session; returns how many were taken (fewer under back-pressure).
    public mutating func write(_ sessionID: UInt16, _ bytes: some Collection<UInt8>, now: LinkTime) throws(EndpointError) -> Int {
        if let slice = bytes as? ArraySlice<UInt8> { return try write(sessionID, span: slice.span.bytes, now: now) }
        let array = Array(bytes)
        return try write(sessionID, span: array.span.bytes, now: now)
    }

    /// Queues bytes for a session from a view of them; returns how many were taken. The bytes
    /// are copied once, into the link packets that will carry them.
    public mutating func write(_ sessionID: UInt16, span bytes: RawSpan, now: LinkTime) throws(EndpointError) -> Int {
        let taken = try upper.write(sessionID, bytes, link: &link)
        settle(now: now)
        return taken
    }

    /// Takes up to `maxBytes` received bytes of a session. The room this makes lets packets the
    /// link had to refuse come in at once.
    public mutating func read(_ sessionID: UInt16, maxBytes: Int = .max) -> [UInt8] {
        let bytes = upper.read(sessionID, maxBytes: maxBytes)
        if !bytes.isEmpty {
            link.redeliver(now: upper.now, sink: &upper)
            settle(now: upper.now)
        }
        return bytes
    }

    /// Takes up to `maxBytes` of the next received bytes of a session as a view of the array
    /// they arrived in, without copying them (a copy when they lie in a lent USB slot; empty
    /// when nothing is readable). Like
    /// ``read(_:maxBytes:)``, the room this makes lets refused packets in.
    public mutating func readChunk(_ sessionID: UInt16, maxBytes: Int = .max) -> ArraySlice<UInt8> {
        let bytes = upper.readChunk(sessionID, maxBytes: maxBytes)
        if !bytes.isEmpty {
            link.redeliver(now: upper.now, sink: &upper)
            settle(now: upper.now)
        }
        return bytes
    }

    /// Lends the next received bytes of a session in place, without copying them: `body` gets a
    /// view of them and returns how many it consumed. Returns nil when nothing is readable.
    public mutating func borrow<Result>(_ sessionID: UInt16, _ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        let result = try upper.borrow(sessionID, body)
        if result != nil {
            link.redeliver(now: upper.now, sink: &upper)
            settle(now: upper.now)
        }
        return result
    }

    /// Bytes readable on a session.
    public func bytesAvailable(_ sessionID: UInt16) -> Int { upper.sessions[sessionID]?.inbound.byteCount ?? 0 }
    /// Bytes a session may still queue for sending.
    public func spaceAvailable(_ sessionID: UInt16) -> Int {
        guard let session = upper.sessions[sessionID], session.state == .open else { return 0 }
        return max(0, upper.bufferLimit - session.outbound.byteCount)
    }
    /// Bytes written to a session and not yet handed to the link.
    public func bytesPending(_ sessionID: UInt16) -> Int { upper.sessions[sessionID]?.outbound.byteCount ?? 0 }
    /// Bytes written to a session that the peer's link acknowledged (they reached the peer's
    /// link layer, in order); 0 for a session that is not open.
    public func bytesAcknowledged(_ sessionID: UInt16) -> Int { upper.sessions[sessionID]?.acknowledged ?? 0 }
    /// The state of session `sessionID`; nil for an id that was never opened (or was forgotten).
    public func sessionState(_ sessionID: UInt16) -> EASessionState? { upper.sessions[sessionID]?.state }
    /// The open (or opening) sessions and their protocol names.
    public var sessions: [(id: UInt16, protocolName: String)] {
        upper.sessions.entries.filter { $0.state == .open || $0.state == .opening }
            .sorted { $0.id < $1.id }.map { ($0.id, $0.protocolName) }
    }
    /// Control messages received that nobody handles.
    public var unhandledMessages: Int { upper.unhandledMessages }

    /// How many session bytes this endpoint moved and how many of them it copied, the link's
    /// copies on the way in included.
    public var dataPlane: DataPlaneStatistics {
        // The link's copies out are of control messages only (session data reaches it framed);
        // its copies in are of session and control packets alike (reassembled or parked).
        var counts = upper.dataPlane
        counts.bytesCopiedIn += link.statistics.payloadBytesCopiedIn
        return counts
    }
}

/// Received bytes queued where they arrived, with a running count: the received bytes of one
/// session, kept in the arrays or lent USB slots they arrived in (``ReceivedBytes``), or the one
/// copy the endpoint made of bytes it could not keep. Lending them (``borrowFirst(_:)``) copies
/// nothing; taking them as views of arrays (``takeChunk(_:)``) copies only what lies in a lent
/// slot; taking them as an array (``take(_:)``) copies once, into that array, unless a whole
/// array of the queue's own can be handed over as it is.
public struct ChunkQueue: Sendable {
    private struct Chunk: Sendable {
        var bytes: ReceivedBytes
        /// The slice is a whole array nobody else holds: it can be returned as it is.
        var owned: Bool
    }
    private var chunks = FIFO<Chunk>()
    /// The bytes queued.
    public private(set) var byteCount = 0

    /// An empty queue.
    public init() {}

    /// Whether nothing is queued.
    public var isEmpty: Bool { byteCount == 0 }

    /// The oldest queued bytes: a view of the first chunk (nil when empty).
    public var first: ReceivedBytes? { chunks.first?.bytes }

    /// Queues a view of bytes. `owned` says the slice is a whole array nobody else holds (a copy
    /// the caller made), which ``take(_:)`` may then hand over without copying.
    public mutating func append(_ bytes: ArraySlice<UInt8>, owned: Bool) {
        guard !bytes.isEmpty else { return }
        chunks.append(Chunk(bytes: ReceivedBytes(bytes), owned: owned))
        byteCount += bytes.count
    }

    /// Queues received bytes kept where they arrived (an array or a lent slot).
    public mutating func append(_ bytes: ReceivedBytes) {
        guard !bytes.isEmpty else { return }
        chunks.append(Chunk(bytes: bytes, owned: false))
        byteCount += bytes.count
    }

    /// Takes up to `maxBytes` as one array; `copied` counts the bytes copied to make it.
    public mutating func take(_ maxBytes: Int) -> (bytes: [UInt8], copied: Int) {
        guard maxBytes > 0, let first = chunks.first else { return ([], 0) }
        // A whole array of our own that fits, with nothing after it that would also fit: hand it
        // over as it is.
        if first.owned, first.bytes.count <= maxBytes,
           chunks.count == 1 || first.bytes.count == maxBytes {
            _ = chunks.popFirst()
            byteCount -= first.bytes.count
            return (Array(first.bytes.arraySlice().bytes), 0)
        }
        var result: [UInt8] = []
        result.reserveCapacity(min(maxBytes, byteCount))
        while result.count < maxBytes, let chunk = chunks.first {
            let take = min(maxBytes - result.count, chunk.bytes.count)
            chunk.bytes.prefix(take).append(to: &result)
            removeFirst(take)
        }
        return (result, result.count)
    }

    /// Takes up to `maxBytes` of the first chunk as a view of the array it lies in (no copy), or
    /// a copy when it lies in a lent slot (`copied` counts the bytes copied).
    public mutating func takeChunk(_ maxBytes: Int) -> (bytes: ArraySlice<UInt8>, copied: Int) {
        guard maxBytes > 0, let chunk = chunks.first else { return ([], 0) }
        let taken = chunk.bytes.prefix(maxBytes).arraySlice()
        removeFirst(taken.bytes.count)
        return taken
    }

    /// Drops `count` bytes from the front of the first chunk (at most its length).
    public mutating func removeFirst(_ count: Int) {
        guard count > 0, let chunk = chunks.first else { return }
        let dropped = min(count, chunk.bytes.count)
        if dropped == chunk.bytes.count {
            _ = chunks.popFirst()
        } else {
            chunks.withFirst { $0.bytes = $0.bytes.dropFirst(dropped); $0.owned = false }
        }
        byteCount -= dropped
    }

    /// Empties the queue.
    public mutating func removeAll() {
        chunks.removeAll()
        byteCount = 0
    }

    /// Lends the bytes of the first chunk in place; `body` says how many it consumed.
    public mutating func borrowFirst<Result>(_ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        guard let chunk = chunks.first else { return nil }
        let (consumed, result) = try chunk.bytes.withSpan(body)
        removeFirst(max(0, consumed))
        return result
    }
}

/// The EA sessions of an endpoint, in an array searched by id (there are few): a session is
/// changed in place through ``with(_:_:)``, with no copy of its queues and no allocation (a
/// dictionary's in-place access allocates for a value this large).
struct SessionTable: Sendable {
    private(set) var entries: [Upper.Session] = []

    /// A copy of the session `id`, to read it.
    subscript(id: UInt16) -> Upper.Session? { entries.first { $0.id == id } }

    func contains(_ id: UInt16) -> Bool { entries.contains { $0.id == id } }

    /// The ids, in order.
    var ids: [UInt16] { entries.map(\.id).sorted() }

    mutating func insert(_ session: Upper.Session) {
        remove(session.id)
        entries.append(session)
    }

    mutating func remove(_ id: UInt16) { entries.removeAll { $0.id == id } }

    /// Runs `body` on the session `id` in place; nil when there is none.
    mutating func with<Result>(_ id: UInt16, _ body: (inout Upper.Session) throws -> Result) rethrows -> Result? {
        guard let index = entries.firstIndex(where: { $0.id == id }) else { return nil }
        return try body(&entries[index])
    }
}

/// Bytes written to one session and not yet handed to the link, already laid out as link packets:
/// each element is storage from the link (a transmit buffer the transport lent, or an array from
/// ``LinkPacket/framedBuffer(payloadCapacity:)``) holding the header's headroom, the EA session
/// id and up to one packet's worth of application bytes. The application's bytes are copied
/// once, into this storage; the link finishes each packet where it lies and the transport sends
/// a transmit buffer as it is.
struct OutboundQueue: Sendable {
    private var packets = FIFO<LinkFrame>()
    /// Application bytes queued (EA headers and headroom not counted).
    private(set) var byteCount = 0
    /// The smallest buffer made for a short write, so a run of small writes shares packets.
    static let minimumBuffer = 1_024
    /// Writes at least this long get a buffer of a whole packet.
    static let largeWrite = 4_096

    /// Copies up to `limit - byteCount` bytes of `bytes` into packets of at most `chunk`
    /// application bytes each; returns how many were taken.
    mutating func append(_ bytes: RawSpan, sessionID: UInt16, chunk: Int, limit: Int, buffers link: inout IAP2Link) -> Int {
        let total = min(max(0, limit - byteCount), bytes.byteCount)
        guard chunk > 0, total > 0 else { return 0 }
        let headroom = LinkPacketHeader.size + EASessionData.headerSize
        var taken = 0
        while taken < total {
            // Fill the newest packet up to its capacity (one byte stays free for the checksum),
            // so it never grows by reallocation; otherwise start a new one.
            let filled = packets.withLast { packet -> Int in
                let room = min(headroom + chunk, packet.capacity - 1) - packet.count
                guard room > 0 else { return 0 }
                let count = min(room, total - taken)
                packet.append(bytes.extracting(taken..<(taken + count)))
                return count
            } ?? 0
            if filled > 0 {
                taken += filled
                continue
            }
            // A write of a few KiB or more gets a whole packet's room (later writes fill it);
            // a short one a small buffer.
            let remaining = total - taken
            let capacity = EASessionData.headerSize
                + (remaining >= Self.largeWrite ? chunk : min(chunk, max(remaining, Self.minimumBuffer)))
            var packet = link.packetStorage(payloadCapacity: capacity)
            packet.append(UInt8(sessionID >> 8))
            packet.append(UInt8(sessionID & 0xFF))
            packets.append(packet)
        }
        byteCount += taken
        return taken
    }

    /// Takes the oldest packet and the number of application bytes it carries.
    mutating func popPacket() -> (packet: LinkFrame, dataBytes: Int)? {
        guard let packet = packets.popFirst() else { return nil }
        let data = packet.count - LinkPacketHeader.size - EASessionData.headerSize
        byteCount -= data
        return (packet, data)
    }

    mutating func removeAll() {
        packets.removeAll()
        byteCount = 0
    }
}

/// The control session and the EA router: everything above the link.
struct Upper: LinkSink, Sendable {
    struct Session: Sendable {
        var id: UInt16
        var protocolName: String
        var protocolID: UInt8
        var state: EASessionState
        var inbound = ChunkQueue()
        var outbound = OutboundQueue()
        var wasFull = false
        /// Bytes of this session the peer's link acknowledged.
        var acknowledged = 0
    }

    enum ControlStep: Sendable {
        case idle
        case awaitingCertificate
        case awaitingResponse(certificate: [UInt8], challenge: [UInt8])
        case awaitingIdentification
        case done
    }

    let role: LinkRole
    var identity: AccessoryIdentity?
    var identified = false
    let policy: any AuthenticationPolicy
    let bufferLimit: Int
    var certificate: [UInt8] = []
    /// Accessory: the coprocessor that signs challenges (nil: the stand-in response).
    var signer: (any AuthenticationSigner)?
    /// Device: the policy's conclusion on this link's authentication.
    var authentication = AuthenticationOutcome.notChecked
    /// Device: the policy accepted the accessory's authentication on this link.
    var authenticationPassed = false
    var answerTimeout: Duration = .seconds(10)
    var peerBluetoothAddress: [UInt8]?
    /// Accessory: the RequestAppLaunch sent after identification, when the identity declares it.
    var appLaunch: AppLaunchRequest?
    /// Accessory: how long its coprocessor takes to answer a challenge, and the answer waiting
    /// for that time to pass.
    var challengeDelay: Duration = .zero
    var delayedResponse: (message: ControlMessage, at: LinkTime)?
    var now: LinkTime = .zero

    var events: [EndpointEvent] = []
    var controlOut = FIFO<[UInt8]>()
    /// Control messages queued since the link came up (the number of the last one queued), and
    /// the link's count of acknowledged control packets when it came up. Each message is one
    /// packet, sent and acknowledged in order: message n is acknowledged once the link counts
    /// `controlAcknowledgedBase + n`.
    var controlQueuedSinceUp = 0
    var controlAcknowledgedBase = 0
    /// Device: the stops sent for sessions the owner closed, until the accessory's link
    /// acknowledges them or `deadline` passes (at most one per closed session).
    var stopsInFlight: [(id: UInt16, name: String, number: Int, deadline: LinkTime)] = []
    /// Set once the control queue overflowed: nothing more is queued on this connection.
    var overwhelmed = false
    var controlSessionID: UInt8?
    var eaLinkSessionID: UInt8?
    /// What each EA data packet handed to the link and not yet acknowledged carries, in the order
    /// sent (at most the link's window plus its queue).
    var dataInFlight = FIFO<(session: UInt16, bytes: Int)>()
    /// The link's counts of acknowledged packets (per link session) already attributed.
    var acknowledgedSeen: [UInt8: Int] = [:]
    var step: ControlStep = .idle
    var deadline: LinkTime?
    var sessions = SessionTable()
    var nextSessionID: UInt16 = 1
    var unhandledMessages = 0
    /// The kinds of tolerance already reported on this connection (``EndpointEvent/tolerated(_:)``
    /// is said once per kind).
    var toleratedKinds = Set<String>()
    var roundRobin: [UInt16] = []
    /// The data plane's copies of session bytes (see ``DataPlaneStatistics``).
    var dataPlane = DataPlaneStatistics()

    init(role: LinkRole, identity: AccessoryIdentity?, policy: any AuthenticationPolicy, bufferLimit: Int) {
        self.role = role
        self.identity = identity
        self.policy = policy
        self.bufferLimit = bufferLimit
    }

    // MARK: Link up and down

    mutating func linkUp(_ parameters: LinkParameters, now: LinkTime) {
        controlQueuedSinceUp = 0
        controlSessionID = parameters.session(ofType: .control)?.id
        eaLinkSessionID = parameters.session(ofType: .externalAccessory)?.id
        identified = role == .accessory ? false : identified
        if role == .device {
            identified = false
            identity = nil
            authentication = .notChecked
            authenticationPassed = false
            send(ControlMessage(id: .requestAuthenticationCertificate))
            step = .awaitingCertificate
            deadline = now + answerTimeout
        }
    }

    mutating func linkDown() {
        // The link discards what it had in flight: none of it will be acknowledged.
        dataInFlight.removeAll()
        for id in sessions.ids { closeSession(id, reason: "the link went down", notifyPeer: false) }
        controlOut.removeAll()
        stopsInFlight.removeAll() // never to be acknowledged: the owner sees the link go down
        delayedResponse = nil
        step = .idle
        deadline = nil
        if role == .device { identified = false }
    }

    /// The soonest of the control step's deadline and the stops'.
    var nextDeadline: LinkTime? {
        var soonest = deadline
        for stop in stopsInFlight where soonest.map({ stop.deadline < $0 }) ?? true { soonest = stop.deadline }
        if let delayed = delayedResponse, soonest.map({ delayed.at < $0 }) ?? true { soonest = delayed.at }
        return soonest
    }

    /// Says ``EndpointEvent/tolerated(_:)`` once per `kind` on this connection.
    mutating func tolerate(_ kind: String, _ text: @autoclosure () -> String) {
        guard role == .device, toleratedKinds.insert(kind).inserted else { return }
        events.append(.tolerated(text()))
    }

    mutating func advance(to now: LinkTime) {
        if let delayed = delayedResponse, delayed.at <= now {
            delayedResponse = nil
            send(delayed.message)
        }
        let overdue = stopsInFlight.filter { $0.deadline <= now }
        if !overdue.isEmpty {
            stopsInFlight.removeAll { $0.deadline <= now }
            for stop in overdue {
                events.append(.sessionStopTimedOut(sessionID: stop.id, protocolName: stop.name, after: answerTimeout))
            }
        }
        guard let deadline, deadline <= now else { return }
        self.deadline = nil
        let what: String
        switch step {
        case .awaitingCertificate: what = "the certificate request"
        case .awaitingResponse: what = "the authentication challenge"
        case .awaitingIdentification: what = "StartIdentification"
        case .idle, .done: return
        }
        step = .done
        events.append(.controlFailed(.noAnswer(what)))
    }

    // MARK: LinkSink

    mutating func accept(sessionID: UInt8, payload: RawSpan) -> Bool {
        accept(sessionID: sessionID, payload: payload, retained: nil)
    }

    mutating func accept(sessionID: UInt8, payload: RawSpan, retained: ReceivedBytes?) -> Bool {
        if sessionID == controlSessionID {
            var offset = 0
            while offset < payload.byteCount {
                do {
                    let (message, length) = try ControlMessage.decode(prefixOf: payload.extracting(offset..<payload.byteCount))
                    handle(message)
                    offset += length
                } catch {
                    events.append(.malformedMessage(error.description))
                    break
                }
            }
            return true
        }
        guard sessionID == eaLinkSessionID else {
            // A link session the host does not use (file transfer): accepted in the SYN, left idle.
            tolerate("idle-link-session", "packets on link session \(sessionID), which the host does not use, are acknowledged and ignored")
            return true
        }
        guard let (id, range) = try? EASessionData.decode(payload) else {
            events.append(.malformedMessage("EA data shorter than its session id"))
            return true
        }
        guard let queued = sessions[id]?.inbound.byteCount, sessions[id]?.state == .open else {
            // Not open here (never opened, or closed): taken and dropped, as nothing will read it.
            tolerate("ea-data-not-open", "EA data for session \(id), which is not open on this side, was dropped")
            return true
        }
        // Back-pressure. A packet larger than the whole buffer (a peer that sends more than
        // it was told it may) is still taken into an empty one rather than refused for ever:
        // a session then holds at most its limit plus one packet.
        if queued > 0, queued + range.count > bufferLimit { return false }
        guard !range.isEmpty else { return true }
        dataPlane.bytesReceived += range.count
        if let retained {
            // Kept as a view of the array or the lent slot the bytes arrived in: no copy.
            sessions.with(id) { $0.inbound.append(retained.extracting(range)) }
        } else {
            dataPlane.bytesCopiedIn += range.count
            let copy = payload.extracting(range).withUnsafeBytes { Array($0) }
            sessions.with(id) { $0.inbound.append(copy[...], owned: true) }
        }
        if queued == 0 { events.append(.bytesAvailable(sessionID: id)) }
        return true
    }

    // MARK: Control messages

    mutating func send(_ message: ControlMessage) {
        guard !overwhelmed else { return }
        guard controlOut.count < IAP2Endpoint.controlQueueLimit else {
            // Replies pile up only when the peer keeps asking and does not acknowledge: bound
            // them, and end the connection rather than grow.
            overwhelmed = true
            let queued = controlOut.count
            controlOut.removeAll()
            fail(.overwhelmed(queued: queued))
            return
        }
        if let bytes = try? message.encoded() {
            controlOut.append(bytes)
            controlQueuedSinceUp += 1
        }
    }

    /// Tells which stops the accessory's link acknowledged since the last call.
    mutating func noteStopAcknowledgements(_ link: IAP2Link) {
        guard !stopsInFlight.isEmpty, let control = controlSessionID else { return }
        let acknowledged = (link.acknowledgedPackets[control] ?? 0) - controlAcknowledgedBase
        let done = stopsInFlight.filter { $0.number <= acknowledged }
        guard !done.isEmpty else { return }
        stopsInFlight.removeAll { $0.number <= acknowledged }
        for stop in done { events.append(.sessionStopAcknowledged(sessionID: stop.id)) }
    }

    mutating func handle(_ message: ControlMessage) {
        switch role {
        case .device: deviceHandle(message)
        case .accessory: accessoryHandle(message)
        }
    }

    mutating func deviceHandle(_ message: ControlMessage) {
        if identified, let identity, !identity.messagesSent.contains(message.id.rawValue),
           message.id != .identificationInformation {
            // iOS is not known to refuse these; the message is handled as if declared.
            tolerate("undeclared-\(message.id.rawValue)",
                     "the accessory sent \(message.id), which its identification does not list among the messages it sends; handled all the same")
        }
        switch (message.id, step) {
        case (.authenticationCertificate, .awaitingCertificate):
            let certificate = message.parameter(0)?.data ?? []
            let examination = policy.examine(certificate: certificate)
            if let refusal = examination.refusal {
                authentication = AuthenticationOutcome(status: .notVerified(refusal), accepted: false, certificate: examination.summary)
                send(ControlMessage(id: .authenticationFailed))
                fail(.authenticationFailed(refusal.description))
                return
            }
            let length = examination.scheme?.challengeLength ?? policy.challengeLength(certificate: certificate)
            let challenge = Challenge.draw(length: length)
            send(ControlMessage(id: .requestAuthenticationChallengeResponse, parameters: [.blob(0, challenge)]))
            step = .awaitingResponse(certificate: certificate, challenge: challenge)
            deadline = now + answerTimeout
        case let (.authenticationResponse, .awaitingResponse(certificate, challenge)):
            let response = message.parameter(0)?.data ?? []
            let outcome = policy.outcome(certificate: certificate, challenge: challenge, response: response)
            authentication = outcome
            guard outcome.accepted else {
                send(ControlMessage(id: .authenticationFailed))
                fail(.authenticationFailed(outcome.failure?.description ?? "the challenge response did not verify"))
                return
            }
            authenticationPassed = true
            send(ControlMessage(id: .authenticationSucceeded))
            events.append(.authenticated(certificate: certificate, outcome: outcome))
            send(ControlMessage(id: .startIdentification))
            step = .awaitingIdentification
            deadline = now + answerTimeout
        case (.identificationInformation, .awaitingIdentification), (.identificationInformation, .done):
            // Identification follows an accepted authentication on this link, never a refused,
            // missing or unanswered one (whatever the owner does with the failure).
            guard authenticationPassed else {
                unhandledMessages += 1
                events.append(.unhandledMessage(message.id))
                return
            }
            switch AccessoryIdentity.validate(message, bluetoothAddress: peerBluetoothAddress) {
            case var .success(identity):
                if let wrong = identity.wronglyDirectedMessages { tolerate("message-lists", "\(wrong); accepted all the same") }
                let unknown = Set(message.parameters.map(\.id).filter { MessageCatalogue.identificationParameters[$0] == nil }).sorted()
                if !unknown.isEmpty {
                    tolerate("identification-parameters",
                             "IdentificationInformation carries parameters the host does not know (\(unknown.map(String.init).joined(separator: ", "))); ignored")
                }
                identity.authentication = authentication
                self.identity = identity
                identified = true
                send(ControlMessage(id: .identificationAccepted))
                step = .done
                deadline = nil
                events.append(.identified(identity))
            case let .failure(rejection):
                send(rejection.message)
                events.append(.identificationRejected(rejection))
                deadline = now + answerTimeout // the accessory may send a corrected one
            }
        case (.startPowerUpdates, _):
            // Answer with what was asked for: full current available, battery at 100 %.
            var parameters: [Parameter] = []
            for parameter in message.parameters {
                if ![0, 1, 2, 4, 5, 6].contains(parameter.id) {
                    tolerate("power-fields", "StartPowerUpdates asks for field \(parameter.id), which the host does not report; left out")
                }
                switch parameter.id {
                case 0: parameters.append(.uint16(0, 1_000))
                case 1: parameters.append(.bool(1, false))
                case 2: parameters.append(.uint8(2, 0))
                case 4: parameters.append(.bool(4, true))
                case 5: parameters.append(.uint8(5, 0))
                case 6: parameters.append(.uint16(6, 100))
                default: break
                }
            }
            send(ControlMessage(id: .powerUpdate, parameters: parameters))
        case (.stopPowerUpdates, _), (.powerSourceUpdate, _), (.accessoryAuthenticationSerialNumber, _):
            break
        case (.statusExternalAccessoryProtocolSession, _):
            // The session is open already (it is from the moment the start is sent): status 0
            // confirms it, anything else ends it with the accessory's reason.
            guard let id = try? message.parameter(0)?.uint16(), let session = sessions[id], session.state == .open else {
                tolerate("status-unknown-session", "StatusExternalAccessoryProtocolSession for a session that is not open was ignored")
                return
            }
            let status = (try? message.parameter(1)?.uint8()) ?? 0
            if status == 0 {
                events.append(.sessionConfirmed(sessionID: id))
            } else {
                closeSession(id, reason: "the accessory refused the session for '\(session.protocolName)' (status \(status))", notifyPeer: false)
            }
        case (.stopExternalAccessoryProtocolSession, _):
            // A device-originated message in the catalogue, but an accessory that ends a session
            // this way is taken at its word.
            guard let id = try? message.parameter(0)?.uint16(), let session = sessions[id], session.state == .open else {
                tolerate("stop-unknown-session", "StopExternalAccessoryProtocolSession from the accessory for a session that is not open was ignored")
                return
            }
            closeSession(id, reason: "the accessory ended the session for '\(session.protocolName)'", notifyPeer: false)
        case (.requestAppLaunch, _):
            events.append(.appLaunchRequested(AppLaunchRequest(message)))
        default:
            unhandledMessages += 1
            events.append(.unhandledMessage(message.id))
        }
    }

    mutating func accessoryHandle(_ message: ControlMessage) {
        switch message.id {
        case .requestAuthenticationCertificate:
            send(ControlMessage(id: .authenticationCertificate, parameters: [.blob(0, certificate)]))
        case .requestAuthenticationChallengeResponse:
            // A real accessory asks its coprocessor; without a signer, a stand-in.
            let challenge = message.parameter(0)?.data ?? []
            let response = signer?.sign(challenge: challenge) ?? standInResponse(to: challenge)
            let answer = ControlMessage(id: .authenticationResponse, parameters: [.blob(0, response)])
            if challengeDelay > .zero {
                delayedResponse = (answer, now + challengeDelay)
            } else {
                send(answer)
            }
        case .authenticationSucceeded:
            break
        case .authenticationFailed:
            events.append(.controlFailed(.authenticationRefusedByDevice))
        case .startIdentification:
            if let identity { send(identity.message) }
        case .identificationAccepted:
            identified = true
            if let identity {
                events.append(.identified(identity))
                // Right after identification, as the FLIR ONE does (PROTOCOL.md §7.1).
                if let appLaunch, identity.messagesSent.contains(MessageID.requestAppLaunch.rawValue) {
                    send(appLaunch.message)
                }
                // Ask for power updates when the identity says so (DJI asks for fields 0, 1, 6).
                if identity.messagesSent.contains(MessageID.startPowerUpdates.rawValue) {
                    send(ControlMessage(id: .startPowerUpdates, parameters: [.flag(0), .flag(1), .flag(6)]))
                }
            }
        case .identificationRejected:
            events.append(.controlFailed(.identificationRejected(message.parameters.map(\.id))))
        case .startExternalAccessoryProtocolSession:
            guard let protocolID = try? message.parameter(0)?.uint8(), let id = try? message.parameter(1)?.uint16() else {
                events.append(.malformedMessage("StartExternalAccessoryProtocolSession without protocol or session id"))
                return
            }
            // Only an accessory that declares StatusExternalAccessoryProtocolSession answers with
            // it; one that does not (the FLIR ONE) says nothing, and a protocol it does not know
            // then gets no session.
            let answers = identity?.messagesSent.contains(MessageID.statusExternalAccessoryProtocolSession.rawValue) ?? false
            guard let declared = identity?.protocols.first(where: { $0.identifier == protocolID }) else {
                if answers { send(ControlMessage(id: .statusExternalAccessoryProtocolSession, parameters: [.uint16(0, id), .uint8(1, 1)])) }
                return
            }
            sessions.insert(Session(id: id, protocolName: declared.name, protocolID: protocolID, state: .open))
            if answers { send(ControlMessage(id: .statusExternalAccessoryProtocolSession, parameters: [.uint16(0, id), .uint8(1, 0)])) }
            events.append(.sessionOpened(sessionID: id, protocolName: declared.name))
        case .stopExternalAccessoryProtocolSession:
            if let id = try? message.parameter(0)?.uint16() { closeSession(id, reason: nil, notifyPeer: false) }
        case .powerUpdate:
            events.append(.powerUpdate(message.parameters))
        default:
            unhandledMessages += 1
            events.append(.unhandledMessage(message.id))
        }
    }

    mutating func fail(_ failure: ControlFailure) {
        step = .done
        deadline = nil
        events.append(.controlFailed(failure))
    }

    // MARK: Sessions

    mutating func openSession(protocolName: String) throws(EndpointError) -> UInt16 {
        guard role == .device, identified, let identity else { throw .notIdentified }
        guard let declared = identity.protocols.first(where: { $0.name == protocolName }) else {
            throw .unsupportedProtocol(protocolName)
        }
        guard eaLinkSessionID != nil else { throw .noExternalAccessoryLinkSession }
        if sessions.entries.contains(where: { $0.protocolName == protocolName && ($0.state == .open || $0.state == .opening) }) {
            throw .protocolInUse(protocolName)
        }
        var id = nextSessionID
        while id == 0 || sessions.contains(id) { id &+= 1 }
        nextSessionID = id &+ 1
        // Open at once, as on an iPhone: the accessory may answer with
        // StatusExternalAccessoryProtocolSession (only if it lists 0xEA03 among the messages it
        // sends), and may just as well send data straight away or say nothing (PROTOCOL.md §3.6,
        // §7.1). Data written now follows the start on the link, in order.
        sessions.insert(Session(id: id, protocolName: protocolName, protocolID: declared.identifier, state: .open))
        send(ControlMessage(id: .startExternalAccessoryProtocolSession, parameters: [.uint8(0, declared.identifier), .uint16(1, id)]))
        events.append(.sessionOpened(sessionID: id, protocolName: protocolName))
        events.append(.spaceAvailable(sessionID: id))
        return id
    }

    /// Ends a session. The owner's close (`notifyPeer`) forgets it at once; a close that comes
    /// from the peer or the link keeps the session, closed, with the bytes already received still
    /// readable, until the owner closes it too.
    mutating func closeSession(_ id: UInt16, reason: String?, notifyPeer: Bool) {
        guard let state = sessions[id]?.state else { return }
        let wasLive = state == .open || state == .opening
        roundRobin.removeAll { $0 == id }
        if notifyPeer {
            let name = sessions[id]?.protocolName ?? ""
            sessions.remove(id)
            if wasLive, role == .device {
                let queued = controlQueuedSinceUp
                send(ControlMessage(id: .stopExternalAccessoryProtocolSession, parameters: [.uint16(0, id)]))
                if controlQueuedSinceUp > queued {
                    stopsInFlight.removeAll { $0.id == id }
                    stopsInFlight.append((id, name, controlQueuedSinceUp, now + answerTimeout))
                }
            }
        } else {
            sessions.with(id) {
                $0.state = .closed(reason)
                $0.outbound.removeAll()
            }
        }
        if wasLive { events.append(.sessionClosed(sessionID: id, reason: reason)) }
    }

    /// Copies what fits of `bytes` into the session's outbound packets (the one copy of the
    /// way out); the session is mutated in place.
    mutating func write(_ id: UInt16, _ bytes: RawSpan, link: inout IAP2Link) throws(EndpointError) -> Int {
        guard let state = sessions[id]?.state else { throw .unknownSession(id) }
        guard state == .open else { throw .sessionNotOpen(id) }
        let chunk = link.maxPayloadLength - EASessionData.headerSize
        let limit = bufferLimit
        let taken = sessions.with(id) { session -> Int in
            let taken = session.outbound.append(bytes, sessionID: id, chunk: chunk, limit: limit, buffers: &link)
            if taken < bytes.byteCount { session.wasFull = true }
            return taken
        } ?? 0
        dataPlane.bytesWritten += taken
        dataPlane.bytesCopiedOut += taken
        if !roundRobin.contains(id) { roundRobin.append(id) }
        return taken
    }

    mutating func read(_ id: UInt16, maxBytes: Int) -> [UInt8] {
        guard let (bytes, copied) = sessions.with(id, { $0.inbound.take(maxBytes) }) else { return [] }
        dataPlane.bytesRead += bytes.count
        dataPlane.bytesCopiedIn += copied
        return bytes
    }

    mutating func readChunk(_ id: UInt16, maxBytes: Int) -> ArraySlice<UInt8> {
        guard let (bytes, copied) = sessions.with(id, { $0.inbound.takeChunk(maxBytes) }) else { return [] }
        dataPlane.bytesRead += bytes.count
        dataPlane.bytesCopiedIn += copied
        return bytes
    }

    mutating func borrow<Result>(_ id: UInt16, _ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        var consumed = 0
        let result = try sessions.with(id) { session -> Result? in
            let before = session.inbound.byteCount
            defer { consumed = before - session.inbound.byteCount }
            return try session.inbound.borrowFirst(body)
        }
        dataPlane.bytesRead += consumed
        return result ?? nil
    }

    /// Credits the sessions with the EA packets the link saw acknowledged since the last call.
    mutating func noteAcknowledgements(_ link: IAP2Link) {
        guard let eaSession = eaLinkSessionID else { return }
        let total = link.acknowledgedPackets[eaSession] ?? 0
        var newly = total - acknowledgedSeen[eaSession, default: 0]
        acknowledgedSeen[eaSession] = total
        while newly > 0, let packet = dataInFlight.popFirst() {
            sessions.with(packet.session) { $0.acknowledged += packet.bytes }
            newly -= 1
        }
    }

    /// Packets let wait in the link's queue beyond its window. The rest wait in their sessions'
    /// queues, where the turn of each session is decided and where a writer's bytes count
    /// against its buffer; the link takes the next packet from there each time an
    /// acknowledgement opens the window (every input ends in ``pumpData(into:now:)``). A few
    /// ready packets let one acknowledgement refill the window in one go (at 2, the in-process
    /// echo of four sessions lost 12 %); each one beyond that is 64 KiB no session buffer counts,
    /// and on USB a transmit buffer held.
    static let linkQueueDepth = 8

    /// Moves queued session bytes into the link, one packet per session in turn, so several
    /// sessions share the link fairly.
    mutating func pumpData(into link: inout IAP2Link, now: LinkTime) {
        guard let eaSession = eaLinkSessionID else { return }
        guard link.maxPayloadLength > EASessionData.headerSize else { return }
        var idle = 0
        while link.canSend, link.queuedCount < Self.linkQueueDepth, !roundRobin.isEmpty, idle < roundRobin.count {
            let id = roundRobin.removeFirst()
            guard sessions.contains(id) else { continue }
            guard let (packet, dataBytes) = sessions.with(id, { $0.outbound.popPacket() }) ?? nil else {
                idle += 1
                roundRobin.append(id)
                continue
            }
            idle = 0
            // The packet was laid out by write(); the link finishes it where it lies.
            if link.send(sessionID: eaSession, storage: packet, now: now) {
                dataInFlight.append((id, dataBytes))
            }
            let limit = bufferLimit
            let roomAgain = sessions.with(id) { session -> Bool in
                guard session.wasFull, session.outbound.byteCount < limit else { return false }
                session.wasFull = false
                return true
            } ?? false
            if roomAgain { events.append(.spaceAvailable(sessionID: id)) }
            roundRobin.append(id)
        }
    }
}
