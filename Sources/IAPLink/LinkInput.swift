package import ByteRing
internal import IAPWire

// Input of the link: received bytes scanned into frames, each handled by its kind and control
// bits, and the passage of time (timers, a partial frame given up on).
extension IAP2Link {
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
    package mutating func receive<Sink: LinkSink>(lent lease: SlotLease, now: LinkTime, sink: inout Sink) {
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
        if role == .device { advanceSequenceGap(now: now, sink: &sink) }
        guard state == .connected, let parameters = negotiated else { return }
        // An accessory that never sends a packet again (PROTOCOL.md §7.7, played by the
        // simulator) leaves its packets to the device.
        guard configuration.retransmits else { return }
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
    var gapDeadline: LinkTime? {
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
    mutating func updateScanLimits() {
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
    mutating func dropMalformedSYN(_ error: WireError) {
        statistics.malformedSYNsDropped += 1
        events.append(.malformedSYNDropped(error))
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
            for sequence in missing where configuration.retransmits {
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
        } else if role == .device, control == .ack {
            // On any link session: a bare ACK is an acknowledgement wherever it says it belongs.
            noteBareAck(header.sequence, now: now, sink: &sink)
        }
    }
}

/// A sink that takes nothing: what ``IAP2Link/advance(to:)`` offers payloads to.
private struct RefusingSink: LinkSink {
    mutating func accept(sessionID: UInt8, payload: RawSpan) -> Bool { false }
}
