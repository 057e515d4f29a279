internal import IAPWire

/// The control session and the EA router: everything above the link.
struct Upper: LinkSink, Sendable {
    enum ControlStep: Sendable {
        case idle
        case awaitingCertificate
        case awaitingResponse(certificate: [UInt8], challenge: [UInt8])
        case awaitingIdentification
        case done
    }

    let role: LinkRole
    var identity: AccessoryIdentity?
    var identified = false
    let policy: any AuthenticationPolicy
    let bufferLimit: Int
    var certificate: [UInt8] = []
    /// Accessory: the coprocessor that signs challenges (nil: the stand-in response).
    var signer: (any AuthenticationSigner)?
    /// Device: the policy's conclusion on this link's authentication.
    var authentication = AuthenticationOutcome.notChecked
    /// Device: the policy accepted the accessory's authentication on this link.
    var authenticationPassed = false
    var answerTimeout: Duration = .seconds(10)
    var peerBluetoothAddress: [UInt8]?
    /// Accessory: the RequestAppLaunch sent after identification, when the identity declares it.
    var appLaunch: AppLaunchRequest?
    /// Accessory: how long its coprocessor takes to answer a challenge, and the answer waiting
    /// for that time to pass.
    var challengeDelay: Duration = .zero
    var delayedResponse: (message: ControlMessage, at: LinkTime)?
    var now: LinkTime = .zero

    /// Device: a control message longer than the link packet it began in (the Clicks keyboard
    /// spreads its certificate over eight, PROTOCOL.md §7.7), joined from the packets that
    /// follow on the control session up to its declared length; given up on when the next part
    /// does not come within `answerTimeout`.
    var partialControl: (bytes: [UInt8], length: Int, deadline: LinkTime, started: LinkTime)?
    /// The longest a control message may take to come whole, from its first part: four answer
    /// timeouts (64 KiB at 9,600 baud takes about 70 s; a certificate, one).
    static let controlReassemblyLimit = 4
    /// Accessory: spread control messages longer than this many bytes after the headers over
    /// several link packets, as the Clicks keyboard does (nil: one message, one packet).
    var controlSplitChunk: Int?
    /// Accessory: the IdentificationInformation it sends instead of its identity's own (a
    /// simulator playing an accessory's deviations); nil sends the identity's message.
    var identificationOverride: ControlMessage?
    /// Accessory: control messages it takes (the link acknowledges them) and never answers (a
    /// simulator playing an accessory that stalls).
    var ignoredMessages: Set<MessageID> = []

    /// Device: the last IdentificationRejected sent on this link (named when no corrected
    /// identification comes in time).
    var lastRejection: IdentificationRejection?

    var events: [EndpointEvent] = []
    var controlOut = FIFO<[UInt8]>()
    /// Control messages queued since the link came up (the number of the last one queued), and
    /// the link's count of acknowledged control packets when it came up. Each message is one
    /// packet, sent and acknowledged in order: message n is acknowledged once the link counts
    /// `controlAcknowledgedBase + n`.
    var controlQueuedSinceUp = 0
    var controlAcknowledgedBase = 0
    /// Device: the stops sent for sessions the owner closed, until the accessory's link
    /// acknowledges them or `deadline` passes (at most one per closed session).
    var stopsInFlight: [(id: UInt16, name: String, number: Int, deadline: LinkTime)] = []
    /// Set once the control queue overflowed: nothing more is queued on this connection.
    var overwhelmed = false
    var controlSessionID: UInt8?
    var eaLinkSessionID: UInt8?
    /// What each EA data packet handed to the link and not yet acknowledged carries, in the order
    /// sent (at most the link's window plus its queue).
    var dataInFlight = FIFO<(session: UInt16, bytes: Int)>()
    /// The link's counts of acknowledged packets (per link session) already attributed.
    var acknowledgedSeen: [UInt8: Int] = [:]
    var step: ControlStep = .idle
    var deadline: LinkTime?
    var sessions = SessionTable()
    var nextSessionID: UInt16 = 1
    var unhandledMessages = 0
    /// The kinds of tolerance already reported on this connection (``EndpointEvent/tolerated(_:)``
    /// is said once per kind).
    var toleratedKinds = Set<String>()
    var roundRobin: [UInt16] = []
    /// The data plane's copies of session bytes (see ``DataPlaneStatistics``).
    var dataPlane = DataPlaneStatistics()

