public import IAPWire
package import ByteRing

/// One side of a connection whichever protocol it speaks: an ``IAP2Endpoint`` or an
/// ``IAP1Endpoint`` behind the same calls and the same ``EndpointEvent``s.
///
/// The device side starts in iAP2 and answers the detect. It switches to iAP1, without anyone
/// asking, when the accessory shows it speaks iAP1 before the iAP2 link is up: any iAP1 packet
/// (StartIDPS, IdentifyDeviceLingoes…) or the iAP1 answer to the detect (iPodAck BadParameter
/// for 0xEE), after which it asks the accessory to identify (RequestIdentify). An iAP1 accessory
/// that later sends the iAP2 detect starts over in iAP2. The accessory side speaks what it was
/// built with.
public struct IAPEndpoint: Sendable {
    /// The protocol that runs.
    private enum Running: Sendable {
        /// iAP2, in `two`.
        case iap2
        /// iAP1, in this endpoint; `two` is then a dormant endpoint that never started.
        case iap1(IAP1Endpoint)
    }

    // The iAP2 endpoint is stored as it is, not as a payload of `Running` (nor as an optional):
    // reading an enum's payload, even in a getter, copies it (a retain and release of every
    // reference the endpoint holds), and the connection reads its endpoint after every input.
    // Stored as it is, it is read and changed in place. iAP1 is slow enough for the copies of
    // its payload not to matter.
    private var two: IAP2Endpoint
    private var running: Running = .iap2
    private let deviceSettings: (configuration: LinkConfiguration, policy: any AuthenticationPolicy, bufferLimit: Int)?
    /// Whether this is the device side (which switches); kept apart so the receive path tests a
    /// plain Bool.
    private let switches: Bool
    private var answerTimeoutValue: Duration = .seconds(10)
    private var peerBluetoothAddressValue: [UInt8]?
    private var pendingEvents: [EndpointEvent] = []
    /// Output of an endpoint that was replaced, sent before the new one's.
    private var pendingOutput: [[UInt8]] = []
    private var transmitBufferPool: PacketBufferPool?
    /// The initial sequence number of each new iAP2 endpoint.
    private var random: SplitMix
    private var switchCount = 0
    /// How often one connection may change protocol (an accessory alternating the iAP2 detect
    /// and iAP1 packets would otherwise have the host rebuild its endpoints for ever).
    public static let maxSwitches = 8

    /// Creates the device side: iAP2 until the accessory shows it speaks iAP1.
    public init(device configuration: LinkConfiguration = .device, policy: any AuthenticationPolicy = AcceptingAuthentication(),
                sessionBufferLimit: Int = 1 << 20, initialSequence: UInt8, randomSeed: UInt64) {
        two = IAP2Endpoint(device: configuration, policy: policy, sessionBufferLimit: sessionBufferLimit,
                           initialSequence: initialSequence, randomSeed: randomSeed)
        deviceSettings = (configuration, policy, sessionBufferLimit)
        switches = true
        random = SplitMix(state: randomSeed ^ 0xA5A5_5A5A_0F0F_F0F0)
    }

    /// Wraps an iAP2 endpoint (of either role) that keeps its protocol.
    public init(_ endpoint: IAP2Endpoint) {
        two = endpoint
        deviceSettings = nil
        switches = false
        random = SplitMix(state: 0)
    }

    /// Wraps an iAP1 endpoint.
    public init(_ endpoint: IAP1Endpoint) {
        running = .iap1(endpoint)
        two = Self.dormant
        deviceSettings = nil
        switches = false
        random = SplitMix(state: 0)
    }

    /// Runs `body` on the iAP1 endpoint `one` (the payload of `running`) in place: it is taken out
    /// of `running` meanwhile, so that it is the only holder of its buffers and changing them
    /// copies nothing, and put back after.
    private mutating func change<Result, Failure: Error>(_ one: consuming IAP1Endpoint,
                                                         _ body: (inout IAP1Endpoint) throws(Failure) -> Result) throws(Failure) -> Result {
        var one = one
        running = .iap2
        defer { running = .iap1(one) }
        return try body(&one)
    }

