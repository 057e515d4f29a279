internal import IAPWire

/// The protocol an accessory speaks on a connection.
public enum IAPProtocolVersion: String, Hashable, Sendable, Codable {
    /// Legacy iAP (30-pin era, many UART modules): packets of lingoes and commands.
    case iap1 = "iAP1"
    /// iAP2: a link layer with sessions, control messages and EA sessions.
    case iap2 = "iAP2"
}

/// How an accessory-role ``IAP1Endpoint`` identifies itself.
public enum IAP1IdentificationStyle: String, Hashable, Sendable, Codable, CaseIterable {
    /// StartIDPS, SetFIDTokenValues (identity, protocols), EndIDPS; transaction ids on.
    case idps
    /// IdentifyDeviceLingoes: lingoes and options only, no strings, no protocols; no transaction ids.
    case deviceLingoes = "device-lingoes"
}

/// One side of an iAP1 connection (PROTOCOL.md §1): identification (IDPS or
/// IdentifyDeviceLingoes), authentication 2.0 through an ``AuthenticationPolicy``, and EA data
/// sessions (OpenDataSessionForProtocol, iPodDataTransfer / AccessoryDataTransfer with their acks,
/// CloseDataSession), as one deterministic state machine.
///
/// It has the session calls of ``IAP2Endpoint`` and reports the same ``EndpointEvent``s, so the
/// layers above do not care which protocol runs. The device role is what the host runs once an
/// accessory shows it speaks iAP1 (``IAPEndpoint`` switches); the accessory role is the
/// simulator's. Like the iAP2 endpoint it does no I/O and reads no clock.
///
/// Flow control: each data packet is acknowledged (AccessoryAck for the device's, iPodAck for the
/// accessory's). At most ``dataWindow`` packets per session are unacknowledged at once; a receiver whose
/// reader has no room holds one packet unacknowledged until the reader makes room, which holds
/// the sender off. There is no timeout on a data acknowledgement: a peer that does not read is
/// back-pressure, not a failure (the transport reports a peer that went away).
public struct IAP1Endpoint: Sendable {
    struct Session: Sendable {
        var protocolName: String
        var protocolIndex: UInt8
        var state: EASessionState
        var inbound = ChunkQueue()
        var outbound = ChunkQueue()
        var wasFull = false
        var acknowledged = 0
        /// Data packets that arrived while the reader had no room, in order: each is acknowledged
        /// once it fits.
        var held: [(transactionID: UInt16?, data: [UInt8])] = []
        /// Device: the OpenDataSessionForProtocol awaiting its AccessoryAck.
        var openTransactionID: UInt16?
        var openDeadline: LinkTime?
    }

    enum Step: Sendable {
        /// Waiting for the accessory to identify (device) / to be asked (accessory).
        case idle
        /// Device: between StartIDPS and EndIDPS. Accessory: waiting for the answer to `command`.
        case identifying(awaiting: UInt8)
        /// Device: collecting certificate sections; `next` is the section expected.
        case awaitingCertificate(sections: [UInt8], next: UInt8)
        case awaitingSignature(certificate: [UInt8], challenge: [UInt8])
        case done
    }

    /// Which side this endpoint plays: the device (host) or the accessory (the simulator).
    public let role: LinkRole
    /// Data packets a session may have sent without acknowledgement.
    public let dataWindow: Int
    /// How long the device waits for each answer of the accessory.
    public var answerTimeout: Duration = .seconds(10)
    /// The most bytes one data packet of ours carries (the peer's declared maximum payload, less
    /// the session id); the default until the peer says otherwise.
    public internal(set) var maxDataPerPacket: Int
    /// Whether packets carry transaction ids (StartIDPS turns them on).
    public internal(set) var transactionIDs = false
    /// Whether identification and authentication are done.
    public internal(set) var identified = false

