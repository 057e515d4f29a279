public import IAPWire

/// An External Accessory protocol an accessory declares (IdentificationInformation parameter 10).
public struct ExternalAccessoryProtocol: Hashable, Sendable, Codable {
    /// The id the device uses in StartExternalAccessoryProtocolSession.
    public var identifier: UInt8
    /// The reverse-DNS protocol string apps open sessions for.
    public var name: String
    /// What the device should do when no app speaks the protocol (0 no action, 1 optional
    /// action, 2 no alert, 3 no communication protocol).
    public var matchAction: UInt8
    /// The USB host transport component whose native interface carries this protocol, if any.
    public var nativeTransportComponentIdentifier: UInt16?

    /// A declared protocol: its `identifier` (unique within the accessory), its protocol string, the
    /// match action (0, no action, by default) and, for a native-transport protocol, the identifier of
    /// the USB host transport component that carries it.
    public init(identifier: UInt8, name: String, matchAction: UInt8 = 0, nativeTransportComponentIdentifier: UInt16? = nil) {
        self.identifier = identifier
        self.name = name
        self.matchAction = matchAction
        self.nativeTransportComponentIdentifier = nativeTransportComponentIdentifier
    }
}

/// A transport component an accessory declares (IdentificationInformation parameters 14–17, 24).
public struct TransportComponent: Hashable, Sendable, Codable {
    /// The IdentificationInformation parameter id of the component kind (e.g. 16 for
    /// USBHostTransportComponent).
    public var kind: UInt16
    /// The component's identifier, unique within the accessory; a native-transport protocol names it
    /// (``ExternalAccessoryProtocol/nativeTransportComponentIdentifier``).
    public var identifier: UInt16
    /// The component's name as the accessory gives it (e.g. "iAP2"), for people.
    public var name: String
    /// Whether the accessory speaks iAP2 over this component (the TransportSupportsiAP2Connection flag).
    public var supportsIAP2: Bool
    /// A BluetoothTransportComponent's MAC address (its parameter 3, six bytes as sent); nil
    /// for other kinds or when not declared.
    public var bluetoothAddress: [UInt8]?

    /// A component of `kind` (an IdentificationInformation parameter id, e.g.
    /// ``IdentificationParameter/usbHostTransportComponent``) with its identifier and name, and
    /// for a Bluetooth component its MAC address (six bytes).
    public init(kind: UInt16, identifier: UInt16, name: String, supportsIAP2: Bool = true, bluetoothAddress: [UInt8]? = nil) {
        self.kind = kind
        self.identifier = identifier
        self.name = name
        self.supportsIAP2 = supportsIAP2
        self.bluetoothAddress = bluetoothAddress
    }

    /// The kind's catalogue name.
    public var kindName: String { MessageCatalogue.identificationParameters[kind]?.name ?? "component \(kind)" }
}

/// Everything an accessory said about itself in IdentificationInformation: what EAAccessory
/// exposes, and more.
public struct AccessoryIdentity: Hashable, Sendable, Codable {
    /// The accessory's name for people (EAAccessory's `name`; parameter 0).
    public var name: String
    /// The model (EAAccessory's `modelNumber`; parameter 1).
    public var modelIdentifier: String
    /// The manufacturer's name (parameter 2).
    public var manufacturer: String
    /// The serial number (parameter 3): what tells two accessories of one model apart across
    /// reconnections.
    public var serialNumber: String
    /// The firmware revision (EAAccessory's `firmwareRevision`; parameter 4): what a firmware upgrade
    /// changes and waits to see after the accessory's reboot.
    public var firmwareVersion: String
    /// The hardware revision (EAAccessory's `hardwareRevision`; parameter 5).
    public var hardwareVersion: String
    /// The control message ids the accessory will send (parameter 6); each must be one an accessory
    /// sends, or identification is rejected.
    public var messagesSent: [UInt16]
    /// The control message ids the accessory wants to receive (parameter 7); each must be one the
    /// device sends, or identification is rejected.
    public var messagesReceived: [UInt16]
    /// Whether the accessory powers the device: 0 none, 1 Lightning receptacle pass-through, 2
    /// advanced (parameter 8).
    public var powerProvidingCapability: UInt8
    /// The most current the accessory draws from the device, in mA (parameter 9).
    public var maximumCurrentDrawnFromDevice: UInt16
    /// The External Accessory protocols, in the order declared (parameter 10, one group each): what
    /// sessions can be opened for.
    public var protocols: [ExternalAccessoryProtocol]
    /// The Apple developer team id of the apps that match the accessory (parameter 11), if declared.
    public var appMatchTeamID: String?
    /// The language the accessory uses now, e.g. "en" (parameter 12).
    public var currentLanguage: String
    /// Every language the accessory supports (parameter 13, repeated).
    public var supportedLanguages: [String]
    /// The transports the accessory declares (serial, USB, Bluetooth: parameters 14–17 and 24).
    public var transportComponents: [TransportComponent]
    /// The product plan's UID from the MFi portal (parameter 34, 16 hex digits), if declared.
    public var productPlanUID: String?
    /// The protocol the accessory identified with (an application tells iAP1 accessories from
    /// iAP2 ones by this alone).
    public var protocolVersion: IAPProtocolVersion
    /// What the host's authentication policy concluded about the accessory, with its
    /// certificate's subject, issuer, serial and validity (``AuthenticationOutcome/notChecked``
    /// until the device side sets it, and on the accessory side).
    public var authentication: AuthenticationOutcome = .notChecked

