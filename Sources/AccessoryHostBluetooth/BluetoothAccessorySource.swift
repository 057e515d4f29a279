public import AccessoryHost
package import BluetoothTransport
public import IAPTransport
internal import Synchronization

/// Bluetooth as a source of accessories for an ``AccessoryHost/AccessoryManager``: the iAP2
/// profile registered with BlueZ over D-Bus, each RFCOMM connection BlueZ hands over run as a
/// connection of the manager. One per manager, made by
/// ``AccessoryHost/AccessoryManager/startBluetooth(options:)``.
public final class BluetoothAccessorySource: AccessorySource {
    /// The registration in force (nil until one succeeded), and whether the manager stopped.
    private let state = Mutex<(profile: BluetoothProfile?, stopped: Bool)>((nil, false))

    init() {}

    /// The iAP2 profile registered with BlueZ now, nil before the first registration.
    package var profile: BluetoothProfile? { state.withLock { $0.profile } }

    /// Closes every Bluetooth connection and leaves the bus (BlueZ then drops the profile).
    public func stop() {
        let profile = state.withLock { state -> BluetoothProfile? in
            state.stopped = true
            return state.profile
        }
        profile?.stop()
    }

    /// Whether a registration may be made now: none yet, or one BlueZ no longer holds, and the
    /// manager running.
    var acceptsRegistration: Bool { state.withLock { ($0.profile?.isReleased ?? true) && !$0.stopped } }

    /// Installs `profile` in place of a released registration (which is retired, its
    /// connections kept). False when the manager stopped or another live registration won.
    func install(_ profile: BluetoothProfile) -> Bool {
        let (installed, released) = state.withLock { state -> (Bool, BluetoothProfile?) in
            guard !state.stopped, state.profile?.isReleased ?? true else { return (false, nil) }
            defer { state.profile = profile }
            return (true, state.profile)
        }
        released?.retire()
        return installed
    }
}

extension AccessoryManager {
    /// Starts taking accessories over Bluetooth: the iAP2 service is registered with BlueZ
    /// (`org.bluez.ProfileManager1.RegisterProfile`, UUID `00000000-deca-fade-deca-deafdecacafe`,
    /// an RFCOMM channel and SDP record of BlueZ's), and every connection of a paired accessory
    /// BlueZ hands over is run like any other transport: the accessory is announced with
    /// transport `TransportKind.bluetooth` and `Accessory.bluetoothAddress`, once
    /// its identification declared a BluetoothTransportComponent with the connection's address.
    /// With ``BluetoothOptions/connectsOut``, ``connectBluetooth(to:)``
    /// connects out to a paired accessory, through the UUID accessories advertise
    /// (`00000000-deca-fade-deca-deafdecacaff`, PROTOCOL.md §7.11, for which a client profile is
    /// registered too) or the one above.
    ///
    /// - Throws: ``BluetoothError`` saying what to run: no D-Bus, BlueZ not
    ///   running (`systemctl start bluetooth`), no adapter, adapter off (`bluetoothctl power
    ///   on`), the D-Bus policy (the bluetooth group), the profile taken by another program.
    public func startBluetooth(options: BluetoothOptions = BluetoothOptions()) async throws(BluetoothError) {
        // A registration BlueZ no longer holds (released, or a bluetoothd that restarted) is
        // replaced, its open connections kept; a live one is not.
        guard let source = source(BluetoothAccessorySource.self, orAdd: { BluetoothAccessorySource() }), source.acceptsRegistration else {
            throw BluetoothError(.failed, "Bluetooth is started already (or the manager stopped)", advice: "start it once per manager")
        }
        let profile: BluetoothProfile
        do {
            profile = try await BluetoothProfile.register(options: options.profile, queue: queue) { [weak self] transport in
                self?.beginOpening().attach(transport)
            }
        } catch {
            throw BluetoothError(error)
        }
        guard source.install(profile) else {
            profile.stop()
            throw BluetoothError(.failed, "the manager stopped (or Bluetooth was started twice) while Bluetooth started", advice: "start it once per manager")
        }
        configuration.logger.info("Bluetooth: the iAP2 profile is registered with BlueZ at \(options.profilePath)")
    }

    /// Connects out to the paired accessory at `address` (BlueZ's `Device1.ConnectProfile` for
    /// the iAP2 UUID the accessory lists: its own `…caff`, which accessories advertise, before
    /// `…cafe`); it is announced like any accessory once identified. Needs
    /// ``startBluetooth(options:)`` with ``BluetoothOptions/connectsOut``.
    ///
    /// - Throws: ``BluetoothError``: not paired, pairing refused, iAP2 not
    ///   offered, not answering (each with the `bluetoothctl` command), Bluetooth not started.
    public func connectBluetooth(to address: BluetoothAddress) async throws(BluetoothError) {
        let uuid: String
        do {
            uuid = try await startedProfile().connect(to: address)
        } catch {
            throw BluetoothError(error)
        }
        configuration.logger.info("Bluetooth: connected out to \(address) through its iAP2 service \(uuid)")
    }

    /// Whether the iAP2 profile is registered with the BlueZ running now:
    /// ``startBluetooth(options:)`` succeeded, and since then BlueZ has neither released the
    /// profile nor stopped or restarted (a restarted bluetoothd forgets registrations without
    /// saying so). When this is false, ``startBluetooth(options:)`` may be called again.
    public func isBluetoothRegistered() async -> Bool {
        guard let profile = source(BluetoothAccessorySource.self)?.profile else { return false }
        return await profile.checkRegistration()
    }

    /// The Bluetooth devices with an open connection to this host, identified or not yet (those
    /// a registration that was replaced handed over included), sorted.
    public var bluetoothConnections: [BluetoothAddress] {
        Set(connectionCapabilities(BluetoothPeer.self).map(\.address)).sorted()
    }

    /// The devices BlueZ knows (paired or seen), for a person choosing one to connect to.
    ///
    /// - Throws: ``BluetoothError`` when Bluetooth is not started or BlueZ
    ///   cannot be asked.
    public func bluetoothDevices() async throws(BluetoothError) -> [BluetoothDevice] {
        do {
            return try await startedProfile().devices().map(BluetoothDevice.init)
        } catch {
            throw BluetoothError(error)
        }
    }

    private func startedProfile() throws(BlueZError) -> BluetoothProfile {
        guard let profile = source(BluetoothAccessorySource.self)?.profile else {
            throw BlueZError(.failed, "Bluetooth is not started", advice: "call startBluetooth(options:) first (iapctl --bluetooth)")
        }
        return profile
    }
}
