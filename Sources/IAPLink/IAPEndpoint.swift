internal import IAPWire

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
    // Exactly one of the two is set. Optionals (not an enum with payloads) so that calls
    // mutate the running endpoint in place, without copying its buffers.
    private var two: IAP2Endpoint?
    private var one: IAP1Endpoint?
    private let deviceSettings: (configuration: LinkConfiguration, policy: any AuthenticationPolicy, bufferLimit: Int, seed: UInt64)?
    private var answerTimeoutValue: Duration = .seconds(10)
    private var pendingEvents: [EndpointEvent] = []

    /// Creates the device side: iAP2 until the accessory shows it speaks iAP1.
    public init(device configuration: LinkConfiguration = .device, policy: any AuthenticationPolicy = AcceptingAuthentication(),
                sessionBufferLimit: Int = 1 << 20, initialSequence: UInt8, randomSeed: UInt64) {
        two = IAP2Endpoint(device: configuration, policy: policy, sessionBufferLimit: sessionBufferLimit,
                           initialSequence: initialSequence, randomSeed: randomSeed)
        deviceSettings = (configuration, policy, sessionBufferLimit, randomSeed)
    }

    /// Wraps an iAP2 endpoint (of either role) that keeps its protocol.
    public init(_ endpoint: IAP2Endpoint) {
        two = endpoint
        deviceSettings = nil
    }

    /// Wraps an iAP1 endpoint.
    public init(_ endpoint: IAP1Endpoint) {
        one = endpoint
        deviceSettings = nil
    }

    /// The protocol running now.
    public var protocolVersion: IAPProtocolVersion { one == nil ? .iap2 : .iap1 }

    /// The iAP2 endpoint, while iAP2 runs (for inspection: link state, statistics).
    public var iap2: IAP2Endpoint? { two }

    /// The iAP1 endpoint, while iAP1 runs.
    public var iap1: IAP1Endpoint? { one }

    /// How long the device waits for each answer of the accessory.
    public var answerTimeout: Duration {
        get { answerTimeoutValue }
        set {
            answerTimeoutValue = newValue
            two?.answerTimeout = newValue
            one?.answerTimeout = newValue
        }
    }

    // MARK: Driving

    public mutating func start(now: LinkTime) {
        if one != nil { one!.start(now: now) } else { two!.start(now: now) }
    }

    public mutating func receive(_ bytes: RawSpan, now: LinkTime) {
        if one != nil { one!.receive(bytes, now: now) } else { two!.receive(bytes, now: now) }
        if deviceSettings != nil { switchIfNeeded(now: now) }
    }

    public mutating func receive(_ bytes: [UInt8], now: LinkTime) { receive(bytes.span.bytes, now: now) }

    public mutating func advance(to now: LinkTime) {
        if one != nil { one!.advance(to: now) } else { two!.advance(to: now) }
    }

    public var nextDeadline: LinkTime? { one?.nextDeadline ?? two?.nextDeadline }

    public mutating func takeOutput() -> [[UInt8]] { one != nil ? one!.takeOutput() : two!.takeOutput() }
    public var hasOutput: Bool { one?.hasOutput ?? two!.hasOutput }

    public mutating func takeEvents() -> [EndpointEvent] {
        let events = one != nil ? one!.takeEvents() : two!.takeEvents()
        guard !pendingEvents.isEmpty else { return events }
        defer { pendingEvents.removeAll() }
        return pendingEvents + events
    }

    public var identity: AccessoryIdentity? { one != nil ? one!.identity : two!.identity }

    /// Device role: moves to iAP1 when an iAP1 packet arrived before the iAP2 link came up, and
    /// back to iAP2 when an iAP1 accessory sends the detect.
    private mutating func switchIfNeeded(now: LinkTime) {
        guard let settings = deviceSettings else { return }
        if let iap1 = one {
            guard iap1.sawIAP2Detect else { return }
            pendingEvents += one!.takeEvents()
            if iap1.identified { pendingEvents.append(.accessoryRestarted(reason: "the accessory started over in iAP2")) }
            var iap2 = IAP2Endpoint(device: settings.configuration, policy: settings.policy, sessionBufferLimit: settings.bufferLimit,
                                    initialSequence: UInt8(truncatingIfNeeded: settings.seed), randomSeed: settings.seed)
            iap2.answerTimeout = answerTimeoutValue
            pendingEvents.append(.protocolSwitched(.iap2))
            iap2.receive(IAP2Detect.bytes, now: now)
            one = nil
            two = iap2
            return
        }
        guard two!.link.state != .connected else { return }
        let events = two!.takeEvents()
        let bodies = events.compactMap { event -> [UInt8]? in
            if case let .link(.iap1Packet(body)) = event { return body }
            return nil
        }
        pendingEvents += events.filter { if case .link(.iap1Packet) = $0 { false } else { true } }
        guard !bodies.isEmpty else { return }
        let partial = two!.takeUnscannedBytes()
        var iap1 = IAP1Endpoint(device: settings.policy, sessionBufferLimit: settings.bufferLimit, randomSeed: settings.seed)
        iap1.answerTimeout = answerTimeoutValue
        pendingEvents.append(.protocolSwitched(.iap1))
        iap1.start(now: now)
        let refusal: [UInt8] = [0x00, IAP1Command.iPodAck, IAP1AckStatus.badParameter, IAP2Detect.command]
        if bodies.allSatisfy({ $0 == refusal }) { iap1.requestIdentify() }
        iap1.takeOver(bodies: bodies, partial: partial, now: now)
        two = nil
        one = iap1
    }

    // MARK: Sessions

    public mutating func openSession(protocolName: String, now: LinkTime) throws(EndpointError) -> UInt16 {
        if one != nil { return try one!.openSession(protocolName: protocolName, now: now) }
        return try two!.openSession(protocolName: protocolName, now: now)
    }

    public mutating func closeSession(_ sessionID: UInt16, now: LinkTime) {
        if one != nil { one!.closeSession(sessionID, now: now) } else { two!.closeSession(sessionID, now: now) }
    }

    public mutating func write(_ sessionID: UInt16, _ bytes: some Collection<UInt8>, now: LinkTime) throws(EndpointError) -> Int {
        if one != nil { return try one!.write(sessionID, bytes, now: now) }
        return try two!.write(sessionID, bytes, now: now)
    }

    public mutating func read(_ sessionID: UInt16, maxBytes: Int = .max) -> [UInt8] {
        one != nil ? one!.read(sessionID, maxBytes: maxBytes) : two!.read(sessionID, maxBytes: maxBytes)
    }

    public mutating func borrow<Result>(_ sessionID: UInt16, _ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        if one != nil { return try one!.borrow(sessionID, body) }
        return try two!.borrow(sessionID, body)
    }

    public func bytesAvailable(_ sessionID: UInt16) -> Int { one?.bytesAvailable(sessionID) ?? two!.bytesAvailable(sessionID) }
    public func spaceAvailable(_ sessionID: UInt16) -> Int { one?.spaceAvailable(sessionID) ?? two!.spaceAvailable(sessionID) }
    public func bytesPending(_ sessionID: UInt16) -> Int { one?.bytesPending(sessionID) ?? two!.bytesPending(sessionID) }
    public func bytesAcknowledged(_ sessionID: UInt16) -> Int { one?.bytesAcknowledged(sessionID) ?? two!.bytesAcknowledged(sessionID) }
    public func sessionState(_ sessionID: UInt16) -> EASessionState? { one != nil ? one!.sessionState(sessionID) : two!.sessionState(sessionID) }
}
