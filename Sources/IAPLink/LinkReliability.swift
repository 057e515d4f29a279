internal import IAPWire

// Reliability: the send window, retransmission on timeout and for EAKs, cumulative
// acknowledgement, and received packets delivered in order once (duplicates acknowledged
// again, out-of-order ones held and listed in an EAK).
extension IAP2Link {
    /// Ends a time of a full send window, adding it to ``LinkStatistics/windowFullNanoseconds``.
    mutating func closeWindowFullTime(now: LinkTime) {
        guard let since = windowFullSince else { return }
        windowFullSince = nil
        let (seconds, attoseconds) = (now - since).components
        statistics.windowFullNanoseconds += Int(max(0, seconds)) * 1_000_000_000 + Int(max(0, attoseconds) / 1_000_000_000)
    }

    /// The counters, with the gauges of now filled in (packets in flight, the send window,
    /// packet length and cumulative-ACK timeout).
    public var statisticsNow: LinkStatistics {
        var now = statistics
        now.packetsInFlight = unacked.count
        if let peerLimits {
            now.sendWindow = configuration.ignoresPeerWindow ? 127 : Int(peerLimits.maxOutstandingPackets)
            now.sendPacketLength = configuration.sendsPacketLength.map(Int.init) ?? Int(peerLimits.maxPacketLength)
        }
        now.cumulativeAckTimeoutMilliseconds = negotiated.map { Int($0.cumulativeAckTimeout) } ?? 0
        return now
    }

