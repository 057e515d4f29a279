public import IAPWire
package import ByteRing

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

    /// Accessory role: spread control messages longer than this many bytes after their headers
    /// over several link packets (the first with the message's and first parameter's headers
    /// and this many bytes, then this many a packet), as the Clicks keyboard sends its
    /// certificate (PROTOCOL.md §7.7); nil (the default) sends each message in one packet.
    public var controlMessageSplit: Int? {
        get { upper.controlSplitChunk }
        set { upper.controlSplitChunk = newValue.map { max(1, $0) } }
    }

    /// Accessory role: the IdentificationInformation this side sends instead of its identity's
    /// own (to play an accessory whose message has deviations of its own); nil sends
    /// ``AccessoryIdentity/message``.
    public var identificationOverride: ControlMessage? {
        get { upper.identificationOverride }
        set { upper.identificationOverride = newValue }
    }

    /// Accessory role: control messages this side takes and never answers (the link
    /// acknowledges them; nothing else happens), to play an accessory that stalls.
    public var ignoredMessages: Set<MessageID> {
        get { upper.ignoredMessages }
        set { upper.ignoredMessages = newValue }
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
    /// buffers; pass an array (or ``LentBytes``, ``receive(lent:now:)``) to keep it without a copy.
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
    public mutating func receive(lent bytes: LentBytes, now: LinkTime) {
        let lease = bytes.lease
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
    /// ``takeFrames(into:)`` before the owner's turn: an acknowledgement the link owes stays
    /// owed, for the data the turn queues to carry (``IAP2Link/takeFramesLeavingAckOwed(into:)``).
    public mutating func takeFramesBeforeUpdate(into frames: inout [LinkFrame]) { link.takeFramesLeavingAckOwed(into: &frames) }
    /// Whether packets are waiting.
    public var hasOutput: Bool { link.hasOutput }
    /// Buffers the transport lends for outgoing packets (see ``IAP2Link/transmitBuffers``).
    package var transmitBuffers: PacketBufferPool? {
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
            case let .tolerated(tolerance):
                upper.tolerate(tolerance.kind, tolerance.description)
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
    /// router: how a test or the simulator plays an accessory that uses a link session the host
    /// does not (file transfer), or sends what no router would. False when the link does not
    /// take it now.
    @discardableResult
    public mutating func sendLinkPayload(sessionID: UInt8, payload: [UInt8], now: LinkTime) -> Bool {
        let sent = link.send(sessionID: sessionID, payload: payload, now: now)
        settle(now: now)
        return sent
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
    public func bytesAvailable(_ sessionID: UInt16) -> Int { upper.sessions.reading(sessionID) { $0.inbound.byteCount } ?? 0 }
    /// Bytes a session may still queue for sending.
    public func spaceAvailable(_ sessionID: UInt16) -> Int {
        let limit = upper.bufferLimit
        return upper.sessions.reading(sessionID) { $0.state == .open ? max(0, limit - $0.outbound.byteCount) : 0 } ?? 0
    }
    /// Bytes written to a session and not yet handed to the link.
    public func bytesPending(_ sessionID: UInt16) -> Int { upper.sessions.reading(sessionID) { $0.outbound.byteCount } ?? 0 }
    /// Bytes written to a session that the peer's link acknowledged (they reached the peer's
    /// link layer, in order); 0 for a session that is not open.
    public func bytesAcknowledged(_ sessionID: UInt16) -> Int { upper.sessions.reading(sessionID) { $0.acknowledged } ?? 0 }
    /// The state of session `sessionID`; nil for an id that was never opened (or was forgotten).
    public func sessionState(_ sessionID: UInt16) -> EASessionState? { upper.sessions.reading(sessionID) { $0.state } }
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
