internal import IAPWire

// The EA router: EA data from the link into the sessions' buffers, with back-pressure; sessions
// opened and closed; bytes written into packets and handed to the link, one session's packet
// at a time; acknowledgements credited to the sessions.
extension Upper {
    // MARK: LinkSink

    mutating func accept(sessionID: UInt8, payload: RawSpan) -> Bool {
        accept(sessionID: sessionID, payload: payload, retained: nil)
    }

    mutating func accept(sessionID: UInt8, payload: RawSpan, retained: ReceivedBytes?) -> Bool {
        if sessionID == controlSessionID {
            acceptControl(payload)
            return true
        }
        guard sessionID == eaLinkSessionID else {
            // A link session the host does not use (file transfer): accepted in the SYN, left idle.
            tolerate("idle-link-session", "packets on link session \(sessionID), which the host does not use, are acknowledged and ignored")
            return true
        }
        guard let (id, range) = try? EASessionData.decode(payload) else {
            events.append(.malformedMessage("EA data shorter than its session id"))
            return true
        }
        guard let queued = sessions.reading(id, { $0.state == .open ? $0.inbound.byteCount : nil }) ?? nil else {
            // Not open here (never opened, or closed): taken and dropped, as nothing will read it.
            tolerate("ea-data-not-open", "EA data for session \(id), which is not open on this side, was dropped")
            return true
        }
        // Back-pressure. A packet larger than the whole buffer (a peer that sends more than
        // it was told it may) is still taken into an empty one rather than refused for ever:
        // a session then holds at most its limit plus one packet.
        if queued > 0, queued + range.count > bufferLimit { return false }
        guard !range.isEmpty else { return true }
        dataPlane.bytesReceived += range.count
        if let retained {
            // Kept as a view of the array or the lent slot the bytes arrived in: no copy.
            sessions.modifying(id) { $0.inbound.append(retained.extracting(range)) }
        } else {
            dataPlane.bytesCopiedIn += range.count
            let copy = payload.extracting(range).withUnsafeBytes { Array($0) }
            sessions.modifying(id) { $0.inbound.append(copy[...], owned: true) }
        }
        if queued == 0 { events.append(.bytesAvailable(sessionID: id)) }
        return true
    }

    // MARK: Sessions

    mutating func openSession(protocolName: String) throws(EndpointError) -> UInt16 {
        guard role == .device, identified, let identity else { throw .notIdentified }
        guard let declared = identity.protocols.first(where: { $0.name == protocolName }) else {
            throw .unsupportedProtocol(protocolName)
        }
        guard eaLinkSessionID != nil else { throw .noExternalAccessoryLinkSession }
        if sessions.entries.contains(where: { $0.protocolName == protocolName && ($0.state == .open || $0.state == .opening) }) {
            throw .protocolInUse(protocolName)
        }
        var id = nextSessionID
        while id == 0 || sessions.contains(id) { id &+= 1 }
        nextSessionID = id &+ 1
        // Open at once, as on an iPhone: the accessory may answer with
        // StatusExternalAccessoryProtocolSession (only if it lists 0xEA03 among the messages it
        // sends), and may just as well send data straight away or say nothing (PROTOCOL.md §3.6,
        // §7.1). Data written now follows the start on the link, in order.
        sessions.insert(Session(id: id, protocolName: protocolName, protocolID: declared.identifier, state: .open))
        send(ControlMessage(id: .startExternalAccessoryProtocolSession, parameters: [.uint8(0, declared.identifier), .uint16(1, id)]))
        events.append(.sessionOpened(sessionID: id, protocolName: protocolName))
        events.append(.spaceAvailable(sessionID: id))
        return id
    }

    /// Ends a session. The owner's close (`notifyPeer`) forgets it at once; a close that comes
    /// from the peer or the link keeps the session, closed, with the bytes already received still
    /// readable, until the owner closes it too.
    mutating func closeSession(_ id: UInt16, reason: String?, notifyPeer: Bool) {
        guard let state = sessions.reading(id, { $0.state }) else { return }
        let wasLive = state == .open || state == .opening
        roundRobin.removeAll { $0 == id }
        if notifyPeer {
            let name = sessions.reading(id, { $0.protocolName }) ?? ""
            sessions.remove(id)
            if wasLive, role == .device {
                let queued = controlQueuedSinceUp
                send(ControlMessage(id: .stopExternalAccessoryProtocolSession, parameters: [.uint16(0, id)]))
                if controlQueuedSinceUp > queued {
                    stopsInFlight.removeAll { $0.id == id }
                    stopsInFlight.append((id, name, controlQueuedSinceUp, now + answerTimeout))
                }
            }
        } else {
            sessions.modifying(id) {
                $0.state = .closed(reason)
                $0.outbound.removeAll()
            }
        }
        if wasLive { events.append(.sessionClosed(sessionID: id, reason: reason)) }
    }