    /// The protocol running now.
    public var protocolVersion: IAPProtocolVersion {
        switch running {
        case .iap2: .iap2
        case .iap1: .iap1
        }
    }

    /// The iAP2 endpoint, while iAP2 runs (for inspection: link state, statistics).
    public var iap2: IAP2Endpoint? {
        switch running {
        case .iap2: two
        case .iap1: nil
        }
    }

    /// The iAP1 endpoint, while iAP1 runs.
    public var iap1: IAP1Endpoint? {
        switch running {
        case .iap2: nil
        case let .iap1(one): one
        }
    }

    /// How long the device waits for each answer of the accessory.
    public var answerTimeout: Duration {
        get { answerTimeoutValue }
        set {
            answerTimeoutValue = newValue
            two.answerTimeout = newValue
            if case let .iap1(one) = running { change(one) { $0.answerTimeout = newValue } }
        }
    }

    /// On a Bluetooth connection, the peer's address (six bytes, most significant first), which
    /// an iAP2 accessory's BluetoothTransportComponent must declare
    /// (``IAP2Endpoint/peerBluetoothAddress``). iAP1 identification has no such component.
    public var peerBluetoothAddress: [UInt8]? {
        get { peerBluetoothAddressValue }
        set {
            peerBluetoothAddressValue = newValue
            two.peerBluetoothAddress = newValue
        }
    }

    /// Sends a control message as it is (iAP2; nothing on iAP1): for a simulator playing an
    /// accessory's messages, and for tests (``IAP2Endpoint/sendControlMessage(_:now:)``).
    public mutating func sendControlMessage(_ message: ControlMessage, now: LinkTime) {
        guard case .iap2 = running else { return }
        two.sendControlMessage(message, now: now)
    }

    /// Queues a raw payload on link session `sessionID` (iAP2; false on iAP1), past the control
    /// session and the EA router (``IAP2Endpoint/sendLinkPayload(sessionID:payload:now:)``).
    @discardableResult
    public mutating func sendLinkPayload(sessionID: UInt8, payload: [UInt8], now: LinkTime) -> Bool {
        guard case .iap2 = running else { return false }
        return two.sendLinkPayload(sessionID: sessionID, payload: payload, now: now)
    }

    // MARK: Driving

    /// Starts: the accessory side identifies unless it waits for the device; the device side waits (the iAP2 device sends the detect).
    public mutating func start(now: LinkTime) {
        switch running {
        case .iap2: two.start(now: now)
        case let .iap1(one): change(one) { $0.start(now: now) }
        }
    }

    /// Feeds bytes from the peer, in any chunking.
    public mutating func receive(_ bytes: RawSpan, now: LinkTime) {
        switch running {
        case .iap2: two.receive(bytes, now: now)
        case let .iap1(one): change(one) { $0.receive(bytes, now: now) }
        }
        if switches { switchIfNeeded(now: now) }
    }

    /// Feeds bytes from the peer held in an array (iAP2 keeps views of it instead of copying).
    public mutating func receive(_ bytes: [UInt8], now: LinkTime) {
        switch running {
        case .iap2: two.receive(bytes, now: now)
        case let .iap1(one): change(one) { $0.receive(bytes.span.bytes, now: now) }
        }
        if switches { switchIfNeeded(now: now) }
    }

    /// Feeds bytes lent by the transport (a USB IN slot; iAP2 keeps views of the lease instead
    /// of copying).
    public mutating func receive(lent bytes: LentBytes, now: LinkTime) {
        let lease = bytes.lease
        switch running {
        case .iap2: two.receive(lent: bytes, now: now)
        case let .iap1(one): change(one) { one in lease.withSpan { one.receive($0, now: now) } }
        }
        if switches { switchIfNeeded(now: now) }
    }

