public import IAPLink
import IAPWire

extension SimulatorProfile {
    /// One way a real accessory departs from the reference, which the simulator can play (the JSON
    /// array `deviations`, by name; `iapctl simulate --deviation NAME`).
    ///
    /// The catalogue is the host's contract of tolerance: every row of `docs/LENIENCY.md` names the
    /// deviations that play it, each habit of `PROTOCOL.md` §7 has one, and the sweep test runs
    /// every deviation alone and every pair of them through the link, authentication,
    /// identification and an echo, requiring each to be served, or refused with the reason the
    /// table gives (``expectation``).
    public enum Deviation: String, Codable, Sendable, CaseIterable, Comparable {
        // MARK: Link
        /// Sends its SYN without the detect first.
        case skipsDetect = "skips-detect"
        /// Sends bytes that are neither iAP1 nor iAP2 before its detect.
        case noiseBeforeLink = "noise-before-link"
        /// Offers a cumulative-ACK timeout of 0 ms, outside the reference range, and takes the
        /// device's corrected value (the Double 2, §7.6).
        case outOfRangeTimers = "out-of-range-timers"
        /// A cumulative-ACK timeout of 4,169 ms, longer than its 1,500 ms retransmission timeout,
        /// 3 retransmissions and 3 cumulative ACKs (the Canon Ivy, §7.8).
        case slowAcknowledgements = "slow-acknowledgements"
        /// Link session ids 10 (control) and 11 (EA) (the Canon Ivy §7.8, the TD300 §7.2).
        case sessionIDsTenAndEleven = "session-ids-10-11"
        /// One link session only, the control session with id 10: its protocols' data goes over
        /// native transports (the Clicks keyboard, §7.7).
        case controlSessionOnly = "control-session-only"
        /// A control session of version 2 and a file-transfer session beside it (the Hyundai
        /// DN8, §7.4).
        case fileTransferSession = "file-transfer-session"
        /// One packet outstanding at a time (the TD300 §7.2, the Double 2 §7.6).
        case windowOfOne = "window-of-one"
        /// Packets of at most 255 bytes towards it (the Double 2, §7.6).
        case smallPackets = "small-packets"
        /// Sends packets of 65,535 bytes whatever the device advertised (tuned on iPhones, which
        /// advertise 65,535; the Double 2 sends 928-byte packets after announcing 255, §7.6).
        case oversizedPackets = "oversized-packets"
        /// Its bare ACKs carry the next sequence number, which its next data packet carries too
        /// (the Double 2, §7.6).
        case bareAcksCarryNextNumber = "bare-acks-carry-next-number"
        /// Its bare ACKs use sequence numbers up: its next data packet takes the one after (the
        /// Clicks keyboard, §7.7).
        case bareAcksUseUpNumbers = "bare-acks-use-up-numbers"
        /// Its bare ACKs go on its control session's id, not 0 (the Clicks keyboard, §7.7).
        case bareAcksOnControlSession = "bare-acks-on-control-session"
        /// Never sends a packet again, for a timeout or an EAK (the Clicks keyboard, §7.7).
        case neverRetransmits = "never-retransmits"
        /// Keeps up to 127 packets in flight whatever the device's window (the Clicks keyboard,
        /// §7.7).
        case ignoresWindow = "ignores-window"
        /// Acknowledges every packet at once (one cumulative ACK; the TD300 §7.2, the Clicks
        /// keyboard §7.7).
        case acknowledgesEveryPacket = "acknowledges-every-packet"
        /// Restates its own offer as a SYN|ACK once before it agrees (the Clicks keyboard, §7.7).
        case restatesOffer = "restates-offer"

