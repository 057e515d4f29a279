public import ByteRing
public import IAPWire

/// Counters kept by an ``IAP2Link``.
public struct LinkStatistics: Hashable, Sendable {
    /// SYN and data packets handed to the transport, retransmissions included (bare ACKs, EAKs,
    /// RST and SLP are not counted here).
    public var packetsSent = 0
    /// iAP2 packets received whose checksums verified, of any kind (duplicates included).
    public var packetsReceived = 0
    /// Data packets sent again, on a timeout or because an EAK named them.
    public var retransmissions = 0
    /// Packets an EAK named that were not sent again because they had just been (a repeated
    /// EAK, or a flood of them).
    public var eakRetransmissionsSkipped = 0
    /// Retransmissions not made because the packet had most likely not even left yet: the
    /// transport was still sending it from its transmit buffer (``LinkFrame/buffer(_:)``), or
    /// still had output queued and moving (``IAP2Link/noteOutputProgress(_:)``).
    public var retransmissionsDeferred = 0
    /// Data packets received again after they were delivered (the peer missed an ACK); they are
    /// acknowledged again and not delivered twice.
    public var duplicatesReceived = 0
    /// Data packets received ahead of a missing one, parked until the gap is filled (and reported
    /// with an EAK unless the receiver is refusing).
    public var outOfOrderReceived = 0
    /// Data packets whose sequence number lies beyond the receive window: dropped.
    public var outsideWindowReceived = 0
    /// Packets the sink could not take yet (receiver flow control); the peer sends them again.
    public var refusedByReceiver = 0
    /// EAKs sent, each listing the out-of-order packets held so the peer resends only what is missing.
    public var eaksSent = 0
    /// EAKs received from the peer.
    public var eaksReceived = 0
    /// Bare ACK packets sent (acknowledgements that rode on data packets are not counted).
    public var acksSent = 0
    /// Payload bytes of data packets sent the first time (retransmissions not counted again).
    public var payloadBytesSent = 0
    /// Payload bytes delivered in order to the sink (duplicates and refused packets not counted).
    public var payloadBytesDelivered = 0
    /// Payload bytes the link copied on the way out: payloads handed to
    /// ``IAP2Link/send(sessionID:payload:now:)`` are framed by one copy; framed packets
    /// (``IAP2Link/send(sessionID:framedPacket:now:)``) and retransmissions are not copied.
    public var payloadBytesCopiedOut = 0
    /// Payload bytes the link copied on the way in: twice for a packet split across receives
    /// (the scanner reassembles it, the link moves it out of the scanner's buffer), and once for
    /// a packet parked out of order or refused by the sink when its bytes were not already held
    /// in an array the link could keep.
    public var payloadBytesCopiedIn = 0
    /// SYNs (SYN|ACKs in the accessory role) dropped because their payload is not SYN
    /// parameters; the link kept listening (``LinkEvent/malformedSYNDropped(_:)``).
    public var malformedSYNsDropped = 0
    /// Partial frames given up on because the line fell silent in their middle for longer than
    /// ``LinkConfiguration/interByteGap`` (the scanner counts the bytes, reason
    /// ``ScanDropReason/partialFrameAbandoned``).
    public var partialFramesAbandoned = 0
    /// Device role: negotiations given up on because the accessory never acknowledged our
    /// SYN|ACK (sent its negotiated number of times); the device then waits for a new SYN.
    public var unansweredNegotiations = 0
    /// Counters at zero, as a new link starts.
    public init() {}
}

/// The iAP2 link layer as a deterministic state machine, for both roles.
///
/// Inputs are received bytes (``receive(_:now:sink:)-(RawSpan,_,_)``, its array twin, or
/// ``receive(lent:now:sink:)``), the passage of time (``advance(to:)``) and payloads to send
/// (``send(sessionID:payload:now:)``). Outputs are taken by the owner:
/// packets to transmit (``takeOutput()``, one link packet or detect per element, to be written one
/// per USB transfer), events (``takeEvents()``), and payloads handed in order to a ``LinkSink``.
/// The owner asks ``nextDeadline`` when to call ``advance(to:)`` next. No clocks, threads or
/// Dispatch inside: the same code runs under an event loop and under virtual time in tests.
///
/// Wire rules implemented (PROTOCOL.md §2): detect and its answer, SYN negotiation with
/// validation and counter-offers (the device never sends the first SYN), 8-bit sequence numbers
/// with wrap-around, a send window of the negotiated outstanding-packet count, cumulative ACKs on
/// a timer or a count, duplicates re-acknowledged and never delivered twice, out-of-order packets
/// held and reported with EAK, EAK honoured by resending exactly the missing packets,
/// retransmission on timeout until the negotiated maximum, RST and SLP.
public struct IAP2Link: Sendable {
    /// Which side this link plays: the device (host) or the accessory.
    public let role: LinkRole
    /// What this side offers and accepts (limits, timeouts, timing), fixed for the link's life.
    public let configuration: LinkConfiguration
    /// Where the link is (detecting, negotiating, connected, sleeping, failed); every change is also
    /// reported as ``LinkEvent/stateChanged(_:)``.
    public private(set) var state: LinkState = .detecting
    /// The parameters this side agreed to, once connected: the last SYN payload it sent (the
    /// device) or accepted (the accessory). Timing values and sessions are common to both sides;
    /// the receive limits in it are this side's own (see ``receiveLimits``).
    public private(set) var negotiated: LinkParameters?
    /// The peer's receive limits, once connected: what bounds this side's sending (window =
    /// `maxOutstandingPackets`, packets of at most `maxPacketLength`). Each side sends by the
    /// other's limits and receives by its own (PROTOCOL.md §2.4).
    public private(set) var peerLimits: LinkParameters?
    /// This side's own receive limits, once connected.
    public private(set) var receiveLimits: LinkParameters?
    /// The counters since the link was made (never reset, whatever the link goes through).
    public private(set) var statistics = LinkStatistics()

    private var scanner: FrameScanner
    /// When the last bytes were received: with a partial frame held, the inter-byte gap runs
    /// from here.
    private var lastReceiveAt: LinkTime = .zero
    private var outbox: [LinkFrame] = []
    private var events: [LinkEvent] = []

    // Negotiation.
    private var initialSequence: UInt8
    private var rounds = 0
    private var lastOffer: LinkParameters?
    private var lastPeerOffer: LinkParameters?
    private var detectDeadline: LinkTime?
    private var synDeadline: LinkTime?
    private var synTransmissions = 0
    private var lastReceivedSYNACK: UInt8?
    /// Device: this negotiation answers with the exact copy of the accessory's offer (the
    /// accessory did not take an answer with our own receive limits).
    private var echoOffers = false

