public import IAPLink
import IAPWire

/// What a simulated accessory is: its identity, the External Accessory protocols it declares and
/// how each behaves, optional link parameters, and optional faults.
///
/// Profiles are JSON files (see `tools/data/profiles/`), loaded with ``load(path:)`` or
/// ``decode(_:)``, or built in (``builtIn(named:)``). The format:
///
/// ```json
/// {
///   "identity": { "name": "Multi Sensor", "model": "SIM-MS1", "manufacturer": "Acme",
///                 "serialNumber": "MS-0001", "firmwareVersion": "2.1.0", "hardwareVersion": "B" },
///   "protocols": [ { "name": "com.acme.echo", "behaviour": "echo" },
///                  { "name": "com.acme.source", "behaviour": "source", "sourceBytes": 1048576 } ],
///   "link": { "maxPacketLength": 4096, "maxOutstandingPackets": 8,
///             "retransmissionTimeoutMs": 1000, "cumulativeAckTimeoutMs": 20 },
///   "rebootDelayMs": 200,
///   "checksumsSessionData": true,
///   "faults": { "dropRate": 0.0, "corruptRate": 0.0, "delayMs": 0,
///               "stopReadingAfterBytes": 4096, "vanishAfterBytes": 65536, "seed": 1,
///               "forged": false, "losesFrames": [5], "ignoresMessages": ["0xAA00"] },
///   "authentication": { "certificate": "accessory.pem", "key": "accessory.key" }
/// }
/// ```
///
/// `authentication` (optional) names PEM files, relative to the profile's directory: the
/// accessory then sends that certificate and signs challenges with that key (see
/// ``Authentication``); without it, it presents the built-in test credentials
/// (``testCredentials()``): a real chain to "AccessoryHost Test CA" (`tools/data/profiles/test-ca.pem`),
/// which proves nothing.
///
/// `identity` and `protocols` are required; `link`, every field inside it, `rebootDelayMs`
/// (default 200), `checksumsSessionData` (default true), `faults` and every field inside it are
/// optional. Unknown fields are refused,
/// so a misspelt field is reported instead of silently ignored.
public struct SimulatorProfile: Codable, Sendable, Equatable {
    /// Most protocols a profile may mark native: the native-transport interfaces a simulated USB
    /// accessory has endpoint numbers for (two bulk endpoints each, beside the iAP2 pair).
    public static let maxNativeTransports = 6

    /// The strings the accessory declares in IdentificationInformation.
    public struct Identity: Codable, Sendable, Equatable {
        /// The accessory's name (what EAAccessory.name shows).
        public var name: String
        /// The model identifier.
        public var model: String
        /// The manufacturer.
        public var manufacturer: String
        /// The serial number.
        public var serialNumber: String
        /// The firmware version; a firmware update changes it (``SimulatorProfile/withFirmwareVersion(_:)``).
        public var firmwareVersion: String
        /// The hardware version.
        public var hardwareVersion: String

        /// Creates an identity from its six strings.
        public init(name: String, model: String, manufacturer: String, serialNumber: String, firmwareVersion: String,
                    hardwareVersion: String) {
            self.name = name
            self.model = model
            self.manufacturer = manufacturer
            self.serialNumber = serialNumber
            self.firmwareVersion = firmwareVersion
            self.hardwareVersion = hardwareVersion
        }

        enum CodingKeys: String, CodingKey, CaseIterable {
            case name, model, manufacturer, serialNumber, firmwareVersion, hardwareVersion
        }

        /// Decodes the identity, refusing unknown fields.
        public init(from decoder: any Decoder) throws {
            try rejectUnknownFields(in: decoder, known: CodingKeys.self)
            let container = try decoder.container(keyedBy: CodingKeys.self)
            name = try container.decode(String.self, forKey: .name)
            model = try container.decode(String.self, forKey: .model)
            manufacturer = try container.decode(String.self, forKey: .manufacturer)
            serialNumber = try container.decode(String.self, forKey: .serialNumber)
            firmwareVersion = try container.decode(String.self, forKey: .firmwareVersion)
            hardwareVersion = try container.decode(String.self, forKey: .hardwareVersion)
        }
    }