    var identityValue: AccessoryIdentity?
    let policy: any AuthenticationPolicy
    let bufferLimit: Int
    private var scanner: FrameScanner
    var output: [[UInt8]] = []
    var events: [EndpointEvent] = []
    var step: Step = .idle
    var deadline: LinkTime?
    var awaitedTransactionID: UInt16?
    var nextTransactionID: UInt16 = 0
    var now: LinkTime = .zero
    var sessions: [UInt16: Session] = [:]
    private var nextSessionID: UInt16 = 1
    var roundRobin: [UInt16] = []
    var inFlight: [(transactionID: UInt16?, session: UInt16, bytes: Int, sentAt: LinkTime)] = []
    /// Device: the accessory left a data packet unacknowledged for `answerTimeout`: its data
    /// is taken as delivered when sent from then on (said once), instead of waited for.
    var dataAcknowledgementsMissing = false
    /// Device: the accessory acknowledged a data packet on this connection: a packet left
    /// unacknowledged is then its flow control (or a lost iPodAck, settled by the next), and is
    /// waited for.
    var dataAcknowledgementsSeen = false
    /// Device: FID tokens and what was wrong with them, gathered between StartIDPS and EndIDPS.
    var tokens: [FIDToken] = []
    var requiredTokenRejected = false
    var tokenProblems: [String] = []
    // Accessory role.
    let style: IAP1IdentificationStyle
    private let waitsForDevice: Bool
    var certificate: [UInt8] = []
    /// Accessory: the coprocessor that signs challenges (nil: the stand-in response).
    var signer: (any AuthenticationSigner)?
    /// Device: the policy's conclusion on the accessory's authentication.
    public internal(set) var authentication = AuthenticationOutcome.notChecked
    var certificateTransactionID: UInt16?
    var certificateSectionsSent = 0
    /// Accessory role: ask GetiPodOptionsForLingo for the General lingo before the FID tokens,
    /// and declare the protocols only when its options have bit 13 (communication with iOS
    /// applications) set, as car head units do (PROTOCOL.md §7.10). False (the default) declares
    /// them without asking.
    public var gatesProtocolsOnLingoOptions = false
    /// Whether this side answers the peer's data packets with iPodAck (true by the protocol).
    /// False plays an accessory that never does: the device then stops waiting for them.
    public var acknowledgesData = true
    /// Device role: the accessory sent the iAP2 detect (it started over in iAP2).
    public internal(set) var sawIAP2Detect = false
    /// Device role: the bytes that followed the iAP2 detect, for the iAP2 endpoint that takes
    /// over (see ``takeBytesAfterDetect()``).
    private var afterDetect: [UInt8] = []
    /// How long the line may stay silent in the middle of a packet before the packet is given up
    /// on and the bytes it held are scanned again (see ``LinkConfiguration/interByteGap``).
    public let interByteGap: Duration
    /// Partial packets given up on after ``interByteGap``.
    public private(set) var partialPacketsAbandoned = 0
    /// When the last bytes were received.
    private var lastReceiveAt: LinkTime = .zero
    /// Packets this side could not encode (always 0 unless a limit is wrong; checked by tests).
    public internal(set) var encodeFailures = 0
    /// Transaction ids of data packets whose session closed before their acknowledgement came:
    /// a late acknowledgement for one of them is expected, not an error.
    var retiredTransactions: [UInt16] = []
    /// Indices declared by EAProtocolTokens during this IDPS.
    var declaredIndices: Set<UInt8> = []

    /// The most payload bytes this side takes per packet (what it answers to
    /// RequestTransportMaxPayloadSize and declares in AccessoryInfo).
    public let maxIncomingPayload: Int
    /// The most payload bytes the device side takes per packet unless told otherwise.
    public static let defaultMaxIncomingPayload = 16_384
    /// Bytes of an iAP1 certificate section.
    public static let certificateSectionLength = 128
    /// The largest certificate the device collects.
    public static let maxCertificateLength = 16 * 1024
    /// Data per packet towards a peer that declared no maximum.
    public static let defaultDataPerPacket = 500
    /// The most FID tokens one IDPS may send (a real accessory sends about a dozen).
    public static let maxTokens = 64