        // MARK: Authentication
        /// Its coprocessor takes 500 ms to answer the challenge (the TD300 100 ms §7.2, the
        /// Double 2 464 ms §7.6).
        case slowCoprocessor = "slow-coprocessor"
        /// Spreads control messages over link packets of 128 bytes after the headers: its
        /// certificate is one message over several packets (the Clicks keyboard, §7.7).
        case splitControlMessages = "split-control-messages"
        /// Sends a certificate that is no certificate (neither PKCS#7 nor X.509: the endpoint's
        /// stand-in, in place of the profile's or the built-in test certificate): the `record`
        /// policy serves it and records why it is not verified.
        case unverifiableCertificate = "unverifiable-certificate"

        // MARK: Identification
        /// Leaves out a required parameter (HardwareVersion): refused, and named.
        case missingRequiredParameter = "missing-required-parameter"
        /// Lists the device's messages among those it sends and its own among those it receives.
        case wronglyDirectedMessageLists = "wrongly-directed-message-lists"
        /// Declares two External Accessory protocols with the same identifier: refused.
        case duplicateProtocolIDs = "duplicate-protocol-ids"
        /// Carries parameters the host does not use (ProductPlanUID, a USB host HID component)
        /// and one no source names (the Clicks keyboard, §7.7).
        case unknownIdentificationParameters = "unknown-identification-parameters"
        /// AppMatchTeamID with six bytes after its NUL (the Clicks keyboard, §7.7).
        case bytesAfterNUL = "bytes-after-nul"
        /// Its USB host transport component has id 0 (DJI).
        case componentIDZero = "component-id-0"
        /// On Bluetooth, its BluetoothTransportComponent gives the address in the other byte order.
        case bluetoothAddressReversed = "bluetooth-address-reversed"

        // MARK: External Accessory sessions
        /// Never sends StatusExternalAccessoryProtocolSession (the FLIR ONE, §7.1).
        case noSessionStatus = "no-session-status"
        /// Refuses every session with status 1: refused, with the status named.
        case refusesSessions = "refuses-sessions"
        /// Ends every session with StopExternalAccessoryProtocolSession as it opens: refused, as
        /// the accessory ending it.
        case endsSessions = "ends-sessions"
        /// Sends EA data on a session id that is not open.
        case dataForUnknownSession = "data-for-unknown-session"
        /// Sends StatusExternalAccessoryProtocolSession for a session that is not open.
        case statusForUnknownSession = "status-for-unknown-session"
        /// Declares one more protocol, on a native transport (DJI, the FLIR ONE's fileio).
        case nativeProtocol = "native-protocol"

        // MARK: Other messages
        /// Asks for an application with RequestAppLaunch after identification (the FLIR ONE
        /// §7.1, the Double 2 §7.6, the Clicks keyboard §7.7).
        case appLaunch = "app-launch"
        /// Sends a message its identification does not declare (PowerSourceUpdate).
        case undeclaredMessages = "undeclared-messages"
        /// Sends a message the host does not know and a control payload that is no message.
        case unknownMessages = "unknown-messages"
        /// Asks StartPowerUpdates for fields the host does not report.
        case oddPowerFields = "odd-power-fields"
        /// Answers the first PowerUpdate with StopPowerUpdates, and sends PowerSourceUpdate (the
        /// Clicks keyboard, §7.7).
        case powerChatter = "power-chatter"

        // MARK: iAP1
        /// iAP1: declares its protocols only when the General lingo's options have bit 13 set
        /// (car head units, §7.10).
        case iap1OptionsGateProtocols = "iap1-options-gate-protocols"
        /// iAP1: identifies with IdentifyDeviceLingoes, without transaction ids (the Prius, §7.10).
        case iap1DeviceLingoes = "iap1-device-lingoes"
        /// iAP1: never acknowledges the device's data packets (iPodDataTransfer) with iPodAck.
        case iap1UnacknowledgedData = "iap1-unacknowledged-data"

        /// Orders by catalogue position.
        public static func < (lhs: Self, rhs: Self) -> Bool {
            (allCases.firstIndex(of: lhs) ?? 0) < (allCases.firstIndex(of: rhs) ?? 0)
        }

