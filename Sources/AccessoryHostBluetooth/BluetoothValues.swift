package import BluetoothTransport
public import IAPTransport

// Bluetooth's settings, failures and devices as the product shows them. BluetoothTransport
// (BlueZ over libdbus) is no product: these are AccessoryHostBluetooth's own values, each made
// from (or turned into) BluetoothTransport's.

/// How the host offers the iAP2 service to BlueZ: the channel, security, connecting out, the
/// adapter. Every setting has the default a host usually wants.
public struct BluetoothOptions: Sendable, Hashable {
    /// The settings in BluetoothTransport's form.
    package var profile: BluetoothProfileOptions

    /// Options; every parameter has the default a host usually wants.
    public init(busAddress: String? = nil, channel: UInt16 = 0, connectsOut: Bool = false, requireAuthentication: Bool = true,
                requireAuthorization: Bool = false, serviceName: String = "iAP2", adapter: String? = nil,
                profilePath: String = "/org/accessoryhost/iap2", callTimeout: Duration = .seconds(30), registersAgent: Bool = false) {
        profile = BluetoothProfileOptions(busAddress: busAddress, channel: channel, connectsOut: connectsOut,
                                          requireAuthentication: requireAuthentication, requireAuthorization: requireAuthorization,
                                          serviceName: serviceName, adapter: adapter, profilePath: profilePath, callTimeout: callTimeout,
                                          registersAgent: registersAgent)
    }

    /// The D-Bus bus BlueZ is on; nil for the system bus (`DBUS_SYSTEM_BUS_ADDRESS`, else `unix:path=/var/run/dbus/system_bus_socket`).
    public var busAddress: String? {
        get { profile.busAddress }
        set { profile.busAddress = newValue }
    }
    /// The RFCOMM channel of the service (1–30), or 0 for one BlueZ picks (the kernel's first
    /// free channel), which the SDP record then names. BlueZ opens no RFCOMM server at all for
    /// a vendor UUID without this option, so it is always sent.
    public var channel: UInt16 {
        get { profile.channel }
        set { profile.channel = newValue }
    }
    /// Whether the host may also connect out to paired accessories
    /// (``AccessoryHost/AccessoryManager/connectBluetooth(to:)``): BlueZ then registers the profile in both roles
    /// (no `Role` option), and a second profile registers the accessories' own UUID
    /// (`00000000-deca-fade-deca-deafdecacaff`, PROTOCOL.md §7.11) as a client at
    /// ``profilePath`` with `/accessory` after it, which is what BlueZ needs to look for that UUID on a device and
    /// connect to it; otherwise `Role` is `server` and only accessories connect.
    public var connectsOut: Bool {
        get { profile.connectsOut }
        set { profile.connectsOut = newValue }
    }
    /// Whether a connection needs a paired (authenticated) link (`RequireAuthentication`).
    public var requireAuthentication: Bool {
        get { profile.requireAuthentication }
        set { profile.requireAuthentication = newValue }
    }
    /// Whether BlueZ asks its agent before handing over a connection of a device that is not
    /// trusted (`RequireAuthorization`); off by default, so a paired accessory is enough.
    public var requireAuthorization: Bool {
        get { profile.requireAuthorization }
        set { profile.requireAuthorization = newValue }
    }
    /// The service's name in its SDP record.
    public var serviceName: String {
        get { profile.serviceName }
        set { profile.serviceName = newValue }
    }
    /// Only connections through this adapter (e.g. `hci0`); nil for any.
    public var adapter: String? {
        get { profile.adapter }
        set { profile.adapter = newValue }
    }
    /// The object path the profile is served at.
    public var profilePath: String {
        get { profile.profilePath }
        set { profile.profilePath = newValue }
    }
    /// How long each call to BlueZ may take (connecting out includes the SDP search and paging).
    public var callTimeout: Duration {
        get { profile.callTimeout }
        set { profile.callTimeout = newValue }
    }
    /// Whether to serve a pairing agent too (an agent: Just Works accepted, as a host
    /// without a screen does), for machines where no other agent (a desktop's) answers BlueZ.
    public var registersAgent: Bool {
        get { profile.registersAgent }
        set { profile.registersAgent = newValue }
    }
}