    init(role: LinkRole, identity: AccessoryIdentity?, policy: any AuthenticationPolicy, bufferLimit: Int) {
        self.role = role
        self.identity = identity
        self.policy = policy
        self.bufferLimit = bufferLimit
    }

    // MARK: Link up and down

    mutating func linkUp(_ parameters: LinkParameters, now: LinkTime) {
        controlQueuedSinceUp = 0
        controlSessionID = parameters.session(ofType: .control)?.id
        eaLinkSessionID = parameters.session(ofType: .externalAccessory)?.id
        identified = role == .accessory ? false : identified
        if role == .device {
            identified = false
            identity = nil
            lastRejection = nil
            authentication = .notChecked
            authenticationPassed = false
            send(ControlMessage(id: .requestAuthenticationCertificate))
            step = .awaitingCertificate
            deadline = now + answerTimeout
        }
    }

    mutating func linkDown() {
        // The link discards what it had in flight: none of it will be acknowledged.
        dataInFlight.removeAll()
        for id in sessions.ids { closeSession(id, reason: "the link went down", notifyPeer: false) }
        controlOut.removeAll()
        partialControl = nil
        stopsInFlight.removeAll() // never to be acknowledged: the owner sees the link go down
        delayedResponse = nil
        step = .idle
        deadline = nil
        if role == .device { identified = false }
    }

    /// The soonest of the control step's deadline and the stops'.
    var nextDeadline: LinkTime? {
        var soonest = deadline
        for stop in stopsInFlight where soonest.map({ stop.deadline < $0 }) ?? true { soonest = stop.deadline }
        if let delayed = delayedResponse, soonest.map({ delayed.at < $0 }) ?? true { soonest = delayed.at }
        if let partial = partialControl, soonest.map({ partial.deadline < $0 }) ?? true { soonest = partial.deadline }
        return soonest
    }

    /// Says ``EndpointEvent/tolerated(_:)`` once per `kind` on this connection.
    mutating func tolerate(_ kind: String, _ text: @autoclosure () -> String) {
        guard role == .device, toleratedKinds.insert(kind).inserted else { return }
        events.append(.tolerated(text()))
    }

    mutating func advance(to now: LinkTime) {
        if let delayed = delayedResponse, delayed.at <= now {
            delayedResponse = nil
            send(delayed.message)
        }
        if let partial = partialControl, partial.deadline <= now {
            partialControl = nil
            events.append(.malformedMessage("a control message of \(partial.length) bytes stopped after \(partial.bytes.count) "
                + "(no more of it came within \(answerTimeout)); dropped"))
        }
        let overdue = stopsInFlight.filter { $0.deadline <= now }
        if !overdue.isEmpty {
            stopsInFlight.removeAll { $0.deadline <= now }
            for stop in overdue {
                events.append(.sessionStopTimedOut(sessionID: stop.id, protocolName: stop.name, after: answerTimeout))
            }
        }
        guard let deadline, deadline <= now else { return }
        self.deadline = nil
        let what: String
        switch step {
        case .awaitingCertificate: what = "the certificate request"
        case .awaitingResponse: what = "the authentication challenge"
        case .awaitingIdentification:
            what = lastRejection.map { "StartIdentification with an identification the host can accept (the last was rejected: \($0.reasons.joined(separator: "; ")))" }
                ?? "StartIdentification"
        case .idle, .done: return
        }
        step = .done
        events.append(.controlFailed(.noAnswer(what)))
    }

