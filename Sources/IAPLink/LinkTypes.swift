public import IAPWire

/// Which side of the iAP2 link a state machine plays.
public enum LinkRole: String, Sendable {
    /// The Apple-device role: what the Linux host runs. Answers the detect, never sends the
    /// first SYN, accepts or counter-offers the accessory's parameters.
    case device
    /// The accessory role: what the simulator runs. Sends the detect and the first SYN.
    case accessory
}

/// Time on the link's clock: a duration since an arbitrary origin. The owner of a state machine
/// passes the current time with every input, so tests run on virtual time.
public typealias LinkTime = Duration

/// How a link behaves.
public struct LinkConfiguration: Sendable {
    /// Accessory role: the SYN parameters it proposes. Device role: its receive limits
    /// (`maxPacketLength`, `maxOutstandingPackets`, bounded by its receive buffers) and the values
    /// it falls back to when an accessory proposes something invalid.
    public var parameters: LinkParameters
    /// Accessory role: how often the detect is sent until answered.
    public var detectInterval: Duration
    /// How many SYN rounds before negotiation fails (Apple's reference code: 10).
    public var maxNegotiationRounds: Int
    /// Device role: send one detect when starting, without waiting for the accessory's. An
    /// accessory that is already up (a serial line whose previous host went away) then
    /// renegotiates instead of waiting for a SYN the device never sends; a fresh accessory takes
    /// it as the answer to its own detect. Captures show iPhone-impersonating hosts doing it.
    public var announcesDetect: Bool
    /// Device role: answer an acceptable SYN as an iPhone does, with the accessory's session
    /// table and timing values but this side's own receive limits (`maxOutstandingPackets`,
    /// `maxPacketLength` of ``parameters``), so an accessory that proposes small packets may
    /// still send large ones to the host (PROTOCOL.md §2.4). An accessory that answers that with
    /// a SYN of its own instead of the ACK gets the exact copy of its offer instead. When false,
    /// every acceptable offer is answered with its exact copy (what the BOYA and CAT hosts do).
    public var advertisesReceiveLimits: Bool
    /// Accessory role: accept a SYN|ACK whose receive limits differ from this side's offer (they
    /// are the device's; this side keeps its own for what it receives). When false, the
    /// accessory insists on its own offer with a new SYN: an accessory that refuses the
    /// counter-offer, for testing the device's fallback.
    public var acceptsPeerReceiveLimits: Bool
    /// How long the line may stay silent in the middle of a frame: once no byte came for this
    /// long while a frame is incomplete, the link abandons it and scans the bytes it held again
    /// (a length field that lied, from noise or a lost byte, would otherwise swallow the frames
    /// that follow). ``defaultInterByteGap`` by default; a serial line's owner passes
    /// ``interByteGap(baudRate:)``. Longer than any pause a sender makes inside one frame;
    /// a frame abandoned wrongly costs one retransmission.
    public var interByteGap: Duration
    /// Device role: the longest iAP1 packet taken before the link is up. An accessory that
    /// speaks iAP1 starts with short packets (StartIDPS, IdentifyDeviceLingoes, the answer to the
    /// detect), and the connection switches to iAP1 on the first of them; this bounds the packets
    /// that come in the same read, by what the iAP1 side takes
    /// (``IAP1Endpoint/defaultMaxIncomingPayload``). The accessory role takes only the detect and
    /// the iAP1 answer to it.
    public var maxIAP1PacketLength: Int
    /// Accessory role, to play an accessory tuned on iPhones: the length of the packets it
    /// sends, whatever the device advertised (nil: by the device's receive limit, as the
    /// protocol says). An iPhone advertises 65,535 bytes, so such an accessory may send packets
    /// that long to a host that asked for less.
    public var sendsPacketLength: UInt16?
    /// Accessory role, to play a real accessory's numbering: the sequence number its bare ACKs
    /// carry (``BareAckNumbering``). The device role works out the accessory's numbering by
    /// itself and ignores this.
    public var bareAckNumbering: BareAckNumbering = .reference
    /// Accessory role: the link session id its bare ACKs carry (0 by the reference; the Clicks
    /// keyboard uses its control session's id, PROTOCOL.md §7.7).
    public var bareAckSessionID: UInt8 = 0
    /// Accessory role: whether it sends a packet again after its retransmission timeout or for
    /// an EAK (true by the reference). False plays an accessory that never does (PROTOCOL.md
    /// §7.7): a packet of its that is lost stays lost, and the device must not wait for it.
    public var retransmits = true
    /// Accessory role: answer the device's first SYN|ACK with a SYN|ACK restating this side's own
    /// offer once before agreeing (the Clicks keyboard restates its values when the answer
    /// differs from them, PROTOCOL.md §7.7).
    public var restatesOffer = false
    /// Accessory role: send the SYN without a detect first (the device must start negotiating on
    /// the SYN alone).
    public var skipsDetect = false
    /// Accessory role: keep up to 127 packets in flight whatever the device's window (the Clicks
    /// keyboard does not look at it, PROTOCOL.md §7.7). The device delivers packets that come in
    /// order beyond its window as any other.
    public var ignoresPeerWindow = false