        /// Decodes a deviation name, naming the valid ones when it is not one of them.
        public init(from decoder: any Decoder) throws {
            let raw = try decoder.singleValueContainer().decode(String.self)
            guard let deviation = Deviation(rawValue: raw) else {
                throw SimulatorProfileError(field: fieldPath(decoder.codingPath),
                                            problem: "'\(raw)' is not a deviation; use one of " + Deviation.allCases.map(\.rawValue).joined(separator: ", "))
            }
            self = deviation
        }

        /// Which protocol the deviation belongs to.
        public var protocolVersion: IAPProtocolVersion {
            switch self {
            case .iap1OptionsGateProtocols, .iap1DeviceLingoes, .iap1UnacknowledgedData: .iap1
            default: .iap2
            }
        }

        /// What the host does with an accessory that has this deviation.
        public enum Expectation: Hashable, Sendable {
            /// Served: linked, authenticated, identified, and an echo carried byte for byte.
            case served
            /// Refused, with a reason that contains this text.
            case refused(String)
        }

        /// What the host must do with an accessory that has this deviation (docs/LENIENCY.md).
        public var expectation: Expectation {
            switch self {
            case .missingRequiredParameter: .refused("HardwareVersion is missing")
            case .duplicateProtocolIDs: .refused("is declared twice")
            case .refusesSessions: .refused("the accessory refused the session")
            case .endsSessions: .refused("the accessory ended the session")
            default: .served
            }
        }

        /// Words of what the host says once in its log when it serves this deviation (its
        /// `tolerated` line, or the link's line on an oversized packet); nil where it says
        /// nothing particular.
        public var hostSays: String? {
            switch self {
            case .bareAcksCarryNextNumber: "bare ACKs carry the sequence number of its next data packet"
            case .bareAcksUseUpNumbers: "bare ACKs use sequence numbers up"
            case .splitControlMessages: "spreads control messages over several link packets"
            case .bytesAfterNUL: "bytes after their string's NUL"
            case .unknownIdentificationParameters: "parameters the host does not know"
            case .wronglyDirectedMessageLists: "accepted all the same"
            case .undeclaredMessages: "does not list among the messages it sends"
            case .statusForUnknownSession: "for a session that is not open was ignored"
            case .dataForUnknownSession: "which is not open on this side, was dropped"
            case .oddPowerFields: "which the host does not report"
            case .iap1UnacknowledgedData: "did not acknowledge iPodDataTransfer"
            default: nil
            }
        }

        /// Whether it departs from the reference (PROTOCOL.md §2–3) rather than being an unusual
        /// choice the reference allows (a window of one, session ids 10 and 11, a slow
        /// coprocessor): what `iapctl report` lists as a finding for the accessory's maker.
        public var departsFromReference: Bool {
            switch self {
            case .sessionIDsTenAndEleven, .controlSessionOnly, .fileTransferSession, .windowOfOne, .smallPackets, .acknowledgesEveryPacket,
                 .slowCoprocessor, .nativeProtocol, .appLaunch, .componentIDZero, .refusesSessions, .endsSessions, .iap1DeviceLingoes:
                return false
            default:
                return true
            }
        }