    /// Data bytes per packet for a peer that takes `payload` bytes per packet: the session id
    /// takes two, and the packet body (lingo, command, transaction id, payload) must stay within
    /// the large form's 65535 bytes.
    static func dataPerPacket(forPayload payload: Int) -> Int { max(1, min(payload, 0xFFF0) - 2) }
    /// Data packets a receiver holds unacknowledged for a reader without room; a peer that sends
    /// more without waiting for acknowledgements has the excess dropped and is told so.
    public static let maxHeldPackets = 8

    /// Creates the device side. `randomSeed` is not used: every authentication challenge is a
    /// fresh draw of the system's generator.
    public init(device policy: any AuthenticationPolicy = AcceptingAuthentication(), sessionBufferLimit: Int = 1 << 20,
                maxIncomingPayload: Int = IAP1Endpoint.defaultMaxIncomingPayload, dataWindow: Int = 4,
                interByteGap: Duration = LinkConfiguration.defaultInterByteGap, randomSeed: UInt64) {
        role = .device
        // All kinds: after an iAP2 detect, the iAP2 packets behind it are handed over intact.
        // No packet is longer than this side says it takes; no iAP2 packet that can follow the
        // detect (the accessory's SYN) is longer than a SYN.
        scanner = FrameScanner(kinds: .all)
        scanner.iap1LengthLimit = IAP1Packet.maxEncodedLength(payloadLength: min(max(maxIncomingPayload, 64), 0xFFF0))
        scanner.iap2LengthLimit = LinkParameters.maxSYNPacketLength
        self.interByteGap = interByteGap
        self.policy = policy
        bufferLimit = sessionBufferLimit
        self.maxIncomingPayload = min(max(maxIncomingPayload, 64), 0xFFF0)
        self.dataWindow = max(1, dataWindow)
        maxDataPerPacket = Self.defaultDataPerPacket - 2
        style = .idps
        waitsForDevice = false
    }

    /// Creates the accessory side with the identity it declares.
    ///
    /// - Parameters:
    ///   - identity: what the accessory declares (its protocols become IDPS protocol tokens).
    ///   - sessionBufferLimit: bytes the endpoint holds per session and direction.
    ///   - maxIncomingPayload: the most payload bytes per packet it takes (64 … 65520), which it
    ///     declares to the device.
    ///   - dataWindow: data packets a session may have unacknowledged at once (at least 1).
    ///   - interByteGap: the silence after which a partial frame is given up on.
    ///   - randomSeed: not used (the accessory draws no challenges).
    ///   - style: IDPS (with protocols) or IdentifyDeviceLingoes (legacy: no protocols).
    ///   - waitsForDevice: stay silent until the device sends RequestIdentify (or the iAP2 detect,
    ///     which is answered the iAP1 way and then waits for RequestIdentify); otherwise identify
    ///     at start.
    ///   - certificate: the DER certificate the accessory sends in RetAccessoryAuthenticationInfo
    ///     (split into sections as the protocol does) when it has no `signer`; the default is a
    ///     stand-in of the size a real one has.
    ///   - signer: its coprocessor: the certificate it sends and the signatures of the device's
    ///     challenges. Without one it answers with a stand-in no verifying host accepts.
    public init(accessory identity: AccessoryIdentity, style: IAP1IdentificationStyle = .idps, waitsForDevice: Bool = false,
                certificate: [UInt8] = [UInt8](repeating: 0x30, count: 608), signer: (any AuthenticationSigner)? = nil,
                sessionBufferLimit: Int = 1 << 20,
                maxIncomingPayload: Int = 8_192, dataWindow: Int = 4,
                interByteGap: Duration = LinkConfiguration.defaultInterByteGap, randomSeed: UInt64) {
        role = .accessory
        scanner = FrameScanner(kinds: [.iap1, .detect])
        scanner.iap1LengthLimit = IAP1Packet.maxEncodedLength(payloadLength: min(max(maxIncomingPayload, 64), 0xFFF0))
        self.interByteGap = interByteGap
        var identity = identity
        identity.protocolVersion = .iap1
        identityValue = identity
        policy = AcceptingAuthentication()
        bufferLimit = sessionBufferLimit
        self.maxIncomingPayload = min(max(maxIncomingPayload, 64), 0xFFF0)
        self.dataWindow = max(1, dataWindow)
        maxDataPerPacket = Self.defaultDataPerPacket - 2
        self.style = style
        self.waitsForDevice = waitsForDevice
        // Sections are numbered with one byte: at most 256 of 128 bytes.
        self.certificate = Array((signer?.certificate ?? certificate).prefix(Self.maxCertificateLength))
        self.signer = signer
    }

