public import IAPLink
import IAPWire

/// A virtual MFi accessory: an accessory-role ``IAP2Endpoint`` built from a
/// ``SimulatorProfile``, with a behaviour running on every open EA session and optional faults.
///
/// Like `IAP2Endpoint` it is a pure state machine: no I/O, no clock, no Dispatch. The owner feeds
/// the device's bytes (``receive(_:now:)``) and the passage of time (``advance(to:)`` at
/// ``nextDeadline``), and takes frames for the device (``takeOutput()``) and events
/// (``takeEvents()``). After every input the behaviours run:
///
/// - echo writes back every byte it reads, in order. What the endpoint does not take waits in a
///   buffer of at most ``pendingLimit`` bytes; while that is full nothing more is read, so a host
///   that does not read slows the echo down instead of growing memory.
/// - sink reads everything, counting bytes and their CRC-32 (``statistics(for:)``).
/// - source writes `sourceBytes` bytes of ``sourcePatternByte(at:)`` as fast as back-pressure
///   allows, then nothing (bytes the host sends are read and counted).
/// - firmware-update speaks ``FirmwareUpdateProtocol``; a successful update ends with
///   ``SimulatorEvent/reboot(newFirmwareVersion:)`` after the profile's `rebootDelayMs`.
///
/// Faults apply to the frames the accessory sends (drop, corrupt, delay) and to the session data
/// it reads (stop reading, vanish). After ``SimulatorEvent/reboot(newFirmwareVersion:)`` or
/// ``SimulatorEvent/vanish`` the accessory is gone: it takes no input, produces no output
/// (frames still held by the delay fault are discarded) and has no deadline.
public struct SimulatedAccessory: Sendable {
    /// Whether the accessory is still there.
    public enum Lifecycle: Hashable, Sendable {
        /// Connected and working.
        case running
        /// Rebooted after a firmware update; start a new accessory with the new version.
        case rebooted(newFirmwareVersion: String)
        /// Gone by the `vanishAfterBytes` fault.
        case vanished
    }

    /// The profile the accessory was built from.
    public let profile: SimulatorProfile
    /// The accessory-role endpoint inside (for inspection: link state, statistics).
    public internal(set) var endpoint: IAPEndpoint
    /// The most bytes the endpoint holds per session and direction.
    public let sessionBufferLimit: Int
    /// Whether the accessory is still there.
    public private(set) var lifecycle = Lifecycle.running
    /// The latest time the owner passed in.
    public private(set) var now: LinkTime = .zero
    /// What the fault injection did so far.
    public private(set) var faultCounters = FaultCounters()

    /// The most bytes a behaviour holds for one session beyond what the endpoint takes (echo data
    /// waiting for the endpoint; firmware-update answers may exceed it by one read's worth).
    public static let pendingLimit = 16_384

    var runtimes: [UInt16: SessionRuntime] = [:]
    /// Sessions on native transports, by their native session id (its own numbering).
    var nativeRuntimes: [UInt16: SessionRuntime] = [:]
    var nativeBuffers: [UInt16: NativeBuffers] = [:]
    private var nextNativeID: UInt16 = 1
    var events: [SimulatorEvent] = []
    private var outbox = FIFO<(release: LinkTime, frame: [UInt8])>()
    private var random: FaultRandom
    var bytesRead = 0
    var bytesMoved = 0
    var readingStopped = false
    var reboot: (at: LinkTime, version: String)?
    /// Arrays the endpoint's events and frames are taken into, kept across calls.
    private var eventScratch = ReusableArray<EndpointEvent>()
    private var frameScratch = ReusableArray<[UInt8]>()
    /// The open sessions' ids in order (kept as they open and close, not sorted per call).
    var runtimeIDs: [UInt16] = []
    /// Whether the power-chatter deviation's answer went out.
    var saidPowerChatter = false

    /// Bytes a firmware-update session reads at a time (bounds the answers one read produces).
    static let firmwareReadSize = 256
    /// Most rounds of event handling and behaviours per input (a guard; a round that moves
    /// nothing ends the work much earlier).
    static let maxSettleRounds = 1_000

