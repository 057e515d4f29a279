internal import IAPWire

// The device role of iAP1: IDPS or IdentifyDeviceLingoes judged, authentication 2.0 through
// the policy, and the accessory's acknowledgements.
extension IAP1Endpoint {
    mutating func deviceHandle(_ command: UInt8, _ packet: IAP1Packet, reader: inout IAP1PayloadReader) throws(WireError) {
        let tid = packet.transactionID
        switch command {
        case IAP1Command.startIDPS:
            restartIdentification()
            acknowledge(command, status: IAP1AckStatus.success, transactionID: tid)
            step = .identifying(awaiting: IAP1Command.endIDPS)
            deadline = now + answerTimeout
        case IAP1Command.setFIDTokenValues:
            guard case .identifying = step else {
                return acknowledge(command, status: IAP1AckStatus.badParameter, transactionID: tid)
            }
            let list = try FIDToken.decodeList(packet.payload)
            guard tokens.count + list.count <= Self.maxTokens else {
                tokenProblems.append("more than \(Self.maxTokens) FID tokens")
                return acknowledge(command, status: IAP1AckStatus.outOfResources, transactionID: tid)
            }
            let acks = list.map { judge($0) }
            send(IAP1Command.ackFIDTokenValues, FIDTokenAck.encodeList(acks), answering: tid)
        case IAP1Command.endIDPS:
            guard case .identifying = step else {
                return acknowledge(command, status: IAP1AckStatus.badParameter, transactionID: tid)
            }
            let status = try reader.uint8("status")
            finishIDPS(accessoryStatus: status, transactionID: tid)
        case IAP1Command.identifyDeviceLingoes:
            let lingoes = try reader.uint32("lingoes")
            let options = try reader.uint32("options")
            _ = try reader.uint32("device id")
            restartIdentification()
            acknowledge(command, status: IAP1AckStatus.success, transactionID: tid)
            identityValue = AccessoryIdentity(name: "", modelIdentifier: "", manufacturer: "", serialNumber: "", firmwareVersion: "",
                                              hardwareVersion: "", transportComponents: [], protocolVersion: .iap1)
            _ = lingoes
            // Options 1 (defer) and 2 (now) both mean the accessory can authenticate: the device
            // may ask whenever it likes, and asks at once. 0: no authentication.
            if options & 0x3 == 0 {
                guard !policy.requiresAuthentication else {
                    return failAuthentication(.refused("the accessory does not authenticate (IdentifyDeviceLingoes without authentication) and the policy requires it"))
                }
                identifiedNow()
            } else {
                startAuthentication()
            }
        case IAP1Command.requestTransportMaxPayloadSize:
            var payload: [UInt8] = []
            payload.appendUInt16BE(UInt16(maxIncomingPayload))
            send(IAP1Command.returnTransportMaxPayloadSize, payload, answering: tid)
        case IAP1Command.requestLingoProtocolVersion:
            let lingo = try reader.uint8("lingo")
            guard lingo == 0x00 else { return acknowledge(command, status: IAP1AckStatus.badParameter, transactionID: tid) }
            send(IAP1Command.returnLingoProtocolVersion, [lingo, 1, 9], answering: tid)
        case IAP1Command.getiPodOptionsForLingo:
            // The options the host really has: of the General lingo, communication with iOS
            // applications (bit 13), which head units wait for before they declare their
            // protocols (PROTOCOL.md §7.10); none of the other lingoes.
            let lingo = try reader.uint8("lingo")
            var options: [UInt8] = [lingo]
            options.appendUInt64BE(lingo == 0x00 ? Self.generalLingoOptions : 0)
            send(IAP1Command.retiPodOptionsForLingo, options, answering: tid)
        case IAP1Command.retAccessoryAuthenticationInfo:
            guard case let .awaitingCertificate(sections, next) = step else {
                return acknowledge(command, status: IAP1AckStatus.badParameter, transactionID: tid)
            }
            guard matches(packet, awaitedTransactionID) else { return }
            let major = try reader.uint8("major version")
            _ = try reader.uint8("minor version")
            guard major == 2 else {
                send(IAP1Command.ackAccessoryAuthenticationInfo, [IAP1AckStatus.badAuthenticationVersion], answering: tid)
                return failAuthentication("the accessory uses authentication version \(major); only 2.0 is supported")
            }
            let current = try reader.uint8("current section")
            let last = try reader.uint8("last section")
            guard current == next, current <= last else {
                send(IAP1Command.ackAccessoryAuthenticationInfo, [IAP1AckStatus.certificateInvalid], answering: tid)
                return failAuthentication(.malformedCertificate("certificate section \(current) of \(last) arrived where section \(next) was expected"))
            }
            let collected = sections + reader.rest()
            guard collected.count <= Self.maxCertificateLength else {
                send(IAP1Command.ackAccessoryAuthenticationInfo, [IAP1AckStatus.badParameter], answering: tid)
                return failAuthentication(.malformedCertificate("the certificate is longer than \(Self.maxCertificateLength) bytes"))
            }
            deadline = now + answerTimeout
            if current < last {
                step = .awaitingCertificate(sections: collected, next: next + 1)
                acknowledge(command, status: IAP1AckStatus.success, transactionID: tid)
                return
            }
            let examination = policy.examine(certificate: collected)
            if let refusal = examination.refusal {
                send(IAP1Command.ackAccessoryAuthenticationInfo, [IAP1AckStatus.certificateInvalid], answering: tid)
                return failAuthentication(refusal, certificate: examination.summary)
            }
            send(IAP1Command.ackAccessoryAuthenticationInfo, [IAP1AckStatus.success], answering: tid)
            // Authentication 2.0 over iAP1 uses a 20-byte challenge (PROTOCOL.md §1.8); a P-256
            // certificate (coprocessor 3.0) gets the 32 bytes its scheme signs.
            let challenge = Challenge.draw(length: examination.scheme?.challengeLength ?? 20)
            awaitedTransactionID = send(IAP1Command.getAccessoryAuthenticationSignature, challenge + [1])
            step = .awaitingSignature(certificate: collected, challenge: challenge)
        case IAP1Command.retAccessoryAuthenticationSignature:
            guard case let .awaitingSignature(certificate, challenge) = step else {
                return acknowledge(command, status: IAP1AckStatus.badParameter, transactionID: tid)
            }
            guard matches(packet, awaitedTransactionID) else { return }
            let outcome = policy.outcome(certificate: certificate, challenge: challenge, response: packet.payload)
            guard outcome.accepted else {
                send(IAP1Command.ackAccessoryAuthenticationStatus, [IAP1AckStatus.certificateInvalid], answering: tid)
                authentication = outcome
                return failAuthentication(outcome.failure ?? .refused("the challenge response did not verify"), certificate: outcome.certificate)
            }
            send(IAP1Command.ackAccessoryAuthenticationStatus, [IAP1AckStatus.success], answering: tid)
            authentication = outcome
            events.append(.authenticated(certificate: certificate, outcome: outcome))
            identifiedNow()
        case IAP1Command.accessoryAck:
            let status = try reader.uint8("status")
            let acked = try reader.uint8("command")
            accessoryAck(status: status, command: acked, packet: packet)
        case IAP1Command.accessoryDataTransfer:
            guard identified else {
                return acknowledge(command, status: IAP1AckStatus.notAuthenticated, transactionID: tid)
            }
            try receiveData(packet, reader: &reader)
        case IAP1Command.iPodAck:
            break // an accessory has no business sending it; nothing to answer
        default:
            events.append(.unhandledIAP1Command(lingo: 0x00, command: packet.command))
            acknowledge(command, status: IAP1AckStatus.badParameter, transactionID: tid)
        }
    }