    // Data.
    /// A packet sent and not yet acknowledged: the framed bytes as transmitted (the transport
    /// may hold the same storage; a retransmission finishes the header again in place).
    private struct InFlight: Sendable {
        var sequence: UInt8
        var sessionID: UInt8
        var packet: LinkFrame
        /// When its retransmission timer started: when it was last sent, or later when the
        /// timer started again because the transport's queue was still moving.
        var timerStart: LinkTime
        /// When it was last handed to the transport (what an EAK's spacing counts from).
        var lastSentAt: LinkTime
        var transmissions: Int
        /// Retransmissions by timer since the peer was last heard from: the link fails when one
        /// packet's count passes the negotiated maximum.
        var silentRetransmissions = 0
        /// The transport's written-bytes count (``TransportOutputProgress/writtenBytes``, as
        /// last noted) when the packet's timer started.
        var writtenMark: UInt64 = 0
        /// Times its timer started again because the transport's queue was still moving: at
        /// most the negotiated maximum of retransmissions, so a line that keeps writing into
        /// the void (a UART whose peer was unplugged) delays the failure by at most as long
        /// again as the retransmissions themselves take.
        var deferrals = 0
    }
    /// A received packet parked until it can be delivered in order: a view of the storage it
    /// arrived in when it can be kept (no copy), else a copy.
    private struct Held: Sendable {
        var sessionID: UInt8
        var payload: ReceivedBytes
    }
    /// Where received bytes lie, when the sink may keep views of them.
    private enum Backing {
        case array([UInt8])
        case lease(SlotLease)

        /// What a view pins: the array's storage, or the lent transfer (at least 256 bytes, so
        /// that a tiny payload, whose lease and queue entry cost more than its bytes, is copied).
        var byteCount: Int {
            switch self {
            case let .array(bytes): bytes.capacity
            case let .lease(lease): max(lease.count, 256)
            }
        }
    }
    private var nextSequence: UInt8 = 0
    private var lastSentSequence: UInt8 = 0
    private var lastReceived: UInt8 = 0
    private var unacked: [InFlight] = []
    private var sendQueue = FIFO<(sessionID: UInt8, packet: LinkFrame)>()
    private var held: [UInt8: Held] = [:]
    private var pendingAcks = 0
    private var ackDeadline: LinkTime?
    /// Whether the peer was heard from since the packets in flight were last retransmitted by
    /// timer: any packet from it resets every packet's ``InFlight/silentRetransmissions``. A peer
    /// that answers but cannot take data yet (receiver flow control) is alive, and waiting for it
    /// is back-pressure; a silent one is given up on after the negotiated number of rounds.
    private var heardFromPeer = false
    /// The peer's next in-order packet was refused by the sink; until it is taken, later
    /// packets are neither held nor reported with EAK (that would only make the peer resend).
    private var refusing = false
    /// Most packets queued beyond the window before ``send(sessionID:payload:now:)`` refuses.
    public var sendQueueLimit = 64

    /// Packets the peer acknowledged, kept to lay later packets out in (``framedBuffer(payloadCapacity:)``).
    private var spareBuffers: [[UInt8]] = []
    /// Most buffers kept for reuse: a window's worth and a few more.
    private static let spareLimit = 40
    /// Buffers the transport lends for outgoing packets (``LinkFrame/buffer(_:)``): memory it
    /// sends from as it is (usbfs device memory), so a packet laid out there is never copied
    /// again. Used for payloads of at least ``transmitBufferThreshold`` bytes while one is free;
    /// arrays otherwise.
    public var transmitBuffers: PacketBufferPool?
    /// The smallest payload given a transmit buffer: shorter ones (control messages, short
    /// writes) are copied into arrays, where a copy costs little and a whole buffer would be
    /// wasted.
    public static let transmitBufferThreshold = 2_048

    // Scratch buffers reused across receive calls.
    private var frameScratch: [(ScannedFrame, Bool)] = []
    private var spillScratch: [UInt8] = []

    /// Creates a link.
    ///
    /// - Parameters:
    ///   - role: the side this link plays: `.device` for a host, `.accessory` for the simulator.
    ///   - configuration: what this side offers and accepts (limits, timeouts, timing).
    ///   - initialSequence: the first sequence number (the ISN); pick it at random in production.
    public init(role: LinkRole, configuration: LinkConfiguration, initialSequence: UInt8) {
        self.role = role
        self.configuration = configuration
        self.initialSequence = initialSequence
        self.scanner = FrameScanner(kinds: .all, maxFrameLength: max(Self.acceptedPacketLength(role, configuration), 1_024))
        updateScanLimits()
    }

    /// The longest packet this side takes. The device takes any length the header can say
    /// (65,535 bytes) whatever it advertised: an iPhone always advertises 65,535, so an
    /// accessory tuned on iPhones may not honour a smaller limit, and dropping its packets would
    /// stall it for ever (``LinkEvent/oversizedPacketTaken(length:advertised:)`` says so once).
    /// The accessory takes what it offered.
    static func acceptedPacketLength(_ role: LinkRole, _ configuration: LinkConfiguration) -> Int {
        role == .device ? LinkPacketHeader.maxPacketLength : Int(configuration.parameters.maxPacketLength)
    }

    /// Whether ``LinkEvent/oversizedPacketTaken(length:advertised:)`` was said since the link came up.
    private var saidOversized = false

    /// What the scanner has found and dropped on this link.
    public var scanStatistics: ScanStatistics { scanner.statistics }

    // MARK: Owner's view

    /// When ``advance(to:)`` must be called next, if any timer is armed.
    public var nextDeadline: LinkTime? {
        var deadline: LinkTime?
        func consider(_ candidate: LinkTime?) {
            guard let candidate else { return }
            if deadline.map({ candidate < $0 }) ?? true { deadline = candidate }
        }
        consider(detectDeadline)
        consider(synDeadline)
        consider(ackDeadline)
        consider(gapDeadline)
        if state == .connected, let timeout = negotiated.map({ Duration.milliseconds(Int($0.retransmissionTimeout)) }) {
            for packet in unacked { consider(packet.timerStart + timeout) }
        }
        return deadline
    }

    /// Packets to transmit, oldest first; each element is one link packet (or detect). Packets
    /// in transmit buffers are copied into arrays (see ``takeFrames(into:)``).
    public mutating func takeOutput() -> [[UInt8]] {
        var frames: [[UInt8]] = []
        takeOutput(into: &frames)
        return frames
    }

    /// Appends the packets to transmit to `frames`, as arrays (a packet in a transmit buffer is
    /// copied; ``takeFrames(into:)`` hands it over as it is).
    public mutating func takeOutput(into frames: inout [[UInt8]]) {
        for frame in outbox { frames.append(frame.copiedBytes()) }
        outbox.removeAll(keepingCapacity: true)
    }