    // MARK: Control messages

    mutating func send(_ message: ControlMessage) {
        guard !overwhelmed else { return }
        guard controlOut.count < IAP2Endpoint.controlQueueLimit else {
            // Replies pile up only when the peer keeps asking and does not acknowledge: bound
            // them, and end the connection rather than grow.
            overwhelmed = true
            let queued = controlOut.count
            controlOut.removeAll()
            fail(.overwhelmed(queued: queued))
            return
        }
        if let bytes = try? message.encoded() {
            if role == .accessory, let chunk = controlSplitChunk, bytes.count > ControlMessage.headerSize + 4 + chunk {
                // The first packet: the message's and the first parameter's headers and `chunk`
                // bytes; then `chunk` raw bytes a packet.
                var start = 0
                var end = ControlMessage.headerSize + 4 + chunk
                while start < bytes.count {
                    controlOut.append(Array(bytes[start..<min(end, bytes.count)]))
                    start = end
                    end += chunk
                }
            } else {
                controlOut.append(bytes)
            }
            controlQueuedSinceUp += 1
        }
    }

    /// Whether `bytes` start a message longer than they are, as an accessory that spreads
    /// messages sends them: a message header declaring more than the packet holds (and at most
    /// 65,535 bytes), followed by whole parameters and at most one parameter that runs past the
    /// packet within the declared length. Anything else is malformed, not a part.
    static func startsLongMessage(_ bytes: RawSpan) -> Bool {
        guard bytes.byteCount >= ControlMessage.headerSize + Parameter.headerSize,
              let declared = try? ControlMessage.declaredLength(in: bytes), declared > bytes.byteCount else { return false }
        let head = bytes.withUnsafeBytes { Array($0) }
        var offset = ControlMessage.headerSize
        while offset + Parameter.headerSize <= head.count {
            let length = Int(head[offset]) << 8 | Int(head[offset + 1])
            guard length >= Parameter.headerSize, offset + length <= declared else { return false }
            offset += length
        }
        return true
    }

    /// Whether `bytes` are one or more whole control messages.
    static func wholeMessages(_ bytes: RawSpan) -> Bool {
        var offset = 0
        while offset < bytes.byteCount {
            guard let (_, length) = try? ControlMessage.decode(prefixOf: bytes.extracting(offset..<bytes.byteCount)) else { return false }
            offset += length
        }
        return offset > 0
    }

    /// A control-session payload: the control messages in it, joined with the parts before and
    /// after it where a message is longer than its packet.
    mutating func acceptControl(_ payload: RawSpan) {
        var offset = 0
        let count = payload.byteCount
        if let partial = partialControl, Self.wholeMessages(payload) {
            // A packet of whole messages is no part of the one pending: that one was not what it
            // said (a length that lied), and is dropped rather than swallow good messages.
            partialControl = nil
            events.append(.malformedMessage("a control message of \(partial.length) bytes stopped after \(partial.bytes.count), "
                + "and whole messages came instead; dropped"))
        } else if var partial = partialControl {
            let take = min(partial.length - partial.bytes.count, count)
            payload.extracting(0..<take).withUnsafeBytes { partial.bytes.append(contentsOf: $0) }
            offset = take
            guard partial.bytes.count == partial.length else {
                partial.deadline = min(now + answerTimeout, partial.started + answerTimeout * Self.controlReassemblyLimit)
                partialControl = partial
                return
            }
            partialControl = nil
            do {
                handle(try ControlMessage.decode(partial.bytes))
            } catch {
                events.append(.malformedMessage(error.description))
            }
        }
        while offset < count {
            let rest = payload.extracting(offset..<count)
            do {
                let (message, length) = try ControlMessage.decode(prefixOf: rest)
                handle(message)
                offset += length
            } catch {
                // A message that declares more bytes than its packet holds: the rest follows in
                // the next packets of the control session (bounded by the declared length, at
                // most 65,535 bytes, and by `answerTimeout` a part).
                if role == .device, Self.startsLongMessage(rest), let declared = try? ControlMessage.declaredLength(in: rest) {
                    partialControl = (rest.withUnsafeBytes { Array($0) }, declared, now + answerTimeout, now)
                    tolerate("split-control-message",
                             "the accessory spreads control messages over several link packets (one of \(declared) bytes began in a packet of \(rest.byteCount)); joined")
                } else {
                    events.append(.malformedMessage(error.description))
                }
                return
            }
        }
    }

