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
    /// Data packets delivered in order to the sink (duplicates and refused packets not counted):
    /// with ``acksSent``, how many bare ACKs the link sent per data packet it took.
    public var dataPacketsDelivered = 0
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
    /// Device role: times the link started over after it was up: the host reset it (RST), or the
    /// accessory sent a detect or a SYN on the live link (it restarted). Each ends the sessions,
    /// and the accessory is identified again.
    public var linkResets = 0
    /// Device role: sequence numbers the accessory's bare ACKs used up (an accessory that numbers
    /// its bare ACKs as data packets, PROTOCOL.md §7.7), stepped over without data.
    public var sequenceNumbersUsedByBareAcks = 0
    /// Device role: gaps in the accessory's sequence numbers that no retransmission filled
    /// within the bound of docs/LENIENCY.md, after which the link took the accessory's position.
    public var sequenceGapsSkipped = 0
    /// Device role: sequence numbers stepped over in those gaps.
    public var sequenceNumbersSkipped = 0
    /// Data packets sent the first time (retransmissions not counted): with
    /// ``payloadBytesSent``, the mean size of the packets sent.
    public var dataPacketsSent = 0
    /// The most data packets that were in flight at once (sent and not yet acknowledged).
    public var peakPacketsInFlight = 0
    /// Nanoseconds the link had packets queued behind a full send window: the time spent waiting
    /// for the peer's acknowledgements to send more (counted when the window opens again).
    public var windowFullNanoseconds = 0
    /// Now: data packets in flight (a gauge, not a counter).
    public var packetsInFlight = 0
    /// The send window: the peer's outstanding-packet limit as this side sends by it (0 before
    /// the link is up).
    public var sendWindow = 0
    /// The length of the packets this side sends, header included: the peer's packet limit (0
    /// before the link is up).
    public var sendPacketLength = 0
    /// The negotiated cumulative-ACK timeout in milliseconds: how long the peer may wait
    /// before it acknowledges (0 before the link is up).
    public var cumulativeAckTimeoutMilliseconds = 0
    /// Counters at zero, as a new link starts.
    public init() {}
}
