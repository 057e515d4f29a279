package import DBus
internal import IAPTransport

/// Why Bluetooth cannot be used, with the command that fixes it.
///
/// Decide on ``kind``, never on the message: the message is for people.
package struct BlueZError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What a caller can decide on.
    package enum Kind: String, Sendable, Hashable, Codable {
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
    package var kind: Kind
    /// What failed, e.g. "BlueZ (bluetoothd) is not running".
    package var message: String
    /// What to do next, with the command, e.g. "start it: systemctl start bluetooth".
    package var advice: String
    /// The D-Bus error behind it, when there was one.
    package var busError: BusError?

    /// An error of `kind` saying `message`, and what to do.
    package init(_ kind: Kind, _ message: String, advice: String, busError: BusError? = nil) {
        self.kind = kind
        self.message = message
        self.advice = advice
        self.busError = busError
    }

    /// The message, then the advice after a semicolon.
    package var description: String { "\(message); \(advice)" }

    static func bus(_ error: BusError, address: String) -> BlueZError {
        switch error.name {
        case BusError.fileNotFound, BusError.noServer:
            BlueZError(.busUnavailable, "no D-Bus system bus at \(address)",
                           advice: "start it: systemctl start dbus (Debian's dbus package)", busError: error)
        case BusError.accessDenied:
            permission(error)
        default:
            BlueZError(.failed, "cannot connect to the D-Bus bus at \(address): \(error)",
                           advice: "check that dbus-daemon runs (systemctl status dbus)", busError: error)
        }
    }

    static func permission(_ error: BusError) -> BlueZError {
        BlueZError(.permission, "the D-Bus policy does not let this user talk to BlueZ (\(error.message))",
                       advice: "run as root, or add the user to the bluetooth group (usermod -aG bluetooth USER, then log in again); "
                           + "BlueZ's policy is /etc/dbus-1/system.d/bluetooth.conf", busError: error)
    }

    /// A failed call to BlueZ, in BlueZ's terms.
    static func bluez(_ error: BusError, doing what: String, device: BluetoothAddress? = nil) -> BlueZError {
        let name = device.map(\.description) ?? "the device"
        switch error.name {
        case BusError.serviceUnknown, "org.freedesktop.DBus.Error.NameHasNoOwner":
            return BlueZError(.bluezNotRunning, "BlueZ (bluetoothd) is not running",
                                  advice: "start bluetoothd: systemctl start bluetooth (Debian's bluez package)", busError: error)
        case BusError.accessDenied, "org.bluez.Error.NotAuthorized":
            return permission(error)
        case BusError.disconnected:
            return BlueZError(.busUnavailable, "the D-Bus connection ended while \(what)",
                                  advice: "check that dbus-daemon runs (systemctl status dbus), then try again", busError: error)
        case BusError.noReply:
            return BlueZError(.unreachable, "BlueZ did not answer in time while \(what)",
                                  advice: "check that \(name) is on and in range, and that bluetoothd runs (systemctl status bluetooth)", busError: error)
        case "org.bluez.Error.NotPermitted", "org.bluez.Error.AlreadyExists":
            return BlueZError(.profileInUse, "another program registered the iAP2 profile with BlueZ (\(error.message))",
                                  advice: "stop it first (another iapctl, or the daemon: systemctl stop iapd)", busError: error)
        case "org.bluez.Error.NotReady":
            return BlueZError(.adapterOff, "the Bluetooth adapter is not ready (powered off)",
                                  advice: "power it on: bluetoothctl power on (and rfkill unblock bluetooth if it is blocked)", busError: error)
        case "org.bluez.Error.AuthenticationFailed", "org.bluez.Error.AuthenticationRejected", "org.bluez.Error.AuthenticationCanceled",
             "org.bluez.Error.AuthenticationTimeout", "org.bluez.Error.ConnectionAttemptFailed":
            return BlueZError(.pairingRefused, "pairing with \(name) was refused or failed (\(error.message))",
                                  advice: "pair again: bluetoothctl remove \(name); bluetoothctl pair \(name); bluetoothctl trust \(name)",
                                  busError: error)
        case "org.bluez.Error.NotAvailable", "org.bluez.Error.NotSupported":
            return BlueZError(.notAdvertised, "\(name) does not offer the iAP2 service (\(error.message))",
                                  advice: "check that the accessory is in iAP2 mode; bluetoothctl info \(name) lists its service UUIDs "
                                      + "(accessories advertise iAP2 as \(BluetoothProfile.accessoryIAP2UUID), some as \(BluetoothProfile.iAP2UUID))",
                                  busError: error)
        case "org.bluez.Error.DoesNotExist", BusError.unknownObject, BusError.unknownMethod:
            return BlueZError(.unknownDevice, "BlueZ knows no device \(name)",
                                  advice: "pair it first: bluetoothctl scan on, then bluetoothctl pair \(name)", busError: error)
        case "org.bluez.Error.InProgress", "org.bluez.Error.AlreadyConnected":
            return BlueZError(.failed, "\(name) is being connected already (\(error.message))",
                                  advice: "wait for that connection, or disconnect it: bluetoothctl disconnect \(name)", busError: error)
        case let name where name.hasPrefix("org.freedesktop.DBus.Error.Spawn.") || name.hasPrefix("org.freedesktop.systemd1."):
            // org.bluez is activatable on the system bus: the bus tried to start bluetoothd for
            // this call and could not (no systemd, the unit masked or failing).
            return BlueZError(.bluezNotRunning, "BlueZ (bluetoothd) is not running, and the bus could not start it (\(error.message))",
                                  advice: "start bluetoothd: systemctl start bluetooth; journalctl -u bluetooth says why it does not start",
                                  busError: error)
        default:
            if error.message.localizedHostDown {
                return BlueZError(.unreachable, "\(name) did not answer (\(error.message))",
                                      advice: "check that it is on, in range and not connected to another host, then try again", busError: error)
            }
            return BlueZError(.failed, "BlueZ failed \(what): \(error)",
                                  advice: "journalctl -u bluetooth shows what bluetoothd reports", busError: error)
        }
    }
}

extension String {
    /// BlueZ's Failed errors for a device that did not answer ("Host is down", "Page Timeout").
    fileprivate var localizedHostDown: Bool {
        let lower = lowercased()
        return lower.contains("host is down") || lower.contains("page timeout") || lower.contains("no route to host")
    }
}