    private mutating func restartIdentification() {
        if identified { events.append(.accessoryRestarted(reason: "the accessory identified again")) }
        for id in sessions.keys.sorted() { closeSession(id, reason: "the accessory identified again", notifyPeer: false) }
        identified = false
        identityValue = nil
        authentication = .notChecked
        tokens = []
        tokenProblems = []
        declaredIndices = []
        requiredTokenRejected = false
        dataAcknowledgementsMissing = false
        dataAcknowledgementsSeen = false
        step = .idle
        deadline = nil
    }

    /// Checks one FID token; valid ones are kept for the identity.
    private mutating func judge(_ token: FIDToken) -> FIDTokenAck {
        func ack(_ status: UInt8, _ extra: [UInt8] = [], _ problem: String? = nil) -> FIDTokenAck {
            if let problem, tokenProblems.count < 16 { tokenProblems.append(problem) }
            if status == FIDTokenAck.requiredFailed { requiredTokenRejected = true }
            if status == FIDTokenAck.accepted { tokens.append(token) }
            return FIDTokenAck(type: token.type, subtype: token.subtype, status: status, extra: extra)
        }
        var reader = IAP1PayloadReader(token.data, what: "FID token \(IAP1Catalogue.tokenName(token.kind))")
        do {
            switch token.kind {
            case FIDToken.identify:
                let count = Int(try reader.uint8("lingo count"))
                let lingoes = try reader.bytes(count, "lingoes")
                _ = try reader.uint32("options")
                _ = try reader.uint32("device id")
                return ack(FIDTokenAck.accepted, lingoes)
            case FIDToken.accessoryCaps:
                _ = try reader.uint64("capabilities")
                return ack(FIDTokenAck.accepted)
            case FIDToken.accessoryInfo:
                let type = try reader.uint8("info type")
                switch type {
                case FIDToken.InfoType.name, FIDToken.InfoType.manufacturer, FIDToken.InfoType.modelNumber, FIDToken.InfoType.serialNumber:
                    _ = try reader.cString("string")
                case FIDToken.InfoType.firmwareVersion, FIDToken.InfoType.hardwareVersion:
                    _ = try reader.bytes(3, "version")
                case FIDToken.InfoType.maxIncomingPayloadSize:
                    _ = try reader.uint16("size")
                default:
                    break
                }
                return ack(FIDTokenAck.accepted, [type])
            case FIDToken.eaProtocol:
                let index = try reader.uint8("protocol index")
                let name = try reader.cString("protocol string")
                guard !name.isEmpty else { return ack(FIDTokenAck.requiredFailed, [index], "EAProtocolToken \(index) has an empty protocol string") }
                guard declaredIndices.insert(index).inserted else {
                    return ack(FIDTokenAck.requiredFailed, [index], "EAProtocolToken index \(index) is declared twice")
                }
                return ack(FIDTokenAck.accepted, [index])
            case FIDToken.bundleSeedIDPref, FIDToken.eaProtocolMetadata, 0x0003:
                return ack(FIDTokenAck.accepted, Array(token.data.prefix(1)))
            default:
                return ack(FIDTokenAck.notSupported, [], "FID token \(hexByte(token.type)):\(hexByte(token.subtype)) is not supported; ignored")
            }
        } catch {
            let required = token.kind == FIDToken.identify || token.kind == FIDToken.eaProtocol
            return ack(required ? FIDTokenAck.requiredFailed : FIDTokenAck.optionalFailed, Array(token.data.prefix(1)), "\(error)")
        }
    }