    /// Appends the packets to transmit to `frames`, as they lie (arrays, or transmit buffers to
    /// send without a copy). Given an empty array, it swaps storage with it: a caller that
    /// empties and passes the same array each time allocates nothing.
    public mutating func takeFrames(into frames: inout [LinkFrame]) {
        Self.move(&outbox, into: &frames)
    }

    /// Moves the elements of `source` to the end of `target`, swapping their storage when
    /// `target` is empty.
    static func move<Element>(_ source: inout [Element], into target: inout [Element]) {
        guard !source.isEmpty else { return }
        if target.isEmpty {
            swap(&source, &target)
        } else {
            target.append(contentsOf: source)
            source.removeAll(keepingCapacity: true)
        }
    }

    /// Whether packets are waiting in ``takeOutput()``.
    public var hasOutput: Bool { !outbox.isEmpty }

    /// Events since the last call.
    public mutating func takeEvents() -> [LinkEvent] {
        var taken: [LinkEvent] = []
        takeEvents(into: &taken)
        return taken
    }

    /// Appends the events since the last call to `taken` (swapping storage when it is empty).
    public mutating func takeEvents(into taken: inout [LinkEvent]) {
        Self.move(&events, into: &taken)
    }

    /// Packets sent and not yet acknowledged.
    public var inFlightCount: Int { unacked.count }

    /// The transport's output progress as last noted (``noteOutputProgress(_:)``); nil for a
    /// transport that does not report it (USB, memory).
    private var outputProgress: TransportOutputProgress?

    /// Tells the link how far the transport has got with its output, just before time passes
    /// (``advance(to:sink:)``). A packet whose retransmission timer runs out while the
    /// transport still has output queued and has written some since the timer started is most
    /// likely still waiting in that queue, not lost: its timer starts again instead
    /// (``LinkStatistics/retransmissionsDeferred``), so a window of large packets on a slow
    /// line does not send every packet twice. A transport that wrote nothing for a whole
    /// timeout (the peer stopped reading) gets the ordinary retransmissions and their limit,
    /// and one packet's timer starts again at most the negotiated maximum of retransmissions
    /// times.
    public mutating func noteOutputProgress(_ progress: TransportOutputProgress) {
        outputProgress = progress
    }
    /// Data packets the peer has acknowledged, per link session, since the link was made. Packets
    /// are acknowledged in the order they were first sent (ACKs are cumulative), so a layer that
    /// remembers what each packet carried can tell how much of it arrived.
    public private(set) var acknowledgedPackets: [UInt8: Int] = [:]
    /// Packets queued behind the window.
    public var queuedCount: Int { sendQueue.count }
    /// Whether ``send(sessionID:payload:now:)`` would accept a packet now.
    public var canSend: Bool { state == .connected && sendQueue.count < sendQueueLimit }
    /// The largest payload one packet may carry towards the peer (0 before the link is up).
    public var maxPayloadLength: Int {
        guard let peerLimits else { return 0 }
        let length = configuration.sendsPacketLength.map(Int.init) ?? Int(peerLimits.maxPacketLength)
        return length - LinkPacketHeader.overhead
    }

    // MARK: Inputs

    /// Starts the link: the accessory sends the detect; the device waits for it.
    public mutating func start(now: LinkTime) {
        switch role {
        case .accessory:
            sendDetect(now: now)
        case .device:
            if configuration.announcesDetect { outbox.append(.bytes(IAP2Detect.bytes)) }
        }
    }

    /// Queues a payload for link session `sessionID`.
    ///
    /// - Returns: false when the link is not up, the payload is longer than
    ///   ``maxPayloadLength``, or ``sendQueueLimit`` packets are already waiting (back-pressure:
    ///   try again when ``canSend`` is true).
    @discardableResult
    public mutating func send(sessionID: UInt8, payload: [UInt8], now: LinkTime) -> Bool {
        guard canSend, !payload.isEmpty, payload.count <= maxPayloadLength else { return false }
        var packet = framedBuffer(payloadCapacity: payload.count)
        packet.append(contentsOf: payload)
        statistics.payloadBytesCopiedOut += payload.count
        return send(sessionID: sessionID, framedPacket: packet, now: now)
    }

    /// Storage to lay a packet of up to `payloadCapacity` payload bytes out in: a transmit
    /// buffer when the payload is long enough and one is free, else ``framedBuffer(payloadCapacity:)``.
    /// It holds the header's headroom already.
    mutating func packetStorage(payloadCapacity: Int) -> LinkFrame {
        let needed = LinkPacketHeader.size + max(0, payloadCapacity) + 1
        if payloadCapacity >= Self.transmitBufferThreshold, let pool = transmitBuffers, needed <= pool.bufferCapacity,
           let buffer = pool.take() {
            buffer.appendZeros(LinkPacketHeader.size)
            return .buffer(buffer)
        }
        return .bytes(framedBuffer(payloadCapacity: payloadCapacity))
    }

    /// An empty buffer to lay a packet out in, as ``LinkPacket/framedBuffer(payloadCapacity:)``
    /// makes, reusing the storage of a packet the peer acknowledged when one is large enough:
    /// the steady state allocates no packets.
    public mutating func framedBuffer(payloadCapacity: Int) -> [UInt8] {
        let needed = LinkPacketHeader.size + max(0, payloadCapacity) + 1
        // The smallest that fits (a short packet does not take a 64 KiB buffer), the oldest of
        // those (the likeliest to be free of the peer's views).
        var best: Int?
        for index in spareBuffers.indices where spareBuffers[index].capacity >= needed {
            if best.map({ spareBuffers[index].capacity < spareBuffers[$0].capacity }) ?? true { best = index }
        }
        if let index = best {
            var buffer = spareBuffers.remove(at: index)
            buffer.removeAll(keepingCapacity: true)
            buffer.append(contentsOf: repeatElement(0, count: LinkPacketHeader.size))
            return buffer
        }
        return LinkPacket.framedBuffer(payloadCapacity: payloadCapacity)
    }

    /// Queues a packet whose payload already lies in place: `framedPacket` holds
    /// ``LinkPacketHeader/size`` bytes of headroom, the payload, and nothing after it (see
    /// ``LinkPacket/framedBuffer(payloadCapacity:)``). The link writes the header and the payload
    /// checksum around the payload where it lies and sends that array as the packet: the payload is
    /// never copied again, retransmissions included.
    ///
    /// - Returns: false under the same conditions as ``send(sessionID:payload:now:)``, or when
    ///   the buffer holds no payload.
    @discardableResult
    public mutating func send(sessionID: UInt8, framedPacket: [UInt8], now: LinkTime) -> Bool {
        send(sessionID: sessionID, storage: .bytes(framedPacket), now: now)
    }

