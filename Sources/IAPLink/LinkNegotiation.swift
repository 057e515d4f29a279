internal import IAPWire

// Negotiation (PROTOCOL.md §2): the detect, SYN offers validated, counter-offered and echoed,
// and the link brought up with the parameters each side sends and receives by.
extension IAP2Link {
    mutating func deviceReceivedSYN(_ header: LinkPacketHeader, payload: RawSpan, now: LinkTime) {
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

    mutating func accessoryReceivedSYNACK(_ header: LinkPacketHeader, payload: RawSpan, now: LinkTime) {
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
        // An offer of ours that was out of range (the Double 2 offers a 0 ms cumulative-ACK
        // timeout) agrees with the device's answer made valid, as the robot takes the iPhone's.
        let agrees = configuration.acceptsPeerReceiveLimits
            ? offer.agreesApartFromReceiveLimits(with: ours) || offer.agreesApartFromReceiveLimits(with: echo(of: ours))
            : offer == ours
        if agrees, configuration.restatesOffer, !restatedOffer {
            // Plays an accessory that restates its values as a SYN|ACK before it agrees.
            restatedOffer = true
            if let packet = try? LinkPacket.encode(control: [.syn, .ack], sequence: initialSequence, acknowledgement: lastReceived,
                                                   sessionID: 0, payload: ours.encoded) {
                outbox.append(.bytes(packet))
                statistics.packetsSent += 1
            }
            return
        }
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

    mutating func restartAfterReset(now: LinkTime) {
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
    mutating func linkUp(_ parameters: LinkParameters, peer: LinkParameters, own: LinkParameters) {
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

    mutating func sendDetect(now: LinkTime) {
        outbox.append(.bytes(IAP2Detect.bytes))
        detectDeadline = now + configuration.detectInterval
        setState(.detecting)
    }

    mutating func transmitSYN(_ parameters: LinkParameters, acknowledging: Bool, now: LinkTime) {
        let control: LinkControl = acknowledging ? [.syn, .ack] : [.syn]
        if let packet = try? LinkPacket.encode(control: control, sequence: initialSequence,
                                               acknowledgement: acknowledging ? lastReceived : 0, sessionID: 0,
                                               payload: parameters.encoded) {
            outbox.append(.bytes(packet))
            statistics.packetsSent += 1
        }
        synDeadline = now + .milliseconds(Int(max(parameters.retransmissionTimeout, 20)))
    }
}