    /// Fires every timer due at `now`.
    public mutating func advance(to now: LinkTime) {
        switch running {
        case .iap2: two.advance(to: now)
        case let .iap1(one): change(one) { $0.advance(to: now) }
        }
        // A partial frame abandoned after the inter-byte gap may have held the packets that
        // tell which protocol the accessory speaks.
        if switches { switchIfNeeded(now: now) }
    }

    /// When ``advance(to:)`` must be called next, if anything is scheduled.
    public var nextDeadline: LinkTime? {
        switch running {
        case .iap2: two.nextDeadline
        case let .iap1(one): one.nextDeadline
        }
    }

    /// Packets to send, in order (each a whole packet with its sync byte, or the detect).
    public mutating func takeOutput() -> [[UInt8]] {
        let output = switch running {
        case .iap2: two.takeOutput()
        case let .iap1(one): change(one) { $0.takeOutput() }
        }
        guard !pendingOutput.isEmpty else { return output }
        defer { pendingOutput.removeAll() }
        return pendingOutput + output
    }
    /// Appends the packets to send to `frames` (swapping storage when it is empty and nothing
    /// else is pending: a caller that empties and passes the same array each time allocates
    /// nothing on the iAP2 path).
    public mutating func takeOutput(into frames: inout [[UInt8]]) {
        if !pendingOutput.isEmpty {
            frames.append(contentsOf: pendingOutput)
            pendingOutput.removeAll()
        }
        switch running {
        case .iap2: two.takeOutput(into: &frames)
        case let .iap1(one): frames.append(contentsOf: change(one) { $0.takeOutput() })
        }
    }

    /// Appends the packets to send to `frames` as they lie: iAP2 packets in the transport's
    /// transmit buffers are handed over without a copy (see ``IAP2Link/takeFrames(into:)``).
    public mutating func takeFrames(into frames: inout [LinkFrame]) {
        takeFrames(into: &frames, leavingAckOwed: false)
    }

    /// ``takeFrames(into:)`` before the owner's turn: an acknowledgement the iAP2 link owes stays
    /// owed, for the data the turn queues to carry.
    public mutating func takeFramesBeforeUpdate(into frames: inout [LinkFrame]) {
        takeFrames(into: &frames, leavingAckOwed: true)
    }

    private mutating func takeFrames(into frames: inout [LinkFrame], leavingAckOwed: Bool) {
        if !pendingOutput.isEmpty {
            for frame in pendingOutput { frames.append(.bytes(frame)) }
            pendingOutput.removeAll()
        }
        switch running {
        case .iap2:
            if leavingAckOwed { two.takeFramesBeforeUpdate(into: &frames) } else { two.takeFrames(into: &frames) }
        case let .iap1(one): for frame in change(one, { $0.takeOutput() }) { frames.append(.bytes(frame)) }
        }
    }

    /// Buffers the transport lends for outgoing iAP2 packets (see ``IAP2Link/transmitBuffers``);
    /// kept across a switch of protocol. iAP1 does not use them.
    package var transmitBuffers: PacketBufferPool? {
        get { transmitBufferPool }
        set {
            transmitBufferPool = newValue
            if case .iap2 = running { two.transmitBuffers = newValue }
        }
    }

    /// Whether ``takeOutput()`` has anything.
    public var hasOutput: Bool {
        if !pendingOutput.isEmpty { return true }
        switch running {
        case .iap2: return two.hasOutput
        case let .iap1(one): return one.hasOutput
        }
    }

    /// What happened since the last call, in order.
    public mutating func takeEvents() -> [EndpointEvent] {
        let events = switch running {
        case .iap2: two.takeEvents()
        case let .iap1(one): change(one) { $0.takeEvents() }
        }
        guard !pendingEvents.isEmpty else { return events }
        defer { pendingEvents.removeAll() }
        return pendingEvents + events
    }