    /// Queues a packet laid out in `storage` (from ``packetStorage(payloadCapacity:)``), as
    /// ``send(sessionID:framedPacket:now:)`` does.
    mutating func send(sessionID: UInt8, storage: LinkFrame, now: LinkTime) -> Bool {
        let payloadLength = storage.count - LinkPacketHeader.size
        guard canSend, payloadLength > 0, payloadLength <= maxPayloadLength else { return false }
        sendQueue.append((sessionID, storage))
        pump(now: now)
        return true
    }

    /// Feeds received bytes; payloads are offered to `sink` in order.
    public mutating func receive<Sink: LinkSink>(_ bytes: RawSpan, now: LinkTime, sink: inout Sink) {
        receive(bytes, backing: nil, now: now, sink: &sink)
    }

    /// Feeds received bytes held in an array. Payloads that lie whole in it are offered to the
    /// sink as views of it too, which the sink may keep instead of copying them.
    public mutating func receive<Sink: LinkSink>(_ bytes: [UInt8], now: LinkTime, sink: inout Sink) {
        receive(bytes.span.bytes, backing: .array(bytes), now: now, sink: &sink)
    }

    /// Feeds received bytes lent by the transport (a USB IN slot). Payloads that lie whole in
    /// them are offered to the sink as views of the lease too, which the sink may keep instead of
    /// copying them.
    public mutating func receive<Sink: LinkSink>(lent lease: SlotLease, now: LinkTime, sink: inout Sink) {
        lease.withSpan { receive($0, backing: .lease(lease), now: now, sink: &sink) }
    }

    private mutating func receive<Sink: LinkSink>(_ bytes: RawSpan, backing: Backing?, now: LinkTime, sink: inout Sink) {
        if bytes.byteCount > 0 { lastReceiveAt = now }
        // Collect the frames first (the scanner cannot call back into `self` while it runs).
        var frames = frameScratch
        var spill = spillScratch
        frameScratch = []
        spillScratch = []
        frames.removeAll(keepingCapacity: true)
        spill.removeAll(keepingCapacity: true)
        var drops: [ScanDrop] = []
        scanner.scan(bytes, onFrame: { frame, span in
            if frame.isReassembled {
                // Reassembled frames live in the scanner's buffer, which the next frame reuses.
                let start = spill.count
                span.extracting(frame.range).withUnsafeBytes { spill.append(contentsOf: $0) }
                var moved = frame
                let shift = start - frame.range.lowerBound
                moved.range = (frame.range.lowerBound + shift)..<(frame.range.upperBound + shift)
                moved.payload = (frame.payload.lowerBound + shift)..<(frame.payload.upperBound + shift)
                frames.append((moved, true))
            } else {
                frames.append((frame, false))
            }
        }, onDrop: { drops.append($0) })
        for drop in drops { events.append(.dropped(drop)) }
        for (frame, spilled) in frames {
            if spilled {
                // A frame split across receives: the scanner copied it whole to reassemble it,
                // and it was copied again above, out of the scanner's reused buffer. The sink may
                // keep views of the spill (a later receive then starts a new one).
                if case .iap2 = frame.kind { statistics.payloadBytesCopiedIn += 2 * frame.payload.count }
                handle(frame, in: spill.span.bytes, backing: spill.count > 0 ? .array(spill) : nil, now: now, sink: &sink)
            } else {
                handle(frame, in: bytes, backing: backing, now: now, sink: &sink)
            }
        }
        frameScratch = frames
        spillScratch = spill
    }

    /// A view of `range` of `backing` for the sink to keep, when it is a good part of the
    /// storage (the array's capacity, the lent bytes): a short payload in a large buffer is
    /// copied instead, so what a session holds in memory (or the slot copy a lagging reader
    /// forces) stays within a small multiple of the bytes it counts.
    private static func keepable(_ range: Range<Int>, in backing: Backing?) -> ReceivedBytes? {
        guard let backing, range.count * 4 >= backing.byteCount else { return nil }
        switch backing {
        case let .array(bytes): return ReceivedBytes(bytes[range])
        case let .lease(lease): return ReceivedBytes(lease, range: range)
        }
    }

    /// Hands over the bytes of a partial frame not yet complete (see
    /// ``FrameScanner/takePendingBytes()``).
    public mutating func takeUnscannedBytes() -> [UInt8] { scanner.takePendingBytes() }

    /// Fires every timer due at `now`. Frames found again in a partial frame abandoned after the
    /// inter-byte gap are handled as received; their payloads are offered to a sink that takes
    /// none (so they are held unacknowledged, and the peer sends them again): an owner with a
    /// sink passes it to ``advance(to:sink:)``.
    public mutating func advance(to now: LinkTime) {
        var sink = RefusingSink()
        advance(to: now, sink: &sink)
    }

    /// Fires every timer due at `now`; payloads in frames found again in an abandoned partial
    /// frame are offered to `sink`, in order, as ``receive(_:now:sink:)-(RawSpan,_,_)`` does.
    public mutating func advance<Sink: LinkSink>(to now: LinkTime, sink: inout Sink) {
        if let deadline = gapDeadline, deadline <= now {
            abandonPartialFrame(now: now, sink: &sink)
        }
        if let deadline = detectDeadline, deadline <= now, state == .detecting, role == .accessory {
            sendDetect(now: now)
        }
        if let deadline = synDeadline, deadline <= now, state == .negotiating, let offer = lastOffer {
            // The accessory repeats its SYN until answered; the device repeats its SYN|ACK until
            // the accessory's ACK arrives (a lost ACK would otherwise leave both sides waiting).
            synTransmissions += 1
            if synTransmissions > Int(offer.maxRetransmissions) {
                guard role == .device else {
                    fail(.negotiationFailed(rounds: rounds))
                    return
                }
                // The SYN we answered is not followed up (noise that looked like one, or an
                // accessory that went quiet): the device never sends the first SYN, so it goes
                // back to waiting for one instead of giving the line up.
                statistics.unansweredNegotiations += 1
                synDeadline = nil
                startNegotiating()
                return
            }
            transmitSYN(offer, acknowledging: role == .device, now: now)
        }
        if let deadline = ackDeadline, deadline <= now {
            sendAck()
        }
        guard state == .connected, let parameters = negotiated else { return }
        let timeout = Duration.milliseconds(Int(parameters.retransmissionTimeout))
        if heardFromPeer {
            heardFromPeer = false
            for index in unacked.indices { unacked[index].silentRetransmissions = 0 }
        }
        // Counted per packet, so a window of packets whose timers fire at different moments is
        // one round, not one round per packet.
        for index in unacked.indices where unacked[index].timerStart + timeout <= now {
            if let progress = outputProgress, progress.queuedBytes > 0, progress.writtenBytes > unacked[index].writtenMark,
               unacked[index].deferrals < Int(parameters.maxRetransmissions) {
                // Still queued behind output that is moving: the timer starts again.
                unacked[index].timerStart = now
                unacked[index].writtenMark = progress.writtenBytes
                unacked[index].deferrals += 1
                statistics.retransmissionsDeferred += 1
                continue
            }
            unacked[index].silentRetransmissions += 1
            if unacked[index].silentRetransmissions > Int(parameters.maxRetransmissions) {
                fail(.maxRetransmissionsExceeded(sequence: unacked[index].sequence, count: unacked[index].transmissions))
                return
            }
            retransmit(at: index, now: now)
        }
    }

