internal import IAPWire

// The device's tolerance of how accessories number their packets (docs/LENIENCY.md, "sequence
// numbers"): three numberings of bare ACKs are known, and a gap that no retransmission fills is
// waited for within a bound, then stepped over.
//
// By the reference a bare ACK repeats the number of the last packet its sender sent. The Double 2
// robot gives it the next number and sends its next data packet with that number too (PROTOCOL.md
// §7.6); the Clicks keyboard uses the number up, so its next data packet comes one later (§7.7).
// A used-up number and a lost data packet look alike in one window, so the link decides from what
// the accessory shows while nothing is missing: its first bare ACK with every packet before it
// delivered says which numbering it uses, and the data packet after such ACKs says which of the
// two "ahead" numberings it is. Until then a missing number is a loss, as by the reference.

/// What the device's link knows of the accessory's bare-ACK numbering.
enum PeerNumbering: Hashable, Sendable {
    /// Nothing shown yet.
    case unknown
    /// Bare ACKs carried the next number; the next data packet tells which kind of "ahead".
    case ahead
    /// Known.
    case known(BareAckNumbering)
}

/// A gap in the accessory's sequence numbers (packets held after a missing one) being waited for.
struct GapWatch: Hashable, Sendable {
    /// The last number delivered when the gap was first seen: progress moves it.
    var mark: UInt8
    /// When the first EAK for it went out.
    var since: LinkTime
    /// EAKs sent for it so far.
    var eaks: Int
    /// When the next EAK goes out, or the gap is stepped over.
    var deadline: LinkTime
}

extension IAP2Link {
    /// EAKs, one retransmission timeout apart, after which a gap is stepped over when the
    /// accessory was never seen sending a packet again. One that was seen doing so gets as many
    /// as it says it makes (its maximum of retransmissions): it gives up itself after that.
    static let gapEAKsWithoutRetransmissions = 3

    /// The accessory's bare-ACK numbering once it is known (nil before).
    public var peerBareAckNumbering: BareAckNumbering? {
        if case let .known(numbering) = peerNumbering { return numbering }
        return nil
    }

    /// Says `tolerance` once per kind on this link.
    mutating func tolerate(_ tolerance: LinkTolerance) {
        guard toleratedKinds.insert(tolerance.kind).inserted else { return }
        events.append(.tolerated(tolerance))
    }

    /// Device: a bare ACK (no payload, no EAK) carrying `sequence`.
    mutating func noteBareAck<Sink: LinkSink>(_ sequence: UInt8, now: LinkTime, sink: inout Sink) {
        let expected = lastReceived &+ 1
        switch peerNumbering {
        case .unknown:
            // Judged only before the accessory's first data packet, while nothing is missing or
            // refused: later, a bare ACK after a lost data packet carries that packet's number
            // by the reference, and looks like one that carries the next.
            guard !dataSinceLinkUp, held.isEmpty, !refusing else { return }
            if sequence == lastReceived {
                peerNumbering = .known(.reference)
            } else if sequence == expected {
                peerNumbering = .ahead
                aheadBareAcks = [sequence]
            }
        case .ahead:
            if let last = aheadBareAcks.last, sequence == last &+ 1, aheadBareAcks.count < 128 { aheadBareAcks.append(sequence) }
        case .known(.usesUp):
            stepOverUsedNumber(sequence, now: now, sink: &sink)
        case .known:
            break
        }
    }

    /// Device: the first data packet after bare ACKs that carried numbers ahead decides which
    /// numbering the accessory uses. Called before the packet is placed.
    mutating func decideNumbering(dataSequence sequence: UInt8) {
        guard case .ahead = peerNumbering else { return }
        defer { aheadBareAcks.removeAll() }
        let expected = lastReceived &+ 1
        guard held.isEmpty, let first = aheadBareAcks.first, let last = aheadBareAcks.last, first == expected else {
            peerNumbering = .unknown
            return
        }
        if sequence == expected {
            peerNumbering = .known(.next)
            tolerate(.bareAcksCarryNextNumber)
        } else if sequence == last &+ 1 {
            peerNumbering = .known(.usesUp)
            statistics.sequenceNumbersUsedByBareAcks += aheadBareAcks.count
            lastReceived = last
            lastSteppedOver = last
            tolerate(.bareAcksUseUpNumbers)
        } else {
            // Neither: a loss after all; the numbering is judged again later.
            peerNumbering = .unknown
        }
    }