    /// Appends what happened since the last call to `taken`, in order (swapping storage when it
    /// is empty and nothing else is pending).
    public mutating func takeEvents(into taken: inout [EndpointEvent]) {
        if !pendingEvents.isEmpty {
            taken.append(contentsOf: pendingEvents)
            pendingEvents.removeAll()
        }
        switch running {
        case .iap2: two.takeEvents(into: &taken)
        case let .iap1(one): taken.append(contentsOf: change(one) { $0.takeEvents() })
        }
    }

    /// The identity, once identified (and authenticated when the accessory asked for it).
    public var identity: AccessoryIdentity? {
        switch running {
        case .iap2: two.identity
        case let .iap1(one): one.identity
        }
    }

    /// Device role: moves to iAP1 when an iAP1 packet arrived before the iAP2 link came up, and
    /// back to iAP2 when an iAP1 accessory sends the detect.
    private mutating func switchIfNeeded(now: LinkTime) {
        if case let .iap1(current) = running {
            guard current.sawIAP2Detect, switchCount < Self.maxSwitches, let settings = deviceSettings else { return }
            var one = current
            running = .iap2 // `one` is now the only holder of its buffers; `two` takes over below
            switchCount += 1
            pendingEvents += one.takeEvents()
            pendingOutput += one.takeOutput()
            if one.identified { pendingEvents.append(.accessoryRestarted(reason: "the accessory started over in iAP2")) }
            let rest = one.takeBytesAfterDetect()
            var iap2 = IAP2Endpoint(device: settings.configuration, policy: settings.policy, sessionBufferLimit: settings.bufferLimit,
                                    initialSequence: UInt8(truncatingIfNeeded: random.next()), randomSeed: random.next())
            iap2.answerTimeout = answerTimeoutValue
            iap2.peerBluetoothAddress = peerBluetoothAddressValue
            iap2.transmitBuffers = transmitBufferPool
            pendingEvents.append(.protocolSwitched(.iap2))
            iap2.receive(IAP2Detect.bytes + rest, now: now)
            two = iap2
            return
        }
        guard two.link.state != .connected, switchCount < Self.maxSwitches, let settings = deviceSettings else { return }
        let events = two.takeEvents()
        let bodies = events.compactMap { event -> [UInt8]? in
            if case let .link(.iap1Packet(body)) = event { return body }
            return nil
        }
        pendingEvents += events.filter { if case .link(.iap1Packet) = $0 { false } else { true } }
        guard !bodies.isEmpty else { return }
        switchCount += 1
        // Bytes were dropped before these packets: they may be noise that happened to form a
        // valid iAP1 packet (50 MiB of garbage holds a checksummed IdentifyDeviceLingoes now and
        // then). An identification found among them is not believed: the accessory is asked to
        // identify again, and only its answer identifies it.
        let amidNoise = two.link.scanStatistics.droppedBytes > 0
        let believed = amidNoise ? bodies.filter { !Self.isIdentification($0) } : bodies
        pendingOutput += two.takeOutput()
        let partial = two.takeUnscannedBytes()
        var iap1 = IAP1Endpoint(device: settings.policy, sessionBufferLimit: settings.bufferLimit,
                                interByteGap: settings.configuration.interByteGap, randomSeed: random.next())
        iap1.answerTimeout = answerTimeoutValue
        pendingEvents.append(.protocolSwitched(.iap1))
        iap1.start(now: now)
        // An accessory that did not start identifying (it answered the detect, or sent
        // something else) is asked to.
        if !believed.contains(where: Self.isIdentification) { iap1.requestIdentify() }
        iap1.takeOver(bodies: believed, partial: partial, now: now)
        two = Self.dormant
        running = .iap1(iap1)
    }