    /// Creates a configuration; see each property.
    public init(parameters: LinkParameters, detectInterval: Duration = .seconds(1), maxNegotiationRounds: Int = 10,
                announcesDetect: Bool = false, advertisesReceiveLimits: Bool = true, acceptsPeerReceiveLimits: Bool = true,
                interByteGap: Duration = LinkConfiguration.defaultInterByteGap,
                maxIAP1PacketLength: Int = IAP1Packet.maxEncodedLength(payloadLength: IAP1Endpoint.defaultMaxIncomingPayload)) {
        self.parameters = parameters
        self.advertisesReceiveLimits = advertisesReceiveLimits
        self.acceptsPeerReceiveLimits = acceptsPeerReceiveLimits
        self.detectInterval = detectInterval
        self.maxNegotiationRounds = maxNegotiationRounds
        self.announcesDetect = announcesDetect
        self.interByteGap = interByteGap
        self.maxIAP1PacketLength = maxIAP1PacketLength
    }

    /// The inter-byte gap of USB and in-memory transports, where a frame arrives whole or in
    /// pieces moments apart: 50 ms, well past scheduling delays of a busy machine, well within
    /// the accessory's first SYN retransmission.
    public static let defaultInterByteGap: Duration = .milliseconds(50)

    /// The inter-byte gap for a serial line at `baudRate`: the time 32 characters (10 bits each,
    /// 8N1 with start and stop bits) take on the wire, and never less than
    /// ``defaultInterByteGap`` (a tty hands bytes over in batches, on a scheduler's time). At
    /// 9600 baud and above (every rate a serial port takes today) that is the floor; slower
    /// lines get longer.
    public static func interByteGap(baudRate: Int) -> Duration {
        guard baudRate > 0 else { return defaultInterByteGap }
        let characters = Duration.microseconds(Int64(32 * 10 * 1_000_000 / baudRate))
        return max(defaultInterByteGap, characters)
    }

    /// Defaults for the device role: up to 32 packets of up to 65535 bytes in flight towards us;
    /// timing values are taken from the accessory's offer.
    public static let device = LinkConfiguration(parameters: LinkParameters(
        maxOutstandingPackets: 32, maxPacketLength: 65_535, retransmissionTimeout: 1_000, cumulativeAckTimeout: 20,
        maxRetransmissions: 30, maxCumulativeAcks: 16,
        sessions: [LinkSession(id: 1, type: .control), LinkSession(id: 2, type: .externalAccessory)]), announcesDetect: true)

    /// Defaults for the accessory role (the values the BOYA mini 2 proposes, with a larger window
    /// and packets).
    public static let accessory = LinkConfiguration(parameters: LinkParameters(
        maxOutstandingPackets: 8, maxPacketLength: 4_096, retransmissionTimeout: 1_000, cumulativeAckTimeout: 20,
        maxRetransmissions: 30, maxCumulativeAcks: 4,
        sessions: [LinkSession(id: 1, type: .control), LinkSession(id: 2, type: .externalAccessory)]))
}

/// Where a link is.
public enum LinkState: Hashable, Sendable {
    /// Accessory: sending the detect. Device: waiting for it.
    case detecting
    /// SYN exchanged, waiting for the other side to agree.
    case negotiating
    /// Link up: data flows.
    case connected
    /// The peer sent SLP (or this side did): waiting to be woken.
    case sleeping
    /// The link is down for good; see ``LinkFailure``.
    case failed(LinkFailure)
}

/// Why a link went down.
public enum LinkFailure: Hashable, Sendable, CustomStringConvertible {
    /// A packet was sent `count` times without acknowledgement.
    case maxRetransmissionsExceeded(sequence: UInt8, count: Int)
    /// The two sides did not agree on parameters within the allowed number of rounds.
    case negotiationFailed(rounds: Int)
    /// The peer answered the detect the iAP1 way: it does not speak iAP2.
    case peerSpeaksIAP1
    /// The peer's SYN could not be decoded. Not raised by ``IAP2Link`` any more: such a SYN is
    /// dropped and counted (``LinkEvent/malformedSYNDropped(_:)``,
    /// ``LinkStatistics/malformedSYNsDropped``) and the link keeps listening.
    case malformedSYN(WireError)
    /// The owner closed the link.
    case closed