    /// Device, accessory numbering ``BareAckNumbering/usesUp``: a bare ACK's number is stepped
    /// over as an empty packet would be (at once when it is the next expected, held otherwise).
    private mutating func stepOverUsedNumber<Sink: LinkSink>(_ sequence: UInt8, now: LinkTime, sink: inout Sink) {
        let distance = Int(sequence &- (lastReceived &+ 1))
        let window = max(Int(configuration.parameters.maxOutstandingPackets), 1)
        if distance == 0 {
            // Behind a refused packet, the number is the refused packet's own: nothing to step over.
            guard !refusing, held[sequence] == nil else { return }
            statistics.sequenceNumbersUsedByBareAcks += 1
            lastReceived = sequence
            lastSteppedOver = sequence
            let before = pendingAcks
            deliverHeld(sink: &sink)
            if pendingAcks > before { scheduleAck(now: now) }
            watchSequenceGap(now: now)
        } else if distance < window, held[sequence] == nil {
            statistics.sequenceNumbersUsedByBareAcks += 1
            held[sequence] = Held(sessionID: 0, payload: ReceivedBytes([UInt8]()[...]), numberOnly: true)
            watchSequenceGap(now: now)
        }
    }

    /// Device, accessory numbering ``BareAckNumbering/usesUp``: a data packet that carries the
    /// number last stepped over shows that the accessory's bare ACKs carry the next number
    /// after all (the first data packet the decision rested on followed a loss). The packet is
    /// delivered in its place (the number carried nothing) and the numbering corrected.
    /// - Returns: whether it was taken.
    mutating func correctNumbering<Sink: LinkSink>(_ header: LinkPacketHeader, payload: RawSpan, retained: ReceivedBytes?,
                                                   now: LinkTime, sink: inout Sink) -> Bool {
        guard case .known(.usesUp) = peerNumbering, header.sequence == lastSteppedOver, header.sequence == lastReceived, !refusing,
              sink.accept(sessionID: header.sessionID, payload: payload, retained: retained) else { return false }
        peerNumbering = .known(.next)
        lastSteppedOver = nil
        statistics.payloadBytesDelivered += payload.byteCount
        statistics.dataPacketsDelivered += 1
        pendingAcks += 1
        scheduleAck(now: now)
        tolerate(.bareAcksCarryNextNumber)
        return true
    }

    /// Device: starts, keeps or ends the watch on a gap after any change to what was received.
    mutating func watchSequenceGap(now: LinkTime) {
        guard role == .device, state == .connected, !refusing, !held.isEmpty, held[lastReceived &+ 1] == nil,
              let timeout = negotiated.map({ Duration.milliseconds(Int(max($0.retransmissionTimeout, 20))) }) else {
            sequenceGap = nil
            return
        }
        if let watch = sequenceGap, watch.mark == lastReceived { return }
        // The EAK that reported the gap went out with the packet that showed it.
        sequenceGap = GapWatch(mark: lastReceived, since: now, eaks: 1, deadline: now + timeout)
    }

    /// Device: the gap's deadline passed. Another EAK, or once the bound is reached, the gap is
    /// stepped over: the accessory's position is taken and the packets held after it delivered.
    mutating func advanceSequenceGap<Sink: LinkSink>(now: LinkTime, sink: inout Sink) {
        guard var watch = sequenceGap, watch.deadline <= now, let parameters = negotiated else { return }
        let timeout = Duration.milliseconds(Int(max(parameters.retransmissionTimeout, 20)))
        let bound = peerRetransmits ? max(Self.gapEAKsWithoutRetransmissions, Int(parameters.maxRetransmissions)) : Self.gapEAKsWithoutRetransmissions
        if watch.eaks < bound {
            watch.eaks += 1
            watch.deadline = now + timeout
            sequenceGap = watch
            sendEAK()
            return
        }
        let expected = lastReceived &+ 1
        guard let first = held.keys.min(by: { Int($0 &- expected) < Int($1 &- expected) }) else {
            sequenceGap = nil
            return
        }
        let count = Int(first &- expected)
        statistics.sequenceGapsSkipped += 1
        statistics.sequenceNumbersSkipped += count
        tolerate(.sequenceGapSkipped(first: expected, count: count, waited: now - watch.since))
        sequenceGap = nil
        lastReceived = first &- 1
        deliverHeld(sink: &sink)
        oweAck()
        watchSequenceGap(now: now)
    }
}