    /// Creates an accessory from a profile.
    ///
    /// - Parameters:
    ///   - profile: who the accessory is (identity, protocols, behaviours, faults), validated here.
    ///   - sessionBufferLimit: bytes the endpoint holds per session and direction; raised to the
    ///     profile's packet length if smaller (a packet must fit).
    ///   - initialSequence: the link's first sequence number.
    /// - Throws: ``SimulatorProfileError`` when the profile has an invalid value.
    public init(profile: SimulatorProfile, sessionBufferLimit: Int = 65_536, initialSequence: UInt8 = 0x01)
        throws(SimulatorProfileError)
    {
        let profile = profile.applyingDeviations()
        try profile.validate()
        var configuration = profile.linkConfiguration()
        profile.applyingDeviations(to: &configuration)
        let signer = try profile.signer()
        self.profile = profile
        self.sessionBufferLimit = max(sessionBufferLimit, Int(configuration.parameters.maxPacketLength))
        if let iap1 = profile.iap1 {
            var one = IAP1Endpoint(accessory: profile.identity(), style: iap1.identification,
                                   waitsForDevice: iap1.waitsForDevice, signer: signer, sessionBufferLimit: self.sessionBufferLimit,
                                   interByteGap: configuration.interByteGap, randomSeed: profile.faults.seed)
            one.gatesProtocolsOnLingoOptions = profile.deviations.contains(.iap1OptionsGateProtocols)
            one.acknowledgesData = !profile.deviations.contains(.iap1UnacknowledgedData)
            endpoint = IAPEndpoint(one)
        } else {
            var two = IAP2Endpoint(accessory: profile.identity(), configuration: configuration, signer: signer,
                                   sessionBufferLimit: self.sessionBufferLimit, initialSequence: initialSequence,
                                   randomSeed: profile.faults.seed)
            two.appLaunchRequest = profile.habits.appLaunch.map { AppLaunchRequest(bundleIdentifier: $0) }
            two.challengeResponseDelay = .milliseconds(profile.habits.challengeResponseDelayMs)
            if profile.deviations.contains(.splitControlMessages) { two.controlMessageSplit = 128 }
            two.identificationOverride = profile.deviatingIdentification(profile.identity())
            two.ignoredMessages = Set(profile.faults.ignoresMessages.map { MessageID($0) })
            endpoint = IAPEndpoint(two)
        }
        random = FaultRandom(seed: profile.faults.seed)
    }

    /// Whether the accessory is still there (neither rebooted nor vanished).
    public var isRunning: Bool { lifecycle == .running }

    /// Byte `index` of what a source session sends: `UInt8(truncatingIfNeeded: index &* 31 &+ 7)`.
    public static func sourcePatternByte(at index: Int) -> UInt8 { UInt8(truncatingIfNeeded: index &* 31 &+ 7) }

    /// `count` bytes of the source pattern from offset `start` (``sourcePatternByte(at:)`` of each),
    /// built in one pass: what a source session sends, and what a test compares with.
    public static func sourcePattern(from start: Int = 0, count: Int) -> [UInt8] {
        // With a capacity of 0 the initializer would write into the stdlib's shared empty
        // array, a race ThreadSanitizer reports when two threads do it at once.
        guard count > 0 else { return [] }
        return [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
            var index = 0
            while index < count {
                buffer[index] = UInt8(truncatingIfNeeded: (start &+ index) &* 31 &+ 7)
                index &+= 1
            }
            initialized = count
        }
    }

    // MARK: Driving

    /// Starts the link (the accessory sends the detect).
    public mutating func start(now: LinkTime) {
        note(now)
        guard isRunning else { return }
        if profile.deviations.contains(.noiseBeforeLink) {
            // Neither iAP1 nor iAP2: a boot banner, as a UART accessory may print.
            outbox.append((self.now, Array("boot 1.0\r\n".utf8) + [0xFF, 0x00, 0x5A, 0x13]))
        }
        endpoint.start(now: self.now)
        settle()
    }

    /// Feeds bytes from the device.
    public mutating func receive(_ bytes: [UInt8], now: LinkTime) {
        note(now)
        guard isRunning else { return }
        endpoint.receive(bytes, now: self.now)
        settle()
    }

    /// Tells the link how far the transport has got with its output (so time in the
    /// transport's queue is not taken for the host's silence).
    public mutating func noteOutputProgress(_ progress: TransportOutputProgress) {
        endpoint.noteOutputProgress(progress)
    }

    /// Fires every timer due at `now`: the link's, the delay fault's, the reboot.
    public mutating func advance(to now: LinkTime) {
        note(now)
        guard isRunning else { return }
        if let reboot, reboot.at <= self.now {
            self.reboot = nil
            goAway(.rebooted(newFirmwareVersion: reboot.version))
            events.append(.reboot(newFirmwareVersion: reboot.version))
            return
        }
        endpoint.advance(to: self.now)
        settle()
    }

