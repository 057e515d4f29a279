internal import IAPWire

// The accessory role of iAP1: identification (IDPS or IdentifyDeviceLingoes), the certificate
// sent in sections, the device's challenge signed, and the device's commands answered.
extension IAP1Endpoint {
    // MARK: Accessory role

    mutating func beginIdentification() {
        for id in sessions.keys.sorted() { closeSession(id, reason: "the device asked the accessory to identify again", notifyPeer: false) }
        sessions = [:]
        identified = false
        switch style {
        case .idps:
            transactionIDs = true
            awaitedTransactionID = send(IAP1Command.startIDPS, [])
            step = .identifying(awaiting: IAP1Command.startIDPS)
        case .deviceLingoes:
            transactionIDs = false
            var payload: [UInt8] = []
            payload.appendUInt32BE(1) // the General lingo
            payload.appendUInt32BE(2) // authenticate now
            payload.appendUInt32BE(0x200)
            send(IAP1Command.identifyDeviceLingoes, payload)
            step = .identifying(awaiting: IAP1Command.identifyDeviceLingoes)
        }
    }

    /// The FID tokens this accessory declares.
    var declaredTokens: [FIDToken] {
        guard let identity = identityValue else { return [] }
        var tokens: [FIDToken] = []
        var identify: [UInt8] = [1, 0x00]
        identify.appendUInt32BE(2)
        identify.appendUInt32BE(0x200)
        tokens.append(FIDToken(type: 0, subtype: 0, data: identify))
        var caps: [UInt8] = []
        caps.appendUInt64BE(1 << 9) // application communication (EA)
        tokens.append(FIDToken(type: 0, subtype: 1, data: caps))
        func info(_ type: UInt8, _ value: [UInt8]) { tokens.append(FIDToken(type: 0, subtype: 2, data: [type] + value)) }
        func cString(_ text: String) -> [UInt8] { Array(text.utf8.prefix(200)) + [0] }
        func version(_ text: String) -> [UInt8] {
            let parts = text.split(separator: ".").map { UInt8(clamping: Int($0) ?? 0) }
            return (0..<3).map { $0 < parts.count ? parts[$0] : 0 }
        }
        info(FIDToken.InfoType.name, cString(identity.name))
        info(FIDToken.InfoType.firmwareVersion, version(identity.firmwareVersion))
        info(FIDToken.InfoType.hardwareVersion, version(identity.hardwareVersion))
        info(FIDToken.InfoType.manufacturer, cString(identity.manufacturer))
        info(FIDToken.InfoType.modelNumber, cString(identity.modelIdentifier))
        info(FIDToken.InfoType.serialNumber, cString(identity.serialNumber))
        info(FIDToken.InfoType.maxIncomingPayloadSize, [UInt8(maxIncomingPayload >> 8), UInt8(maxIncomingPayload & 0xFF)])
        for item in identity.protocols {
            tokens.append(FIDToken(type: 0, subtype: 4, data: [item.identifier] + cString(item.name)))
        }
        if let team = identity.appMatchTeamID { tokens.append(FIDToken(type: 0, subtype: 5, data: cString(team))) }
        return tokens
    }