    private mutating func finishIDPS(accessoryStatus: UInt8, transactionID: UInt16?) {
        guard accessoryStatus == 0 else {
            // 1 reset, 2 abort, 3 identifying on another transport.
            let answer: UInt8 = [1: 4, 2: 6, 3: 7][accessoryStatus] ?? 6
            send(IAP1Command.idpsStatus, [answer], answering: transactionID)
            restartIdentification()
            return
        }
        let missing = !tokens.contains { $0.kind == FIDToken.identify }
        if missing { tokenProblems.append("no IdentifyToken was sent") }
        if missing || requiredTokenRejected {
            let status: UInt8 = missing && requiredTokenRejected ? 3 : (missing ? 2 : 1)
            send(IAP1Command.idpsStatus, [status], answering: transactionID)
            events.append(.identificationRejected(IdentificationRejection(parameterIDs: [], reasons: tokenProblems)))
            // The accessory may start IDPS again; if it does not, the deadline reports it.
            step = .identifying(awaiting: IAP1Command.startIDPS)
            deadline = now + answerTimeout
            tokens = []
            declaredIndices = []
            requiredTokenRejected = false
            return
        }
        send(IAP1Command.idpsStatus, [0], answering: transactionID)
        identityValue = Self.identity(from: tokens)
        if let size = Self.maxIncomingPayload(in: tokens) { maxDataPerPacket = Self.dataPerPacket(forPayload: size) }
        startAuthentication()
    }