    /// When the partial frame held is given up on, if one is held: ``LinkConfiguration/interByteGap``
    /// after the last bytes came.
    private var gapDeadline: LinkTime? {
        scanner.pendingByteCount > 0 ? lastReceiveAt + configuration.interByteGap : nil
    }

    /// The line fell silent in the middle of a frame: the frame is given up on, and the bytes
    /// it held after its first are scanned again (a length that lied swallows the frames behind
    /// it) and what they hold is handled as received.
    private mutating func abandonPartialFrame<Sink: LinkSink>(now: LinkTime, sink: inout Sink) {
        var frames: [ScannedFrame] = []
        var spill: [UInt8] = []
        var drops: [ScanDrop] = []
        scanner.abandonPartialFrame(onFrame: { frame, span in
            // The span is the scanner's copy, valid during the call only: moved to `spill`.
            let shift = spill.count - frame.range.lowerBound
            span.extracting(frame.range).withUnsafeBytes { spill.append(contentsOf: $0) }
            var moved = frame
            moved.range = (frame.range.lowerBound + shift)..<(frame.range.upperBound + shift)
            moved.payload = (frame.payload.lowerBound + shift)..<(frame.payload.upperBound + shift)
            frames.append(moved)
        }, onDrop: { drops.append($0) })
        statistics.partialFramesAbandoned += 1
        for drop in drops { events.append(.dropped(drop)) }
        for frame in frames {
            // Copied twice, as a frame reassembled across receives is: held by the scanner, moved out.
            if case .iap2 = frame.kind { statistics.payloadBytesCopiedIn += 2 * frame.payload.count }
            handle(frame, in: spill.span.bytes, backing: .array(spill), now: now, sink: &sink)
        }
    }

    /// Judges lengths by what can be right in the link's state, so that noise whose length
    /// field cannot be right is dropped at once instead of being waited for:
    ///
    /// - before the link is up, no iAP2 packet is longer than the longest valid SYN
    ///   (``LinkParameters/maxSYNPacketLength``), except on the device once it answered a SYN:
    ///   the accessory's ACK may come with its first packets in the same read, as long as this
    ///   side said it takes;
    /// - once it is up, no packet is longer than this side ever says it takes (its
    ///   configuration's `maxPacketLength`: the receive limits of any negotiation are within it,
    ///   and a SYN that crossed our answer may have left the peer with our first offer);
    /// - iAP1 packets before the link is up: on the device, up to
    ///   ``LinkConfiguration/maxIAP1PacketLength`` (an iAP1 accessory's first packets); on the
    ///   accessory, the iAP1 answer to its detect; once the link is up, only the detect.
    private mutating func updateScanLimits() {
        let ownLimit = Self.acceptedPacketLength(role, configuration)
        if state == .connected {
            scanner.iap2LengthLimit = ownLimit
            scanner.iap1LengthLimit = IAP2Detect.bytes.count
            return
        }
        let answered = role == .device && state == .negotiating && lastOffer != nil
        scanner.iap2LengthLimit = answered ? ownLimit : LinkParameters.maxSYNPacketLength
        scanner.iap1LengthLimit = role == .device ? configuration.maxIAP1PacketLength : IAP2Detect.iap1Reply.count
    }

    /// A SYN whose payload is not SYN parameters: nothing in PROTOCOL.md §2 answers it, so it is
    /// dropped and counted, and the link keeps listening for a good one.
    private mutating func dropMalformedSYN(_ error: WireError) {
        statistics.malformedSYNsDropped += 1
        events.append(.malformedSYNDropped(error))
    }

    /// Device role: resets the link (RST); the accessory answers with a fresh SYN. Everything in
    /// flight or queued is discarded.
    public mutating func reset(now: LinkTime) {
        transmitControl([.rst], payload: [])
        clearData()
        startNegotiating()
    }

    /// Device role: a new negotiation begins; nothing of the last one's offers carries over (an
    /// exact-copy fallback then applies to that negotiation alone).
    private mutating func startNegotiating() {
        rounds = 0
        lastOffer = nil
        lastPeerOffer = nil
        echoOffers = false
        setState(.negotiating)
        updateScanLimits()
    }

    /// Device role: tells the accessory this side goes to sleep (SLP).
    public mutating func suspend(now: LinkTime) {
        transmitControl([.slp, .ack], payload: [])
        clearData()
        setState(.sleeping)
    }

    /// Accessory role: wakes from sleep and starts over with the detect.
    public mutating func wake(now: LinkTime) {
        guard state == .sleeping else { return }
        setState(.detecting)
        if role == .accessory { sendDetect(now: now) }
    }

    /// Closes the link for good.
    public mutating func close() {
        clearData()
        fail(.closed)
    }

    // MARK: Frames

    private mutating func handle<Sink: LinkSink>(_ frame: ScannedFrame, in bytes: RawSpan, backing: Backing?, now: LinkTime,
                                                 sink: inout Sink) {
        if case .failed = state { return }
        switch frame.kind {
        case .detect:
            handleDetect(now: now)
        case let .iap1(framing):
            let body = bytes.extracting(frame.payload).withUnsafeBytes { Array($0) }
            if role == .accessory, state == .detecting, framing.body.count == 4,
               body == [0x00, 0x02, 0x04, IAP2Detect.command] {
                fail(.peerSpeaksIAP1)
            } else {
                events.append(.iap1Packet(body))
            }
        case let .iap2(header):
            statistics.packetsReceived += 1
            handle(header, payload: bytes.extracting(frame.payload), retained: Self.keepable(frame.payload, in: backing), now: now, sink: &sink)
        }
    }

    private mutating func handleDetect(now: LinkTime) {
        switch role {
        case .device:
            // Answer every detect with one detect. A detect on a live link means the accessory
            // started over: so does the link.
            outbox.append(.bytes(IAP2Detect.bytes))
            if state != .negotiating {
                clearData()
                startNegotiating()
            }
        case .accessory:
            if state == .connected {
                // The device started over (a new host on a serial line): so do we.
                restartAfterReset(now: now)
                return
            }
            guard state == .detecting else { return }
            detectDeadline = nil
            rounds = 0
            synTransmissions = 0
            setState(.negotiating)
            lastOffer = configuration.parameters
            nextSequence = initialSequence
            transmitSYN(configuration.parameters, acknowledging: false, now: now)
        }
    }