    /// What the simulator does with an open session of a protocol.
    public enum Behaviour: String, Codable, Sendable, Equatable, CaseIterable {
        /// Writes back every byte read, in order, under back-pressure.
        case echo
        /// Reads and counts every byte and keeps their CRC-32.
        case sink
        /// Writes `sourceBytes` bytes of ``SimulatedAccessory/sourcePatternByte(at:)``, then nothing.
        case source
        /// Speaks the firmware-update protocol (``FirmwareUpdateProtocol``).
        case firmwareUpdate = "firmware-update"

        /// Decodes a behaviour name, naming the valid ones when it is not one of them.
        public init(from decoder: any Decoder) throws {
            let raw = try decoder.singleValueContainer().decode(String.self)
            guard let behaviour = Behaviour(rawValue: raw) else {
                throw SimulatorProfileError(field: fieldPath(decoder.codingPath),
                                            problem: "'\(raw)' is not a behaviour; use one of "
                                                + Behaviour.allCases.map(\.rawValue).joined(separator: ", "))
            }
            self = behaviour
        }
    }

    /// One declared External Accessory protocol.
    public struct ProtocolSpec: Codable, Sendable, Equatable {
        /// The reverse-DNS protocol string apps open sessions for.
        public var name: String
        /// What the simulator does on a session of this protocol.
        public var behaviour: Behaviour
        /// For ``Behaviour/source`` only (and required there): how many bytes each session sends.
        public var sourceBytes: Int?
        /// Whether the protocol's bytes travel on a native transport of its own (an FF/F0/01 USB
        /// interface, raw) instead of the iAP2 link: identification binds it to the accessory's
        /// USB host transport component. Absent means false.
        public var native: Bool?
        /// A source that sends nothing until the host has written at least one byte on the
        /// session (its request to start, as `iapctl bench --start` sends). Absent means false.
        public var startsOnRequest: Bool?

        /// Creates a protocol entry.
        public init(name: String, behaviour: Behaviour, sourceBytes: Int? = nil, native: Bool? = nil, startsOnRequest: Bool? = nil) {
            self.name = name
            self.behaviour = behaviour
            self.sourceBytes = sourceBytes
            self.native = native
            self.startsOnRequest = startsOnRequest
        }

        /// Whether ``native`` is set.
        public var isNative: Bool { native == true }

        enum CodingKeys: String, CodingKey, CaseIterable {
            case name, behaviour, sourceBytes, native, startsOnRequest
        }

        /// Decodes a protocol entry, refusing unknown fields.
        public init(from decoder: any Decoder) throws {
            try rejectUnknownFields(in: decoder, known: CodingKeys.self)
            let container = try decoder.container(keyedBy: CodingKeys.self)
            name = try container.decode(String.self, forKey: .name)
            behaviour = try container.decode(Behaviour.self, forKey: .behaviour)
            sourceBytes = try container.decodeIfPresent(Int.self, forKey: .sourceBytes)
            native = try container.decodeIfPresent(Bool.self, forKey: .native)
            startsOnRequest = try container.decodeIfPresent(Bool.self, forKey: .startsOnRequest)
        }
    }

    /// How a legacy iAP1 accessory behaves (the JSON object `iap1`; its presence makes the
    /// accessory speak iAP1 instead of iAP2).
    public struct IAP1Settings: Codable, Sendable, Equatable {
        /// `"idps"` (StartIDPS and FID tokens: strings and protocols; the default) or
        /// `"device-lingoes"` (IdentifyDeviceLingoes: no strings, no protocols).
        public var identification: IAP1IdentificationStyle
        /// Stay silent until the device asks (RequestIdentify); the iAP2 detect is answered the
        /// iAP1 way. Default false: identify at once.
        public var waitsForDevice: Bool