    /// When ``advance(to:)`` must be called next, if anything is scheduled.
    public var nextDeadline: LinkTime? {
        guard isRunning else { return nil }
        var earliest = endpoint.nextDeadline
        for candidate in [outbox.first?.release, reboot?.at] {
            if let candidate, earliest.map({ candidate < $0 }) ?? true { earliest = candidate }
        }
        return earliest
    }

    /// Frames for the device that are due, oldest first (one link packet or detect each).
    public mutating func takeOutput() -> [[UInt8]] {
        var frames: [[UInt8]] = []
        takeOutput(into: &frames)
        return frames
    }

    /// Appends the frames for the device that are due to `frames`.
    public mutating func takeOutput(into frames: inout [[UInt8]]) {
        while let next = outbox.first, next.release <= now, let frame = outbox.popFirst()?.frame {
            frames.append(frame)
        }
    }

    /// Appends the frames for the device that are due to `frames`, as link frames: what the
    /// driver takes each turn, into an array it keeps (no array made per turn).
    public mutating func takeFrames(into frames: inout [LinkFrame]) {
        while let next = outbox.first, next.release <= now, let frame = outbox.popFirst()?.frame {
            frames.append(.bytes(frame))
        }
    }

    /// Whether ``takeOutput()`` has frames now.
    public var hasOutput: Bool { outbox.first.map { $0.release <= now } ?? false }

    /// Events since the last call.
    public mutating func takeEvents() -> [SimulatorEvent] {
        guard !events.isEmpty else { return [] }
        var taken: [SimulatorEvent] = []
        swap(&taken, &events)
        return taken
    }

    // MARK: Native transports

    /// Opens a session of `protocolName` on its native transport (what a host's
    /// SET_INTERFACE to alternate setting 1 does) and returns its native session id; nil when
    /// the profile does not declare the protocol as native, or the accessory is gone.
    ///
    /// A native session's bytes are raw: the owner moves them with
    /// ``receiveNative(_:_:now:)-(_,ArraySlice<UInt8>,_)`` (at most ``nativeRoom(_:)``) and ``drainNativeOutput(_:into:)``. Both buffers hold at most
    /// ``sessionBufferLimit`` bytes, so a host that stops reading stops the accessory's writes.
    public mutating func openNativeSession(protocolName: String, now: LinkTime) -> UInt16? {
        note(now)
        guard isRunning, let spec = profile.protocols.first(where: { $0.name == protocolName }), spec.native == true else { return nil }
        var id = nextNativeID
        while id == 0 || nativeRuntimes[id] != nil { id &+= 1 }
        nextNativeID = id &+ 1
        nativeRuntimes[id] = SessionRuntime(id: id, name: protocolName, spec: spec)
        nativeBuffers[id] = NativeBuffers()
        events.append(.nativeSessionOpened(sessionID: id, protocolName: protocolName))
        settle()
        return id
    }

    /// Ends a native session (the host selected alternate setting 0, or the wire went away).
    public mutating func closeNativeSession(_ id: UInt16, now: LinkTime) {
        note(now)
        guard let runtime = nativeRuntimes.removeValue(forKey: id) else { return }
        nativeBuffers[id] = nil
        events.append(.nativeSessionClosed(sessionID: id, protocolName: runtime.statistics.protocolName,
                                           statistics: snapshot(runtime)))
    }

    /// How many more bytes ``receiveNative(_:_:now:)-(_,ArraySlice<UInt8>,_)`` takes for the session now.
    public func nativeRoom(_ id: UInt16) -> Int {
        guard isRunning, let buffers = nativeBuffers[id] else { return 0 }
        return max(0, sessionBufferLimit - buffers.inbound.byteCount)
    }

    /// Feeds bytes the host sent on a native session (at most ``nativeRoom(_:)``; the rest is
    /// refused, and the count taken is returned).
    @discardableResult
    public mutating func receiveNative(_ id: UInt16, _ bytes: some Collection<UInt8>, now: LinkTime) -> Int {
        note(now)
        let taken = min(bytes.count, nativeRoom(id))
        guard taken > 0 else { return 0 }
        let copy = taken == bytes.count ? Array(bytes) : Array(bytes.prefix(taken))
        nativeBuffers[id]?.inbound.append(copy[...], owned: true)
        settle()
        return taken
    }