    public var description: String {
        switch self {
        case let .maxRetransmissionsExceeded(sequence, count):
            return "packet 0x\(String(sequence, radix: 16)) was sent \(count) times without acknowledgement; the accessory stopped answering"
        case let .negotiationFailed(rounds):
            return "link parameters not agreed after \(rounds) rounds"
        case .peerSpeaksIAP1:
            return "the peer answered the iAP2 detect with iAP1: it does not speak iAP2"
        case let .malformedSYN(error):
            return "the peer's SYN is malformed: \(error)"
        case .closed:
            return "the link was closed"
        }
    }
}

/// Something the link tells its owner.
public enum LinkEvent: Hashable, Sendable {
    /// The state changed.
    case stateChanged(LinkState)
    /// Negotiation finished: these parameters govern the link.
    case negotiated(LinkParameters)
    /// An iAP1 packet arrived (body bytes) while the link was not up: the iAP1 layer's business.
    case iap1Packet([UInt8])
    /// Bytes the scanner dropped.
    case dropped(ScanDrop)
    /// A received packet was malformed for the link.
    case protocolViolation(String)
    /// Device: the accessory sent a packet longer than the receive limit this side advertised,
    /// and it was taken all the same (as an iPhone, which advertises 65,535 bytes, would have).
    /// Said once per negotiation, for the log.
    case oversizedPacketTaken(length: Int, advertised: Int)
    /// A SYN (device role) or SYN|ACK (accessory role) whose checksums verified but whose payload
    /// is not SYN parameters (too short, or a session table that is not whole entries). PROTOCOL.md
    /// §2 gives no answer to it (a counter-offer needs an offer to answer), so it is dropped and
    /// counted, and the link keeps listening for a good one.
    case malformedSYNDropped(WireError)
    /// Device: the accessory did something the reference does not, and the link served it
    /// (its bare ACKs' sequence numbers, a gap no retransmission filled). Said once per kind
    /// and link, for the log.
    case tolerated(LinkTolerance)
}

/// The sequence number an accessory's payload-less ACK carries (PROTOCOL.md §2.5, §7.6, §7.7).
public enum BareAckNumbering: String, Sendable, Hashable, CaseIterable {
    /// By the reference: the number of the last packet it sent (its next data packet takes the
    /// one after).
    case reference
    /// The next number, which its next data packet then carries too (the Double 2 robot).
    case next
    /// The next number, used up: its next data packet takes the one after (the Clicks keyboard).
    case usesUp = "uses-up"
}

/// Something the device's link served although the reference does not do it
/// (``LinkEvent/tolerated(_:)``).
public enum LinkTolerance: Hashable, Sendable, CustomStringConvertible {
    /// The accessory's bare ACKs carry the number its next data packet will carry.
    case bareAcksCarryNextNumber
    /// The accessory's bare ACKs use sequence numbers up: they are stepped over.
    case bareAcksUseUpNumbers
    /// `count` sequence numbers from `first` never came, although EAKs asked for them for
    /// `waited`: the link took the accessory's position and went on from the packets after them.
    case sequenceGapSkipped(first: UInt8, count: Int, waited: Duration)

    /// The kind, for saying each once.
    public var kind: String {
        switch self {
        case .bareAcksCarryNextNumber: "bare-ack-next"
        case .bareAcksUseUpNumbers: "bare-ack-uses-up"
        case .sequenceGapSkipped: "sequence-gap"
        }
    }

    public var description: String {
        switch self {
        case .bareAcksCarryNextNumber:
            return "the accessory's bare ACKs carry the sequence number of its next data packet (the reference repeats the last one); served"
        case .bareAcksUseUpNumbers:
            return "the accessory's bare ACKs use sequence numbers up (its data packets skip them); the link steps over them"
        case let .sequenceGapSkipped(first, count, waited):
            let last = first &+ UInt8(truncatingIfNeeded: count - 1)
            func hex(_ value: UInt8) -> String { "0x" + (value < 16 ? "0" : "") + String(value, radix: 16) }
            let range = count == 1 ? hex(first) : "\(hex(first))…\(hex(last))"
            return "the accessory never sent packet\(count == 1 ? "" : "s") \(range) again although EAKs asked for \(waited.formattedSeconds); "
                + "the link took its position and went on (that data is lost; an accessory by the reference retransmits)"
        }
    }
}