        /// Creates the settings.
        public init(identification: IAP1IdentificationStyle = .idps, waitsForDevice: Bool = false) {
            self.identification = identification
            self.waitsForDevice = waitsForDevice
        }

        enum CodingKeys: String, CodingKey, CaseIterable {
            case identification, waitsForDevice
        }

        /// Decodes the settings, refusing unknown fields.
        public init(from decoder: any Decoder) throws {
            try rejectUnknownFields(in: decoder, known: CodingKeys.self)
            let container = try decoder.container(keyedBy: CodingKeys.self)
            if let raw = try container.decodeIfPresent(String.self, forKey: .identification) {
                guard let style = IAP1IdentificationStyle(rawValue: raw) else {
                    throw SimulatorProfileError(field: fieldPath(decoder.codingPath + [CodingKeys.identification]),
                                                problem: "'\(raw)' is not an identification; use one of "
                                                    + IAP1IdentificationStyle.allCases.map(\.rawValue).joined(separator: ", "))
                }
                identification = style
            } else {
                identification = .idps
            }
            waitsForDevice = try container.decodeIfPresent(Bool.self, forKey: .waitsForDevice) ?? false
        }
    }

    /// Link parameters that replace those of `LinkConfiguration.accessory`; nil keeps the default.
    public struct LinkOverrides: Codable, Sendable, Equatable {
        /// The longest packet the accessory accepts, header included (default 4096).
        public var maxPacketLength: Int?
        /// How many unacknowledged packets the accessory accepts at once (default 8).
        public var maxOutstandingPackets: Int?
        /// Milliseconds before an unacknowledged packet is sent again (default 1000).
        public var retransmissionTimeoutMs: Int?
        /// Milliseconds a receiver may wait before acknowledging (default 20).
        public var cumulativeAckTimeoutMs: Int?
        /// How many received packets a receiver may leave unacknowledged (default 4); 1 makes
        /// both sides acknowledge every packet at once, as the TD300 asks.
        public var maxCumulativeAcks: Int?
        /// How many times a packet is sent again before the link gives up (default 30).
        public var maxRetransmissions: Int?
        /// Milliseconds of silence in the middle of a frame after which the accessory gives the
        /// frame up and scans its bytes again (default 50, 1–60000); iAP1 and iAP2 alike.
        public var interByteGapMs: Int?
        /// The length of the packets the accessory sends, header included, whatever the host
        /// advertised (24–65535; default: by the host's limit, as the protocol says). Plays an
        /// accessory tuned on iPhones, which always advertise 65535.
        public var sendsPacketLength: Int?

        /// Creates overrides; every nil field keeps the default.
        public init(maxPacketLength: Int? = nil, maxOutstandingPackets: Int? = nil, retransmissionTimeoutMs: Int? = nil,
                    cumulativeAckTimeoutMs: Int? = nil, maxCumulativeAcks: Int? = nil, maxRetransmissions: Int? = nil,
                    interByteGapMs: Int? = nil, sendsPacketLength: Int? = nil) {
            self.maxCumulativeAcks = maxCumulativeAcks
            self.maxRetransmissions = maxRetransmissions
            self.sendsPacketLength = sendsPacketLength
            self.maxPacketLength = maxPacketLength
            self.maxOutstandingPackets = maxOutstandingPackets
            self.retransmissionTimeoutMs = retransmissionTimeoutMs
            self.cumulativeAckTimeoutMs = cumulativeAckTimeoutMs
            self.interByteGapMs = interByteGapMs
        }

        enum CodingKeys: String, CodingKey, CaseIterable {
            case maxPacketLength, maxOutstandingPackets, retransmissionTimeoutMs, cumulativeAckTimeoutMs, maxCumulativeAcks,
                 maxRetransmissions, interByteGapMs, sendsPacketLength
        }