        /// What an iPhone is known to do with an accessory that has this habit, and how that is
        /// known (PROTOCOL.md §7's sources); "not published" where no source shows it.
        public var iPhone: String {
            switch self {
            case .skipsDetect, .noiseBeforeLink:
                "not published; the reference has the accessory send the detect first and nothing before it (§2.1)"
            case .outOfRangeTimers:
                "served: an iPhone answered the Double 2's cumulative-ACK timeout of 0 ms with 10 ms in its SYN|ACK (§7.6)"
            case .slowAcknowledgements:
                "served, by the Canon Ivy's use with iPhones (§7.8); its timing is outside the reference's usual ranges"
            case .bareAcksCarryNextNumber:
                "served: an iPhone's capture with the Double 2 shows its bare ACKs carrying the next number (§7.6)"
            case .bareAcksUseUpNumbers, .bareAcksOnControlSession, .neverRetransmits, .ignoresWindow, .restatesOffer, .splitControlMessages,
                 .bytesAfterNUL, .unknownIdentificationParameters, .powerChatter:
                "served, as far as known: the Clicks keyboard works with iPhones; the habit is read from a port of its stock firmware "
                    + "recovered by static analysis, not yet checked on hardware (§7.7)"
            case .oversizedPackets:
                "never seen as oversized: an iPhone advertises 65,535-byte packets; the Double 2 sends 928-byte packets after announcing 255 (§7.6)"
            case .noSessionStatus:
                "served: the FLIR ONE never sends StatusExternalAccessoryProtocolSession and works with iPhones (§7.1)"
            case .unverifiableCertificate:
                "refused: an iPhone verifies the certificate and ends the connection (§3.2)"
            case .wronglyDirectedMessageLists, .undeclaredMessages, .unknownMessages, .oddPowerFields, .dataForUnknownSession,
                 .statusForUnknownSession, .missingRequiredParameter, .duplicateProtocolIDs, .bluetoothAddressReversed:
                "not published"
            case .iap1OptionsGateProtocols:
                "an iPod answers GetiPodOptionsForLingo for the General lingo with bit 13 set; head units gate their protocols on it (§7.10)"
            case .iap1UnacknowledgedData:
                "not published"
            case .sessionIDsTenAndEleven, .controlSessionOnly, .fileTransferSession, .windowOfOne, .smallPackets, .acknowledgesEveryPacket,
                 .slowCoprocessor, .nativeProtocol, .appLaunch, .componentIDZero, .refusesSessions, .endsSessions, .iap1DeviceLingoes:
                "allowed by the reference"
            }
        }

        /// Where the habit was seen, or why it is in the catalogue.
        public var source: String {
            switch self {
            case .skipsDetect, .noiseBeforeLink: "PROTOCOL.md §2.1, §3.6"
            case .outOfRangeTimers, .smallPackets, .bareAcksCarryNextNumber: "PROTOCOL.md §7.6 (Double 2)"
            case .slowAcknowledgements: "PROTOCOL.md §7.8 (Canon Ivy)"
            case .sessionIDsTenAndEleven: "PROTOCOL.md §7.2 (TD300), §7.8 (Canon Ivy)"
            case .fileTransferSession: "PROTOCOL.md §7.4 (Hyundai DN8)"
            case .windowOfOne: "PROTOCOL.md §7.2 (TD300), §7.6 (Double 2)"
            case .oversizedPackets: "PROTOCOL.md §7.5, §7.6; issue 31"
            case .bareAcksUseUpNumbers, .bareAcksOnControlSession, .neverRetransmits, .ignoresWindow, .restatesOffer, .splitControlMessages,
                 .controlSessionOnly,
                 .bytesAfterNUL, .unknownIdentificationParameters, .powerChatter:
                "PROTOCOL.md §7.7 (Clicks keyboard)"
            case .acknowledgesEveryPacket: "PROTOCOL.md §7.2 (TD300), §7.7 (Clicks keyboard)"
            case .slowCoprocessor: "PROTOCOL.md §7.2 (TD300), §7.6 (Double 2)"
            case .unverifiableCertificate: "PROTOCOL.md §3.2; the record policy"
            case .missingRequiredParameter, .wronglyDirectedMessageLists, .duplicateProtocolIDs: "PROTOCOL.md §3.3"
            case .componentIDZero: "PROTOCOL.md §3.3 (DJI)"
            case .bluetoothAddressReversed: "issue 22"
            case .noSessionStatus: "PROTOCOL.md §7.1 (FLIR ONE)"
            case .refusesSessions, .endsSessions, .dataForUnknownSession, .statusForUnknownSession: "PROTOCOL.md §3.4"
            case .nativeProtocol: "PROTOCOL.md §3.4, §4.3, §7.1"
            case .appLaunch: "PROTOCOL.md §7.1, §7.6, §7.7"
            case .undeclaredMessages, .unknownMessages: "the brief's rule: what it sends that we do not use, ignore"
            case .oddPowerFields: "PROTOCOL.md §3.5"
            case .iap1OptionsGateProtocols, .iap1DeviceLingoes: "PROTOCOL.md §7.10"
            case .iap1UnacknowledgedData: "the audit of waits (issue 46): no wait without an exit"
            }
        }