    private mutating func handle<Sink: LinkSink>(_ header: LinkPacketHeader, payload: RawSpan, retained: ReceivedBytes?,
                                                 now: LinkTime, sink: inout Sink) {
        let control = header.control
        if control.contains(.rst) {
            if role == .accessory { restartAfterReset(now: now) }
            return
        }
        if control.contains(.slp) {
            if role == .accessory {
                clearData()
                setState(.sleeping)
            }
            return
        }
        if control.contains(.syn) {
            switch role {
            case .device: deviceReceivedSYN(header, payload: payload, now: now)
            case .accessory: accessoryReceivedSYNACK(header, payload: payload, now: now)
            }
            return
        }
        if state == .negotiating, role == .device, control.contains(.ack), header.acknowledgement == initialSequence,
           let offer = lastOffer, let peer = lastPeerOffer {
            // We send by the accessory's receive limits (its offer, made valid) and receive by ours.
            linkUp(offer, peer: echo(of: peer), own: offer)
        }
        guard state == .connected else { return }
        heardFromPeer = true
        if control.contains(.ack) { acknowledge(upTo: header.acknowledgement, now: now) }
        if control.contains(.eak) {
            statistics.eaksReceived += 1
            let listed = payload.withUnsafeBytes { Array($0) }
            let missing = ExtendedAcknowledgement.missing(after: header.acknowledgement, received: listed)
            // A packet is sent again for an EAK once, then not before half a retransmission
            // timeout has passed: an EAK that repeats (or a flood of them) would otherwise queue
            // the same window again and again faster than the line carries it.
            let spacing = Duration.milliseconds(Int(negotiated?.retransmissionTimeout ?? 0)) / 2
            for sequence in missing {
                guard let index = unacked.firstIndex(where: { $0.sequence == sequence }) else { continue }
                if unacked[index].transmissions == 1 || unacked[index].lastSentAt + spacing <= now {
                    retransmit(at: index, now: now)
                } else {
                    statistics.eakRetransmissionsSkipped += 1
                }
            }
            return
        }
        if header.payloadLength > 0 {
            // Judged by what this side advertised in this negotiation; taken all the same (the
            // scanner let it through: the device takes up to 65,535 bytes), and said once.
            let advertised = Int(receiveLimits?.maxPacketLength ?? configuration.parameters.maxPacketLength)
            if header.packetLength > advertised, !saidOversized {
                saidOversized = true
                events.append(.oversizedPacketTaken(length: header.packetLength, advertised: advertised))
            }
            receiveData(header, payload: payload, retained: retained, now: now, sink: &sink)
        }
    }

    // MARK: Negotiation

    private mutating func deviceReceivedSYN(_ header: LinkPacketHeader, payload: RawSpan, now: LinkTime) {
        let offer: LinkParameters
        do {
            offer = try LinkParameters.decode(payload)
        } catch {
            dropMalformedSYN(error)
            return
        }
        if state == .connected || state == .sleeping || state == .detecting {
            clearData()
            startNegotiating()
        }
        // A repeated SYN (our SYN|ACK was lost) is answered again without counting a round.
        if offer != lastPeerOffer {
            rounds += 1
            lastPeerOffer = offer
        }
        if rounds > configuration.maxNegotiationRounds {
            fail(.negotiationFailed(rounds: rounds - 1))
            return
        }
        // A SYN after we answered with our own receive limits (the accessory did not take them,
        // or our SYN|ACK was lost: the two look alike): from now on, the exact copy.
        if let sent = lastOffer, sent != echo(of: offer), sent.agreesApartFromReceiveLimits(with: echo(of: offer)) {
            echoOffers = true
        }
        lastReceived = header.sequence
        let reply = counterOffer(to: offer)
        if reply != lastOffer { synTransmissions = 0 }
        lastOffer = reply
        updateScanLimits()
        nextSequence = initialSequence
        transmitSYN(reply, acknowledging: true, now: now)
    }

    /// The device's answer to an offer: the offer's session table and timing values (the nearest
    /// valid ones), with this side's own receive limits (``LinkConfiguration/advertisesReceiveLimits``),
    /// or, as the BOYA and CAT hosts answer and as the fallback, the offer itself when it is
    /// valid and within our receive limits (an exact copy).
    func counterOffer(to offer: LinkParameters) -> LinkParameters {
        var reply = echo(of: offer)
        if configuration.advertisesReceiveLimits, !echoOffers {
            reply.maxOutstandingPackets = configuration.parameters.maxOutstandingPackets
            reply.maxPacketLength = configuration.parameters.maxPacketLength
            // QCADK: at most as many cumulative ACKs as packets outstanding.
            reply.maxCumulativeAcks = min(reply.maxCumulativeAcks, reply.maxOutstandingPackets)
        }
        return reply
    }

    /// The offer made valid and brought within our receive limits: the exact copy when it is
    /// both already.
    func echo(of offer: LinkParameters) -> LinkParameters {
        var reply = offer
        let limits = configuration.parameters
        func clamp<T: FixedWidthInteger>(_ value: T, _ field: LinkParameters.Field) -> T {
            let range = field.validRange
            return T(min(max(Int(value), range.lowerBound), range.upperBound))
        }
        reply.version = 1
        reply.maxOutstandingPackets = min(clamp(offer.maxOutstandingPackets, .maxOutstandingPackets), limits.maxOutstandingPackets)
        reply.maxPacketLength = min(clamp(offer.maxPacketLength, .maxPacketLength), limits.maxPacketLength)
        reply.retransmissionTimeout = clamp(offer.retransmissionTimeout, .retransmissionTimeout)
        reply.cumulativeAckTimeout = clamp(offer.cumulativeAckTimeout, .cumulativeAckTimeout)
        reply.maxRetransmissions = clamp(offer.maxRetransmissions, .maxRetransmissions)
        reply.maxCumulativeAcks = clamp(offer.maxCumulativeAcks, .maxCumulativeAcks)
        // Keep the valid sessions; make sure there is exactly one control session.
        var ids = Set<UInt8>()
        var types = Set<LinkSessionType>()
        reply.sessions = offer.sessions.filter { session in
            session.id != 0 && session.type.rawValue <= LinkSessionType.externalAccessory.rawValue
                && ids.insert(session.id).inserted && types.insert(session.type).inserted
        }
        if !types.contains(.control) {
            let id = (1...255).map(UInt8.init).first { !ids.contains($0) } ?? 1
            reply.sessions.insert(LinkSession(id: id, type: .control), at: 0)
        }
        return reply
    }