        /// Decodes the overrides, refusing unknown fields.
        public init(from decoder: any Decoder) throws {
            try rejectUnknownFields(in: decoder, known: CodingKeys.self)
            let container = try decoder.container(keyedBy: CodingKeys.self)
            maxPacketLength = try container.decodeIfPresent(Int.self, forKey: .maxPacketLength)
            maxOutstandingPackets = try container.decodeIfPresent(Int.self, forKey: .maxOutstandingPackets)
            retransmissionTimeoutMs = try container.decodeIfPresent(Int.self, forKey: .retransmissionTimeoutMs)
            cumulativeAckTimeoutMs = try container.decodeIfPresent(Int.self, forKey: .cumulativeAckTimeoutMs)
            maxCumulativeAcks = try container.decodeIfPresent(Int.self, forKey: .maxCumulativeAcks)
            maxRetransmissions = try container.decodeIfPresent(Int.self, forKey: .maxRetransmissions)
            interByteGapMs = try container.decodeIfPresent(Int.self, forKey: .interByteGapMs)
            sendsPacketLength = try container.decodeIfPresent(Int.self, forKey: .sendsPacketLength)
        }
    }

    /// Misbehaviour on purpose, to test how a host copes. Everything is deterministic for a seed.
    public struct Faults: Codable, Sendable, Equatable {
        /// Fraction (0…1) of outgoing frames dropped.
        public var dropRate: Double
        /// Fraction (0…1) of the remaining outgoing frames with one byte changed.
        public var corruptRate: Double
        /// Milliseconds every outgoing frame is held before it may be taken.
        public var delayMs: Int
        /// Stop reading EA session data once this many bytes were read (all sessions together):
        /// the host then sees its writes back up.
        public var stopReadingAfterBytes: Int?
        /// Disappear once this many EA session bytes moved (read plus written, all sessions):
        /// ``SimulatorEvent/vanish`` is reported and the accessory goes silent.
        public var vanishAfterBytes: Int?
        /// Seed of the fault generator (and of the endpoint's own generator).
        public var seed: UInt64
        /// Sign challenges with a key other than the certificate's (a forged accessory): a
        /// verifying host sees a bad signature. The certificate is the profile's
        /// (``SimulatorProfile/authentication``), else the built-in test certificate.
        public var forged: Bool
        /// The frames the accessory sends that are lost on the way, by number (1 is its first
        /// frame, its detect): a packet lost for good when it also never retransmits.
        public var losesFrames: [Int]
        /// iAP2 control message ids the accessory takes (its link acknowledges them) and never
        /// answers: an accessory that stalls at a step (e.g. 0xAA00, the certificate; 0xEA00,
        /// every session).
        public var ignoresMessages: [UInt16]

        /// Creates faults; the defaults are no faults at all.
        public init(dropRate: Double = 0, corruptRate: Double = 0, delayMs: Int = 0, stopReadingAfterBytes: Int? = nil,
                    vanishAfterBytes: Int? = nil, seed: UInt64 = 1, forged: Bool = false, losesFrames: [Int] = [],
                    ignoresMessages: [UInt16] = []) {
            self.forged = forged
            self.losesFrames = losesFrames
            self.ignoresMessages = ignoresMessages
            self.dropRate = dropRate
            self.corruptRate = corruptRate
            self.delayMs = delayMs
            self.stopReadingAfterBytes = stopReadingAfterBytes
            self.vanishAfterBytes = vanishAfterBytes
            self.seed = seed
        }

        enum CodingKeys: String, CodingKey, CaseIterable {
            case dropRate, corruptRate, delayMs, stopReadingAfterBytes, vanishAfterBytes, seed, forged, losesFrames, ignoresMessages
        }