        /// Whether this deviation can be played together with `other` (some set the same thing
        /// two ways; iAP1 and iAP2 deviations never meet on one accessory).
        public func combines(with other: Deviation) -> Bool {
            guard self != other, protocolVersion == other.protocolVersion else { return false }
            let pair: Set = [self, other]
            // Both set the bare ACKs' numbering.
            if pair == [.bareAcksCarryNextNumber, .bareAcksUseUpNumbers] { return false }
            // Both set the link's session table.
            if !pair.isDisjoint(with: [.controlSessionOnly]), !pair.isDisjoint(with: [.sessionIDsTenAndEleven, .fileTransferSession]) { return false }
            if pair == [.sessionIDsTenAndEleven, .fileTransferSession] { return false }
            // Without an EA link session there is no EA data to send, and no session on the link
            // for the accessory to refuse or end.
            if pair.contains(.controlSessionOnly), !pair.isDisjoint(with: [.dataForUnknownSession, .refusesSessions, .endsSessions]) { return false }
            // IdentifyDeviceLingoes declares no protocol, so no session's data flows to go unacknowledged.
            if pair == [.iap1DeviceLingoes, .iap1UnacknowledgedData] { return false }
            return true
        }
    }

    /// The profile with its ``deviations`` applied to what the profile itself says (link
    /// parameters, habits, protocols); what the endpoint does differently is applied by
    /// ``SimulatedAccessory``.
    func applyingDeviations() -> SimulatorProfile {
        var profile = self
        for deviation in deviations {
            switch deviation {
            case .slowAcknowledgements:
                profile.link.retransmissionTimeoutMs = 1_500
                profile.link.cumulativeAckTimeoutMs = 4_169
                profile.link.maxRetransmissions = 3
                profile.link.maxCumulativeAcks = 3
            case .windowOfOne: profile.link.maxOutstandingPackets = 1
            case .smallPackets:
                // And, as the Double 2, packets of its own longer than that (its certificate in one).
                profile.link.maxPacketLength = 255
                profile.link.sendsPacketLength = profile.link.sendsPacketLength ?? 1_024
            case .oversizedPackets: profile.link.sendsPacketLength = 65_535
            case .acknowledgesEveryPacket: profile.link.maxCumulativeAcks = 1
            case .slowCoprocessor: profile.habits.challengeResponseDelayMs = 500
            case .noSessionStatus: profile.habits.sessionStatus = false
            case .appLaunch: profile.habits.appLaunch = profile.habits.appLaunch ?? "com.example.app"
            case .controlSessionOnly:
                profile.protocols = profile.protocols.map { spec in
                    var native = spec
                    native.native = true
                    return native
                }
            case .nativeProtocol:
                if !profile.protocols.contains(where: \.isNative) {
                    profile.protocols.append(ProtocolSpec(name: "com.example.deviation.native", behaviour: .echo, native: true))
                }
            case .bluetoothAddressReversed:
                profile.bluetoothAddress = profile.bluetoothAddress ?? [0x00, 0x1A, 0x7D, 0xDA, 0x71, 0x13]
            case .iap1DeviceLingoes:
                profile.iap1 = IAP1Settings(identification: .deviceLingoes, waitsForDevice: profile.iap1?.waitsForDevice ?? false)
            case .iap1OptionsGateProtocols, .iap1UnacknowledgedData:
                profile.iap1 = profile.iap1 ?? IAP1Settings()
            default:
                break
            }
        }
        return profile
    }