    private mutating func accessoryReceivedSYNACK(_ header: LinkPacketHeader, payload: RawSpan, now: LinkTime) {
        // A repeated SYN|ACK after we agreed means our ACK was lost: send it again.
        if state == .connected, header.control.contains(.ack), header.sequence == lastReceivedSYNACK,
           let negotiated, (try? LinkParameters.decode(payload)) == negotiated {
            transmitControl([.ack], payload: [])
            return
        }
        guard state == .negotiating, header.control.contains(.ack), let ours = lastOffer else { return }
        let offer: LinkParameters
        do {
            offer = try LinkParameters.decode(payload)
        } catch {
            // Our SYN's timer keeps running: the device answers it again.
            dropMalformedSYN(error)
            return
        }
        lastReceivedSYNACK = header.sequence
        lastReceived = header.sequence
        // The device's receive limits in its answer are its own business: they bound what we send.
        // Ours stay as we offered them.
        let agrees = configuration.acceptsPeerReceiveLimits ? offer.agreesApartFromReceiveLimits(with: ours) : offer == ours
        if agrees {
            linkUp(offer, peer: offer, own: ours)
            transmitControl([.ack], payload: [])
            return
        }
        rounds += 1
        if rounds >= configuration.maxNegotiationRounds || !offer.violations().isEmpty {
            fail(.negotiationFailed(rounds: rounds))
            return
        }
        // Adopt the device's counter-offer, keeping the smaller of the timing values (the
        // reference accessory does the same); agree at once if nothing changed.
        var adopted = offer
        adopted.retransmissionTimeout = min(offer.retransmissionTimeout, ours.retransmissionTimeout)
        adopted.cumulativeAckTimeout = min(offer.cumulativeAckTimeout, ours.cumulativeAckTimeout)
        adopted.maxRetransmissions = min(offer.maxRetransmissions, ours.maxRetransmissions)
        adopted.maxCumulativeAcks = min(offer.maxCumulativeAcks, ours.maxCumulativeAcks)
        // What we receive stays ours, whatever the device proposed.
        adopted.maxOutstandingPackets = ours.maxOutstandingPackets
        adopted.maxPacketLength = ours.maxPacketLength
        if configuration.acceptsPeerReceiveLimits, adopted.agreesApartFromReceiveLimits(with: offer) {
            linkUp(offer, peer: offer, own: adopted)
            transmitControl([.ack], payload: [])
        } else {
            lastOffer = adopted
            synTransmissions = 0
            transmitSYN(adopted, acknowledging: false, now: now)
        }
    }

    private mutating func restartAfterReset(now: LinkTime) {
        clearData()
        initialSequence = initialSequence &+ 0x40
        nextSequence = initialSequence
        rounds = 0
        synTransmissions = 0
        setState(.negotiating)
        lastOffer = configuration.parameters
        transmitSYN(configuration.parameters, acknowledging: false, now: now)
    }

    /// The link is up: `parameters` is what this side agreed to, `peer` the peer's receive limits
    /// (bounding what we send), `own` ours (bounding what we accept).
    private mutating func linkUp(_ parameters: LinkParameters, peer: LinkParameters, own: LinkParameters) {
        negotiated = parameters
        peerLimits = peer
        receiveLimits = own
        saidOversized = false
        synDeadline = nil
        detectDeadline = nil
        nextSequence = initialSequence &+ 1
        lastSentSequence = initialSequence
        events.append(.negotiated(parameters))
        setState(.connected)
    }

    private mutating func sendDetect(now: LinkTime) {
        outbox.append(.bytes(IAP2Detect.bytes))
        detectDeadline = now + configuration.detectInterval
        setState(.detecting)
    }

    private mutating func transmitSYN(_ parameters: LinkParameters, acknowledging: Bool, now: LinkTime) {
        let control: LinkControl = acknowledging ? [.syn, .ack] : [.syn]
        if let packet = try? LinkPacket.encode(control: control, sequence: initialSequence,
                                               acknowledgement: acknowledging ? lastReceived : 0, sessionID: 0,
                                               payload: parameters.encoded) {
            outbox.append(.bytes(packet))
            statistics.packetsSent += 1
        }
        synDeadline = now + .milliseconds(Int(max(parameters.retransmissionTimeout, 20)))
    }

    // MARK: Data

    private mutating func pump(now: LinkTime) {
        guard state == .connected, let parameters = peerLimits else { return }
        while unacked.count < Int(parameters.maxOutstandingPackets), var next = sendQueue.popFirst() {
            let sequence = nextSequence
            nextSequence &+= 1
            lastSentSequence = sequence
            // Moved out of the queue entry, so an array is uniquely ours and the checksum is
            // appended in place (a copy would make the array be copied whole).
            var packet = LinkFrame.bytes([])
            swap(&packet, &next.packet)
            transmitData(sequence: sequence, sessionID: next.sessionID, packet: &packet, checksummed: false)
            statistics.payloadBytesSent += packet.count - LinkPacketHeader.overhead
            unacked.append(InFlight(sequence: sequence, sessionID: next.sessionID, packet: packet, timerStart: now, lastSentAt: now,
                                    transmissions: 1, writtenMark: outputProgress?.writtenBytes ?? 0))
        }
    }

    /// Finishes a framed packet in place (header before the payload, checksum after it) and
    /// queues it for the transport. A packet finished before (a retransmission) carries the
    /// checksum already: only the header is written again.
    ///
    /// - Returns: false when the packet is in a transmit buffer the transport has not finished
    ///   sending: its memory may be read by the kernel at any moment, so it is not rewritten,
    ///   and sending it again would only queue a duplicate behind the first.
    @discardableResult
    private mutating func transmitData(sequence: UInt8, sessionID: UInt8, packet: inout LinkFrame, checksummed: Bool) -> Bool {
        switch packet {
        case .bytes(var array):
            packet = .bytes([]) // uniquely ours while the header is written
            if LinkPacket.finish(framed: &array, control: .ack, sequence: sequence, acknowledgement: lastReceived,
                                 sessionID: sessionID, checksummed: checksummed) {
                outbox.append(.bytes(array))
                statistics.packetsSent += 1
            }
            packet = .bytes(array)
        case let .buffer(buffer):
            guard buffer.pendingTransmissions == 0 else { return false }
            if !checksummed { buffer.append(0) }
            let finished = buffer.withMutableSpan { span in
                LinkPacket.finish(framedBytes: &span, control: .ack, sequence: sequence, acknowledgement: lastReceived,
                                  sessionID: sessionID, checksummed: checksummed)
            }
            if finished {
                outbox.append(.buffer(buffer))
                statistics.packetsSent += 1
            }
        }
        // The packet carries our acknowledgement.
        pendingAcks = 0
        ackDeadline = nil
        return true
    }