    mutating func pump(now: LinkTime) {
        guard state == .connected, let parameters = peerLimits else { return }
        let window = configuration.ignoresPeerWindow ? 127 : Int(parameters.maxOutstandingPackets)
        // Time with packets queued behind a full window (waiting for acknowledgements) is
        // counted up to now at every pass, and goes on from now while the window stays full.
        closeWindowFullTime(now: now)
        defer {
            statistics.peakPacketsInFlight = max(statistics.peakPacketsInFlight, unacked.count)
            if unacked.count >= window, !sendQueue.isEmpty { windowFullSince = now }
        }
        while unacked.count < window, var next = sendQueue.popFirst() {
            let sequence = nextSequence
            nextSequence &+= 1
            lastSentSequence = sequence
            // Moved out of the queue entry, so an array is uniquely ours and the checksum is
            // appended in place (a copy would make the array be copied whole).
            var packet = LinkFrame.bytes([])
            swap(&packet, &next.packet)
            transmitData(sequence: sequence, sessionID: next.sessionID, packet: &packet, checksummed: false, payloadSum: next.payloadSum)
            statistics.payloadBytesSent += packet.count - LinkPacketHeader.overhead
            statistics.dataPacketsSent += 1
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
    private mutating func transmitData(sequence: UInt8, sessionID: UInt8, packet: inout LinkFrame, checksummed: Bool,
                                       payloadSum: UInt8? = nil) -> Bool {
        switch packet {
        case .bytes(var array):
            packet = .bytes([]) // uniquely ours while the header is written
            if LinkPacket.finish(framed: &array, control: .ack, sequence: sequence, acknowledgement: lastReceived,
                                 sessionID: sessionID, checksummed: checksummed, payloadSum: payloadSum) {
                outbox.append(.bytes(array))
                statistics.packetsSent += 1
            }
            packet = .bytes(array)
        case let .buffer(frame):
            let buffer = frame.packet
            guard buffer.pendingTransmissions == 0 else { return false }
            if !checksummed { buffer.append(0) }
            let finished = buffer.withMutableSpan { span in
                LinkPacket.finish(framedBytes: &span, control: .ack, sequence: sequence, acknowledgement: lastReceived,
                                  sessionID: sessionID, checksummed: checksummed, payloadSum: payloadSum)
            }
            if finished {
                outbox.append(.buffer(frame))
                statistics.packetsSent += 1
            }
        }
        // The packet carries our acknowledgement.
        pendingAcks = 0
        ackDeadline = nil
        ackOwed = false
        return true
    }

    mutating func retransmit(at index: Int, now: LinkTime) {
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

    mutating func acknowledge(upTo acknowledgement: UInt8, now: LinkTime) {
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

    mutating func receiveData<Sink: LinkSink>(_ header: LinkPacketHeader, payload: RawSpan, retained: ReceivedBytes?,
                                                      now: LinkTime, sink: inout Sink) {
        /// The payload to park: a view of the received storage, or a copy.
        func parked() -> ReceivedBytes {
            if let retained { return retained }
            statistics.payloadBytesCopiedIn += payload.byteCount
            return ReceivedBytes(payload.withUnsafeBytes { Array($0) }[...])
        }
        if role == .device {
            decideNumbering(dataSequence: header.sequence)
            dataSinceLinkUp = true
        }
        let expected = lastReceived &+ 1
        let distance = Int(header.sequence &- expected)
        let window = Int(configuration.parameters.maxOutstandingPackets)
        // Watched for a gap after whatever this packet changes (devices only).
        defer { watchSequenceGap(now: now) }
        if distance == 0 {
            // A packet that fills a gap was sent again: this accessory retransmits.
            if sequenceGap != nil { peerRetransmits = true }
            guard sink.accept(sessionID: header.sessionID, payload: payload, retained: retained) else {
                // Not taken, so not acknowledged: the sender's window stops it. The packet is
                // parked (at most a window of packets can be) and offered again by
                // ``redeliver(now:sink:)`` when the reader makes room. When the peer sends it
                // again (its retransmission timer ran out), an ACK of what we did take tells it
                // we are alive; the first refusal needs none (the cumulative ACK of what came
                // before is on its way, and the redelivery acknowledges the packet).
                statistics.refusedByReceiver += 1
                refusing = true
                if held[header.sequence] == nil {
                    held[header.sequence] = Held(sessionID: header.sessionID, payload: parked())
                } else {
                    oweAck()
                }
                return
            }
            held[header.sequence] = nil
            refusing = false
            lastReceived = header.sequence
            statistics.payloadBytesDelivered += payload.byteCount
            statistics.dataPacketsDelivered += 1
            pendingAcks += 1
            deliverHeld(sink: &sink)
            scheduleAck(now: now)
        } else if distance >= 128 {
            // Already delivered: acknowledge again, deliver nothing (unless it carries a number
            // wrongly stepped over, ``correctNumbering``).
            if role == .device, correctNumbering(header, payload: payload, retained: retained, now: now, sink: &sink) { return }
            statistics.duplicatesReceived += 1
            peerRetransmits = true
            oweAck()
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
    mutating func deliverHeld<Sink: LinkSink>(sink: inout Sink) {
        while let next = held[lastReceived &+ 1] {
            if next.numberOnly {
                held[lastReceived &+ 1] = nil
                lastReceived &+= 1
                continue
            }
            guard next.payload.withSpan({ sink.accept(sessionID: next.sessionID, payload: $0, retained: next.payload) }) else {
                statistics.refusedByReceiver += 1
                refusing = true
                return
            }
            held[lastReceived &+ 1] = nil
            lastReceived &+= 1
            statistics.payloadBytesDelivered += next.payload.count
            statistics.dataPacketsDelivered += 1
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
        if lastReceived != before { oweAck() }
        // A gap behind the packets that were refused is watched (and asked for) from now.
        if role == .device, !refusing, !held.isEmpty, held[lastReceived &+ 1] == nil, sequenceGap == nil {
            sendEAK()
            watchSequenceGap(now: now)
        }
    }

    mutating func scheduleAck(now: LinkTime) {
        guard let parameters = negotiated else { return }
        if pendingAcks >= max(1, Int(parameters.maxCumulativeAcks)) {
            oweAck()
        } else if ackDeadline == nil {
            ackDeadline = now + .milliseconds(Int(parameters.cumulativeAckTimeout))
        }
    }

    mutating func sendAck() {
        transmitControl([.ack], payload: [])
        statistics.acksSent += 1
    }

    /// An acknowledgement is due: it goes with the next packet out, a data packet if one is sent
    /// before the output is taken, or bare then.
    mutating func oweAck() {
        ackOwed = true
    }

    /// Sends the owed acknowledgement bare: no data packet carried it.
    mutating func settleOwedAck() {
        guard ackOwed else { return }
        sendAck()
    }

    mutating func sendEAK() {
        let expected = lastReceived &+ 1
        let listed = held.keys.sorted { Int($0 &- expected) < Int($1 &- expected) }
        transmitControl([.ack, .eak], payload: listed)
        statistics.eaksSent += 1
    }

    mutating func transmitControl(_ control: LinkControl, payload: [UInt8]) {
        // The oldest of the control arrays is refilled; the link keeps a reference to reuse it
        // in its turn.
        if controlBuffers.isEmpty {
            controlBuffers = (0..<Self.controlBufferCount).map { _ in
                var array: [UInt8] = []
                array.reserveCapacity(Self.controlBufferCapacity)
                return array
            }
        }
        var packet: [UInt8] = []
        swap(&packet, &controlBuffers[nextControlBuffer])
        packet.removeAll(keepingCapacity: true)
        var sequence = lastSentSequence
        var sessionID: UInt8 = 0
        if role == .accessory, state == .connected, control == .ack {
            // A real accessory's numbering of bare ACKs (the device's side works it out).
            sessionID = configuration.bareAckSessionID
            switch configuration.bareAckNumbering {
            case .reference: break
            case .next: sequence = nextSequence
            case .usesUp:
                sequence = nextSequence
                nextSequence &+= 1
                lastSentSequence = sequence
            }
        }
        if (try? LinkPacket.encode(control: control, sequence: sequence, acknowledgement: lastReceived,
                                   sessionID: sessionID, payload: payload.span.bytes, into: &packet)) != nil {
            outbox.append(.bytes(packet))
        }
        controlBuffers[nextControlBuffer] = packet
        nextControlBuffer = (nextControlBuffer + 1) % Self.controlBufferCount
        if control.contains(.ack) {
            pendingAcks = 0
            ackDeadline = nil
            ackOwed = false
        }
    }
}
