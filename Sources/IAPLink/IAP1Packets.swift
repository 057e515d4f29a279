internal import IAPWire

// Packets of an iAP1 endpoint: queued with their transaction ids, scanned from the line and
// dispatched by lingo and role.
extension IAP1Endpoint {
    // MARK: Sending

    /// Queues a General-lingo packet; returns the transaction id it carries.
    @discardableResult
    mutating func send(_ command: UInt8, _ payload: [UInt8], answering transactionID: UInt16? = nil) -> UInt16? {
        var tid: UInt16?
        if transactionIDs {
            if let transactionID {
                tid = transactionID
            } else {
                tid = nextTransactionID
                nextTransactionID &+= 1
            }
        }
        let packet = IAP1Packet(lingo: 0x00, command: UInt16(command), transactionID: tid, payload: payload)
        do {
            output.append(try packet.encoded(sync: true))
        } catch {
            // Every payload this side builds fits (data packets are clamped): counted so a test
            // or the fuzzer sees it if that ever stops being true.
            encodeFailures += 1
            events.append(.malformedMessage("iAP1: could not encode \(IAP1Catalogue.generalCommands[command] ?? "command"): \(error)"))
        }
        return tid
    }

    /// The acknowledgement this side sends for the peer's commands: iPodAck (device) or
    /// AccessoryAck (accessory).
    mutating func acknowledge(_ command: UInt8, status: UInt8, transactionID: UInt16?, extra: [UInt8] = []) {
        let ackCommand = role == .device ? IAP1Command.iPodAck : IAP1Command.accessoryAck
        send(ackCommand, [status, command] + extra, answering: transactionID)
    }

    /// The data command this side sends and the one it receives.
    private var dataOut: UInt8 { role == .device ? IAP1Command.iPodDataTransfer : IAP1Command.accessoryDataTransfer }
    var dataIn: UInt8 { role == .device ? IAP1Command.accessoryDataTransfer : IAP1Command.iPodDataTransfer }

    /// Moves queued session bytes into data packets, one per session in turn, while the window
    /// has room.
    mutating func pump() {
        var idle = 0
        while !roundRobin.isEmpty, idle < roundRobin.count {
            let id = roundRobin.removeFirst()
            guard var session = sessions[id], session.state == .open else { continue }
            roundRobin.append(id)
            // The window is per session, so a session whose reader is slow does not hold up
            // the others.
            guard session.outbound.byteCount > 0, inFlight.count(where: { $0.session == id }) < dataWindow else {
                idle += 1
                continue
            }
            idle = 0
            var payload: [UInt8] = []
            payload.reserveCapacity(2 + min(maxDataPerPacket, session.outbound.byteCount))
            payload.appendUInt16BE(id)
            payload.append(contentsOf: session.outbound.take(maxDataPerPacket).bytes)
            let tid = send(dataOut, payload)
            if dataAcknowledgementsMissing {
                // Not waited for on this connection (see ``advance(to:)``).
                session.acknowledged += payload.count - 2
                if let tid { retiredTransactions.append(tid) }
                if retiredTransactions.count > 4 * dataWindow { retiredTransactions.removeFirst(retiredTransactions.count - 4 * dataWindow) }
            } else {
                inFlight.append((tid, id, payload.count - 2, now))
            }
            if session.wasFull, session.outbound.byteCount < bufferLimit {
                session.wasFull = false
                events.append(.spaceAvailable(sessionID: id))
            }
            sessions[id] = session
        }
    }

    // MARK: Receiving

    mutating func receivedDetect() {
        switch role {
        case .accessory:
            // "I do not speak iAP2", the way PROTOCOL.md §1.11 gives it (an iAP1 device's
            // answer; what real accessories send is not known). Always: on a serial line the
            // host that sends the detect may be a new one that missed this accessory's own
            // StartIDPS, and its RequestIdentify then starts identification over (answers to the
            // earlier attempt are ignored as stale).
            output.append(IAP2Detect.iap1Reply)
        case .device:
            sawIAP2Detect = true
        }
    }

    mutating func receivePacket(body: [UInt8]) {
        // The iAP1 answer to the detect: expected from an iAP1 accessory, nothing to do.
        if body == [0x00, IAP1Command.iPodAck, IAP1AckStatus.badParameter, IAP2Detect.command] { return }
        if role == .accessory, body.count == 2 || body.count == 4, body[0] == 0x00, body[1] == IAP1Command.requestIdentify {
            // The device may ask before or after transaction ids were agreed: both shapes count.
            beginIdentification()
            return
        }
        if role == .device, body.count >= 2, body[0] == 0x00 {
            // How the accessory identifies decides whether transaction ids are present.
            if body[1] == IAP1Command.startIDPS { transactionIDs = body.count >= 4 }
            if body[1] == IAP1Command.identifyDeviceLingoes, body.count == 14 { transactionIDs = false }
        }
        let packet: IAP1Packet
        do {
            packet = try IAP1Packet.decode(body: body.span.bytes, transactionIDs: transactionIDs)
        } catch {
            events.append(.malformedMessage("iAP1: \(error)"))
            return
        }
        guard packet.lingo == 0x00 else {
            events.append(.unhandledIAP1Command(lingo: packet.lingo, command: packet.command))
            guard role == .device else { return }
            if packet.lingo == 0x04 {
                // The Extended Interface lingo has its own iPodAck (0x0001) with a two-byte
                // command id (PROTOCOL.md §1.6).
                let ack = IAP1Packet(lingo: 0x04, command: 0x0001, transactionID: packet.transactionID,
                                     payload: [IAP1AckStatus.badParameter, UInt8(packet.command >> 8), UInt8(packet.command & 0xFF)])
                if let bytes = try? ack.encoded(sync: true) { output.append(bytes) }
            } else {
                // Other lingoes' acks are not in PROTOCOL.md: the General iPodAck names the command.
                acknowledge(UInt8(truncatingIfNeeded: packet.command), status: IAP1AckStatus.badParameter, transactionID: packet.transactionID)
            }
            return
        }
        let command = UInt8(packet.command)
        // Each handler reads the payload's fields through one reader whose errors name the command.
        var reader = IAP1PayloadReader(packet.payload, what: IAP1Catalogue.generalCommands[command] ?? "command")
        do {
            switch role {
            case .device: try deviceHandle(command, packet, reader: &reader)
            case .accessory: try accessoryHandle(command, packet, reader: &reader)
            }
        } catch {
            events.append(.malformedMessage("iAP1 \(IAP1Catalogue.generalCommands[command] ?? "command 0x\(hexByte(command))"): \(error)"))
            if role == .device {
                acknowledge(command, status: IAP1AckStatus.badParameter, transactionID: packet.transactionID)
            }
        }
    }

    /// Whether an answer carries the transaction id of the request it answers; a mismatch is
    /// reported and the answer ignored.
    mutating func matches(_ packet: IAP1Packet, _ expected: UInt16?) -> Bool {
        guard transactionIDs, let expected, packet.transactionID != expected else { return true }
        let name = IAP1Catalogue.generalCommands[UInt8(packet.command)] ?? "command"
        events.append(.malformedMessage("iAP1 \(name) carries transaction id \(packet.transactionID.map(String.init) ?? "none") where \(expected) was expected; ignored"))
        return false
    }
}