    // MARK: Driving

    /// Starts: the accessory side identifies unless it waits for the device; the device side waits (the iAP2 device sends the detect).
    public mutating func start(now: LinkTime) {
        self.now = now
        if role == .accessory, !waitsForDevice { beginIdentification() }
    }

    /// Feeds bytes from the peer, in any chunking.
    public mutating func receive(_ bytes: RawSpan, now: LinkTime) {
        self.now = now
        if bytes.byteCount > 0 { lastReceiveAt = now }
        guard !sawIAP2Detect else {
            // The accessory started over in iAP2: everything from here is for the iAP2 endpoint.
            bytes.withUnsafeBytes { afterDetect.append(contentsOf: $0) }
            return
        }
        scanned { scanner, onFrame, onDrop in scanner.scan(bytes, onFrame: onFrame, onDrop: onDrop) }
    }

    /// Runs `scan` over the scanner and handles the frames and drops it reports.
    private mutating func scanned(
        _ scan: (inout FrameScanner, (ScannedFrame, RawSpan) -> Void, (ScanDrop) -> Void) -> Void
    ) {
        enum Item { case body([UInt8]), detect, raw([UInt8]) }
        var items: [Item] = []
        var drops: [ScanDrop] = []
        var detected = false
        let isDevice = role == .device
        scan(&scanner, { frame, span in
            if detected {
                items.append(.raw(span.extracting(frame.range).withUnsafeBytes { Array($0) }))
                return
            }
            switch frame.kind {
            case .detect:
                items.append(.detect)
                detected = isDevice
            case .iap1: items.append(.body(span.extracting(frame.payload).withUnsafeBytes { Array($0) }))
            case .iap2: break // not for iAP1: dropped like garbage
            }
        }, { drops.append($0) })
        for drop in drops { events.append(.link(.dropped(drop))) }
        for item in items {
            switch item {
            case let .body(body): if !sawIAP2Detect { receivePacket(body: body) }
            case .detect: receivedDetect()
            case let .raw(frame): afterDetect += frame
            }
        }
        if sawIAP2Detect {
            afterDetect += scanner.takePendingBytes()
            return
        }
        pump()
    }

    /// Device role, after ``sawIAP2Detect``: the bytes that came after the detect (whole iAP2
    /// packets and the start of a partial one), for the iAP2 endpoint that takes over.
    public mutating func takeBytesAfterDetect() -> [UInt8] {
        defer { afterDetect = [] }
        return afterDetect
    }

    /// Feeds bytes from the peer held in an array.
    public mutating func receive(_ bytes: [UInt8], now: LinkTime) { receive(bytes.span.bytes, now: now) }

    /// Device: takes packet bodies (lingo through payload) that arrived before the switch to
    /// iAP1, in order, then the bytes of a partial packet.
    public mutating func takeOver(bodies: [[UInt8]], partial: [UInt8], now: LinkTime) {
        self.now = now
        for body in bodies { receivePacket(body: body) }
        if !partial.isEmpty { receive(partial, now: now) } else { pump() }
    }

    /// Device: asks the accessory to identify (RequestIdentify), for an accessory that answered
    /// the iAP2 detect the iAP1 way and waits.
    public mutating func requestIdentify() {
        send(IAP1Command.requestIdentify, [])
        deadline = now + answerTimeout
        step = .identifying(awaiting: IAP1Command.startIDPS)
    }