    private mutating func retransmit(at index: Int, now: LinkTime) {
        // Taken out while it is finished again, so an array is not copied on write for the
        // table's sake (the transport may still hold it: then it is, once).
        var packet = LinkFrame.bytes([])
        swap(&packet, &unacked[index].packet)
        let sent = transmitData(sequence: unacked[index].sequence, sessionID: unacked[index].sessionID, packet: &packet,
                                checksummed: true)
        swap(&packet, &unacked[index].packet)
        unacked[index].timerStart = now
        unacked[index].writtenMark = outputProgress?.writtenBytes ?? 0
        if sent {
            unacked[index].lastSentAt = now
            unacked[index].transmissions += 1
            statistics.retransmissions += 1
        } else {
            statistics.retransmissionsDeferred += 1
        }
    }

    private mutating func acknowledge(upTo acknowledgement: UInt8, now: LinkTime) {
        var removed = 0
        while let sequence = unacked.first?.sequence, Int(acknowledgement &- sequence) < 128 {
            let done = unacked.removeFirst()
            acknowledgedPackets[done.sessionID, default: 0] += 1
            removed += 1
            // An array is kept for a later packet a writer lays out. It is emptied only when
            // reused: by then the peer (an in-process one keeps views of what it received until
            // they are read) has most likely let go of it, and its storage is reused without
            // allocating. A transmit buffer goes back to its pool once the transport is done
            // with it too.
            if case let .bytes(packet) = done.packet, spareBuffers.count < Self.spareLimit { spareBuffers.append(packet) }
        }
        if removed > 0 { pump(now: now) }
    }

    private mutating func receiveData<Sink: LinkSink>(_ header: LinkPacketHeader, payload: RawSpan, retained: ReceivedBytes?,
                                                      now: LinkTime, sink: inout Sink) {
        /// The payload to park: a view of the received storage, or a copy.
        func parked() -> ReceivedBytes {
            if let retained { return retained }
            statistics.payloadBytesCopiedIn += payload.byteCount
            return ReceivedBytes(payload.withUnsafeBytes { Array($0) }[...])
        }
        let expected = lastReceived &+ 1
        let distance = Int(header.sequence &- expected)
        let window = Int(configuration.parameters.maxOutstandingPackets)
        if distance == 0 {
            guard sink.accept(sessionID: header.sessionID, payload: payload, retained: retained) else {
                // Not taken, so not acknowledged: the sender's window stops it. The packet is
                // parked (at most a window of packets can be) and offered again by
                // ``redeliver(now:sink:)`` when the reader makes room; a bare ACK of what we did
                // take tells the peer we are alive.
                statistics.refusedByReceiver += 1
                refusing = true
                if held[header.sequence] == nil {
                    held[header.sequence] = Held(sessionID: header.sessionID, payload: parked())
                }
                sendAck()
                return
            }
            held[header.sequence] = nil
            refusing = false
            lastReceived = header.sequence
            statistics.payloadBytesDelivered += payload.byteCount
            pendingAcks += 1
            deliverHeld(sink: &sink)
            scheduleAck(now: now)
        } else if distance >= 128 {
            // Already delivered: acknowledge again, deliver nothing.
            statistics.duplicatesReceived += 1
            sendAck()
        } else if refusing {
            // Behind a refused packet: park it without an EAK (which would only make the peer
            // resend what we cannot take yet).
            statistics.outOfOrderReceived += 1
            if distance < max(window, 1), held[header.sequence] == nil {
                held[header.sequence] = Held(sessionID: header.sessionID, payload: parked())
            }
        } else if distance < max(window, 1) {
            statistics.outOfOrderReceived += 1
            if held[header.sequence] == nil {
                held[header.sequence] = Held(sessionID: header.sessionID, payload: parked())
            }
            sendEAK()
        } else {
            statistics.outsideWindowReceived += 1
        }
    }

    /// Hands parked packets that now follow in order to `sink`, as far as it takes them.
    private mutating func deliverHeld<Sink: LinkSink>(sink: inout Sink) {
        while let next = held[lastReceived &+ 1] {
            guard next.payload.withSpan({ sink.accept(sessionID: next.sessionID, payload: $0, retained: next.payload) }) else {
                statistics.refusedByReceiver += 1
                refusing = true
                return
            }
            held[lastReceived &+ 1] = nil
            lastReceived &+= 1
            statistics.payloadBytesDelivered += next.payload.count
            pendingAcks += 1
        }
        refusing = false
    }

    /// Offers parked packets to `sink` again (call it when a reader made room). What is taken is
    /// acknowledged at once, so the peer resumes without waiting for its retransmission timer.
    public mutating func redeliver<Sink: LinkSink>(now: LinkTime, sink: inout Sink) {
        guard state == .connected, refusing else { return }
        let before = lastReceived
        deliverHeld(sink: &sink)
        if lastReceived != before { sendAck() }
    }

    private mutating func scheduleAck(now: LinkTime) {
        guard let parameters = negotiated else { return }
        if pendingAcks >= max(1, Int(parameters.maxCumulativeAcks)) {
            sendAck()
        } else if ackDeadline == nil {
            ackDeadline = now + .milliseconds(Int(parameters.cumulativeAckTimeout))
        }
    }

    private mutating func sendAck() {
        transmitControl([.ack], payload: [])
        statistics.acksSent += 1
    }

    private mutating func sendEAK() {
        let expected = lastReceived &+ 1
        let listed = held.keys.sorted { Int($0 &- expected) < Int($1 &- expected) }
        transmitControl([.ack, .eak], payload: listed)
        statistics.eaksSent += 1
    }

    private mutating func transmitControl(_ control: LinkControl, payload: [UInt8]) {
        if let packet = try? LinkPacket.encode(control: control, sequence: lastSentSequence, acknowledgement: lastReceived,
                                               sessionID: 0, payload: payload) {
            outbox.append(.bytes(packet))
        }
        if control.contains(.ack) {
            pendingAcks = 0
            ackDeadline = nil
        }
    }

    private mutating func clearData() {
        heardFromPeer = false
        refusing = false
        unacked.removeAll(keepingCapacity: true)
        sendQueue.removeAll()
        held.removeAll()
        pendingAcks = 0
        ackDeadline = nil
        synDeadline = nil
        detectDeadline = nil
        negotiated = nil
        peerLimits = nil
        receiveLimits = nil
    }

    private mutating func setState(_ new: LinkState) {
        guard new != state else { return }
        state = new
        events.append(.stateChanged(new))
        updateScanLimits()
    }

    private mutating func fail(_ failure: LinkFailure) {
        clearData()
        setState(.failed(failure))
    }
}

/// A sink that takes nothing: what ``IAP2Link/advance(to:)`` offers payloads to.
private struct RefusingSink: LinkSink {
    mutating func accept(sessionID: UInt8, payload: RawSpan) -> Bool { false }
}