    /// The identity the accepted tokens describe.
    static func identity(from tokens: [FIDToken]) -> AccessoryIdentity {
        var strings: [UInt8: String] = [:]
        var versions: [UInt8: String] = [:]
        var protocols: [ExternalAccessoryProtocol] = []
        var teamID: String?
        var actions: [UInt8: UInt8] = [:]
        for token in tokens {
            var reader = IAP1PayloadReader(token.data, what: "token")
            switch token.kind {
            case FIDToken.accessoryInfo:
                guard let type = try? reader.uint8("type") else { continue }
                if let text = try? reader.cString("string") { strings[type] = text }
                if type == FIDToken.InfoType.firmwareVersion || type == FIDToken.InfoType.hardwareVersion, token.data.count >= 4 {
                    versions[type] = token.data[1...3].map(String.init).joined(separator: ".")
                }
            case FIDToken.eaProtocol:
                if let index = try? reader.uint8("index"), let name = try? reader.cString("name") {
                    protocols.append(ExternalAccessoryProtocol(identifier: index, name: name))
                }
            case FIDToken.bundleSeedIDPref:
                let text = String(decoding: token.data.prefix { $0 != 0 }, as: UTF8.self)
                if !text.isEmpty { teamID = text }
            case FIDToken.eaProtocolMetadata where token.data.count >= 2:
                actions[token.data[0]] = token.data[1]
            default:
                break
            }
        }
        for index in protocols.indices { protocols[index].matchAction = actions[protocols[index].identifier] ?? 0 }
        typealias T = FIDToken.InfoType
        return AccessoryIdentity(
            name: strings[T.name] ?? "", modelIdentifier: strings[T.modelNumber] ?? "", manufacturer: strings[T.manufacturer] ?? "",
            serialNumber: strings[T.serialNumber] ?? "", firmwareVersion: versions[T.firmwareVersion] ?? "",
            hardwareVersion: versions[T.hardwareVersion] ?? "", protocols: protocols, appMatchTeamID: teamID,
            transportComponents: [], protocolVersion: .iap1)
    }

    static func maxIncomingPayload(in tokens: [FIDToken]) -> Int? {
        for token in tokens where token.kind == FIDToken.accessoryInfo && token.data.count >= 3
            && token.data[0] == FIDToken.InfoType.maxIncomingPayloadSize {
            return Int(token.data[1]) << 8 | Int(token.data[2])
        }
        return nil
    }

    private mutating func startAuthentication() {
        authentication = .notChecked
        awaitedTransactionID = send(IAP1Command.getAccessoryAuthenticationInfo, [])
        step = .awaitingCertificate(sections: [], next: 0)
        deadline = now + answerTimeout
    }

    private mutating func failAuthentication(_ why: String) {
        failAuthentication(.refused(why))
    }

    private mutating func failAuthentication(_ failure: AuthenticationFailure, certificate: CertificateSummary? = nil) {
        step = .done
        deadline = nil
        if authentication.accepted || authentication.status == .notChecked {
            authentication = AuthenticationOutcome(status: .notVerified(failure), accepted: false, certificate: certificate)
        }
        events.append(.controlFailed(.authenticationFailed(failure.description)))
    }

    private mutating func identifiedNow() {
        step = .done
        deadline = nil
        identified = true
        identityValue?.authentication = authentication
        if let identityValue { events.append(.identified(identityValue)) }
    }

    mutating func accessoryAck(status: UInt8, command: UInt8, packet: IAP1Packet) {
        switch command {
        case IAP1Command.openDataSessionForProtocol:
            let match = sessions.first { $0.value.state == .opening && (!transactionIDs || $0.value.openTransactionID == packet.transactionID) }
            guard let id = match?.key, var session = match?.value else {
                events.append(.malformedMessage("iAP1 AccessoryAck for OpenDataSessionForProtocol matches no session being opened (transaction id \(packet.transactionID.map(String.init) ?? "none"))"))
                return
            }
            guard status == IAP1AckStatus.success else {
                let name = IAP1Catalogue.ackStatuses[status] ?? "status 0x\(hexByte(status))"
                closeSession(id, reason: "the accessory refused the session (\(name))", notifyPeer: false)
                return
            }
            session.state = .open
            session.openDeadline = nil
            session.openTransactionID = nil
            sessions[id] = session
            events.append(.sessionOpened(sessionID: id, protocolName: session.protocolName))
            events.append(.spaceAvailable(sessionID: id))
        case IAP1Command.iPodDataTransfer:
            dataAcknowledged(status: status, packet: packet)
        default:
            break // CloseDataSession and others: nothing waits for them
        }
    }
}

extension IAP1Endpoint {
    /// What the device answers GetiPodOptionsForLingo for the General lingo: communication with
    /// iOS applications (bit 13, 0x2000), the one option of that lingo the host has. Head units
    /// send their protocol tokens only when it is set (PROTOCOL.md §7.10).
    public static let generalLingoOptions: UInt64 = 0x2000
}