        /// Decodes the faults, refusing unknown fields; missing fields take the defaults.
        public init(from decoder: any Decoder) throws {
            try rejectUnknownFields(in: decoder, known: CodingKeys.self)
            let container = try decoder.container(keyedBy: CodingKeys.self)
            dropRate = try container.decodeIfPresent(Double.self, forKey: .dropRate) ?? 0
            corruptRate = try container.decodeIfPresent(Double.self, forKey: .corruptRate) ?? 0
            delayMs = try container.decodeIfPresent(Int.self, forKey: .delayMs) ?? 0
            stopReadingAfterBytes = try container.decodeIfPresent(Int.self, forKey: .stopReadingAfterBytes)
            vanishAfterBytes = try container.decodeIfPresent(Int.self, forKey: .vanishAfterBytes)
            seed = try container.decodeIfPresent(UInt64.self, forKey: .seed) ?? 1
            forged = try container.decodeIfPresent(Bool.self, forKey: .forged) ?? false
            losesFrames = try container.decodeIfPresent([Int].self, forKey: .losesFrames) ?? []
            // Message ids as JSON numbers or as hex strings ("0xAA00").
            if let numbers = try? container.decodeIfPresent([UInt16].self, forKey: .ignoresMessages) {
                ignoresMessages = numbers
            } else {
                let texts = try container.decodeIfPresent([String].self, forKey: .ignoresMessages) ?? []
                ignoresMessages = try texts.enumerated().map { index, text in
                    let digits = text.lowercased().hasPrefix("0x") ? String(text.dropFirst(2)) : text
                    guard let id = UInt16(digits, radix: 16) else {
                        throw SimulatorProfileError(field: "faults.ignoresMessages[\(index)]",
                                                    problem: "'\(text)' is not a message id; write it as hex, e.g. \"0xAA00\"")
                    }
                    return id
                }
            }
        }

        /// Whether any fault is switched on.
        public var isActive: Bool {
            dropRate > 0 || corruptRate > 0 || delayMs > 0 || stopReadingAfterBytes != nil || vanishAfterBytes != nil || forged
                || !losesFrames.isEmpty || !ignoresMessages.isEmpty
        }
    }

    /// The identity strings (the JSON field `identity`; ``identity()`` builds the full
    /// `AccessoryIdentity` from them).
    public var accessory: Identity
    /// The declared protocols, in order (their identifiers are 1, 2, … in this order).
    public var protocols: [ProtocolSpec]
    /// Link parameters replacing the defaults.
    public var link: LinkOverrides
    /// Milliseconds between a successful firmware update (DONE 0) and ``SimulatorEvent/reboot(newFirmwareVersion:)``.
    public var rebootDelayMs: Int
    /// Faults to inject (none by default).
    public var faults: Faults
    /// Set for an accessory that speaks legacy iAP1 (nil: iAP2).
    public var iap1: IAP1Settings?
    /// Whether the accessory computes the CRC-32 of every session byte it reads
    /// (``SessionStatistics/crc32In``). On by default; a benchmark's accessory turns it off so
    /// that the accessory's own checksum does not weigh on the host's figures.
    public var checksumsSessionData: Bool
    /// The accessory's certificate and key (nil: the built-in test credentials, ``testCredentials()``).
    public var authentication: Authentication?
    /// Habits of real accessories it plays (none by default).
    public var habits: Habits
    /// Deviations from the reference it plays (the JSON array `deviations`, by name; none by
    /// default): see ``Deviation``.
    public var deviations: [Deviation]
    /// The Bluetooth address of the adapter the accessory runs on, when it runs over Bluetooth
    /// (six bytes, most significant first): its identity then declares a
    /// BluetoothTransportComponent with it. Set by the program that runs it, never read from
    /// JSON.
    public var bluetoothAddress: [UInt8]?

    /// The reboot delay when a profile gives none.
    public static let defaultRebootDelayMs = 200