extension Duration {
    /// Seconds with up to three decimals and a unit ("1.5 s").
    var formattedSeconds: String {
        let milliseconds = components.seconds * 1_000 + components.attoseconds / 1_000_000_000_000_000
        return milliseconds % 1_000 == 0 ? "\(milliseconds / 1_000) s" : "\(Double(milliseconds) / 1_000) s"
    }
}

/// What receives the payloads the link delivers, in order.
public protocol LinkSink {
    /// Offers a payload that arrived on link session `sessionID`. Return false when it cannot be
    /// taken now (a reader's buffer is full): the link then does not acknowledge it, and the peer
    /// sends it again later. That is the receiver flow control of the reference implementation.
    mutating func accept(sessionID: UInt8, payload: RawSpan) -> Bool

    /// The same offer, with the payload's bytes also as a view of the storage they arrived in
    /// (`retained`: the received array or the lent USB slot, when they lie whole in it): a sink
    /// that keeps the bytes may keep that view instead of copying them. The default forwards to
    /// ``accept(sessionID:payload:)``.
    mutating func accept(sessionID: UInt8, payload: RawSpan, retained: ReceivedBytes?) -> Bool
}

extension LinkSink {
    public mutating func accept(sessionID: UInt8, payload: RawSpan, retained: ReceivedBytes?) -> Bool {
        accept(sessionID: sessionID, payload: payload)
    }
}

/// What an endpoint did with session bytes: how many moved each way and how many times they were
/// copied on the way (the figures behind "copies per payload byte" in `iapbench`).
///
/// Outbound counts the copy from the application's buffer into a link packet (one per byte) and
/// any later copy by the link; inbound counts a copy made on arrival (bytes that did not arrive in
/// storage the endpoint could keep: a frame reassembled across reads, a short payload in a large
/// buffer) and the
/// copy into the array a read returns. Lending bytes (`borrow`) copies nothing. Control messages
/// are not counted. Copies made by a transport below the endpoint are the transport's to count.
public struct DataPlaneStatistics: Hashable, Sendable {
    /// Session bytes the application wrote and the endpoint took.
    public var bytesWritten = 0
    /// Session bytes copied on the way out.
    public var bytesCopiedOut = 0
    /// Session bytes that arrived for open sessions.
    public var bytesReceived = 0
    /// Session bytes the application read or consumed in place.
    public var bytesRead = 0
    /// Session bytes copied on the way in.
    public var bytesCopiedIn = 0
    /// An empty count.
    public init() {}

    /// Copies per byte written (0 when nothing was written).
    public var copiesPerByteOut: Double { bytesWritten == 0 ? 0 : Double(bytesCopiedOut) / Double(bytesWritten) }
    /// Copies per byte read (0 when nothing was read).
    public var copiesPerByteIn: Double { bytesRead == 0 ? 0 : Double(bytesCopiedIn) / Double(bytesRead) }

    /// The sum of two counts (two endpoints, or a transport's copies added to an endpoint's).
    public static func + (lhs: Self, rhs: Self) -> Self { combine(lhs, rhs, &+) }

    /// What was counted between two readings (`after - before`).
    public static func - (lhs: Self, rhs: Self) -> Self { combine(lhs, rhs, &-) }

    private static func combine(_ lhs: Self, _ rhs: Self, _ operation: (Int, Int) -> Int) -> Self {
        var result = Self()
        result.bytesWritten = operation(lhs.bytesWritten, rhs.bytesWritten)
        result.bytesCopiedOut = operation(lhs.bytesCopiedOut, rhs.bytesCopiedOut)
        result.bytesReceived = operation(lhs.bytesReceived, rhs.bytesReceived)
        result.bytesRead = operation(lhs.bytesRead, rhs.bytesRead)
        result.bytesCopiedIn = operation(lhs.bytesCopiedIn, rhs.bytesCopiedIn)
        return result
    }
}

/// How far a byte-stream transport has got with its output: what a link compares so that time a
/// packet spends waiting in the transport's own queue (behind earlier packets, on a slow line
/// such as RFCOMM or a UART) is not taken for the peer's silence.
public struct TransportOutputProgress: Sendable, Hashable {
    /// Bytes accepted for sending that have not been handed to the kernel yet.
    public var queuedBytes: Int
    /// Bytes handed to the kernel since the transport opened.
    public var writtenBytes: UInt64

    /// A reading of `queuedBytes` waiting and `writtenBytes` written.
    public init(queuedBytes: Int, writtenBytes: UInt64) {
        self.queuedBytes = queuedBytes
        self.writtenBytes = writtenBytes
    }
}