    /// What `two` holds while iAP1 runs: an endpoint that never starts, with the smallest buffers.
    private static var dormant: IAP2Endpoint {
        IAP2Endpoint(device: .device, policy: AcceptingAuthentication(), sessionBufferLimit: 4096, initialSequence: 0, randomSeed: 0)
    }

    /// Whether an iAP1 packet body starts an identification (StartIDPS, IdentifyDeviceLingoes).
    private static func isIdentification(_ body: [UInt8]) -> Bool {
        body.count >= 2 && body[0] == 0x00 && (body[1] == IAP1Command.startIDPS || body[1] == IAP1Command.identifyDeviceLingoes)
    }

    // MARK: Sessions

    /// Device: opens a session for `protocolName`. ``EndpointEvent/sessionOpened(sessionID:protocolName:)``
    /// follows at once on iAP2 (the session is open once its start is sent), and when the
    /// accessory acknowledges the open on iAP1.
    public mutating func openSession(protocolName: String, now: LinkTime) throws(EndpointError) -> UInt16 {
        switch running {
        case .iap2:
            return try two.openSession(protocolName: protocolName, now: now)
        case let .iap1(one):
            return try change(one, { (one) throws(EndpointError) in try one.openSession(protocolName: protocolName, now: now) })
        }
    }

    /// Closes a session (the device tells the accessory) and forgets it. On iAP2 the stop's
    /// acknowledgement is followed (``IAP2Endpoint/closeSession(_:now:)``); on iAP1 nothing
    /// waits for the answer to CloseDataSession.
    public mutating func closeSession(_ sessionID: UInt16, now: LinkTime) {
        switch running {
        case .iap2: two.closeSession(sessionID, now: now)
        case let .iap1(one): change(one) { $0.closeSession(sessionID, now: now) }
        }
    }

    /// Whether the stop of a closed session waits for the accessory's acknowledgement
    /// (``IAP2Endpoint/isStopPending(_:)``; always false on iAP1).
    public func isStopPending(_ sessionID: UInt16) -> Bool {
        switch running {
        case .iap2: two.isStopPending(sessionID)
        case .iap1: false
        }
    }

    /// Queues bytes for a session; returns how many were taken (fewer under back-pressure).
    public mutating func write(_ sessionID: UInt16, _ bytes: some Collection<UInt8>, now: LinkTime) throws(EndpointError) -> Int {
        switch running {
        case .iap2:
            return try two.write(sessionID, bytes, now: now)
        case let .iap1(one):
            return try change(one, { (one) throws(EndpointError) in try one.write(sessionID, bytes, now: now) })
        }
    }

    /// Queues bytes for a session from a view of them (iAP2: copied once, into the link packets).
    public mutating func write(_ sessionID: UInt16, span bytes: RawSpan, now: LinkTime) throws(EndpointError) -> Int {
        switch running {
        case .iap2:
            return try two.write(sessionID, span: bytes, now: now)
        case let .iap1(one):
            let copy = bytes.withUnsafeBytes { Array($0) }
            return try change(one, { (one) throws(EndpointError) in try one.write(sessionID, copy, now: now) })
        }
    }

    /// Takes up to `maxBytes` received bytes of a session; the room this makes lets held data in.
    public mutating func read(_ sessionID: UInt16, maxBytes: Int = .max) -> [UInt8] {
        switch running {
        case .iap2: two.read(sessionID, maxBytes: maxBytes)
        case let .iap1(one): change(one) { $0.read(sessionID, maxBytes: maxBytes) }
        }
    }

    /// Takes up to `maxBytes` received bytes of a session as a view (iAP2: of the array they
    /// arrived in, no copy; iAP1: of a copy).
    public mutating func readChunk(_ sessionID: UInt16, maxBytes: Int = .max) -> ArraySlice<UInt8> {
        switch running {
        case .iap2: two.readChunk(sessionID, maxBytes: maxBytes)
        case let .iap1(one): change(one, { $0.read(sessionID, maxBytes: maxBytes) })[...]
        }
    }