/// A Bluetooth device BlueZ knows (paired or seen): ``AccessoryHost/AccessoryManager/bluetoothDevices()``.
public struct BluetoothDevice: Sendable, Hashable {
    /// The device in BluetoothTransport's form.
    package let device: BlueZDevice

    /// The device `device` describes.
    package init(_ device: BlueZDevice) { self.device = device }

    /// Its address.
    public var address: BluetoothAddress { device.address }
    /// Its name (or alias), as BlueZ has it.
    public var name: String { device.name }
    /// Whether it is paired.
    public var paired: Bool { device.paired }
    /// Whether it is connected now (any profile).
    public var connected: Bool { device.connected }
    /// The iAP2 UUIDs among its service UUIDs, lower-case, the accessory's own first: what
    /// ``AccessoryHost/AccessoryManager/connectBluetooth(to:)`` connects to, in this order.
    public var iAP2ServiceUUIDs: [String] { device.iAP2ServiceUUIDs }
    /// BlueZ's D-Bus object for it, e.g. `/org/bluez/hci0/dev_00_11_22_33_44_55`.
    public var path: String { device.path }
    /// Whether its SDP records (as BlueZ last read them) offer iAP2 under either UUID.
    public var offersIAP2: Bool { device.offersIAP2 }
}

/// Why Bluetooth could not do what was asked, with the command that helps.
///
/// Decide on ``kind``, never on the message: the message is for people and may change.
public struct BluetoothError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What a caller can decide on.
    public enum Kind: String, Sendable, Hashable, Codable {
        /// No D-Bus system bus (or none at the address given).
        case busUnavailable
        /// BlueZ's daemon (`bluetoothd`) is not on the bus.
        case bluezNotRunning
        /// BlueZ knows no Bluetooth adapter (controller).
        case noAdapter
        /// Every adapter is powered off (or the one named is).
        case adapterOff
        /// The D-Bus policy refuses this user BlueZ's calls.
        case permission
        /// Another program registered the iAP2 profile with BlueZ.
        case profileInUse
        /// BlueZ knows no device of that address (never paired or discovered).
        case unknownDevice
        /// The device is known but not paired.
        case notPaired
        /// Pairing or authentication was refused or failed.
        case pairingRefused
        /// The device does not offer the iAP2 service (no SDP record with either iAP2 UUID).
        case notAdvertised
        /// The device did not answer (off, out of range).
        case unreachable
        /// Anything else: see the message.
        case failed
    }

    /// What a caller can decide on.
    public var kind: Kind
    /// What failed, e.g. "BlueZ (bluetoothd) is not running".
    public var message: String
    /// What to do next, with the command, e.g. "start it: systemctl start bluetooth".
    public var advice: String
    /// The D-Bus error behind it (its name and message), when there was one.
    public var busError: String?

    /// An error of `kind` saying `message`, and what to do.
    public init(_ kind: Kind, _ message: String, advice: String, busError: String? = nil) {
        self.kind = kind
        self.message = message
        self.advice = advice
        self.busError = busError
    }

    /// The error `error` of the Bluetooth layer.
    package init(_ error: BlueZError) {
        let kind: Kind = switch error.kind {
        case .busUnavailable: .busUnavailable
        case .bluezNotRunning: .bluezNotRunning
        case .noAdapter: .noAdapter
        case .adapterOff: .adapterOff
        case .permission: .permission
        case .profileInUse: .profileInUse
        case .unknownDevice: .unknownDevice
        case .notPaired: .notPaired
        case .pairingRefused: .pairingRefused
        case .notAdvertised: .notAdvertised
        case .unreachable: .unreachable
        case .failed: .failed
        }
        self.init(kind, error.message, advice: error.advice, busError: error.busError.map { "\($0)" })
    }

    /// The message, then the advice after a semicolon.
    public var description: String { "\(message); \(advice)" }
}