    /// Fires every timer due at `now`.
    public mutating func advance(to now: LinkTime) {
        self.now = now
        if let gap = gapDeadline, gap <= now {
            // The line fell silent in the middle of a packet: what its length swallowed is
            // scanned again (the iAP2 detect of an accessory that started over, for one).
            scanned { scanner, onFrame, onDrop in scanner.abandonPartialFrame(onFrame: onFrame, onDrop: onDrop) }
            partialPacketsAbandoned += 1
        }
        if let deadline, deadline <= now {
            self.deadline = nil
            let what: String
            switch step {
            case .identifying: what = role == .device ? "identification (EndIDPS)" : "identification"
            case .awaitingCertificate: what = "GetAccessoryAuthenticationInfo"
            case .awaitingSignature: what = "GetAccessoryAuthenticationSignature"
            case .idle, .done: what = ""
            }
            if !what.isEmpty {
                step = .done
                events.append(.controlFailed(.noAnswer(what)))
            }
        }
        if role == .device, !dataAcknowledgementsSeen, let oldest = inFlight.first, oldest.sentAt + answerTimeout <= now {
            // An accessory that never answers AccessoryDataTransfer... iPodDataTransfer with
            // iPodAck would otherwise hold every session's window for ever.
            dataAcknowledgementsMissing = true
            events.append(.tolerated("the accessory did not acknowledge iPodDataTransfer within \(answerTimeout); its data is taken as "
                + "delivered when sent from now on (written no longer means acknowledged on this connection)"))
            let overdue = inFlight.filter { $0.sentAt + answerTimeout <= now }
            inFlight.removeAll { $0.sentAt + answerTimeout <= now }
            for entry in overdue {
                if let tid = entry.transactionID { retiredTransactions.append(tid) }
                sessions[entry.session]?.acknowledged += entry.bytes
            }
            if retiredTransactions.count > 4 * dataWindow { retiredTransactions.removeFirst(retiredTransactions.count - 4 * dataWindow) }
        }
        for id in sessions.keys.sorted() {
            if let openDeadline = sessions[id]?.openDeadline, openDeadline <= now {
                closeSession(id, reason: "the accessory did not answer OpenDataSessionForProtocol in time", notifyPeer: false)
            }
        }
        pump()
    }

    /// When ``advance(to:)`` must be called next, if anything is scheduled.
    public var nextDeadline: LinkTime? {
        ([deadline, gapDeadline, role == .device && !dataAcknowledgementsSeen ? inFlight.first.map { $0.sentAt + answerTimeout } : nil]
            + sessions.values.map(\.openDeadline)).compactMap { $0 }.min()
    }

    /// When the partial packet held is given up on, if one is held (and the bytes are still
    /// this endpoint's).
    private var gapDeadline: LinkTime? {
        scanner.pendingByteCount > 0 && !sawIAP2Detect ? lastReceiveAt + interByteGap : nil
    }

    /// Packets to send, in order (each a whole packet with its sync byte, or the detect).
    public mutating func takeOutput() -> [[UInt8]] {
        defer { output.removeAll(keepingCapacity: true) }
        return output
    }

    /// Whether ``takeOutput()`` has anything.
    public var hasOutput: Bool { !output.isEmpty }

    /// What happened since the last call, in order.
    public mutating func takeEvents() -> [EndpointEvent] {
        defer { events.removeAll(keepingCapacity: true) }
        return events
    }

    /// The identity, once identified (and authenticated when the accessory asked for it).
    public var identity: AccessoryIdentity? { identified ? identityValue : nil }

    // MARK: Sessions

    /// Device: opens a data session for `protocolName`.
    public mutating func openSession(protocolName: String, now: LinkTime) throws(EndpointError) -> UInt16 {
        self.now = now
        guard role == .device, identified, let identity = identityValue else { throw .notIdentified }
        guard let declared = identity.protocols.first(where: { $0.name == protocolName }) else {
            throw .unsupportedProtocol(protocolName)
        }
        if sessions.values.contains(where: { $0.protocolName == protocolName && ($0.state == .open || $0.state == .opening) }) {
            throw .protocolInUse(protocolName)
        }
        var id = nextSessionID
        while id == 0 || sessions[id] != nil { id &+= 1 }
        nextSessionID = id &+ 1
        var payload: [UInt8] = []
        payload.appendUInt16BE(id)
        payload.append(declared.identifier)
        let tid = send(IAP1Command.openDataSessionForProtocol, payload)
        sessions[id] = Session(protocolName: protocolName, protocolIndex: declared.identifier, state: .opening,
                               openTransactionID: tid, openDeadline: now + answerTimeout)
        return id
    }