    /// Tells which stops the accessory's link acknowledged since the last call.
    mutating func noteStopAcknowledgements(_ link: IAP2Link) {
        guard !stopsInFlight.isEmpty, let control = controlSessionID else { return }
        let acknowledged = (link.acknowledgedPackets[control] ?? 0) - controlAcknowledgedBase
        let done = stopsInFlight.filter { $0.number <= acknowledged }
        guard !done.isEmpty else { return }
        stopsInFlight.removeAll { $0.number <= acknowledged }
        for stop in done { events.append(.sessionStopAcknowledged(sessionID: stop.id)) }
    }

    mutating func handle(_ message: ControlMessage) {
        switch role {
        case .device: deviceHandle(message)
        case .accessory:
            guard !ignoredMessages.contains(message.id) else { return }
            accessoryHandle(message)
        }
    }

    mutating func deviceHandle(_ message: ControlMessage) {
        if identified, let identity, !identity.messagesSent.contains(message.id.rawValue),
           message.id != .identificationInformation {
            // iOS is not known to refuse these; the message is handled as if declared.
            tolerate("undeclared-\(message.id.rawValue)",
                     "the accessory sent \(message.id), which its identification does not list among the messages it sends; handled all the same")
        }
        switch (message.id, step) {
        case (.authenticationCertificate, .awaitingCertificate):
            receivedCertificate(message)
        case let (.authenticationResponse, .awaitingResponse(certificate, challenge)):
            receivedResponse(message, certificate: certificate, challenge: challenge)
        case (.identificationInformation, .awaitingIdentification), (.identificationInformation, .done):
            receivedIdentification(message)
        case (.startPowerUpdates, _):
            // Answer with what was asked for: full current available, battery at 100 %.
            var parameters: [Parameter] = []
            for parameter in message.parameters {
                if ![0, 1, 2, 4, 5, 6].contains(parameter.id) {
                    tolerate("power-fields", "StartPowerUpdates asks for field \(parameter.id), which the host does not report; left out")
                }
                switch parameter.id {
                case 0: parameters.append(.uint16(0, 1_000))
                case 1: parameters.append(.bool(1, false))
                case 2: parameters.append(.uint8(2, 0))
                case 4: parameters.append(.bool(4, true))
                case 5: parameters.append(.uint8(5, 0))
                case 6: parameters.append(.uint16(6, 100))
                default: break
                }
            }
            send(ControlMessage(id: .powerUpdate, parameters: parameters))
        case (.stopPowerUpdates, _), (.powerSourceUpdate, _), (.accessoryAuthenticationSerialNumber, _):
            break
        case (.statusExternalAccessoryProtocolSession, _):
            // The session is open already (it is from the moment the start is sent): status 0
            // confirms it, anything else ends it with the accessory's reason.
            guard let id = try? message.parameter(0)?.uint16(),
                  let name = sessions.reading(id, { $0.state == .open ? $0.protocolName : nil }) ?? nil else {
                tolerate("status-unknown-session", "StatusExternalAccessoryProtocolSession for a session that is not open was ignored")
                return
            }
            let status = (try? message.parameter(1)?.uint8()) ?? 0
            if status == 0 {
                events.append(.sessionConfirmed(sessionID: id))
            } else {
                closeSession(id, reason: "the accessory refused the session for '\(name)' (status \(status))", notifyPeer: false)
            }
        case (.stopExternalAccessoryProtocolSession, _):
            // A device-originated message in the catalogue, but an accessory that ends a session
            // this way is taken at its word.
            guard let id = try? message.parameter(0)?.uint16(),
                  let name = sessions.reading(id, { $0.state == .open ? $0.protocolName : nil }) ?? nil else {
                tolerate("stop-unknown-session", "StopExternalAccessoryProtocolSession from the accessory for a session that is not open was ignored")
                return
            }
            closeSession(id, reason: "the accessory ended the session for '\(name)'", notifyPeer: false)
        case (.requestAppLaunch, _):
            events.append(.appLaunchRequested(AppLaunchRequest(message)))
        default:
            unhandledMessages += 1
            events.append(.unhandledMessage(message.id))
        }
    }

