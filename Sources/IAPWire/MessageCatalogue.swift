/// How a parameter's data is to be read.
public indirect enum ParameterType: Hashable, Sendable {
    /// No data: presence means true.
    case flag
    /// A NUL-terminated UTF-8 string.
    case utf8
    /// An unsigned byte.
    case uint8
    /// An unsigned 16-bit integer, big-endian.
    case uint16
    /// An unsigned 32-bit integer, big-endian.
    case uint32
    /// An unsigned 64-bit integer, big-endian.
    case uint64
    /// One byte, 0 or 1.
    case bool
    /// One byte with named values.
    case enumeration([UInt8: String])
    /// Packed big-endian 16-bit message ids.
    case messageIDList
    /// Raw bytes.
    case blob
    /// Further parameters, described by the table.
    case group([UInt16: ParameterInfo])
}

/// The name and type of one parameter id.
public struct ParameterInfo: Hashable, Sendable {
    /// The parameter's name as PROTOCOL.md §3 spells it (e.g. "ModelIdentifier"), shown by decoders.
    public var name: String
    /// How the parameter's data is read (and, for a group, the table of its sub-parameters).
    public var type: ParameterType
    /// A catalogue entry: the parameter's `name` and how its data is read.
    public init(_ name: String, _ type: ParameterType) {
        self.name = name
        self.type = type
    }
}

/// Which side sends a message. "Device" is the Apple-device role, which this project's host
/// plays; "accessory" is the peripheral.
public enum MessageSender: String, Hashable, Sendable {
    /// The Apple-device role: the host, in this project (e.g. StartIdentification).
    case device
    /// The accessory (e.g. IdentificationInformation).
    case accessory
}

/// The name, sender and parameters of one message id.
public struct MessageInfo: Hashable, Sendable {
    /// The message's name as PROTOCOL.md §3 spells it (e.g. "IdentificationInformation").
    public var name: String
    /// The side that sends the message: decoders show it ("from accessory"), and identification
    /// is rejected when it lists a message for the wrong side (parameters 6 and 7).
    public var sender: MessageSender
    /// The message's parameters by id; ids not in the table are shown by number and kept as bytes.
    public var parameters: [UInt16: ParameterInfo]
    /// A catalogue entry: the message's `name`, who sends it and its parameters by id.
    public init(_ name: String, _ sender: MessageSender, _ parameters: [UInt16: ParameterInfo] = [:]) {
        self.name = name
        self.sender = sender
        self.parameters = parameters
    }
}

extension MessageID {
    /// 0xAA00, device: asks the accessory for its authentication certificate (first message after
    /// the link is up).
    public static let requestAuthenticationCertificate = MessageID(0xAA00)
    /// 0xAA01, accessory: the certificate (parameter 0, X.509 in PKCS#7, at most 1280 bytes).
    public static let authenticationCertificate = MessageID(0xAA01)
    /// 0xAA02, device: the challenge to sign (parameter 0: 20 bytes for coprocessor 2.0, 32 for 3.0).
    public static let requestAuthenticationChallengeResponse = MessageID(0xAA02)
    /// 0xAA03, accessory: the coprocessor's signature over the challenge (parameter 0).
    public static let authenticationResponse = MessageID(0xAA03)
    /// 0xAA04, device: the accessory's authentication was refused; no identification follows.
    public static let authenticationFailed = MessageID(0xAA04)
    /// 0xAA05, device: the accessory's authentication was accepted; StartIdentification follows.
    public static let authenticationSucceeded = MessageID(0xAA05)
    /// 0xAA06, accessory: the coprocessor's serial number (parameter 0, a string), when asked for.
    public static let accessoryAuthenticationSerialNumber = MessageID(0xAA06)
    /// 0x1D00, device: asks the accessory to identify (no parameters).
    public static let startIdentification = MessageID(0x1D00)
    /// 0x1D01, accessory: who it is and what it does; parameters in ``IdentificationParameter``.
    public static let identificationInformation = MessageID(0x1D01)
    /// 0x1D02, device: the identification is accepted; the accessory may now use what it declared.
    public static let identificationAccepted = MessageID(0x1D02)
    /// 0x1D03, device: the identification is refused; one flag parameter per offending
    /// IdentificationInformation parameter id, so the accessory can correct and send it again.
    public static let identificationRejected = MessageID(0x1D03)
    /// 0x1D05, accessory: abandons its identification.
    public static let cancelIdentification = MessageID(0x1D05)
    /// 0x1D06, accessory: new values for some identification strings (name, model, maker, serial,
    /// revisions, current language) after it was accepted.
    public static let identificationInformationUpdate = MessageID(0x1D06)
    /// 0xEA00, device: opens an EA session (parameter 0 the protocol identifier from identification,
    /// parameter 1 the session identifier the device chose).
    public static let startExternalAccessoryProtocolSession = MessageID(0xEA00)
    /// 0xEA01, device: closes the EA session whose identifier is parameter 0.
    public static let stopExternalAccessoryProtocolSession = MessageID(0xEA01)
    /// 0xEA02, accessory: asks the device to launch the app that handles its protocol (its parameters
    /// are not confirmed; decoders show them by number).
    public static let requestAppLaunch = MessageID(0xEA02)
    /// 0xEA03, accessory: the state of an EA session (parameter 0 the session identifier, parameter 1
    /// the status: 0 open, anything else failed or closed).
    public static let statusExternalAccessoryProtocolSession = MessageID(0xEA03)
    /// 0xAE00, accessory: asks for PowerUpdate messages carrying the fields its flag parameters name.
    public static let startPowerUpdates = MessageID(0xAE00)
    /// 0xAE01, device: the device's power state (current the accessory may draw in mA, battery level in
    /// percent, charging state), the fields StartPowerUpdates asked for.
    public static let powerUpdate = MessageID(0xAE01)
    /// 0xAE02, accessory: no more PowerUpdate messages.
    public static let stopPowerUpdates = MessageID(0xAE02)
    /// 0xAE03, accessory: the current it makes available to the device (mA) and whether the device's
    /// battery should charge from it.
    public static let powerSourceUpdate = MessageID(0xAE03)
    /// 0xAE05, accessory: its own power state (one parameter, not confirmed beyond its id).
    public static let accessoryPowerUpdate = MessageID(0xAE05)
}