    /// Creates a profile.
    public init(accessory: Identity, protocols: [ProtocolSpec], link: LinkOverrides = LinkOverrides(),
                rebootDelayMs: Int = SimulatorProfile.defaultRebootDelayMs, faults: Faults = Faults(), iap1: IAP1Settings? = nil,
                checksumsSessionData: Bool = true, authentication: Authentication? = nil, habits: Habits = Habits(),
                deviations: [Deviation] = []) {
        self.deviations = deviations
        self.authentication = authentication
        self.habits = habits
        self.iap1 = iap1
        self.checksumsSessionData = checksumsSessionData
        self.accessory = accessory
        self.protocols = protocols
        self.link = link
        self.rebootDelayMs = rebootDelayMs
        self.faults = faults
    }

    enum CodingKeys: String, CodingKey, CaseIterable {
        case accessory = "identity", protocols, link, rebootDelayMs, faults, iap1, checksumsSessionData, authentication, habits, deviations
    }

    /// Decodes a profile, refusing unknown fields; optional parts take their defaults. Values are
    /// checked by ``validate()`` (``decode(_:)`` and ``load(path:)`` call it).
    public init(from decoder: any Decoder) throws {
        try rejectUnknownFields(in: decoder, known: CodingKeys.self)
        let container = try decoder.container(keyedBy: CodingKeys.self)
        accessory = try container.decode(Identity.self, forKey: .accessory)
        protocols = try container.decode([ProtocolSpec].self, forKey: .protocols)
        link = try container.decodeIfPresent(LinkOverrides.self, forKey: .link) ?? LinkOverrides()
        rebootDelayMs = try container.decodeIfPresent(Int.self, forKey: .rebootDelayMs) ?? Self.defaultRebootDelayMs
        faults = try container.decodeIfPresent(Faults.self, forKey: .faults) ?? Faults()
        iap1 = try container.decodeIfPresent(IAP1Settings.self, forKey: .iap1)
        checksumsSessionData = try container.decodeIfPresent(Bool.self, forKey: .checksumsSessionData) ?? true
        authentication = try container.decodeIfPresent(Authentication.self, forKey: .authentication)
        habits = try container.decodeIfPresent(Habits.self, forKey: .habits) ?? Habits()
        deviations = try container.decodeIfPresent([Deviation].self, forKey: .deviations) ?? []
    }

