/// A Bluetooth device address (BD_ADDR), e.g. `00:1A:7D:DA:71:13`: six bytes, most significant
/// first as people write them.
public struct BluetoothAddress: Hashable, Sendable, Codable, CustomStringConvertible, Comparable {
    /// The six bytes, most significant first (the order of the written form).
    public let bytes: [UInt8]

    /// The address of these six bytes (most significant first); nil unless exactly six.
    public init?(bytes: [UInt8]) {
        guard bytes.count == 6 else { return nil }
        self.bytes = bytes
    }

    /// Parses `AA:BB:CC:DD:EE:FF` (or with `-` or `_` between the bytes; either case); nil for
    /// anything else.
    public init?(_ text: String) {
        let parts = text.split(omittingEmptySubsequences: false) { $0 == ":" || $0 == "-" || $0 == "_" }
        guard parts.count == 6 else { return nil }
        var bytes: [UInt8] = []
        for part in parts {
            guard part.count == 2, let byte = UInt8(part, radix: 16) else { return nil }
            bytes.append(byte)
        }
        self.bytes = bytes
    }

    /// The address in a BlueZ device object path (`/org/bluez/hci0/dev_AA_BB_CC_DD_EE_FF`); nil
    /// when the path's last element is not a device.
    public init?(devicePath: String) {
        guard let last = devicePath.split(separator: "/").last, last.hasPrefix("dev_") else { return nil }
        self.init(String(last.dropFirst(4)))
    }

    /// `AA:BB:CC:DD:EE:FF`, upper case.
    public var description: String {
        bytes.map { byte in
            let digits = String(byte, radix: 16, uppercase: true)
            return byte < 16 ? "0" + digits : digits
        }.joined(separator: ":")
    }

    /// The element BlueZ names a device's object by: `dev_AA_BB_CC_DD_EE_FF`.
    public var devicePathElement: String {
        "dev_" + description.split(separator: ":").joined(separator: "_")
    }

    /// Orders addresses by their bytes.
    public static func < (lhs: BluetoothAddress, rhs: BluetoothAddress) -> Bool {
        lhs.bytes.lexicographicallyPrecedes(rhs.bytes)
    }

    /// Whether `declared` (an accessory's BluetoothTransportComponent MAC address, parameter 3)
    /// names this address: in the written order, or reversed (the little-endian order of
    /// `bdaddr_t`, which accessory stacks built on it may send; the specification's byte order
    /// is not public).
    public func matches(declared: [UInt8]) -> Bool {
        declared == bytes || declared == bytes.reversed()
    }
}

/// One Bluetooth connection BlueZ handed over: who is at the other end.
public struct BluetoothPeer: Sendable, Hashable {
    /// The accessory's address.
    public var address: BluetoothAddress
    /// BlueZ's object for the device, e.g. `/org/bluez/hci0/dev_00_1A_7D_DA_71_13`.
    public var devicePath: String
    /// The local adapter it came in on, e.g. `hci0` (empty when the path names none).
    public var adapter: String
    /// The profile version from the accessory's SDP record, when BlueZ gave one.
    public var profileVersion: UInt16?

    /// A peer at `address`, known to BlueZ as `devicePath`.
    public init(address: BluetoothAddress, devicePath: String, profileVersion: UInt16? = nil) {
        self.address = address
        self.devicePath = devicePath
        let elements = devicePath.split(separator: "/")
        self.adapter = elements.count >= 3 && elements[0] == "org" && elements[1] == "bluez" ? String(elements[2]) : ""
        self.profileVersion = profileVersion
    }
}