    /// The link configuration with the deviations that change the link applied.
    func applyingDeviations(to configuration: inout LinkConfiguration) {
        // In catalogue order, so the session table is set before the bare ACKs take its control id.
        for deviation in deviations.sorted() {
            switch deviation {
            case .skipsDetect: configuration.skipsDetect = true
            case .outOfRangeTimers: configuration.parameters.cumulativeAckTimeout = 0
            case .controlSessionOnly:
                configuration.parameters.sessions = [LinkSession(id: 10, type: .control)]
            case .sessionIDsTenAndEleven:
                configuration.parameters.sessions = [LinkSession(id: 10, type: .control), LinkSession(id: 11, type: .externalAccessory)]
            case .fileTransferSession:
                configuration.parameters.sessions = [LinkSession(id: 1, type: .control, version: 2), LinkSession(id: 2, type: .fileTransfer),
                                                     LinkSession(id: 3, type: .externalAccessory)]
            case .bareAcksCarryNextNumber: configuration.bareAckNumbering = .next
            case .bareAcksUseUpNumbers: configuration.bareAckNumbering = .usesUp
            case .bareAcksOnControlSession:
                configuration.bareAckSessionID = configuration.parameters.session(ofType: .control)?.id ?? 1
            case .neverRetransmits: configuration.retransmits = false
            case .ignoresWindow: configuration.ignoresPeerWindow = true
            case .restatesOffer: configuration.restatesOffer = true
            default: break
            }
        }
    }

    /// The IdentificationInformation the accessory sends when a deviation changes it (nil: its
    /// identity's own).
    func deviatingIdentification(_ identity: AccessoryIdentity) -> ControlMessage? {
        typealias P = IdentificationParameter
        let changing: Set<Deviation> = [.missingRequiredParameter, .wronglyDirectedMessageLists, .duplicateProtocolIDs,
                                        .unknownIdentificationParameters, .bytesAfterNUL, .componentIDZero, .bluetoothAddressReversed]
        guard !changing.isDisjoint(with: deviations) else { return nil }
        var identity = identity
        if deviations.contains(.wronglyDirectedMessageLists) {
            // The lists the other way round, as well: what it sends among what it receives too.
            identity.messagesSent += [0xAE01]
            identity.messagesReceived += [0xAE00]
        }
        if deviations.contains(.componentIDZero) {
            identity.transportComponents = identity.transportComponents.map { component in
                guard component.kind == P.usbHostTransportComponent else { return component }
                var changed = component
                changed.identifier = 0
                return changed
            }
            identity.protocols = identity.protocols.map { item in
                var changed = item
                if changed.nativeTransportComponentIdentifier != nil { changed.nativeTransportComponentIdentifier = 0 }
                return changed
            }
        }
        if deviations.contains(.bluetoothAddressReversed) {
            identity.transportComponents = identity.transportComponents.map { component in
                var changed = component
                changed.bluetoothAddress = component.bluetoothAddress.map { Array($0.reversed()) }
                return changed
            }
        }
        var parameters = identity.message.parameters
        if deviations.contains(.missingRequiredParameter) { parameters.removeAll { $0.id == P.hardwareVersion } }
        if deviations.contains(.duplicateProtocolIDs), let first = identity.protocols.first {
            parameters.append(.group(P.supportedExternalAccessoryProtocol, [
                .uint8(0, first.identifier), .string(1, first.name + ".again"), .uint8(2, 0),
            ]))
        }
        if deviations.contains(.unknownIdentificationParameters) {
            parameters.append(.string(P.productPlanUID, "PPUID-0001"))
            parameters.append(.group(23, [.uint16(0, 7), .string(1, "HID"), .uint8(2, 2)]))
            parameters.append(.blob(99, [1, 2, 3]))
        }
        if deviations.contains(.bytesAfterNUL) {
            parameters.removeAll { $0.id == P.appMatchTeamID }
            parameters.append(.blob(P.appMatchTeamID, Array("79Q5CGN6JK".utf8) + [0, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06]))
        }
        return ControlMessage(id: .identificationInformation, parameters: parameters)
    }
}