    /// Feeds bytes the host sent on a native session as a view the accessory keeps (no copy);
    /// at most ``nativeRoom(_:)`` of them are taken, and the count is returned.
    @discardableResult
    public mutating func receiveNative(_ id: UInt16, _ bytes: ArraySlice<UInt8>, now: LinkTime) -> Int {
        note(now)
        let taken = min(bytes.count, nativeRoom(id))
        guard taken > 0 else { return 0 }
        nativeBuffers[id]?.inbound.append(bytes.prefix(taken), owned: false)
        settle()
        return taken
    }

    /// Whether the session has bytes for the host.
    public func hasNativeOutput(_ id: UInt16) -> Bool { !(nativeBuffers[id]?.outbound.isEmpty ?? true) }

    /// Offers the session's bytes for the host to `write`, which returns how many it took; those
    /// are removed. Behaviours then run again (room appeared).
    public mutating func drainNativeOutput(_ id: UInt16, into write: (ArraySlice<UInt8>) -> Int) {
        var offered = false
        while isRunning, let first = nativeBuffers[id]?.outbound.first {
            let taken = min(max(0, write(first.arraySlice().bytes)), first.count) // arrays of its own: no copy
            nativeBuffers[id]!.outbound.removeFirst(taken)
            if taken > 0 { offered = true }
            guard taken == first.count else { break }
        }
        if offered { settle() }
    }

    /// The open native sessions' ids.
    public var nativeSessionIDs: [UInt16] { nativeRuntimes.keys.sorted() }

    // MARK: Inspection

    /// The counters of an open session.
    public func statistics(for sessionID: UInt16) -> SessionStatistics? { runtimes[sessionID].map(snapshot) }

    /// The counters of an open native-transport session.
    public func nativeStatistics(for sessionID: UInt16) -> SessionStatistics? { nativeRuntimes[sessionID].map(snapshot) }

    /// The counters of every open session, by session id.
    public var sessionStatistics: [SessionStatistics] {
        runtimes.keys.sorted().compactMap { id in runtimes[id].map(snapshot) }
    }

    /// Session data the accessory holds now: the endpoint's receive and send buffers plus what the
    /// behaviours hold. Stays within ``bufferedBytesLimit`` whatever the host does.
    public var bufferedBytes: Int {
        let link = runtimes.reduce(0) { total, entry in
            total + endpoint.bytesAvailable(entry.key) + endpoint.bytesPending(entry.key) + (entry.value.pending.count + entry.value.held.count)
                + (entry.value.firmware?.bufferedBytes ?? 0)
        }
        return nativeRuntimes.reduce(link) { total, entry in
            let buffers = nativeBuffers[entry.key]
            return total + (buffers?.inbound.byteCount ?? 0) + (buffers?.outbound.byteCount ?? 0) + (entry.value.pending.count + entry.value.held.count)
                + (entry.value.firmware?.bufferedBytes ?? 0)
        }
    }

    /// The most session data the accessory can hold with the sessions open now: per session, two
    /// endpoint buffers of ``sessionBufferLimit``, twice ``pendingLimit`` and one firmware-update
    /// message. (The link's own window and send queue are bounded by the link.)
    public var bufferedBytesLimit: Int {
        (runtimes.count + nativeRuntimes.count) * (2 * sessionBufferLimit + 2 * Self.pendingLimit + FirmwareUpdateProtocol.headerSize + 4
            + FirmwareUpdateProtocol.maxChunkSize)
    }

    private func snapshot(_ runtime: SessionRuntime) -> SessionStatistics {
        var statistics = runtime.statistics
        statistics.crc32In = runtime.crc.value
        statistics.pendingBytes = runtime.pending.count + runtime.held.count
        return statistics
    }

    // MARK: Work after every input

    private mutating func note(_ time: LinkTime) {
        now = max(now, time)
    }

    /// Handles the endpoint's events, runs the behaviours until nothing moves, checks the vanish
    /// fault, and passes the endpoint's frames through the output faults.
    private mutating func settle() {
        var endpointEvents = eventScratch.take()
        defer { eventScratch.putBack(&endpointEvents) }
        for _ in 0..<Self.maxSettleRounds {
            endpointEvents.removeAll(keepingCapacity: true)
            endpoint.takeEvents(into: &endpointEvents)
            for event in endpointEvents { handle(event) }
            let moved = runBehaviours()
            if let limit = profile.faults.vanishAfterBytes, bytesMoved >= limit {
                goAway(.vanished)
                events.append(.vanish)
                return
            }
            if endpointEvents.isEmpty, !moved { break }
        }
        takeEndpointOutput()
    }

    private mutating func goAway(_ state: Lifecycle) {
        lifecycle = state
        outbox.removeAll()
        _ = endpoint.takeOutput()
    }