/// Parameter ids of IdentificationInformation (0x1D01).
public enum IdentificationParameter {
    /// 0: the accessory's name for people (UTF-8), `EAAccessory.name`.
    public static let name: UInt16 = 0
    /// 1: the model identifier (UTF-8), `EAAccessory.modelNumber`.
    public static let modelIdentifier: UInt16 = 1
    /// 2: the manufacturer's name (UTF-8).
    public static let manufacturer: UInt16 = 2
    /// 3: the serial number (UTF-8).
    public static let serialNumber: UInt16 = 3
    /// 4: the firmware revision (UTF-8), what an upgrade changes.
    public static let firmwareVersion: UInt16 = 4
    /// 5: the hardware revision (UTF-8).
    public static let hardwareVersion: UInt16 = 5
    /// 6: the control message ids the accessory will send (packed big-endian u16s); each must be an
    /// accessory-sent message.
    public static let messagesSentByAccessory: UInt16 = 6
    /// 7: the control message ids the accessory wants to receive (packed big-endian u16s); each must be
    /// a device-sent message.
    public static let messagesReceivedFromDevice: UInt16 = 7
    /// 8: whether the accessory powers the device (enumeration: 0 none, 1 Lightning receptacle
    /// pass-through, 2 advanced).
    public static let powerProvidingCapability: UInt16 = 8
    /// 9: the most current the accessory draws from the device, in mA (u16).
    public static let maximumCurrentDrawnFromDevice: UInt16 = 9
    /// 10: one EA protocol the accessory speaks (a group, repeated per protocol; sub-parameters in
    /// ``ExternalAccessoryProtocolParameter``).
    public static let supportedExternalAccessoryProtocol: UInt16 = 10
    /// 11: the Apple developer team id of the apps that match the accessory (UTF-8).
    public static let appMatchTeamID: UInt16 = 11
    /// 12: the language the accessory uses now (UTF-8, e.g. "en").
    public static let currentLanguage: UInt16 = 12
    /// 13: a language the accessory supports (UTF-8), repeated per language.
    public static let supportedLanguage: UInt16 = 13
    /// 14: a UART transport of the accessory (a group: identifier u16, name, supports-iAP2 flag).
    public static let serialTransportComponent: UInt16 = 14
    /// 15: a USB transport on which the Apple device is the USB device (a group: identifier, name,
    /// supports-iAP2 flag, audio sample rates).
    public static let usbDeviceTransportComponent: UInt16 = 15
    /// 16: a USB transport on which the Apple device (this host) is the USB host (a group: identifier,
    /// name, supports-iAP2 flag, CarPlay fields); native-transport protocols name its identifier.
    public static let usbHostTransportComponent: UInt16 = 16
    /// 17: a Bluetooth transport (a group: identifier, name, supports-iAP2 flag, MAC address).
    public static let bluetoothTransportComponent: UInt16 = 17
    /// 18: a HID function the accessory offers over iAP2 (a group: identifier, name, function).
    public static let iAP2HIDComponent: UInt16 = 18
    /// 34: the product plan's UID from the MFi portal (UTF-8, 16 hex digits).
    public static let productPlanUID: UInt16 = 34
}