    /// An identity with the given values; the defaults are what a minimal iAP2 accessory declares
    /// (English, one USB host transport component, no messages, no protocols). Nothing is validated
    /// here: the host validates what an accessory sends when it parses it.
    public init(
        name: String, modelIdentifier: String, manufacturer: String, serialNumber: String, firmwareVersion: String,
        hardwareVersion: String, messagesSent: [UInt16] = [], messagesReceived: [UInt16] = [],
        powerProvidingCapability: UInt8 = 0, maximumCurrentDrawnFromDevice: UInt16 = 0,
        protocols: [ExternalAccessoryProtocol] = [], appMatchTeamID: String? = nil, currentLanguage: String = "en",
        supportedLanguages: [String] = ["en"],
        transportComponents: [TransportComponent] = [TransportComponent(kind: IdentificationParameter.usbHostTransportComponent, identifier: 1, name: "iAP2")],
        productPlanUID: String? = nil, protocolVersion: IAPProtocolVersion = .iap2
    ) {
        self.protocolVersion = protocolVersion
        self.name = name
        self.modelIdentifier = modelIdentifier
        self.manufacturer = manufacturer
        self.serialNumber = serialNumber
        self.firmwareVersion = firmwareVersion
        self.hardwareVersion = hardwareVersion
        self.messagesSent = messagesSent
        self.messagesReceived = messagesReceived
        self.powerProvidingCapability = powerProvidingCapability
        self.maximumCurrentDrawnFromDevice = maximumCurrentDrawnFromDevice
        self.protocols = protocols
        self.appMatchTeamID = appMatchTeamID
        self.currentLanguage = currentLanguage
        self.supportedLanguages = supportedLanguages
        self.transportComponents = transportComponents
        self.productPlanUID = productPlanUID
    }

    /// The IdentificationInformation message describing this identity.
    public var message: ControlMessage {
        typealias P = IdentificationParameter
        var parameters: [Parameter] = [
            .string(P.name, name), .string(P.modelIdentifier, modelIdentifier), .string(P.manufacturer, manufacturer),
            .string(P.serialNumber, serialNumber), .string(P.firmwareVersion, firmwareVersion),
            .string(P.hardwareVersion, hardwareVersion), .uint16List(P.messagesSentByAccessory, messagesSent),
            .uint16List(P.messagesReceivedFromDevice, messagesReceived),
            .uint8(P.powerProvidingCapability, powerProvidingCapability),
            .uint16(P.maximumCurrentDrawnFromDevice, maximumCurrentDrawnFromDevice),
        ]
        for item in protocols {
            var group: [Parameter] = [.uint8(0, item.identifier), .string(1, item.name), .uint8(2, item.matchAction)]
            if let native = item.nativeTransportComponentIdentifier { group.append(.uint16(3, native)) }
            parameters.append(.group(P.supportedExternalAccessoryProtocol, group))
        }
        if let appMatchTeamID { parameters.append(.string(P.appMatchTeamID, appMatchTeamID)) }
        parameters.append(.string(P.currentLanguage, currentLanguage))
        for language in supportedLanguages { parameters.append(.string(P.supportedLanguage, language)) }
        for component in transportComponents {
            var group: [Parameter] = [.uint16(0, component.identifier), .string(1, component.name)]
            if component.supportsIAP2 { group.append(.flag(2)) }
            if let address = component.bluetoothAddress { group.append(.blob(3, address)) }
            parameters.append(.group(component.kind, group))
        }
        if let productPlanUID { parameters.append(.string(P.productPlanUID, productPlanUID)) }
        return ControlMessage(id: .identificationInformation, parameters: parameters)
    }