    private mutating func handle(_ event: EndpointEvent) {
        switch event {
        case let .identified(identity):
            events.append(.identified(identity))
            playDeviationsAfterIdentification()
        case let .powerUpdate(parameters):
            events.append(.endpoint(.powerUpdate(parameters)))
            if profile.deviations.contains(.powerChatter), !saidPowerChatter {
                saidPowerChatter = true
                endpoint.sendControlMessage(ControlMessage(id: .stopPowerUpdates), now: now)
                endpoint.sendControlMessage(ControlMessage(id: .powerSourceUpdate, parameters: [.uint16(0, 500), .bool(1, true)]), now: now)
            }
        case let .sessionOpened(id, name) where profile.deviations.contains(.refusesSessions):
            endpoint.sendControlMessage(ControlMessage(id: .statusExternalAccessoryProtocolSession, parameters: [.uint16(0, id), .uint8(1, 1)]),
                                        now: now)
            _ = name
        case let .sessionOpened(id, name) where profile.deviations.contains(.endsSessions):
            endpoint.sendControlMessage(ControlMessage(id: .stopExternalAccessoryProtocolSession, parameters: [.uint16(0, id)]), now: now)
            _ = name
        case let .sessionOpened(id, name):
            let spec = profile.protocols.first { $0.name == name }
            runtimes[id] = SessionRuntime(id: id, name: name, spec: spec)
            if !runtimeIDs.contains(id) { runtimeIDs.append(id); runtimeIDs.sort() }
            events.append(.sessionOpened(sessionID: id, protocolName: name))
        case let .sessionClosed(id, reason):
            guard let runtime = runtimes.removeValue(forKey: id) else { return }
            runtimeIDs.removeAll { $0 == id }
            events.append(.sessionClosed(sessionID: id, protocolName: runtime.statistics.protocolName, reason: reason,
                                         statistics: snapshot(runtime)))
        case .bytesAvailable, .spaceAvailable:
            break
        default:
            events.append(.endpoint(event))
        }
    }

    /// What the deviations make the accessory send once it is identified.
    private mutating func playDeviationsAfterIdentification() {
        let deviations = profile.deviations
        if deviations.contains(.oddPowerFields) {
            endpoint.sendControlMessage(ControlMessage(id: .startPowerUpdates, parameters: [.flag(0), .flag(3), .flag(7), .flag(8)]), now: now)
        }
        if deviations.contains(.undeclaredMessages) {
            endpoint.sendControlMessage(ControlMessage(id: .powerSourceUpdate, parameters: [.uint16(0, 1_000), .bool(1, true)]), now: now)
        }
        if deviations.contains(.statusForUnknownSession) {
            endpoint.sendControlMessage(ControlMessage(id: .statusExternalAccessoryProtocolSession, parameters: [.uint16(0, 0x7F7E), .uint8(1, 0)]),
                                        now: now)
        }
        guard let link = endpoint.iap2?.link.negotiated else { return }
        if deviations.contains(.unknownMessages) {
            endpoint.sendControlMessage(ControlMessage(id: MessageID(0x7F7F), parameters: [.uint8(0, 1)]), now: now)
            if let control = link.session(ofType: .control)?.id {
                endpoint.sendLinkPayload(sessionID: control, payload: [0x00, 0x01, 0x02, 0x03], now: now)
            }
        }
        if deviations.contains(.dataForUnknownSession), let ea = link.session(ofType: .externalAccessory)?.id {
            endpoint.sendLinkPayload(sessionID: ea, payload: [0x7F, 0x7E] + Array("stray".utf8), now: now)
        }
    }

    private mutating func takeEndpointOutput() {
        var frames = frameScratch.take()
        endpoint.takeOutput(into: &frames)
        defer { frameScratch.putBack(&frames) }
        guard isRunning else { return }
        let faults = profile.faults
        let release = now + .milliseconds(faults.delayMs)
        for var frame in frames {
            faultCounters.framesProduced += 1
            if faults.losesFrames.contains(faultCounters.framesProduced) || (faults.dropRate > 0 && random.unit() < faults.dropRate) {
                faultCounters.framesDropped += 1
                continue
            }
            if faults.corruptRate > 0, !frame.isEmpty, random.unit() < faults.corruptRate {
                frame[random.below(frame.count)] ^= UInt8(1 + random.below(255))
                faultCounters.framesCorrupted += 1
            }
            outbox.append((release, frame))
        }
    }
}