    mutating func accessoryHandle(_ message: ControlMessage) {
        switch message.id {
        case .requestAuthenticationCertificate:
            send(ControlMessage(id: .authenticationCertificate, parameters: [.blob(0, certificate)]))
        case .requestAuthenticationChallengeResponse:
            answerChallenge(message)
        case .authenticationSucceeded:
            break
        case .authenticationFailed:
            events.append(.controlFailed(.authenticationRefusedByDevice))
        case .startIdentification:
            if let message = identificationOverride ?? identity?.message { send(message) }
        case .identificationAccepted:
            identified = true
            if let identity {
                events.append(.identified(identity))
                // Right after identification, as the FLIR ONE does (PROTOCOL.md §7.1).
                if let appLaunch, identity.messagesSent.contains(MessageID.requestAppLaunch.rawValue) {
                    send(appLaunch.message)
                }
                // Ask for power updates when the identity says so (DJI asks for fields 0, 1, 6).
                if identity.messagesSent.contains(MessageID.startPowerUpdates.rawValue) {
                    send(ControlMessage(id: .startPowerUpdates, parameters: [.flag(0), .flag(1), .flag(6)]))
                }
            }
        case .identificationRejected:
            events.append(.controlFailed(.identificationRejected(message.parameters.map(\.id))))
        case .startExternalAccessoryProtocolSession:
            guard let protocolID = try? message.parameter(0)?.uint8(), let id = try? message.parameter(1)?.uint16() else {
                events.append(.malformedMessage("StartExternalAccessoryProtocolSession without protocol or session id"))
                return
            }
            // Only an accessory that declares StatusExternalAccessoryProtocolSession answers with
            // it; one that does not (the FLIR ONE) says nothing, and a protocol it does not know
            // then gets no session.
            let answers = identity?.messagesSent.contains(MessageID.statusExternalAccessoryProtocolSession.rawValue) ?? false
            guard let declared = identity?.protocols.first(where: { $0.identifier == protocolID }) else {
                if answers { send(ControlMessage(id: .statusExternalAccessoryProtocolSession, parameters: [.uint16(0, id), .uint8(1, 1)])) }
                return
            }
            sessions.insert(Session(id: id, protocolName: declared.name, protocolID: protocolID, state: .open))
            if answers { send(ControlMessage(id: .statusExternalAccessoryProtocolSession, parameters: [.uint16(0, id), .uint8(1, 0)])) }
            events.append(.sessionOpened(sessionID: id, protocolName: declared.name))
        case .stopExternalAccessoryProtocolSession:
            if let id = try? message.parameter(0)?.uint16() { closeSession(id, reason: nil, notifyPeer: false) }
        case .powerUpdate:
            events.append(.powerUpdate(message.parameters))
        default:
            unhandledMessages += 1
            events.append(.unhandledMessage(message.id))
        }
    }

    mutating func fail(_ failure: ControlFailure) {
        step = .done
        deadline = nil
        events.append(.controlFailed(failure))
    }

}