    /// Lends the next received bytes of a session in place; `body` returns how many it consumed. Nil when nothing is readable.
    ///
    /// Inlined into the caller's module around `lend`, which is not generic: called
    /// across modules, a generic `borrow` would look up the metadata of `Result?` and of its
    /// tuple at run time on every call (about 14,000 instructions a 64-byte round trip
    /// through iapd, counted under callgrind).
    @inlinable
    public mutating func borrow<Result>(_ sessionID: UInt16, _ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        var result: Result?
        _ = try lend(sessionID) { span in
            let (consumed, value) = try body(span)
            result = value
            return consumed
        }
        return result
    }

    /// Lends the next received bytes of a session in place to `body`, which returns how many it
    /// consumed; false when nothing is readable (and `body` was not called).
    @usableFromInline
    mutating func lend(_ sessionID: UInt16, _ body: (RawSpan) throws -> Int) rethrows -> Bool {
        try borrowInPlace(sessionID) { span in (try body(span), ()) } != nil
    }

    private mutating func borrowInPlace<Result>(_ sessionID: UInt16, _ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        switch running {
        case .iap2: return try two.borrow(sessionID, body)
        case let .iap1(one):
            // Taken out in place as `change(_:_:)` does, here where `body` rethrows.
            var one = one
            running = .iap2
            defer { running = .iap1(one) }
            return try one.borrow(sessionID, body)
        }
    }

    /// The session bytes moved and copied (iAP2; iAP1 is not counted and reports zeros).
    public var dataPlane: DataPlaneStatistics {
        switch running {
        case .iap2: two.dataPlane
        case .iap1: DataPlaneStatistics()
        }
    }

    /// Tells the iAP2 link how far the transport has got with its output
    /// (``IAP2Link/noteOutputProgress(_:)``); iAP1 keeps no retransmission timers.
    public mutating func noteOutputProgress(_ progress: TransportOutputProgress) {
        if case .iap2 = running { two.noteOutputProgress(progress) }
    }

    /// The iAP2 link's counters (packets, retransmissions, acknowledgements); nil on iAP1.
    public var linkStatistics: LinkStatistics? {
        switch running {
        case .iap2: two.link.statisticsNow
        case .iap1: nil
        }
    }

    /// Bytes readable on a session.
    public func bytesAvailable(_ sessionID: UInt16) -> Int {
        switch running {
        case .iap2: two.bytesAvailable(sessionID)
        case let .iap1(one): one.bytesAvailable(sessionID)
        }
    }
    /// Bytes a session may still queue for sending (0 unless open).
    public func spaceAvailable(_ sessionID: UInt16) -> Int {
        switch running {
        case .iap2: two.spaceAvailable(sessionID)
        case let .iap1(one): one.spaceAvailable(sessionID)
        }
    }
    /// Bytes written to a session and not yet acknowledged by the peer.
    public func bytesPending(_ sessionID: UInt16) -> Int {
        switch running {
        case .iap2: two.bytesPending(sessionID)
        case let .iap1(one): one.bytesPending(sessionID)
        }
    }
    /// Bytes of a session the peer acknowledged.
    public func bytesAcknowledged(_ sessionID: UInt16) -> Int {
        switch running {
        case .iap2: two.bytesAcknowledged(sessionID)
        case let .iap1(one): one.bytesAcknowledged(sessionID)
        }
    }
    /// A session's state; nil for a session this side does not know.
    public func sessionState(_ sessionID: UInt16) -> EASessionState? {
        switch running {
        case .iap2: two.sessionState(sessionID)
        case let .iap1(one): one.sessionState(sessionID)
        }
    }
}

/// A small deterministic generator (SplitMix64), seeded by the owner: the initial sequence
/// numbers of the endpoints a switch of protocol makes. Never for challenges (see `Challenge`).
struct SplitMix: Sendable {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