    /// Closes a session (the device tells the accessory) and forgets it.
    public mutating func closeSession(_ sessionID: UInt16, now: LinkTime) {
        self.now = now
        closeSession(sessionID, reason: nil, notifyPeer: true)
        pump()
    }

    /// Queues bytes for a session; returns how many were taken (fewer under back-pressure).
    public mutating func write(_ sessionID: UInt16, _ bytes: some Collection<UInt8>, now: LinkTime) throws(EndpointError) -> Int {
        self.now = now
        guard let session = sessions[sessionID] else { throw .unknownSession(sessionID) }
        guard session.state == .open else { throw .sessionNotOpen(sessionID) }
        let taken = min(max(0, bufferLimit - session.outbound.byteCount), bytes.count)
        if taken > 0 { sessions[sessionID]!.outbound.append(Array(bytes.prefix(taken))[...], owned: true) }
        if taken < bytes.count { sessions[sessionID]!.wasFull = true }
        if !roundRobin.contains(sessionID) { roundRobin.append(sessionID) }
        pump()
        return taken
    }

    /// Takes up to `maxBytes` received bytes of a session; the room this makes lets held data in.
    public mutating func read(_ sessionID: UInt16, maxBytes: Int = .max) -> [UInt8] {
        guard sessions[sessionID] != nil else { return [] }
        let bytes = sessions[sessionID]!.inbound.take(maxBytes).bytes
        if !bytes.isEmpty { releaseHeld(sessionID) }
        return bytes
    }

    /// Lends the next received bytes of a session in place; `body` returns how many it consumed. Nil when nothing is readable.
    public mutating func borrow<Result>(_ sessionID: UInt16, _ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        guard sessions[sessionID] != nil else { return nil }
        let result = try sessions[sessionID]!.inbound.borrowFirst(body)
        if result != nil { releaseHeld(sessionID) }
        return result
    }

    /// Bytes readable on a session.
    public func bytesAvailable(_ sessionID: UInt16) -> Int { sessions[sessionID]?.inbound.byteCount ?? 0 }
    /// Bytes a session may still queue for sending (0 unless open).
    public func spaceAvailable(_ sessionID: UInt16) -> Int {
        guard let session = sessions[sessionID], session.state == .open else { return 0 }
        return max(0, bufferLimit - session.outbound.byteCount)
    }
    /// Bytes written to a session and not yet acknowledged by the peer.
    public func bytesPending(_ sessionID: UInt16) -> Int {
        guard let session = sessions[sessionID] else { return 0 }
        return session.outbound.byteCount + inFlight.reduce(0) { $0 + ($1.session == sessionID ? $1.bytes : 0) }
    }
    /// Bytes of received data packets a session holds unacknowledged until its reader makes room
    /// (at most ``maxHeldPackets`` packets).
    public func bytesHeld(_ sessionID: UInt16) -> Int { sessions[sessionID]?.held.reduce(0) { $0 + $1.data.count } ?? 0 }
    /// Bytes of a session the peer acknowledged (AccessoryAck / iPodAck for each data packet).
    public func bytesAcknowledged(_ sessionID: UInt16) -> Int { sessions[sessionID]?.acknowledged ?? 0 }
    /// A session's state; nil for a session this side does not know.
    public func sessionState(_ sessionID: UInt16) -> EASessionState? { sessions[sessionID]?.state }
    /// The open (or opening) sessions and their protocol names.
    public var openSessions: [(id: UInt16, protocolName: String)] {
        sessions.filter { $0.value.state == .open || $0.value.state == .opening }
            .sorted { $0.key < $1.key }.map { ($0.key, $0.value.protocolName) }
    }

}