/// Sub-parameter ids of the SupportedExternalAccessoryProtocol group (IdentificationInformation
/// parameter 10).
public enum ExternalAccessoryProtocolParameter {
    /// 0: the protocol's identifier (u8, unique within the accessory), which
    /// StartExternalAccessoryProtocolSession names.
    public static let identifier: UInt16 = 0
    /// 1: the protocol string (UTF-8, reverse DNS, e.g. "com.example.echo"), what apps open sessions by.
    public static let name: UInt16 = 1
    /// 2: what the device does about apps for the protocol (enumeration: 0 no action, 1 optional
    /// action, 2 no alert, 3 no communication protocol).
    public static let matchAction: UInt16 = 2
    /// 3: the identifier (u16) of the USBHostTransportComponent whose native USB interface (FF/F0/01)
    /// carries this protocol's bytes instead of the iAP2 link.
    public static let nativeTransportComponentIdentifier: UInt16 = 3
}

/// Names and types of the control-session messages and parameters this project knows, from
/// PROTOCOL.md §3. Unknown ids are not errors: they are shown by number and kept as bytes.
public enum MessageCatalogue {
    /// The entry for `id`, if catalogued.
    public static func info(for id: MessageID) -> MessageInfo? { messages[id.rawValue] }

    /// The family an uncatalogued id belongs to, by its range (e.g. "MediaLibrary").
    public static func family(of id: MessageID) -> String? {
        let raw = id.rawValue
        for (range, name) in families where range.contains(raw) { return name }
        return nil
    }

    static let families: [(ClosedRange<UInt16>, String)] = [
        (0x00B0...0x00B4, "Bluetooth"), (0x0B00...0x0B03, "Bluetooth"), (0x1D00...0x1DFF, "Identification"),
        (0x4154...0x4161, "Communications"), (0x4170...0x4172, "Lists"), (0x4300...0x4303, "CarPlay"),
        (0x4C00...0x4C09, "MediaLibrary"), (0x4E01...0x4E0E, "DeviceNotifications"), (0x5000...0x5003, "NowPlaying"),
        (0x5100...0x54FF, "MFi4Authentication"), (0x5200...0x5204, "RouteGuidance"), (0x5601...0x5613, "VoiceOver"),
        (0x5700...0x5703, "WiFi"), (0x6800...0x6807, "HID"), (0x7E00...0x7E02, "USBHostMode"),
        (0xA100...0xA102, "VehicleStatus"), (0xAA00...0xAAFF, "Authentication"), (0xAD00...0xAD04, "AppDiscovery"),
        (0xAE00...0xAEFF, "Power"), (0xB100...0xB107, "BLE"), (0xDA00...0xDA02, "USBDeviceModeAudio"),
        (0xEA00...0xEAFF, "ExternalAccessory"), (0xFFF0...0xFFFC, "Location"),
    ]

    static let matchActions: [UInt8: String] = [
        0: "NoAction", 1: "OptionalAction", 2: "NoAlert", 3: "NoCommunicationProtocol", 4: "NoActionNoCommunication",
    ]

    static let transportCommon: [UInt16: ParameterInfo] = [
        0: ParameterInfo("TransportComponentIdentifier", .uint16),
        1: ParameterInfo("TransportComponentName", .utf8),
        2: ParameterInfo("TransportSupportsiAP2Connection", .flag),
    ]

    static func merging(_ base: [UInt16: ParameterInfo], _ extra: [UInt16: ParameterInfo]) -> [UInt16: ParameterInfo] {
        base.merging(extra) { _, new in new }
    }