    /// Copies what fits of `bytes` into the session's outbound packets (the one copy of the
    /// way out); the session is mutated in place.
    mutating func write(_ id: UInt16, _ bytes: RawSpan, link: inout IAP2Link) throws(EndpointError) -> Int {
        guard let state = sessions.reading(id, { $0.state }) else { throw .unknownSession(id) }
        guard state == .open else { throw .sessionNotOpen(id) }
        let chunk = link.maxPayloadLength - EASessionData.headerSize
        let limit = bufferLimit
        let taken = sessions.modifying(id) { session -> Int in
            let taken = session.outbound.append(bytes, sessionID: id, chunk: chunk, limit: limit, buffers: &link)
            if taken < bytes.byteCount { session.wasFull = true }
            return taken
        } ?? 0
        dataPlane.bytesWritten += taken
        dataPlane.bytesCopiedOut += taken
        if !roundRobin.contains(id) { roundRobin.append(id) }
        return taken
    }

    mutating func read(_ id: UInt16, maxBytes: Int) -> [UInt8] {
        guard let (bytes, copied) = sessions.modifying(id, { $0.inbound.take(maxBytes) }) else { return [] }
        dataPlane.bytesRead += bytes.count
        dataPlane.bytesCopiedIn += copied
        return bytes
    }

    mutating func readChunk(_ id: UInt16, maxBytes: Int) -> ArraySlice<UInt8> {
        guard let (bytes, copied) = sessions.modifying(id, { $0.inbound.takeChunk(maxBytes) }) else { return [] }
        dataPlane.bytesRead += bytes.count
        dataPlane.bytesCopiedIn += copied
        return bytes
    }

    mutating func borrow<Result>(_ id: UInt16, _ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        var consumed = 0
        let result = try sessions.modifying(id) { session -> Result? in
            let before = session.inbound.byteCount
            defer { consumed = before - session.inbound.byteCount }
            return try session.inbound.borrowFirst(body)
        }
        dataPlane.bytesRead += consumed
        return result ?? nil
    }

    /// Credits the sessions with the EA packets the link saw acknowledged since the last call.
    mutating func noteAcknowledgements(_ link: IAP2Link) {
        guard let eaSession = eaLinkSessionID else { return }
        let total = link.acknowledgedPackets[eaSession] ?? 0
        var newly = total - acknowledgedSeen[eaSession, default: 0]
        acknowledgedSeen[eaSession] = total
        while newly > 0, let packet = dataInFlight.popFirst() {
            sessions.modifying(packet.session) { $0.acknowledged += packet.bytes }
            newly -= 1
        }
    }

    /// Packets let wait in the link's queue beyond its window. The rest wait in their sessions'
    /// queues, where the turn of each session is decided and where a writer's bytes count
    /// against its buffer; the link takes the next packet from there each time an
    /// acknowledgement opens the window (every input ends in ``pumpData(into:now:)``). A few
    /// ready packets let one acknowledgement refill the window in one go (at 2, the in-process
    /// echo of four sessions lost 12 %); each one beyond that is 64 KiB no session buffer counts,
    /// and on USB a transmit buffer held.
    static let linkQueueDepth = 8

    /// Moves queued session bytes into the link, one packet per session in turn, so several
    /// sessions share the link fairly.
    mutating func pumpData(into link: inout IAP2Link, now: LinkTime) {
        guard let eaSession = eaLinkSessionID else { return }
        guard link.maxPayloadLength > EASessionData.headerSize else { return }
        var idle = 0
        while link.canSend, link.queuedCount < Self.linkQueueDepth, !roundRobin.isEmpty, idle < roundRobin.count {
            let id = roundRobin.removeFirst()
            guard sessions.contains(id) else { continue }
            guard let (packet, dataBytes, payloadSum) = sessions.modifying(id, { $0.outbound.popPacket() }) ?? nil else {
                idle += 1
                roundRobin.append(id)
                continue
            }
            idle = 0
            // The packet was laid out by write(); the link finishes it where it lies. Handed
            // over, not copied: a second reference would make the link's checksum append copy
            // the whole packet.
            if link.send(sessionID: eaSession, storage: consume packet, payloadSum: payloadSum, now: now) {
                dataInFlight.append((id, dataBytes))
            }
            let limit = bufferLimit
            let roomAgain = sessions.modifying(id) { session -> Bool in
                guard session.wasFull, session.outbound.byteCount < limit else { return false }
                session.wasFull = false
                return true
            } ?? false
            if roomAgain { events.append(.spaceAvailable(sessionID: id)) }
            roundRobin.append(id)
        }
    }
}