    /// The parameters every IdentificationInformation must carry.
    public static let requiredParameters: [UInt16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13]

    /// Reads and validates an IdentificationInformation message.
    ///
    /// - Parameters:
    ///   - message: the IdentificationInformation.
    ///   - bluetoothAddress: on a Bluetooth connection, the peer's address (six bytes, most
    ///     significant first): the accessory must then declare a BluetoothTransportComponent
    ///     with that MAC address (in that order or reversed), or parameter 17 is rejected.
    /// - Returns: the identity, or the ids of every parameter that is missing or wrong (the
    ///   content of an IdentificationRejected).
    public static func validate(_ message: ControlMessage, bluetoothAddress: [UInt8]? = nil) -> Result<AccessoryIdentity, IdentificationRejection> {
        typealias P = IdentificationParameter
        var offending = Set<UInt16>()
        var reasons: [String] = []
        func string(_ id: UInt16) -> String {
            guard let parameter = message.parameter(id) else { return "" }
            // Read up to the NUL: bytes after it are the accessory's business (said once by the
            // control session, ``stringParametersWithBytesAfterNUL(in:)``).
            do { return try parameter.stringUpToNUL() } catch {
                offending.insert(id)
                reasons.append("\(name(id)): \(error)")
                return ""
            }
        }
        for id in requiredParameters where message.parameter(id) == nil {
            offending.insert(id)
            reasons.append("\(name(id)) is missing")
        }
        func ids(_ id: UInt16) -> [UInt16] {
            guard let parameter = message.parameter(id) else { return [] }
            guard let list = try? parameter.uint16List() else {
                offending.insert(id)
                reasons.append("\(name(id)) is not a list of message ids")
                return []
            }
            // A list that names messages of the other side is kept as it is (an iPhone is not
            // known to refuse it; ``wronglyDirectedMessages`` names them for the log).
            return list
        }
        var identity = AccessoryIdentity(
            name: string(P.name), modelIdentifier: string(P.modelIdentifier), manufacturer: string(P.manufacturer),
            serialNumber: string(P.serialNumber), firmwareVersion: string(P.firmwareVersion),
            hardwareVersion: string(P.hardwareVersion),
            messagesSent: ids(P.messagesSentByAccessory),
            messagesReceived: ids(P.messagesReceivedFromDevice),
            currentLanguage: string(P.currentLanguage), supportedLanguages: [], transportComponents: [])
        if let parameter = message.parameter(P.powerProvidingCapability) {
            if let value = try? parameter.uint8() { identity.powerProvidingCapability = value } else {
                offending.insert(P.powerProvidingCapability)
                reasons.append("PowerProvidingCapability is not one byte")
            }
        }
        if let parameter = message.parameter(P.maximumCurrentDrawnFromDevice) {
            if let value = try? parameter.uint16() { identity.maximumCurrentDrawnFromDevice = value } else {
                offending.insert(P.maximumCurrentDrawnFromDevice)
                reasons.append("MaximumCurrentDrawnFromDevice is not a 16-bit value")
            }
        }
        for parameter in message.parameters(P.supportedLanguage) {
            if let language = try? parameter.stringUpToNUL() { identity.supportedLanguages.append(language) } else {
                offending.insert(P.supportedLanguage)
                reasons.append("a SupportedLanguage is not valid UTF-8")
            }
        }
        // Kept for the application, never used by the host: whatever they hold, they are no
        // reason to refuse (an unreadable one is left out).
        identity.appMatchTeamID = try? message.parameter(P.appMatchTeamID)?.stringUpToNUL()
        identity.productPlanUID = try? message.parameter(P.productPlanUID)?.stringUpToNUL()
        var protocolIDs = Set<UInt8>()
        for parameter in message.parameters(P.supportedExternalAccessoryProtocol) {
            guard let group = try? parameter.group(),
                  let identifier = try? group.first(where: { $0.id == 0 })?.uint8(),
                  let name = try? group.first(where: { $0.id == 1 })?.stringUpToNUL(), !name.isEmpty
            else {
                offending.insert(P.supportedExternalAccessoryProtocol)
                reasons.append("an External Accessory protocol lacks a valid identifier or name")
                continue
            }
            if !protocolIDs.insert(identifier).inserted {
                offending.insert(P.supportedExternalAccessoryProtocol)
                reasons.append("External Accessory protocol id \(identifier) is declared twice")
            }
            let action = (try? group.first(where: { $0.id == 2 })?.uint8()) ?? 0
            let native = try? group.first(where: { $0.id == 3 })?.uint16()
            identity.protocols.append(ExternalAccessoryProtocol(identifier: identifier, name: name, matchAction: action,
                                                                nativeTransportComponentIdentifier: native))
        }
        for kind: UInt16 in [14, 15, 16, 17, 24] {
            for parameter in message.parameters(kind) {
                guard let group = try? parameter.group(),
                      let identifier = try? group.first(where: { $0.id == 0 })?.uint16(),
                      let name = try? group.first(where: { $0.id == 1 })?.stringUpToNUL()
                else {
                    offending.insert(kind)
                    reasons.append("a \(Self.name(kind)) lacks a valid identifier or name")
                    continue
                }
                var address: [UInt8]?
                if kind == P.bluetoothTransportComponent, let parameter = group.first(where: { $0.id == 3 }) {
                    if parameter.data.count == 6 { address = parameter.data } else {
                        offending.insert(kind)
                        reasons.append("a BluetoothTransportComponent's MAC address is \(parameter.data.count) bytes, not 6")
                    }
                }
                identity.transportComponents.append(TransportComponent(
                    kind: kind, identifier: identifier, name: name, supportsIAP2: group.contains { $0.id == 2 }, bluetoothAddress: address))
            }
        }
        if let bluetoothAddress {
            let declared = identity.transportComponents.filter { $0.kind == P.bluetoothTransportComponent }
            let matching = declared.contains { component in
                component.bluetoothAddress.map { $0 == bluetoothAddress || $0 == bluetoothAddress.reversed() } ?? false
            }
            if !matching {
                offending.insert(P.bluetoothTransportComponent)
                let connection = bluetoothAddress.map { String($0 >> 4, radix: 16, uppercase: true) + String($0 & 15, radix: 16, uppercase: true) }
                    .joined(separator: ":")
                reasons.append(declared.isEmpty
                    ? "no BluetoothTransportComponent declared on a Bluetooth connection (from \(connection))"
                    : "no BluetoothTransportComponent has the connection's address \(connection)")
            }
        }
        if offending.isEmpty { return .success(identity) }
        return .failure(IdentificationRejection(parameterIDs: offending.sorted(), reasons: reasons))
    }

