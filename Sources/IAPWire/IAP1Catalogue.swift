/// Names of iAP1 lingoes, General-lingo commands and iPodAck status codes (PROTOCOL.md §1.4–1.6).
public enum IAP1Catalogue {
    /// Lingo names by id.
    public static let lingoes: [UInt8: String] = [
        0x00: "General", 0x01: "Microphone", 0x02: "SimpleRemote", 0x03: "DisplayRemote", 0x04: "ExtendedInterface",
        0x05: "AccessoryPower", 0x06: "USBHostMode", 0x07: "RFTuner", 0x08: "AccessoryEqualizer", 0x09: "Sports",
        0x0A: "DigitalAudio", 0x0C: "Storage", 0x0D: "iPodOut", 0x0E: "Location",
    ]

    /// General lingo (0x00) command names by id.
    public static let generalCommands: [UInt8: String] = [
        0x00: "RequestIdentify", 0x01: "Identify", 0x02: "iPodAck", 0x03: "RequestExtendedInterfaceMode",
        0x04: "ReturnExtendedInterfaceMode", 0x05: "EnterExtendedInterfaceMode", 0x06: "ExitExtendedInterfaceMode",
        0x07: "RequestiPodName", 0x08: "ReturniPodName", 0x09: "RequestiPodSoftwareVersion",
        0x0A: "ReturniPodSoftwareVersion", 0x0B: "RequestiPodSerialNum", 0x0C: "ReturniPodSerialNum",
        0x0D: "RequestiPodModelNum", 0x0E: "ReturniPodModelNum", 0x0F: "RequestLingoProtocolVersion",
        0x10: "ReturnLingoProtocolVersion", 0x11: "RequestTransportMaxPayloadSize", 0x12: "ReturnTransportMaxPayloadSize",
        0x13: "IdentifyDeviceLingoes", 0x14: "GetAccessoryAuthenticationInfo", 0x15: "RetAccessoryAuthenticationInfo",
        0x16: "AckAccessoryAuthenticationInfo", 0x17: "GetAccessoryAuthenticationSignature",
        0x18: "RetAccessoryAuthenticationSignature", 0x19: "AckAccessoryAuthenticationStatus",
        0x1A: "GetiPodAuthenticationInfo", 0x1B: "RetiPodAuthenticationInfo", 0x1C: "AckiPodAuthenticationInfo",
        0x1D: "GetiPodAuthenticationSignature", 0x1E: "RetiPodAuthenticationSignature", 0x1F: "AckiPodAuthenticationStatus",
        0x23: "NotifyiPodStateChange", 0x24: "GetiPodOptions", 0x25: "RetiPodOptions", 0x27: "GetAccessoryInfo",
        0x28: "RetAccessoryInfo", 0x29: "GetiPodPreferences", 0x2A: "RetiPodPreferences", 0x2B: "SetiPodPreferences",
        0x35: "GetUIMode", 0x36: "RetUIMode", 0x37: "SetUIMode", 0x38: "StartIDPS", 0x39: "SetFIDTokenValues",
        0x3A: "AckFIDTokenValues", 0x3B: "EndIDPS", 0x3C: "IDPSStatus", 0x3F: "OpenDataSessionForProtocol",
        0x40: "CloseDataSession", 0x41: "AccessoryAck", 0x42: "AccessoryDataTransfer", 0x43: "iPodDataTransfer",
        0x46: "SetAccessoryStatusNotification", 0x47: "RetAccessoryStatusNotification",
        0x48: "AccessoryStatusNotification", 0x49: "SetEventNotification", 0x4A: "iPodNotification",
        0x4B: "GetiPodOptionsForLingo", 0x4C: "RetiPodOptionsForLingo", 0x4D: "GetEventNotification",
        0x4E: "RetEventNotification", 0x4F: "GetSupportedEventNotification", 0x50: "CancelCommand",
        0x51: "RetSupportedEventNotification", 0x54: "SetAvailableCurrent", 0x56: "SetInternalBatteryChargingState",
        0x64: "RequestApplicationLaunch", 0x65: "GetNowPlayingApplicationBundleName",
        0x66: "RetNowPlayingApplicationBundleName", 0x67: "GetLocalizationInfo", 0x68: "RetLocalizationInfo",
        0x69: "RequestWiFiConnectionInfo", 0x6A: "WiFiConnectionInfo", 0xEE: "iAP2Detect",
    ]

    /// USB Host Mode lingo (0x06) command names by id.
    public static let usbHostModeCommands: [UInt8: String] = [
        0x00: "AccessoryAck", 0x04: "NotifyUSBMode", 0x80: "iPodAck", 0x81: "GetiPodUSBMode", 0x82: "RetiPodUSBMode",
        0x83: "SetiPodUSBMode",
    ]

    /// iPodAck status names by code.
    public static let ackStatuses: [UInt8: String] = [
        0x00: "Success", 0x01: "UnknownCategoryOrSessionID", 0x02: "CommandFailed", 0x03: "OutOfResources",
        0x04: "BadParameter", 0x05: "UnknownID", 0x06: "CommandPending", 0x07: "NotAuthenticated",
        0x08: "BadAuthenticationVersion", 0x09: "AccessoryPowerModeRequestFailed", 0x0A: "CertificateInvalid",
        0x0B: "CertificatePermissionsInvalid", 0x0C: "FileInUse", 0x0D: "InvalidFileHandle", 0x0E: "DirectoryNotEmpty",
        0x0F: "OperationTimedOut", 0x10: "CommandUnavailableInThisMode", 0x11: "InvalidAccessoryResistorID",
        0x12: "SelectionNotGenius", 0x13: "MultiSectionDataReceivedOK", 0x14: "LingoBusy",
        0x15: "MaxAccessoryConnections", 0x16: "HIDDescriptorIndexInUse", 0x17: "DroppedData", 0x18: "InvalidVideoSettings",
    ]

    /// FID token names by `type << 8 | subtype` (PROTOCOL.md §1.7).
    public static let tokens: [UInt16: String] = [
        0x0000: "IdentifyToken", 0x0001: "AccessoryCapsToken", 0x0002: "AccessoryInfoToken", 0x0003: "iPodPreferenceToken",
        0x0004: "EAProtocolToken", 0x0005: "BundleSeedIDPrefToken", 0x0007: "ScreenInfoToken",
        0x0008: "EAProtocolMetadataToken", 0x000E: "AccessoryDigitalAudioSampleRatesToken",
        0x000F: "AccessoryDigitalAudioVideoDelayToken", 0x0100: "MicrophoneCapsToken",
    ]

    /// The name of an FID token kind (`type << 8 | subtype`).
    public static func tokenName(_ kind: UInt16) -> String {
        tokens[kind] ?? "token \(hexByte(UInt8(kind >> 8))):\(hexByte(UInt8(kind & 0xFF)))"
    }

    /// The name of `command` on `lingo`, when known.
    public static func commandName(lingo: UInt8, command: UInt16) -> String? {
        switch lingo {
        case 0x00: return command <= 0xFF ? generalCommands[UInt8(command)] : nil
        case 0x06: return command <= 0xFF ? usbHostModeCommands[UInt8(command)] : nil
        default: return nil
        }
    }
}