    mutating func accessoryHandle(_ command: UInt8, _ packet: IAP1Packet, reader: inout IAP1PayloadReader) throws(WireError) {
        let tid = packet.transactionID
        switch command {
        case IAP1Command.requestIdentify:
            beginIdentification()
        case IAP1Command.iPodAck:
            let status = try reader.uint8("status")
            let acked = try reader.uint8("command")
            switch acked {
            case IAP1Command.startIDPS where status == IAP1AckStatus.success:
                guard answers(IAP1Command.startIDPS, packet) else { return }
                awaitedTransactionID = send(IAP1Command.requestTransportMaxPayloadSize, [])
                step = .identifying(awaiting: IAP1Command.requestTransportMaxPayloadSize)
            case IAP1Command.identifyDeviceLingoes where status == IAP1AckStatus.success:
                step = .idle // authentication comes next
            case IAP1Command.retAccessoryAuthenticationInfo where status == IAP1AckStatus.success:
                sendCertificateSection()
            case IAP1Command.accessoryDataTransfer:
                dataAcknowledged(status: status, packet: packet)
            default:
                if status != IAP1AckStatus.success {
                    events.append(.malformedMessage("iAP1: the device answered \(IAP1Catalogue.generalCommands[acked] ?? "command 0x\(hexByte(acked))") with \(IAP1Catalogue.ackStatuses[status] ?? "status \(status)")"))
                }
            }
        case IAP1Command.returnTransportMaxPayloadSize:
            guard answers(IAP1Command.requestTransportMaxPayloadSize, packet) else { return }
            let size = Int(try reader.uint16("size"))
            maxDataPerPacket = Self.dataPerPacket(forPayload: size)
            if gatesProtocolsOnLingoOptions {
                awaitedTransactionID = send(IAP1Command.getiPodOptionsForLingo, [0x00])
                step = .identifying(awaiting: IAP1Command.getiPodOptionsForLingo)
            } else {
                sendTokens(withProtocols: true)
            }
        case IAP1Command.retiPodOptionsForLingo:
            guard answers(IAP1Command.getiPodOptionsForLingo, packet) else { return }
            let lingo = try reader.uint8("lingo")
            let options = try reader.uint64("options")
            sendTokens(withProtocols: lingo == 0x00 && options & 0x2000 != 0)
        case IAP1Command.ackFIDTokenValues:
            guard answers(IAP1Command.setFIDTokenValues, packet) else { return }
            let acks = try FIDTokenAck.decodeList(packet.payload)
            if let refused = acks.first(where: { $0.status == FIDTokenAck.requiredFailed }) {
                events.append(.malformedMessage("iAP1: the device refused FID token \(IAP1Catalogue.tokenName(UInt16(refused.type) << 8 | UInt16(refused.subtype)))"))
            }
            awaitedTransactionID = send(IAP1Command.endIDPS, [0])
            step = .identifying(awaiting: IAP1Command.endIDPS)
        case IAP1Command.idpsStatus:
            guard answers(IAP1Command.endIDPS, packet) else { return }
            let status = try reader.uint8("status")
            if status != 0 {
                step = .done
                events.append(.controlFailed(.identificationRejected([UInt16(status)])))
            } else {
                step = .idle
            }
        case IAP1Command.getAccessoryAuthenticationInfo:
            certificateTransactionID = tid
            certificateSectionsSent = 0
            sendCertificateSection()
        case IAP1Command.ackAccessoryAuthenticationInfo:
            if try reader.uint8("status") != IAP1AckStatus.success { events.append(.controlFailed(.authenticationRefusedByDevice)) }
        case IAP1Command.getAccessoryAuthenticationSignature:
            // The challenge and a retry counter; a real accessory asks its coprocessor, one without
            // a signer sends a stand-in.
            let challenge = Array(packet.payload.dropLast())
            let response = signer?.sign(challenge: challenge) ?? standInResponse(to: challenge)
            send(IAP1Command.retAccessoryAuthenticationSignature, response, answering: tid)
        case IAP1Command.ackAccessoryAuthenticationStatus:
            if try reader.uint8("status") == IAP1AckStatus.success {
                step = .done
                identified = true
                if let identityValue { events.append(.identified(identityValue)) }
            } else {
                events.append(.controlFailed(.authenticationRefusedByDevice))
            }
        case IAP1Command.openDataSessionForProtocol:
            let id = try reader.uint16("session id")
            let index = try reader.uint8("protocol index")
            guard identified, let declared = identityValue?.protocols.first(where: { $0.identifier == index }), sessions[id]?.state != .open else {
                return acknowledge(command, status: IAP1AckStatus.badParameter, transactionID: tid)
            }
            sessions[id] = Session(protocolName: declared.name, protocolIndex: index, state: .open)
            acknowledge(command, status: IAP1AckStatus.success, transactionID: tid)
            events.append(.sessionOpened(sessionID: id, protocolName: declared.name))
        case IAP1Command.closeDataSession:
            let id = try reader.uint16("session id")
            acknowledge(command, status: sessions[id] == nil ? IAP1AckStatus.badParameter : IAP1AckStatus.success, transactionID: tid)
            closeSession(id, reason: nil, notifyPeer: false) // what was received stays readable
        case IAP1Command.iPodDataTransfer:
            try receiveData(packet, reader: &reader)
        default:
            events.append(.unhandledIAP1Command(lingo: 0x00, command: packet.command))
        }
    }

    /// Accessory: SetFIDTokenValues with the declared tokens (the protocols' left out when
    /// `withProtocols` is false).
    private mutating func sendTokens(withProtocols: Bool) {
        let tokens = declaredTokens.filter { withProtocols || !($0.type == 0 && $0.subtype == 4) }
        if let list = try? FIDToken.encodeList(tokens) {
            awaitedTransactionID = send(IAP1Command.setFIDTokenValues, list)
        }
        step = .identifying(awaiting: IAP1Command.setFIDTokenValues)
    }

    /// Accessory: whether `packet` answers the identification request in flight (`command`, with
    /// its transaction id). Answers to a request made before the device asked for a new
    /// identification are stale, and ignored.
    private func answers(_ command: UInt8, _ packet: IAP1Packet) -> Bool {
        guard case let .identifying(awaiting) = step, awaiting == command else { return false }
        return !transactionIDs || packet.transactionID == awaitedTransactionID
    }

    private mutating func sendCertificateSection() {
        let length = Self.certificateSectionLength
        let count = max(1, (certificate.count + length - 1) / length)
        guard certificateSectionsSent < count, count <= 256 else { return }
        let section = certificateSectionsSent
        let start = section * length
        let data = start < certificate.count ? Array(certificate[start..<min(certificate.count, start + length)]) : []
        send(IAP1Command.retAccessoryAuthenticationInfo, [2, 0, UInt8(section), UInt8(count - 1)] + data, answering: certificateTransactionID)
        certificateSectionsSent += 1
    }
}
