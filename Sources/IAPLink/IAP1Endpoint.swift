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
    public private(set) var maxDataPerPacket: Int
    /// Whether packets carry transaction ids (StartIDPS turns them on).
    public private(set) var transactionIDs = false
    /// Whether identification and authentication are done.
    public private(set) var identified = false

    private var identityValue: AccessoryIdentity?
    private let policy: any AuthenticationPolicy
    private let bufferLimit: Int
    private var scanner: FrameScanner
    private var output: [[UInt8]] = []
    private var events: [EndpointEvent] = []
    private var step: Step = .idle
    private var deadline: LinkTime?
    private var awaitedTransactionID: UInt16?
    private var nextTransactionID: UInt16 = 0
    private var now: LinkTime = .zero
    private var sessions: [UInt16: Session] = [:]
    private var nextSessionID: UInt16 = 1
    private var roundRobin: [UInt16] = []
    private var inFlight: [(transactionID: UInt16?, session: UInt16, bytes: Int)] = []
    /// Device: FID tokens and what was wrong with them, gathered between StartIDPS and EndIDPS.
    private var tokens: [FIDToken] = []
    private var requiredTokenRejected = false
    private var tokenProblems: [String] = []
    // Accessory role.
    private let style: IAP1IdentificationStyle
    private let waitsForDevice: Bool
    private var certificate: [UInt8] = []
    /// Accessory: the coprocessor that signs challenges (nil: the stand-in response).
    private var signer: (any AuthenticationSigner)?
    /// Device: the policy's conclusion on the accessory's authentication.
    public private(set) var authentication = AuthenticationOutcome.notChecked
    private var certificateTransactionID: UInt16?
    private var certificateSectionsSent = 0
    /// Device role: the accessory sent the iAP2 detect (it started over in iAP2).
    public private(set) var sawIAP2Detect = false
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
    public private(set) var encodeFailures = 0
    /// Transaction ids of data packets whose session closed before their acknowledgement came:
    /// a late acknowledgement for one of them is expected, not an error.
    private var retiredTransactions: [UInt16] = []
    /// Indices declared by EAProtocolTokens during this IDPS.
    private var declaredIndices: Set<UInt8> = []

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
        for id in sessions.keys.sorted() {
            if let openDeadline = sessions[id]?.openDeadline, openDeadline <= now {
                closeSession(id, reason: "the accessory did not answer OpenDataSessionForProtocol in time", notifyPeer: false)
            }
        }
        pump()
    }

    /// When ``advance(to:)`` must be called next, if anything is scheduled.
    public var nextDeadline: LinkTime? {
        ([deadline, gapDeadline] + sessions.values.map(\.openDeadline)).compactMap { $0 }.min()
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
        payload.appendUInt16(id)
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

    // MARK: Sending

    /// Queues a General-lingo packet; returns the transaction id it carries.
    @discardableResult
    private mutating func send(_ command: UInt8, _ payload: [UInt8], answering transactionID: UInt16? = nil) -> UInt16? {
        var tid: UInt16?
        if transactionIDs {
            if let transactionID {
                tid = transactionID
            } else {
                tid = nextTransactionID
                nextTransactionID &+= 1
            }
        }
        let packet = IAP1Packet(lingo: 0x00, command: UInt16(command), transactionID: tid, payload: payload)
        do {
            output.append(try packet.encoded(sync: true))
        } catch {
            // Every payload this side builds fits (data packets are clamped): counted so a test
            // or the fuzzer sees it if that ever stops being true.
            encodeFailures += 1
            events.append(.malformedMessage("iAP1: could not encode \(IAP1Catalogue.generalCommands[command] ?? "command"): \(error)"))
        }
        return tid
    }

    /// The acknowledgement this side sends for the peer's commands: iPodAck (device) or
    /// AccessoryAck (accessory).
    private mutating func acknowledge(_ command: UInt8, status: UInt8, transactionID: UInt16?, extra: [UInt8] = []) {
        let ackCommand = role == .device ? IAP1Command.iPodAck : IAP1Command.accessoryAck
        send(ackCommand, [status, command] + extra, answering: transactionID)
    }

    /// The data command this side sends and the one it receives.
    private var dataOut: UInt8 { role == .device ? IAP1Command.iPodDataTransfer : IAP1Command.accessoryDataTransfer }
    private var dataIn: UInt8 { role == .device ? IAP1Command.accessoryDataTransfer : IAP1Command.iPodDataTransfer }

    /// Moves queued session bytes into data packets, one per session in turn, while the window
    /// has room.
    private mutating func pump() {
        var idle = 0
        while !roundRobin.isEmpty, idle < roundRobin.count {
            let id = roundRobin.removeFirst()
            guard var session = sessions[id], session.state == .open else { continue }
            roundRobin.append(id)
            // The window is per session, so a session whose reader is slow does not hold up
            // the others.
            guard session.outbound.byteCount > 0, inFlight.count(where: { $0.session == id }) < dataWindow else {
                idle += 1
                continue
            }
            idle = 0
            var payload: [UInt8] = []
            payload.reserveCapacity(2 + min(maxDataPerPacket, session.outbound.byteCount))
            payload.appendUInt16(id)
            payload.append(contentsOf: session.outbound.take(maxDataPerPacket).bytes)
            let tid = send(dataOut, payload)
            inFlight.append((tid, id, payload.count - 2))
            if session.wasFull, session.outbound.byteCount < bufferLimit {
                session.wasFull = false
                events.append(.spaceAvailable(sessionID: id))
            }
            sessions[id] = session
        }
    }

    // MARK: Receiving

    private mutating func receivedDetect() {
        switch role {
        case .accessory:
            // "I do not speak iAP2", the way PROTOCOL.md §1.11 gives it (an iAP1 device's
            // answer; what real accessories send is not known). Always: on a serial line the
            // host that sends the detect may be a new one that missed this accessory's own
            // StartIDPS, and its RequestIdentify then starts identification over (answers to the
            // earlier attempt are ignored as stale).
            output.append(IAP2Detect.iap1Reply)
        case .device:
            sawIAP2Detect = true
        }
    }

    private mutating func receivePacket(body: [UInt8]) {
        // The iAP1 answer to the detect: expected from an iAP1 accessory, nothing to do.
        if body == [0x00, IAP1Command.iPodAck, IAP1AckStatus.badParameter, IAP2Detect.command] { return }
        if role == .accessory, body.count == 2 || body.count == 4, body[0] == 0x00, body[1] == IAP1Command.requestIdentify {
            // The device may ask before or after transaction ids were agreed: both shapes count.
            beginIdentification()
            return
        }
        if role == .device, body.count >= 2, body[0] == 0x00 {
            // How the accessory identifies decides whether transaction ids are present.
            if body[1] == IAP1Command.startIDPS { transactionIDs = body.count >= 4 }
            if body[1] == IAP1Command.identifyDeviceLingoes, body.count == 14 { transactionIDs = false }
        }
        let packet: IAP1Packet
        do {
            packet = try IAP1Packet.decode(body: body.span.bytes, transactionIDs: transactionIDs)
        } catch {
            events.append(.malformedMessage("iAP1: \(error)"))
            return
        }
        guard packet.lingo == 0x00 else {
            events.append(.unhandledIAP1Command(lingo: packet.lingo, command: packet.command))
            guard role == .device else { return }
            if packet.lingo == 0x04 {
                // The Extended Interface lingo has its own iPodAck (0x0001) with a two-byte
                // command id (PROTOCOL.md §1.6).
                let ack = IAP1Packet(lingo: 0x04, command: 0x0001, transactionID: packet.transactionID,
                                     payload: [IAP1AckStatus.badParameter, UInt8(packet.command >> 8), UInt8(packet.command & 0xFF)])
                if let bytes = try? ack.encoded(sync: true) { output.append(bytes) }
            } else {
                // Other lingoes' acks are not in PROTOCOL.md: the General iPodAck names the command.
                acknowledge(UInt8(truncatingIfNeeded: packet.command), status: IAP1AckStatus.badParameter, transactionID: packet.transactionID)
            }
            return
        }
        let command = UInt8(packet.command)
        // Each handler reads the payload's fields through one reader whose errors name the command.
        var reader = IAP1PayloadReader(packet.payload, what: IAP1Catalogue.generalCommands[command] ?? "command")
        do {
            switch role {
            case .device: try deviceHandle(command, packet, reader: &reader)
            case .accessory: try accessoryHandle(command, packet, reader: &reader)
            }
        } catch {
            events.append(.malformedMessage("iAP1 \(IAP1Catalogue.generalCommands[command] ?? "command 0x\(hexByte(command))"): \(error)"))
            if role == .device {
                acknowledge(command, status: IAP1AckStatus.badParameter, transactionID: packet.transactionID)
            }
        }
    }

    /// Whether an answer carries the transaction id of the request it answers; a mismatch is
    /// reported and the answer ignored.
    private mutating func matches(_ packet: IAP1Packet, _ expected: UInt16?) -> Bool {
        guard transactionIDs, let expected, packet.transactionID != expected else { return true }
        let name = IAP1Catalogue.generalCommands[UInt8(packet.command)] ?? "command"
        events.append(.malformedMessage("iAP1 \(name) carries transaction id \(packet.transactionID.map(String.init) ?? "none") where \(expected) was expected; ignored"))
        return false
    }

    // MARK: Device role

    private mutating func deviceHandle(_ command: UInt8, _ packet: IAP1Packet, reader: inout IAP1PayloadReader) throws(WireError) {
        let tid = packet.transactionID
        switch command {
        case IAP1Command.startIDPS:
            restartIdentification()
            acknowledge(command, status: IAP1AckStatus.success, transactionID: tid)
            step = .identifying(awaiting: IAP1Command.endIDPS)
            deadline = now + answerTimeout
        case IAP1Command.setFIDTokenValues:
            guard case .identifying = step else {
                return acknowledge(command, status: IAP1AckStatus.badParameter, transactionID: tid)
            }
            let list = try FIDToken.decodeList(packet.payload)
            guard tokens.count + list.count <= Self.maxTokens else {
                tokenProblems.append("more than \(Self.maxTokens) FID tokens")
                return acknowledge(command, status: IAP1AckStatus.outOfResources, transactionID: tid)
            }
            let acks = list.map { judge($0) }
            send(IAP1Command.ackFIDTokenValues, FIDTokenAck.encodeList(acks), answering: tid)
        case IAP1Command.endIDPS:
            guard case .identifying = step else {
                return acknowledge(command, status: IAP1AckStatus.badParameter, transactionID: tid)
            }
            let status = try reader.uint8("status")
            finishIDPS(accessoryStatus: status, transactionID: tid)
        case IAP1Command.identifyDeviceLingoes:
            let lingoes = try reader.uint32("lingoes")
            let options = try reader.uint32("options")
            _ = try reader.uint32("device id")
            restartIdentification()
            acknowledge(command, status: IAP1AckStatus.success, transactionID: tid)
            identityValue = AccessoryIdentity(name: "", modelIdentifier: "", manufacturer: "", serialNumber: "", firmwareVersion: "",
                                              hardwareVersion: "", transportComponents: [], protocolVersion: .iap1)
            _ = lingoes
            // Options 1 (defer) and 2 (now) both mean the accessory can authenticate: the device
            // may ask whenever it likes, and asks at once. 0: no authentication.
            if options & 0x3 == 0 {
                guard !policy.requiresAuthentication else {
                    return failAuthentication(.refused("the accessory does not authenticate (IdentifyDeviceLingoes without authentication) and the policy requires it"))
                }
                identifiedNow()
            } else {
                startAuthentication()
            }
        case IAP1Command.requestTransportMaxPayloadSize:
            var payload: [UInt8] = []
            payload.appendUInt16(UInt16(maxIncomingPayload))
            send(IAP1Command.returnTransportMaxPayloadSize, payload, answering: tid)
        case IAP1Command.requestLingoProtocolVersion:
            let lingo = try reader.uint8("lingo")
            guard lingo == 0x00 else { return acknowledge(command, status: IAP1AckStatus.badParameter, transactionID: tid) }
            send(IAP1Command.returnLingoProtocolVersion, [lingo, 1, 9], answering: tid)
        case IAP1Command.getiPodOptionsForLingo:
            let lingo = try reader.uint8("lingo")
            send(IAP1Command.retiPodOptionsForLingo, [lingo, 0, 0, 0, 0, 0, 0, 0, 0], answering: tid)
        case IAP1Command.retAccessoryAuthenticationInfo:
            guard case let .awaitingCertificate(sections, next) = step else {
                return acknowledge(command, status: IAP1AckStatus.badParameter, transactionID: tid)
            }
            guard matches(packet, awaitedTransactionID) else { return }
            let major = try reader.uint8("major version")
            _ = try reader.uint8("minor version")
            guard major == 2 else {
                send(IAP1Command.ackAccessoryAuthenticationInfo, [IAP1AckStatus.badAuthenticationVersion], answering: tid)
                return failAuthentication("the accessory uses authentication version \(major); only 2.0 is supported")
            }
            let current = try reader.uint8("current section")
            let last = try reader.uint8("last section")
            guard current == next, current <= last else {
                send(IAP1Command.ackAccessoryAuthenticationInfo, [IAP1AckStatus.certificateInvalid], answering: tid)
                return failAuthentication(.malformedCertificate("certificate section \(current) of \(last) arrived where section \(next) was expected"))
            }
            let collected = sections + reader.rest()
            guard collected.count <= Self.maxCertificateLength else {
                send(IAP1Command.ackAccessoryAuthenticationInfo, [IAP1AckStatus.badParameter], answering: tid)
                return failAuthentication(.malformedCertificate("the certificate is longer than \(Self.maxCertificateLength) bytes"))
            }
            deadline = now + answerTimeout
            if current < last {
                step = .awaitingCertificate(sections: collected, next: next + 1)
                acknowledge(command, status: IAP1AckStatus.success, transactionID: tid)
                return
            }
            let examination = policy.examine(certificate: collected)
            if let refusal = examination.refusal {
                send(IAP1Command.ackAccessoryAuthenticationInfo, [IAP1AckStatus.certificateInvalid], answering: tid)
                return failAuthentication(refusal, certificate: examination.summary)
            }
            send(IAP1Command.ackAccessoryAuthenticationInfo, [IAP1AckStatus.success], answering: tid)
            // Authentication 2.0 over iAP1 uses a 20-byte challenge (PROTOCOL.md §1.8); a P-256
            // certificate (coprocessor 3.0) gets the 32 bytes its scheme signs.
            let challenge = Challenge.draw(length: examination.scheme?.challengeLength ?? 20)
            awaitedTransactionID = send(IAP1Command.getAccessoryAuthenticationSignature, challenge + [1])
            step = .awaitingSignature(certificate: collected, challenge: challenge)
        case IAP1Command.retAccessoryAuthenticationSignature:
            guard case let .awaitingSignature(certificate, challenge) = step else {
                return acknowledge(command, status: IAP1AckStatus.badParameter, transactionID: tid)
            }
            guard matches(packet, awaitedTransactionID) else { return }
            let outcome = policy.outcome(certificate: certificate, challenge: challenge, response: packet.payload)
            guard outcome.accepted else {
                send(IAP1Command.ackAccessoryAuthenticationStatus, [IAP1AckStatus.certificateInvalid], answering: tid)
                authentication = outcome
                return failAuthentication(outcome.failure ?? .refused("the challenge response did not verify"), certificate: outcome.certificate)
            }
            send(IAP1Command.ackAccessoryAuthenticationStatus, [IAP1AckStatus.success], answering: tid)
            authentication = outcome
            events.append(.authenticated(certificate: certificate, outcome: outcome))
            identifiedNow()
        case IAP1Command.accessoryAck:
            let status = try reader.uint8("status")
            let acked = try reader.uint8("command")
            accessoryAck(status: status, command: acked, packet: packet)
        case IAP1Command.accessoryDataTransfer:
            guard identified else {
                return acknowledge(command, status: IAP1AckStatus.notAuthenticated, transactionID: tid)
            }
            try receiveData(packet, reader: &reader)
        case IAP1Command.iPodAck:
            break // an accessory has no business sending it; nothing to answer
        default:
            events.append(.unhandledIAP1Command(lingo: 0x00, command: packet.command))
            acknowledge(command, status: IAP1AckStatus.badParameter, transactionID: tid)
        }
    }

    private mutating func restartIdentification() {
        if identified { events.append(.accessoryRestarted(reason: "the accessory identified again")) }
        for id in sessions.keys.sorted() { closeSession(id, reason: "the accessory identified again", notifyPeer: false) }
        identified = false
        identityValue = nil
        authentication = .notChecked
        tokens = []
        tokenProblems = []
        declaredIndices = []
        requiredTokenRejected = false
        step = .idle
        deadline = nil
    }

    /// Checks one FID token; valid ones are kept for the identity.
    private mutating func judge(_ token: FIDToken) -> FIDTokenAck {
        func ack(_ status: UInt8, _ extra: [UInt8] = [], _ problem: String? = nil) -> FIDTokenAck {
            if let problem, tokenProblems.count < 16 { tokenProblems.append(problem) }
            if status == FIDTokenAck.requiredFailed { requiredTokenRejected = true }
            if status == FIDTokenAck.accepted { tokens.append(token) }
            return FIDTokenAck(type: token.type, subtype: token.subtype, status: status, extra: extra)
        }
        var reader = IAP1PayloadReader(token.data, what: "FID token \(IAP1Catalogue.tokenName(token.kind))")
        do {
            switch token.kind {
            case FIDToken.identify:
                let count = Int(try reader.uint8("lingo count"))
                let lingoes = try reader.bytes(count, "lingoes")
                _ = try reader.uint32("options")
                _ = try reader.uint32("device id")
                return ack(FIDTokenAck.accepted, lingoes)
            case FIDToken.accessoryCaps:
                _ = try reader.uint64("capabilities")
                return ack(FIDTokenAck.accepted)
            case FIDToken.accessoryInfo:
                let type = try reader.uint8("info type")
                switch type {
                case FIDToken.InfoType.name, FIDToken.InfoType.manufacturer, FIDToken.InfoType.modelNumber, FIDToken.InfoType.serialNumber:
                    _ = try reader.cString("string")
                case FIDToken.InfoType.firmwareVersion, FIDToken.InfoType.hardwareVersion:
                    _ = try reader.bytes(3, "version")
                case FIDToken.InfoType.maxIncomingPayloadSize:
                    _ = try reader.uint16("size")
                default:
                    break
                }
                return ack(FIDTokenAck.accepted, [type])
            case FIDToken.eaProtocol:
                let index = try reader.uint8("protocol index")
                let name = try reader.cString("protocol string")
                guard !name.isEmpty else { return ack(FIDTokenAck.requiredFailed, [index], "EAProtocolToken \(index) has an empty protocol string") }
                guard declaredIndices.insert(index).inserted else {
                    return ack(FIDTokenAck.requiredFailed, [index], "EAProtocolToken index \(index) is declared twice")
                }
                return ack(FIDTokenAck.accepted, [index])
            case FIDToken.bundleSeedIDPref, FIDToken.eaProtocolMetadata, 0x0003:
                return ack(FIDTokenAck.accepted, Array(token.data.prefix(1)))
            default:
                return ack(FIDTokenAck.notSupported, [], "FID token \(hexByte(token.type)):\(hexByte(token.subtype)) is not supported; ignored")
            }
        } catch {
            let required = token.kind == FIDToken.identify || token.kind == FIDToken.eaProtocol
            return ack(required ? FIDTokenAck.requiredFailed : FIDTokenAck.optionalFailed, Array(token.data.prefix(1)), "\(error)")
        }
    }

    private mutating func finishIDPS(accessoryStatus: UInt8, transactionID: UInt16?) {
        guard accessoryStatus == 0 else {
            // 1 reset, 2 abort, 3 identifying on another transport.
            let answer: UInt8 = [1: 4, 2: 6, 3: 7][accessoryStatus] ?? 6
            send(IAP1Command.idpsStatus, [answer], answering: transactionID)
            restartIdentification()
            return
        }
        let missing = !tokens.contains { $0.kind == FIDToken.identify }
        if missing { tokenProblems.append("no IdentifyToken was sent") }
        if missing || requiredTokenRejected {
            let status: UInt8 = missing && requiredTokenRejected ? 3 : (missing ? 2 : 1)
            send(IAP1Command.idpsStatus, [status], answering: transactionID)
            events.append(.identificationRejected(IdentificationRejection(parameterIDs: [], reasons: tokenProblems)))
            // The accessory may start IDPS again; if it does not, the deadline reports it.
            step = .identifying(awaiting: IAP1Command.startIDPS)
            deadline = now + answerTimeout
            tokens = []
            declaredIndices = []
            requiredTokenRejected = false
            return
        }
        send(IAP1Command.idpsStatus, [0], answering: transactionID)
        identityValue = Self.identity(from: tokens)
        if let size = Self.maxIncomingPayload(in: tokens) { maxDataPerPacket = Self.dataPerPacket(forPayload: size) }
        startAuthentication()
    }

    /// The identity the accepted tokens describe.
    static func identity(from tokens: [FIDToken]) -> AccessoryIdentity {
        var strings: [UInt8: String] = [:]
        var versions: [UInt8: String] = [:]
        var protocols: [ExternalAccessoryProtocol] = []
        var teamID: String?
        var actions: [UInt8: UInt8] = [:]
        for token in tokens {
            var reader = IAP1PayloadReader(token.data, what: "token")
            switch token.kind {
            case FIDToken.accessoryInfo:
                guard let type = try? reader.uint8("type") else { continue }
                if let text = try? reader.cString("string") { strings[type] = text }
                if type == FIDToken.InfoType.firmwareVersion || type == FIDToken.InfoType.hardwareVersion, token.data.count >= 4 {
                    versions[type] = token.data[1...3].map(String.init).joined(separator: ".")
                }
            case FIDToken.eaProtocol:
                if let index = try? reader.uint8("index"), let name = try? reader.cString("name") {
                    protocols.append(ExternalAccessoryProtocol(identifier: index, name: name))
                }
            case FIDToken.bundleSeedIDPref:
                let text = String(decoding: token.data.prefix { $0 != 0 }, as: UTF8.self)
                if !text.isEmpty { teamID = text }
            case FIDToken.eaProtocolMetadata where token.data.count >= 2:
                actions[token.data[0]] = token.data[1]
            default:
                break
            }
        }
        for index in protocols.indices { protocols[index].matchAction = actions[protocols[index].identifier] ?? 0 }
        typealias T = FIDToken.InfoType
        return AccessoryIdentity(
            name: strings[T.name] ?? "", modelIdentifier: strings[T.modelNumber] ?? "", manufacturer: strings[T.manufacturer] ?? "",
            serialNumber: strings[T.serialNumber] ?? "", firmwareVersion: versions[T.firmwareVersion] ?? "",
            hardwareVersion: versions[T.hardwareVersion] ?? "", protocols: protocols, appMatchTeamID: teamID,
            transportComponents: [], protocolVersion: .iap1)
    }

    static func maxIncomingPayload(in tokens: [FIDToken]) -> Int? {
        for token in tokens where token.kind == FIDToken.accessoryInfo && token.data.count >= 3
            && token.data[0] == FIDToken.InfoType.maxIncomingPayloadSize {
            return Int(token.data[1]) << 8 | Int(token.data[2])
        }
        return nil
    }

    private mutating func startAuthentication() {
        authentication = .notChecked
        awaitedTransactionID = send(IAP1Command.getAccessoryAuthenticationInfo, [])
        step = .awaitingCertificate(sections: [], next: 0)
        deadline = now + answerTimeout
    }

    private mutating func failAuthentication(_ why: String) {
        failAuthentication(.refused(why))
    }

    private mutating func failAuthentication(_ failure: AuthenticationFailure, certificate: CertificateSummary? = nil) {
        step = .done
        deadline = nil
        if authentication.accepted || authentication.status == .notChecked {
            authentication = AuthenticationOutcome(status: .notVerified(failure), accepted: false, certificate: certificate)
        }
        events.append(.controlFailed(.authenticationFailed(failure.description)))
    }

    private mutating func identifiedNow() {
        step = .done
        deadline = nil
        identified = true
        identityValue?.authentication = authentication
        if let identityValue { events.append(.identified(identityValue)) }
    }

    private mutating func accessoryAck(status: UInt8, command: UInt8, packet: IAP1Packet) {
        switch command {
        case IAP1Command.openDataSessionForProtocol:
            let match = sessions.first { $0.value.state == .opening && (!transactionIDs || $0.value.openTransactionID == packet.transactionID) }
            guard let id = match?.key, var session = match?.value else {
                events.append(.malformedMessage("iAP1 AccessoryAck for OpenDataSessionForProtocol matches no session being opened (transaction id \(packet.transactionID.map(String.init) ?? "none"))"))
                return
            }
            guard status == IAP1AckStatus.success else {
                let name = IAP1Catalogue.ackStatuses[status] ?? "status 0x\(hexByte(status))"
                closeSession(id, reason: "the accessory refused the session (\(name))", notifyPeer: false)
                return
            }
            session.state = .open
            session.openDeadline = nil
            session.openTransactionID = nil
            sessions[id] = session
            events.append(.sessionOpened(sessionID: id, protocolName: session.protocolName))
            events.append(.spaceAvailable(sessionID: id))
        case IAP1Command.iPodDataTransfer:
            dataAcknowledged(status: status, packet: packet)
        default:
            break // CloseDataSession and others: nothing waits for them
        }
    }

    // MARK: Both roles: data

    /// A data packet of the peer: kept (and acknowledged) when the reader has room, held
    /// unacknowledged when it has not.
    private mutating func receiveData(_ packet: IAP1Packet, reader: inout IAP1PayloadReader) throws(WireError) {
        let id = try reader.uint16("session id")
        let data = reader.rest()
        let tid = packet.transactionID
        guard var session = sessions[id], session.state == .open else {
            let status = role == .device ? IAP1AckStatus.unknownSessionID : IAP1AckStatus.badParameter
            return acknowledge(dataIn, status: status, transactionID: tid)
        }
        let fits = session.inbound.byteCount + data.count <= bufferLimit || session.inbound.byteCount == 0
        guard session.held.isEmpty, fits else {
            if session.held.count < Self.maxHeldPackets {
                session.held.append((tid, data))
                sessions[id] = session
                return
            }
            // The peer did not wait for the acknowledgements: this packet cannot be kept, and a
            // stream with a hole in it is worse than an ended one.
            var extra: [UInt8] = []
            extra.appendUInt16(id)
            extra.appendUInt32(UInt32(clamping: data.count))
            acknowledge(dataIn, status: role == .device ? IAP1AckStatus.droppedData : IAP1AckStatus.badParameter,
                        transactionID: tid, extra: role == .device ? extra : [])
            sessions[id] = session
            endSession(id, reason: "the peer sent more than \(Self.maxHeldPackets) data packets without waiting for their acknowledgements; \(data.count) bytes were dropped, so the session ended")
            return
        }
        keep(data, in: &session, id: id)
        sessions[id] = session
        acknowledge(dataIn, status: IAP1AckStatus.success, transactionID: tid)
    }

    private mutating func keep(_ data: [UInt8], in session: inout Session, id: UInt16) {
        guard !data.isEmpty else { return }
        let wasEmpty = session.inbound.byteCount == 0
        session.inbound.append(data[...], owned: true)
        if wasEmpty { events.append(.bytesAvailable(sessionID: id)) }
    }

    /// Takes in held packets once the reader made room, and acknowledges them.
    private mutating func releaseHeld(_ id: UInt16) {
        guard var session = sessions[id] else { return }
        var released = false
        while let held = session.held.first,
              session.inbound.byteCount + held.data.count <= bufferLimit || session.inbound.byteCount == 0 {
            session.held.removeFirst()
            keep(held.data, in: &session, id: id)
            acknowledge(dataIn, status: IAP1AckStatus.success, transactionID: held.transactionID)
            released = true
        }
        sessions[id] = session
        if released { pump() }
    }

    /// The peer acknowledged one of our data packets.
    private mutating func dataAcknowledged(status: UInt8, packet: IAP1Packet) {
        let index = inFlight.firstIndex { !transactionIDs || $0.transactionID == packet.transactionID }
        guard let index else {
            if let tid = packet.transactionID, let retired = retiredTransactions.firstIndex(of: tid) {
                retiredTransactions.remove(at: retired) // its session closed meanwhile
                return
            }
            events.append(.malformedMessage("iAP1 acknowledgement of data with transaction id \(packet.transactionID.map(String.init) ?? "none") matches no packet sent; ignored"))
            return
        }
        let entry = inFlight.remove(at: index)
        guard status == IAP1AckStatus.success else {
            let name = IAP1Catalogue.ackStatuses[status] ?? "status 0x\(hexByte(status))"
            endSession(entry.session, reason: "the peer refused \(entry.bytes) bytes of data (\(name))")
            return
        }
        sessions[entry.session]?.acknowledged += entry.bytes
        pump()
    }

    /// Ends a session for a reason of this side's own: closed with the reason, and the device
    /// tells the accessory (CloseDataSession) so that its side ends too.
    private mutating func endSession(_ id: UInt16, reason: String) {
        closeSession(id, reason: reason, notifyPeer: false)
        if role == .device {
            var payload: [UInt8] = []
            payload.appendUInt16(id)
            send(IAP1Command.closeDataSession, payload)
        }
    }

    private mutating func closeSession(_ id: UInt16, reason: String?, notifyPeer: Bool) {
        guard var session = sessions[id] else { return }
        let wasLive = session.state == .open || session.state == .opening
        roundRobin.removeAll { $0 == id }
        for entry in inFlight where entry.session == id {
            if let tid = entry.transactionID { retiredTransactions.append(tid) }
        }
        if retiredTransactions.count > 4 * dataWindow { retiredTransactions.removeFirst(retiredTransactions.count - 4 * dataWindow) }
        inFlight.removeAll { $0.session == id }
        if notifyPeer {
            sessions[id] = nil
            if wasLive, role == .device {
                var payload: [UInt8] = []
                payload.appendUInt16(id)
                send(IAP1Command.closeDataSession, payload)
            }
        } else {
            session.state = .closed(reason)
            session.outbound.removeAll()
            session.held = []
            session.openDeadline = nil
            sessions[id] = session
        }
        if wasLive { events.append(.sessionClosed(sessionID: id, reason: reason)) }
    }

    // MARK: Accessory role

    private mutating func beginIdentification() {
        for id in sessions.keys.sorted() { closeSession(id, reason: "the device asked the accessory to identify again", notifyPeer: false) }
        sessions = [:]
        identified = false
        switch style {
        case .idps:
            transactionIDs = true
            awaitedTransactionID = send(IAP1Command.startIDPS, [])
            step = .identifying(awaiting: IAP1Command.startIDPS)
        case .deviceLingoes:
            transactionIDs = false
            var payload: [UInt8] = []
            payload.appendUInt32(1) // the General lingo
            payload.appendUInt32(2) // authenticate now
            payload.appendUInt32(0x200)
            send(IAP1Command.identifyDeviceLingoes, payload)
            step = .identifying(awaiting: IAP1Command.identifyDeviceLingoes)
        }
    }

    /// The FID tokens this accessory declares.
    var declaredTokens: [FIDToken] {
        guard let identity = identityValue else { return [] }
        var tokens: [FIDToken] = []
        var identify: [UInt8] = [1, 0x00]
        identify.appendUInt32(2)
        identify.appendUInt32(0x200)
        tokens.append(FIDToken(type: 0, subtype: 0, data: identify))
        var caps: [UInt8] = []
        caps.appendUInt64(1 << 9) // application communication (EA)
        tokens.append(FIDToken(type: 0, subtype: 1, data: caps))
        func info(_ type: UInt8, _ value: [UInt8]) { tokens.append(FIDToken(type: 0, subtype: 2, data: [type] + value)) }
        func cString(_ text: String) -> [UInt8] { Array(text.utf8.prefix(200)) + [0] }
        func version(_ text: String) -> [UInt8] {
            let parts = text.split(separator: ".").map { UInt8(clamping: Int($0) ?? 0) }
            return (0..<3).map { $0 < parts.count ? parts[$0] : 0 }
        }
        info(FIDToken.InfoType.name, cString(identity.name))
        info(FIDToken.InfoType.firmwareVersion, version(identity.firmwareVersion))
        info(FIDToken.InfoType.hardwareVersion, version(identity.hardwareVersion))
        info(FIDToken.InfoType.manufacturer, cString(identity.manufacturer))
        info(FIDToken.InfoType.modelNumber, cString(identity.modelIdentifier))
        info(FIDToken.InfoType.serialNumber, cString(identity.serialNumber))
        info(FIDToken.InfoType.maxIncomingPayloadSize, [UInt8(maxIncomingPayload >> 8), UInt8(maxIncomingPayload & 0xFF)])
        for item in identity.protocols {
            tokens.append(FIDToken(type: 0, subtype: 4, data: [item.identifier] + cString(item.name)))
        }
        if let team = identity.appMatchTeamID { tokens.append(FIDToken(type: 0, subtype: 5, data: cString(team))) }
        return tokens
    }

    private mutating func accessoryHandle(_ command: UInt8, _ packet: IAP1Packet, reader: inout IAP1PayloadReader) throws(WireError) {
        let tid = packet.transactionID
        switch command {
        case IAP1Command.requestIdentify:
            beginIdentification()
        case IAP1Command.iPodAck:
            let status = try reader.uint8("status")
            let acked = try reader.uint8("command")
            switch acked {
            case IAP1Command.startIDPS where status == IAP1AckStatus.success:
                guard answers(IAP1Command.startIDPS, packet) else { return }
                awaitedTransactionID = send(IAP1Command.requestTransportMaxPayloadSize, [])
                step = .identifying(awaiting: IAP1Command.requestTransportMaxPayloadSize)
            case IAP1Command.identifyDeviceLingoes where status == IAP1AckStatus.success:
                step = .idle // authentication comes next
            case IAP1Command.retAccessoryAuthenticationInfo where status == IAP1AckStatus.success:
                sendCertificateSection()
            case IAP1Command.accessoryDataTransfer:
                dataAcknowledged(status: status, packet: packet)
            default:
                if status != IAP1AckStatus.success {
                    events.append(.malformedMessage("iAP1: the device answered \(IAP1Catalogue.generalCommands[acked] ?? "command 0x\(hexByte(acked))") with \(IAP1Catalogue.ackStatuses[status] ?? "status \(status)")"))
                }
            }
        case IAP1Command.returnTransportMaxPayloadSize:
            guard answers(IAP1Command.requestTransportMaxPayloadSize, packet) else { return }
            let size = Int(try reader.uint16("size"))
            maxDataPerPacket = Self.dataPerPacket(forPayload: size)
            if let list = try? FIDToken.encodeList(declaredTokens) {
                awaitedTransactionID = send(IAP1Command.setFIDTokenValues, list)
            }
            step = .identifying(awaiting: IAP1Command.setFIDTokenValues)
        case IAP1Command.ackFIDTokenValues:
            guard answers(IAP1Command.setFIDTokenValues, packet) else { return }
            let acks = try FIDTokenAck.decodeList(packet.payload)
            if let refused = acks.first(where: { $0.status == FIDTokenAck.requiredFailed }) {
                events.append(.malformedMessage("iAP1: the device refused FID token \(IAP1Catalogue.tokenName(UInt16(refused.type) << 8 | UInt16(refused.subtype)))"))
            }
            awaitedTransactionID = send(IAP1Command.endIDPS, [0])
            step = .identifying(awaiting: IAP1Command.endIDPS)
        case IAP1Command.idpsStatus:
            guard answers(IAP1Command.endIDPS, packet) else { return }
            let status = try reader.uint8("status")
            if status != 0 {
                step = .done
                events.append(.controlFailed(.identificationRejected([UInt16(status)])))
            } else {
                step = .idle
            }
        case IAP1Command.getAccessoryAuthenticationInfo:
            certificateTransactionID = tid
            certificateSectionsSent = 0
            sendCertificateSection()
        case IAP1Command.ackAccessoryAuthenticationInfo:
            if try reader.uint8("status") != IAP1AckStatus.success { events.append(.controlFailed(.authenticationRefusedByDevice)) }
        case IAP1Command.getAccessoryAuthenticationSignature:
            // The challenge and a retry counter; a real accessory asks its coprocessor, one without
            // a signer sends a stand-in.
            let challenge = Array(packet.payload.dropLast())
            let response = signer?.sign(challenge: challenge) ?? standInResponse(to: challenge)
            send(IAP1Command.retAccessoryAuthenticationSignature, response, answering: tid)
        case IAP1Command.ackAccessoryAuthenticationStatus:
            if try reader.uint8("status") == IAP1AckStatus.success {
                step = .done
                identified = true
                if let identityValue { events.append(.identified(identityValue)) }
            } else {
                events.append(.controlFailed(.authenticationRefusedByDevice))
            }
        case IAP1Command.openDataSessionForProtocol:
            let id = try reader.uint16("session id")
            let index = try reader.uint8("protocol index")
            guard identified, let declared = identityValue?.protocols.first(where: { $0.identifier == index }), sessions[id]?.state != .open else {
                return acknowledge(command, status: IAP1AckStatus.badParameter, transactionID: tid)
            }
            sessions[id] = Session(protocolName: declared.name, protocolIndex: index, state: .open)
            acknowledge(command, status: IAP1AckStatus.success, transactionID: tid)
            events.append(.sessionOpened(sessionID: id, protocolName: declared.name))
        case IAP1Command.closeDataSession:
            let id = try reader.uint16("session id")
            acknowledge(command, status: sessions[id] == nil ? IAP1AckStatus.badParameter : IAP1AckStatus.success, transactionID: tid)
            closeSession(id, reason: nil, notifyPeer: false) // what was received stays readable
        case IAP1Command.iPodDataTransfer:
            try receiveData(packet, reader: &reader)
        default:
            events.append(.unhandledIAP1Command(lingo: 0x00, command: packet.command))
        }
    }

    /// Accessory: whether `packet` answers the identification request in flight (`command`, with
    /// its transaction id). Answers to a request made before the device asked for a new
    /// identification are stale, and ignored.
    private func answers(_ command: UInt8, _ packet: IAP1Packet) -> Bool {
        guard case let .identifying(awaiting) = step, awaiting == command else { return false }
        return !transactionIDs || packet.transactionID == awaitedTransactionID
    }

    private mutating func sendCertificateSection() {
        let length = Self.certificateSectionLength
        let count = max(1, (certificate.count + length - 1) / length)
        guard certificateSectionsSent < count, count <= 256 else { return }
        let section = certificateSectionsSent
        let start = section * length
        let data = start < certificate.count ? Array(certificate[start..<min(certificate.count, start + length)]) : []
        send(IAP1Command.retAccessoryAuthenticationInfo, [2, 0, UInt8(section), UInt8(count - 1)] + data, answering: certificateTransactionID)
        certificateSectionsSent += 1
    }
}

extension Array where Element == UInt8 {
    mutating func appendUInt16(_ value: UInt16) {
        append(UInt8(truncatingIfNeeded: value >> 8))
        append(UInt8(truncatingIfNeeded: value))
    }

    mutating func appendUInt32(_ value: UInt32) {
        appendUInt16(UInt16(truncatingIfNeeded: value >> 16))
        appendUInt16(UInt16(truncatingIfNeeded: value))
    }

    mutating func appendUInt64(_ value: UInt64) {
        appendUInt32(UInt32(truncatingIfNeeded: value >> 32))
        appendUInt32(UInt32(truncatingIfNeeded: value))
    }
}
