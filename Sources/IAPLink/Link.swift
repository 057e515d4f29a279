package import ByteRing
public import IAPWire

/// The iAP2 link layer as a deterministic state machine, for both roles.
///
/// Inputs are received bytes (``receive(_:now:sink:)-(RawSpan,_,_)``, its array twin, or
/// bytes a transport lends), the passage of time (``advance(to:)``) and payloads to send
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
    public internal(set) var state: LinkState = .detecting
    /// The parameters this side agreed to, once connected: the last SYN payload it sent (the
    /// device) or accepted (the accessory). Timing values and sessions are common to both sides;
    /// the receive limits in it are this side's own (see ``receiveLimits``).
    public internal(set) var negotiated: LinkParameters?
    /// The peer's receive limits, once connected: what bounds this side's sending (window =
    /// `maxOutstandingPackets`, packets of at most `maxPacketLength`). Each side sends by the
    /// other's limits and receives by its own (PROTOCOL.md §2.4).
    public internal(set) var peerLimits: LinkParameters?
    /// This side's own receive limits, once connected.
    public internal(set) var receiveLimits: LinkParameters?
    /// The counters since the link was made (never reset, whatever the link goes through).
    public internal(set) var statistics = LinkStatistics()

    var scanner: FrameScanner
    /// When the last bytes were received: with a partial frame held, the inter-byte gap runs
    /// from here.
    var lastReceiveAt: LinkTime = .zero
    var outbox: [LinkFrame] = []
    var events: [LinkEvent] = []

    // Negotiation.
    var initialSequence: UInt8
    var rounds = 0
    var lastOffer: LinkParameters?
    var lastPeerOffer: LinkParameters?
    var detectDeadline: LinkTime?
    var synDeadline: LinkTime?
    var synTransmissions = 0
    var lastReceivedSYNACK: UInt8?
    /// Device: this negotiation answers with the exact copy of the accessory's offer (the
    /// accessory did not take an answer with our own receive limits).
    var echoOffers = false

    // Data.
    /// A packet sent and not yet acknowledged: the framed bytes as transmitted (the transport
    /// may hold the same storage; a retransmission finishes the header again in place).
    struct InFlight: Sendable {
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
    struct Held: Sendable {
        var sessionID: UInt8
        var payload: ReceivedBytes
        /// A sequence number an accessory's bare ACK used up: stepped over, nothing delivered.
        var numberOnly = false
    }
    /// Where received bytes lie, when the sink may keep views of them.
    enum Backing {
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
    var nextSequence: UInt8 = 0
    var lastSentSequence: UInt8 = 0
    /// Since when packets wait behind a full send window (nil: they do not).
    var windowFullSince: LinkTime?
    var lastReceived: UInt8 = 0
    var unacked: [InFlight] = []
    /// Packets waiting for room in the window; `payloadSum` is the sum of the payload's bytes
    /// when the writer summed them as it laid them out (nil: the link reads them for it).
    var sendQueue = FIFO<(sessionID: UInt8, packet: LinkFrame, payloadSum: UInt8?)>()
    var held: [UInt8: Held] = [:]
    var pendingAcks = 0
    var ackDeadline: LinkTime?
    /// An acknowledgement due now that has not gone out yet: sent bare when the output is next
    /// taken (``takeFrames(into:)``), unless a data packet carried it first. What a duplicate or a
    /// redelivery owes the peer is thereby left to ride on the data the same turn sends (an
    /// echo's answer), instead of going out alone just before it.
    var ackOwed = false
    /// Whether the peer was heard from since the packets in flight were last retransmitted by
    /// timer: any packet from it resets every packet's ``InFlight/silentRetransmissions``. A peer
    /// that answers but cannot take data yet (receiver flow control) is alive, and waiting for it
    /// is back-pressure; a silent one is given up on after the negotiated number of rounds.
    var heardFromPeer = false
    /// The peer's next in-order packet was refused by the sink; until it is taken, later
    /// packets are neither held nor reported with EAK (that would only make the peer resend).
    var refusing = false
    /// Device: what the accessory's bare ACKs showed of its numbering (see ``PeerNumbering``).
    var peerNumbering = PeerNumbering.unknown
    /// Device: the numbers the accessory's bare ACKs carried ahead of what it delivered, while
    /// its numbering is not known yet.
    var aheadBareAcks: [UInt8] = []
    /// Device: a gap in the accessory's sequence numbers being waited for (see ``GapWatch``).
    var sequenceGap: GapWatch?
    /// Device: the accessory was seen sending a packet again (a duplicate, or a gap filled).
    var peerRetransmits = false
    /// Device: a data packet came since the link came up. The accessory's numbering is judged
    /// only before it (see ``noteBareAck(_:now:sink:)``): later, a bare ACK after a lost data
    /// packet looks like one that carries the next number.
    var dataSinceLinkUp = false
    /// Device: the last number stepped over as used up by a bare ACK (an accessory whose next
    /// data packet then carries it after all numbers its bare ACKs the Double 2's way).
    var lastSteppedOver: UInt8?
    /// Device: the kinds of ``LinkEvent/tolerated(_:)`` said on this link.
    var toleratedKinds = Set<String>()
    /// Accessory: the device's SYN|ACK was answered with our own offer restated
    /// (``LinkConfiguration/restatesOffer``).
    var restatedOffer = false
    /// Most packets queued beyond the window before ``send(sessionID:payload:now:)`` refuses.
    public var sendQueueLimit = 64

    /// Packets the peer acknowledged, kept to lay later packets out in (``framedBuffer(payloadCapacity:)``).
    var spareBuffers: [[UInt8]] = []
    /// Most buffers kept for reuse: a window's worth and a few more.
    static let spareLimit = 48
    /// The newest acknowledged buffers left to age before reuse: half again the megabyte of full
    /// packets a session buffers by default, which an in-process peer may still hold views of.
    static let spareReserve = 24
    /// The arrays control packets (bare ACKs mostly) go out in, taken in turn: by the time one
    /// comes round the transport and the peer have let go of it, and it is refilled without
    /// allocating. All are made with the first control packet (a fixed cost per link, about
    /// 1 KiB), so the steady state never makes one.
    var controlBuffers: [[UInt8]] = []
    /// The next of ``controlBuffers`` to refill.
    var nextControlBuffer = 0
    /// How many arrays control packets go round in: bare ACKs are one per maximum of cumulative
    /// ACKs at most, and rarer where they ride on data, so 16 come round long after the peer
    /// let go.
    static let controlBufferCount = 16
    /// The room each is made with: a bare ACK, or an EAK listing a few packets (a longer one
    /// grows its array once).
    static let controlBufferCapacity = 32
    /// Buffers the transport lends for outgoing packets (``LinkFrame/buffer(_:)``): memory it
    /// sends from as it is (usbfs device memory), so a packet laid out there is never copied
    /// again. Used for payloads of at least ``transmitBufferThreshold`` bytes while one is free;
    /// arrays otherwise.
    package var transmitBuffers: PacketBufferPool?
    /// The smallest payload given a transmit buffer: shorter ones (control messages, short
    /// writes) are copied into arrays, where a copy costs little and a whole buffer would be
    /// wasted.
    public static let transmitBufferThreshold = 2_048

    // Scratch buffers reused across receive calls.
    var frameScratch: [(ScannedFrame, Bool)] = []
    var spillScratch: [UInt8] = []

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
    var saidOversized = false

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
        consider(sequenceGap?.deadline)
        if state == .connected, configuration.retransmits, let timeout = negotiated.map({ Duration.milliseconds(Int($0.retransmissionTimeout)) }) {
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
        settleOwedAck()
        for frame in outbox { frames.append(frame.copiedBytes()) }
        outbox.removeAll(keepingCapacity: true)
    }

    /// Appends the packets to transmit to `frames`, as they lie (arrays, or transmit buffers to
    /// send without a copy). Given an empty array, it swaps storage with it: a caller that
    /// empties and passes the same array each time allocates nothing.
    public mutating func takeFrames(into frames: inout [LinkFrame]) {
        settleOwedAck()
        Self.move(&outbox, into: &frames)
    }

    /// ``takeFrames(into:)`` that leaves an owed acknowledgement owed: for a caller about to let
    /// its owner queue data (which then carries it), and that takes the frames again after.
    public mutating func takeFramesLeavingAckOwed(into frames: inout [LinkFrame]) {
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
    public var hasOutput: Bool { !outbox.isEmpty || ackOwed }

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
    var outputProgress: TransportOutputProgress?

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
    public internal(set) var acknowledgedPackets: [UInt8: Int] = [:]
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
        case .accessory where configuration.skipsDetect:
            // Straight to the SYN, as if the detect had been answered.
            setState(.negotiating)
            lastOffer = configuration.parameters
            nextSequence = initialSequence
            transmitSYN(configuration.parameters, acknowledging: false, now: now)
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
        // Copied and summed in one pass: the link writes the checksum without reading the
        // payload again.
        var sum: UInt8 = 0
        packet.append(addingCapacity: payload.count) { output in sum = Checksum.append(payload.span.bytes, to: &output) }
        statistics.payloadBytesCopiedOut += payload.count
        // Handed over, not copied: a reference left here would make the checksum's append copy
        // the whole packet.
        return send(sessionID: sessionID, storage: .bytes(consume packet), payloadSum: sum, now: now)
    }

    /// Storage to lay a packet of up to `payloadCapacity` payload bytes out in: a transmit
    /// buffer when the payload is long enough and one is free, else ``framedBuffer(payloadCapacity:)``.
    /// It holds the header's headroom already.
    mutating func packetStorage(payloadCapacity: Int) -> LinkFrame {
        let needed = LinkPacketHeader.size + max(0, payloadCapacity) + 1
        if payloadCapacity >= Self.transmitBufferThreshold, let pool = transmitBuffers, needed <= pool.bufferCapacity,
           let buffer = pool.take() {
            buffer.appendZeros(LinkPacketHeader.size)
            return .buffer(TransmitBuffer(buffer))
        }
        return .bytes(framedBuffer(payloadCapacity: payloadCapacity))
    }

    /// An empty buffer to lay a packet out in, as ``LinkPacket/framedBuffer(payloadCapacity:)``
    /// makes, reusing the storage of a packet the peer acknowledged when one is large enough:
    /// the steady state allocates no packets.
    public mutating func framedBuffer(payloadCapacity: Int) -> [UInt8] {
        let needed = LinkPacketHeader.size + max(0, payloadCapacity) + 1
        // The smallest that fits (a short packet does not take a 64 KiB buffer), the oldest of
        // those, and none of the newest ``spareReserve``: the peer acknowledges a packet when it
        // arrives, and an in-process peer holds views of it until they are read, so a buffer just
        // acknowledged is likely still shared, and emptying a shared array allocates anew.
        var best: Int?
        for index in spareBuffers.indices.dropLast(Self.spareReserve) where spareBuffers[index].capacity >= needed {
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
    public mutating func send(sessionID: UInt8, framedPacket: consuming [UInt8], now: LinkTime) -> Bool {
        send(sessionID: sessionID, storage: .bytes(consume framedPacket), payloadSum: nil, now: now)
    }

    /// Queues a packet laid out in `storage` (from ``packetStorage(payloadCapacity:)``), as
    /// ``send(sessionID:framedPacket:now:)`` does. `payloadSum`: the sum of the payload's bytes
    /// modulo 256 when the writer took it as it copied them in (``Checksum/append(_:to:)``).
    mutating func send(sessionID: UInt8, storage: consuming LinkFrame, payloadSum: UInt8?, now: LinkTime) -> Bool {
        let payloadLength = storage.count - LinkPacketHeader.size
        guard canSend, payloadLength > 0, payloadLength <= maxPayloadLength else { return false }
        // Moved into the queue, so that no second reference lives while `pump` appends the
        // checksum (an array shared then is copied whole, about half the packets of an
        // in-process echo before the `consume`, as dhat showed).
        sendQueue.append((sessionID, consume storage, payloadSum))
        pump(now: now)
        return true
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
    mutating func startNegotiating() {
        if state == .connected { statistics.linkResets += 1 }
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

    mutating func clearData() {
        heardFromPeer = false
        refusing = false
        unacked.removeAll(keepingCapacity: true)
        sendQueue.removeAll()
        windowFullSince = nil
        held.removeAll()
        sequenceGap = nil
        aheadBareAcks.removeAll()
        peerNumbering = .unknown
        dataSinceLinkUp = false
        lastSteppedOver = nil
        peerRetransmits = false
        restatedOffer = false
        pendingAcks = 0
        ackDeadline = nil
        ackOwed = false
        synDeadline = nil
        detectDeadline = nil
        negotiated = nil
        peerLimits = nil
        receiveLimits = nil
    }

    mutating func setState(_ new: LinkState) {
        guard new != state else { return }
        state = new
        events.append(.stateChanged(new))
        updateScanLimits()
    }

    mutating func fail(_ failure: LinkFailure) {
        clearData()
        setState(.failed(failure))
    }
}
