internal import IAPWire

// Data sessions of iAP1, both roles: data packets kept, held or dropped, their
// acknowledgements, and sessions ended.
extension IAP1Endpoint {
    /// A data packet of the peer: kept (and acknowledged) when the reader has room, held
    /// unacknowledged when it has not.
    mutating func receiveData(_ packet: IAP1Packet, reader: inout IAP1PayloadReader) throws(WireError) {
        let id = try reader.uint16("session id")
        let data = reader.rest()
        let tid = packet.transactionID
        guard var session = sessions[id], session.state == .open else {
            let status = role == .device ? IAP1AckStatus.unknownSessionID : IAP1AckStatus.badParameter
            return acknowledge(dataIn, status: status, transactionID: tid)
        }
        let fits = session.inbound.byteCount + data.count <= bufferLimit || session.inbound.byteCount == 0
        guard session.held.isEmpty, fits else {
            if session.held.count < Self.maxHeldPackets {
                session.held.append((tid, data))
                sessions[id] = session
                return
            }
            // The peer did not wait for the acknowledgements: this packet cannot be kept, and a
            // stream with a hole in it is worse than an ended one.
            var extra: [UInt8] = []
            extra.appendUInt16BE(id)
            extra.appendUInt32BE(UInt32(clamping: data.count))
            acknowledge(dataIn, status: role == .device ? IAP1AckStatus.droppedData : IAP1AckStatus.badParameter,
                        transactionID: tid, extra: role == .device ? extra : [])
            sessions[id] = session
            endSession(id, reason: "the peer sent more than \(Self.maxHeldPackets) data packets without waiting for their acknowledgements; \(data.count) bytes were dropped, so the session ended")
            return
        }
        keep(data, in: &session, id: id)
        sessions[id] = session
        if acknowledgesData { acknowledge(dataIn, status: IAP1AckStatus.success, transactionID: tid) }
    }

    private mutating func keep(_ data: [UInt8], in session: inout Session, id: UInt16) {
        guard !data.isEmpty else { return }
        let wasEmpty = session.inbound.byteCount == 0
        session.inbound.append(data[...], owned: true)
        if wasEmpty { events.append(.bytesAvailable(sessionID: id)) }
    }

    /// Takes in held packets once the reader made room, and acknowledges them.
    mutating func releaseHeld(_ id: UInt16) {
        guard var session = sessions[id] else { return }
        var released = false
        while let held = session.held.first,
              session.inbound.byteCount + held.data.count <= bufferLimit || session.inbound.byteCount == 0 {
            session.held.removeFirst()
            keep(held.data, in: &session, id: id)
            if acknowledgesData { acknowledge(dataIn, status: IAP1AckStatus.success, transactionID: held.transactionID) }
            released = true
        }
        sessions[id] = session
        if released { pump() }
    }

    /// The peer acknowledged one of our data packets.
    mutating func dataAcknowledged(status: UInt8, packet: IAP1Packet) {
        let index = inFlight.firstIndex { !transactionIDs || $0.transactionID == packet.transactionID }
        guard let index else {
            if let tid = packet.transactionID, let retired = retiredTransactions.firstIndex(of: tid) {
                retiredTransactions.remove(at: retired) // its session closed meanwhile
                return
            }
            events.append(.malformedMessage("iAP1 acknowledgement of data with transaction id \(packet.transactionID.map(String.init) ?? "none") matches no packet sent; ignored"))
            return
        }
        let entry = inFlight.remove(at: index)
        if role == .device, status == IAP1AckStatus.success {
            dataAcknowledgementsSeen = true
            if transactionIDs {
                // An accessory acknowledges its session's packets in order: earlier ones of the
                // same session still waiting lost their iPodAck on the way (iAP1 resends nothing).
                var kept = inFlight
                kept.removeAll(keepingCapacity: true)
                for (position, earlier) in inFlight.enumerated() {
                    if position < index, earlier.session == entry.session {
                        sessions[earlier.session]?.acknowledged += earlier.bytes
                        if let tid = earlier.transactionID { retiredTransactions.append(tid) }
                    } else {
                        kept.append(earlier)
                    }
                }
                inFlight = kept
            }
        }
        guard status == IAP1AckStatus.success else {
            let name = IAP1Catalogue.ackStatuses[status] ?? "status 0x\(hexByte(status))"
            endSession(entry.session, reason: "the peer refused \(entry.bytes) bytes of data (\(name))")
            return
        }
        sessions[entry.session]?.acknowledged += entry.bytes
        pump()
    }

    /// Ends a session for a reason of this side's own: closed with the reason, and the device
    /// tells the accessory (CloseDataSession) so that its side ends too.
    private mutating func endSession(_ id: UInt16, reason: String) {
        closeSession(id, reason: reason, notifyPeer: false)
        if role == .device {
            var payload: [UInt8] = []
            payload.appendUInt16BE(id)
            send(IAP1Command.closeDataSession, payload)
        }
    }

    mutating func closeSession(_ id: UInt16, reason: String?, notifyPeer: Bool) {
        guard var session = sessions[id] else { return }
        let wasLive = session.state == .open || session.state == .opening
        roundRobin.removeAll { $0 == id }
        for entry in inFlight where entry.session == id {
            if let tid = entry.transactionID { retiredTransactions.append(tid) }
        }
        if retiredTransactions.count > 4 * dataWindow { retiredTransactions.removeFirst(retiredTransactions.count - 4 * dataWindow) }
        inFlight.removeAll { $0.session == id }
        if notifyPeer {
            sessions[id] = nil
            if wasLive, role == .device {
                var payload: [UInt8] = []
                payload.appendUInt16BE(id)
                send(IAP1Command.closeDataSession, payload)
            }
        } else {
            session.state = .closed(reason)
            session.outbound.removeAll()
            session.held = []
            session.openDeadline = nil
            sessions[id] = session
        }
        if wasLive { events.append(.sessionClosed(sessionID: id, reason: reason)) }
    }
}