    /// The parameters of IdentificationInformation.
    public static let identificationParameters: [UInt16: ParameterInfo] = [
        0: ParameterInfo("Name", .utf8),
        1: ParameterInfo("ModelIdentifier", .utf8),
        2: ParameterInfo("Manufacturer", .utf8),
        3: ParameterInfo("SerialNumber", .utf8),
        4: ParameterInfo("FirmwareVersion", .utf8),
        5: ParameterInfo("HardwareVersion", .utf8),
        6: ParameterInfo("MessagesSentByAccessory", .messageIDList),
        7: ParameterInfo("MessagesReceivedFromDevice", .messageIDList),
        8: ParameterInfo("PowerProvidingCapability", .enumeration([0: "None", 1: "LightningReceptaclePassThrough", 2: "Advanced"])),
        9: ParameterInfo("MaximumCurrentDrawnFromDevice", .uint16),
        10: ParameterInfo("SupportedExternalAccessoryProtocol", .group([
            0: ParameterInfo("ExternalAccessoryProtocolIdentifier", .uint8),
            1: ParameterInfo("ExternalAccessoryProtocolName", .utf8),
            2: ParameterInfo("ExternalAccessoryProtocolMatchAction", .enumeration(matchActions)),
            3: ParameterInfo("NativeTransportComponentIdentifier", .uint16),
        ])),
        11: ParameterInfo("AppMatchTeamID", .utf8),
        12: ParameterInfo("CurrentLanguage", .utf8),
        13: ParameterInfo("SupportedLanguage", .utf8),
        14: ParameterInfo("SerialTransportComponent", .group(transportCommon)),
        15: ParameterInfo("USBDeviceTransportComponent", .group(merging(transportCommon, [
            3: ParameterInfo("USBDeviceSupportedAudioSampleRate", .enumeration([
                0: "8000Hz", 1: "11025Hz", 2: "12000Hz", 3: "16000Hz", 4: "22050Hz", 5: "24000Hz", 6: "32000Hz",
                7: "44100Hz", 8: "48000Hz",
            ])),
        ]))),
        16: ParameterInfo("USBHostTransportComponent", .group(merging(transportCommon, [
            3: ParameterInfo("USBHostTransportCarPlayInterfaceNumber", .uint8),
            4: ParameterInfo("USBHostTransportSupportsCarPlay", .flag),
            5: ParameterInfo("SupportsThemeAssets", .flag),
        ]))),
        17: ParameterInfo("BluetoothTransportComponent", .group(merging(transportCommon, [
            3: ParameterInfo("BluetoothTransportMediaAccessControlAddress", .blob),
        ]))),
        18: ParameterInfo("iAP2HIDComponent", .group([
            0: ParameterInfo("HIDComponentIdentifier", .uint16),
            1: ParameterInfo("HIDComponentName", .utf8),
            2: ParameterInfo("HIDComponentFunction", .enumeration([
                0: "Keyboard", 1: "MediaPlaybackRemote", 2: "AssistiveTouchPointer", 4: "GameControllerExtended",
                6: "GameControllerStandard", 7: "SwitchControl", 8: "Headset", 10: "BrailleDisplay",
            ])),
        ])),
        20: ParameterInfo("VehicleInformationComponent", .group([:])),
        21: ParameterInfo("VehicleStatusComponent", .group([:])),
        22: ParameterInfo("LocationInformationComponent", .group([:])),
        23: ParameterInfo("USBHostHIDComponent", .group([
            0: ParameterInfo("HIDComponentIdentifier", .uint16),
            1: ParameterInfo("HIDComponentName", .utf8),
            2: ParameterInfo("HIDComponentFunction", .uint8),
            3: ParameterInfo("USBHostTransportComponentIdentifier", .uint16),
            4: ParameterInfo("USBHostTransportComponentInterfaceNumber", .uint16),
        ])),
        24: ParameterInfo("WirelessCarPlayTransportComponent", .group(merging(transportCommon, [
            4: ParameterInfo("TransportSupportsCarPlay", .flag),
            5: ParameterInfo("SupportsThemeAssets", .flag),
        ]))),
        26: ParameterInfo("BLETransportComponent", .group([:])),
        29: ParameterInfo("BluetoothHIDComponent", .group([:])),
        30: ParameterInfo("RouteGuidanceDisplayComponent", .group([:])),
        33: ParameterInfo("RoadObjectDetectionComponent", .group([:])),
        34: ParameterInfo("ProductPlanUID", .utf8),
        35: ParameterInfo("PhysicalDeviceCompatibility", .utf8),
        240: ParameterInfo("MaximumCurrentDrawnInUHPM", .uint16),
        241: ParameterInfo("PowerDuringSleep", .uint8),
    ]