    /// The ids of the string parameters of an IdentificationInformation that carry bytes after
    /// their NUL (read up to it; for the log).
    public static func stringParametersWithBytesAfterNUL(in message: ControlMessage) -> [UInt16] {
        let ids = message.parameters.filter { parameter in
            if MessageCatalogue.identificationParameters[parameter.id]?.type == .utf8 { return parameter.hasBytesAfterNUL }
            // The names inside the protocol and transport-component groups.
            guard [10, 14, 15, 16, 17, 24].contains(parameter.id), let group = try? parameter.group() else { return false }
            return group.contains { $0.id == 1 && $0.hasBytesAfterNUL }
        }.map(\.id)
        return Set(ids).sorted()
    }

    static func name(_ id: UInt16) -> String { MessageCatalogue.identificationParameters[id]?.name ?? "parameter \(id)" }

    /// What the message lists name the wrong way round, for the log: messages the catalogue
    /// says the device sends among ``messagesSent``, and those the accessory sends among
    /// ``messagesReceived`` (empty when both are right). The host accepts such lists.
    public var wronglyDirectedMessages: String? {
        func wrong(_ list: [UInt16], _ sender: MessageSender) -> [UInt16] {
            list.filter { MessageCatalogue.info(for: MessageID($0)).map { $0.sender != sender } ?? false }
        }
        let sent = wrong(messagesSent, .accessory)
        let received = wrong(messagesReceived, .device)
        guard !sent.isEmpty || !received.isEmpty else { return nil }
        var parts: [String] = []
        if !sent.isEmpty { parts.append("MessagesSentByAccessory lists messages the device sends: " + sent.map { MessageID($0).description }.joined(separator: ", ")) }
        if !received.isEmpty { parts.append("MessagesReceivedFromDevice lists messages the accessory sends: " + received.map { MessageID($0).description }.joined(separator: ", ")) }
        return parts.joined(separator: "; ")
    }
}