    /// Encodes the profile, leaving out parts that hold their defaults.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(accessory, forKey: .accessory)
        try container.encode(protocols, forKey: .protocols)
        if link != LinkOverrides() { try container.encode(link, forKey: .link) }
        if rebootDelayMs != Self.defaultRebootDelayMs { try container.encode(rebootDelayMs, forKey: .rebootDelayMs) }
        if faults != Faults() { try container.encode(faults, forKey: .faults) }
        try container.encodeIfPresent(iap1, forKey: .iap1)
        if !checksumsSessionData { try container.encode(false, forKey: .checksumsSessionData) }
        try container.encodeIfPresent(authentication, forKey: .authentication)
        if habits != Habits() { try container.encode(habits, forKey: .habits) }
        if !deviations.isEmpty { try container.encode(deviations, forKey: .deviations) }
    }

    // MARK: What the endpoint needs

    /// Message ids the simulated accessory sends with the default ``habits``: StartPowerUpdates,
    /// StatusExternalAccessoryProtocolSession.
    public static let messagesSent: [UInt16] = [0xAE00, 0xEA03]
    /// Message ids the simulated accessory receives: PowerUpdate, Start- and
    /// StopExternalAccessoryProtocolSession.
    public static let messagesReceived: [UInt16] = [0xAE01, 0xEA00, 0xEA01]

    /// The identity the accessory declares: the profile's strings, the messages it sends by its
    /// ``habits`` (``messagesSent`` by default), those it receives (``messagesReceived``), and
    /// the protocols with identifiers 1…n in profile order.
    public func identity() -> AccessoryIdentity {
        AccessoryIdentity(
            name: accessory.name, modelIdentifier: accessory.model, manufacturer: accessory.manufacturer,
            serialNumber: accessory.serialNumber, firmwareVersion: accessory.firmwareVersion,
            hardwareVersion: accessory.hardwareVersion, messagesSent: habits.messagesSent,
            messagesReceived: Self.messagesReceived,
            protocols: protocols.enumerated().map { index, spec in
                ExternalAccessoryProtocol(identifier: UInt8(truncatingIfNeeded: index + 1), name: spec.name,
                                          nativeTransportComponentIdentifier: spec.isNative ? Self.usbHostTransportComponentIdentifier : nil)
            },
            transportComponents: [TransportComponent(kind: IdentificationParameter.usbHostTransportComponent,
                                                     identifier: Self.usbHostTransportComponentIdentifier, name: "iAP2")]
                + (bluetoothAddress.map {
                    [TransportComponent(kind: IdentificationParameter.bluetoothTransportComponent, identifier: Self.bluetoothTransportComponentIdentifier,
                                        name: "Bluetooth", bluetoothAddress: $0)]
                } ?? []))
    }

    /// The identifier of the Bluetooth transport component a simulated accessory on Bluetooth
    /// declares (``bluetoothAddress``).
    public static let bluetoothTransportComponentIdentifier: UInt16 = 2

    /// The identifier of the USB host transport component every simulated accessory declares
    /// (the default of `AccessoryIdentity`), which native protocols are bound to.
    public static let usbHostTransportComponentIdentifier: UInt16 = 1

    /// The protocols that travel on native transports, in profile order (one FF/F0/01 interface
    /// each when the accessory is a USB gadget).
    public var nativeProtocolNames: [String] { protocols.filter(\.isNative).map(\.name) }

    /// `LinkConfiguration.accessory` with the profile's overrides applied (values are clamped to
    /// the link's valid ranges; ``validate()`` reports them instead).
    public func linkConfiguration() -> LinkConfiguration {
        var configuration = LinkConfiguration.accessory
        func clamp(_ value: Int, _ field: LinkParameters.Field) -> Int {
            min(max(value, field.validRange.lowerBound), field.validRange.upperBound)
        }
        if let value = link.maxPacketLength {
            configuration.parameters.maxPacketLength = UInt16(clamping: clamp(value, .maxPacketLength))
        }
        if let value = link.maxOutstandingPackets {
            configuration.parameters.maxOutstandingPackets = UInt8(clamping: clamp(value, .maxOutstandingPackets))
        }
        if let value = link.retransmissionTimeoutMs {
            configuration.parameters.retransmissionTimeout = UInt16(clamping: clamp(value, .retransmissionTimeout))
        }
        if let value = link.cumulativeAckTimeoutMs {
            configuration.parameters.cumulativeAckTimeout = UInt16(clamping: clamp(value, .cumulativeAckTimeout))
        }
        if let value = link.maxCumulativeAcks {
            configuration.parameters.maxCumulativeAcks = UInt8(clamping: clamp(value, .maxCumulativeAcks))
        }
        if let value = link.maxRetransmissions {
            configuration.parameters.maxRetransmissions = UInt8(clamping: clamp(value, .maxRetransmissions))
        }
        if let value = link.interByteGapMs {
            configuration.interByteGap = .milliseconds(min(max(value, 1), 60_000))
        }
        if let value = link.sendsPacketLength {
            configuration.sendsPacketLength = UInt16(clamping: clamp(value, .maxPacketLength))
        }
        return configuration
    }

    /// The same profile after a firmware update to `version`: what the owner starts after
    /// ``SimulatorEvent/reboot(newFirmwareVersion:)``.
    public func withFirmwareVersion(_ version: String) -> SimulatorProfile {
        var profile = self
        profile.accessory.firmwareVersion = version
        return profile
    }

}