    static let powerUpdateParameters: [UInt16: ParameterInfo] = [
        0: ParameterInfo("MaximumCurrentDrawnFromAccessory", .uint16),
        1: ParameterInfo("DeviceBatteryWillChargeIfPowerIsPresent", .bool),
        2: ParameterInfo("AccessoryPowerMode", .uint8),
        4: ParameterInfo("IsExternalChargerConnected", .bool),
        5: ParameterInfo("BatteryChargingState", .uint8),
        6: ParameterInfo("BatteryChargeLevel", .uint16),
    ]

    static let messages: [UInt16: MessageInfo] = [
        0xAA00: MessageInfo("RequestAuthenticationCertificate", .device, [0: ParameterInfo("RequestAuthenticationCertificateSerialNumber", .flag)]),
        0xAA01: MessageInfo("AuthenticationCertificate", .accessory, [0: ParameterInfo("AuthenticationCertificate", .blob)]),
        0xAA02: MessageInfo("RequestAuthenticationChallengeResponse", .device, [0: ParameterInfo("AuthenticationChallenge", .blob)]),
        0xAA03: MessageInfo("AuthenticationResponse", .accessory, [0: ParameterInfo("AuthenticationResponse", .blob)]),
        0xAA04: MessageInfo("AuthenticationFailed", .device),
        0xAA05: MessageInfo("AuthenticationSucceeded", .device),
        0xAA06: MessageInfo("AccessoryAuthenticationSerialNumber", .accessory, [0: ParameterInfo("SerialNumber", .utf8)]),
        0x1D00: MessageInfo("StartIdentification", .device),
        0x1D01: MessageInfo("IdentificationInformation", .accessory, identificationParameters),
        0x1D02: MessageInfo("IdentificationAccepted", .device),
        0x1D03: MessageInfo("IdentificationRejected", .device, identificationParameters.mapValues { ParameterInfo($0.name, .flag) }),
        0x1D05: MessageInfo("CancelIdentification", .accessory),
        0x1D06: MessageInfo("IdentificationInformationUpdate", .accessory, [
            0: ParameterInfo("Name", .utf8), 1: ParameterInfo("ModelIdentifier", .utf8), 2: ParameterInfo("Manufacturer", .utf8),
            3: ParameterInfo("SerialNumber", .utf8), 4: ParameterInfo("FirmwareVersion", .utf8),
            5: ParameterInfo("HardwareVersion", .utf8), 6: ParameterInfo("CurrentLanguage", .utf8),
        ]),
        0xEA00: MessageInfo("StartExternalAccessoryProtocolSession", .device, [
            0: ParameterInfo("ExternalAccessoryProtocolIdentifier", .uint8),
            1: ParameterInfo("ExternalAccessoryProtocolSessionIdentifier", .uint16),
        ]),
        0xEA01: MessageInfo("StopExternalAccessoryProtocolSession", .device, [
            0: ParameterInfo("ExternalAccessoryProtocolSessionIdentifier", .uint16),
        ]),
        0xEA02: MessageInfo("RequestAppLaunch", .accessory, [0: ParameterInfo("AppBundleID", .utf8)]),
        0xEA03: MessageInfo("StatusExternalAccessoryProtocolSession", .accessory, [
            0: ParameterInfo("ExternalAccessoryProtocolSessionIdentifier", .uint16),
            1: ParameterInfo("ExternalAccessoryProtocolSessionStatus", .enumeration([0: "OK"])),
        ]),
        0xAE00: MessageInfo("StartPowerUpdates", .accessory, powerUpdateParameters.mapValues { ParameterInfo($0.name, .flag) }),
        0xAE01: MessageInfo("PowerUpdate", .device, powerUpdateParameters),
        0xAE02: MessageInfo("StopPowerUpdates", .accessory),
        0xAE03: MessageInfo("PowerSourceUpdate", .accessory, [
            0: ParameterInfo("AvailableCurrentForDevice", .uint16),
            1: ParameterInfo("DeviceBatteryShouldChargeIfPowerIsPresent", .bool),
        ]),
        0xAE05: MessageInfo("AccessoryPowerUpdate", .accessory),
        0x7E00: MessageInfo("StartUSBHostMode", .accessory),
        0x7E01: MessageInfo("USBModeNotification", .device),
        0x7E02: MessageInfo("StopUSBHostMode", .accessory),
        0xDA00: MessageInfo("StartUSBDeviceModeAudio", .accessory),
        0xDA01: MessageInfo("USBDeviceModeAudioInformation", .device),
        0xDA02: MessageInfo("StopUSBDeviceModeAudio", .accessory),
    ]
}