/// Why identification was rejected: the offending parameter ids and what is wrong with each.
public struct IdentificationRejection: Error, Hashable, Sendable, CustomStringConvertible {
    /// The IdentificationInformation parameter ids that were wrong, ascending: what IdentificationRejected
    /// flags (empty for an iAP1 accessory, whose tokens have no such ids).
    public var parameterIDs: [UInt16]
    /// What is wrong with each, for a person (e.g. "Name is missing").
    public var reasons: [String]
    public var description: String { "identification rejected: " + reasons.joined(separator: "; ") }

    /// The IdentificationRejected message: one flag per offending parameter id.
    public var message: ControlMessage {
        ControlMessage(id: .identificationRejected, parameters: parameterIDs.map { .flag($0) })
    }
}

/// Decides whether an accessory's authentication is good enough.
///
/// The endpoints ask ``examine(certificate:)`` when the certificate has come (a refusal ends the
/// connection before any challenge) and ``outcome(certificate:challenge:response:)`` when the
/// response has; the outcome reaches the identity (``AccessoryIdentity/authentication``). Both
/// have defaults built from the three yes-or-no requirements, so a simple policy implements only
/// those. ``AcceptingAuthentication`` checks nothing; IAPAuthentication's `VerifyingAuthentication`
/// checks certificates, signatures and trust with OpenSSL.
public protocol AuthenticationPolicy: Sendable {
    /// Challenge bytes to send for this certificate (20 for coprocessor 2.0, 32 for 3.0) when
    /// the examination names no scheme.
    func challengeLength(certificate: [UInt8]) -> Int
    /// Whether to go on after seeing the certificate.
    func acceptsCertificate(_ certificate: [UInt8]) -> Bool
    /// Whether `response` answers `challenge` for `certificate`.
    func verifies(certificate: [UInt8], challenge: [UInt8], response: [UInt8]) -> Bool
    /// What the certificate says, its scheme, and whether to refuse at once.
    func examine(certificate: [UInt8]) -> CertificateExamination
    /// The verdict on `response` to `challenge`; the accessory goes on when it is
    /// ``AuthenticationOutcome/accepted``.
    func outcome(certificate: [UInt8], challenge: [UInt8], response: [UInt8]) -> AuthenticationOutcome
    /// Whether an accessory that does not offer to authenticate (an iAP1 accessory identifying
    /// without authentication) is refused.
    var requiresAuthentication: Bool { get }
}

extension AuthenticationPolicy {
    /// Coprocessor 3.0 certificates are about 608 bytes and take a 32-byte challenge; 2.0
    /// certificates are longer and take 20 bytes.
    public func challengeLength(certificate: [UInt8]) -> Int { certificate.count <= 640 ? 32 : 20 }
}

/// Accepts every certificate and response (what iPhone-impersonating tools do today).
public struct AcceptingAuthentication: AuthenticationPolicy {
    /// The policy (it has no settings): every accessory that sends a certificate and a response is in.
    public init() {}
    public func acceptsCertificate(_ certificate: [UInt8]) -> Bool { !certificate.isEmpty }
    public func verifies(certificate: [UInt8], challenge: [UInt8], response: [UInt8]) -> Bool { !response.isEmpty }
}

/// Rejects every accessory (for tests and for locking a host down).
public struct RejectingAuthentication: AuthenticationPolicy {
    /// The policy (it has no settings): no accessory is in.
    public init() {}
    public func acceptsCertificate(_ certificate: [UInt8]) -> Bool { false }
    public func verifies(certificate: [UInt8], challenge: [UInt8], response: [UInt8]) -> Bool { false }
    /// An accessory that does not authenticate is refused too.
    public var requiresAuthentication: Bool { true }
}
