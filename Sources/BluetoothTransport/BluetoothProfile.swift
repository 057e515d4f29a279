package import DBus
package import Dispatch
package import IAPTransport
internal import Synchronization

/// How the iAP2 service is offered through BlueZ.
package struct BluetoothProfileOptions: Sendable, Hashable {
    /// The D-Bus bus BlueZ is on; nil for the system bus (``BusConnection/systemBusAddress``).
    package var busAddress: String?
    /// The RFCOMM channel of the service (1–30), or 0 for one BlueZ picks (the kernel's first
    /// free channel), which the SDP record then names. BlueZ opens no RFCOMM server at all for
    /// a vendor UUID without this option, so it is always sent.
    package var channel: UInt16
    /// Whether the host may also connect out to paired accessories
    /// (``BluetoothProfile/connect(to:)``): BlueZ then registers the profile in both roles
    /// (no `Role` option), and a second profile registers the accessories' own UUID
    /// (``BluetoothProfile/accessoryIAP2UUID``, PROTOCOL.md §7.11) as a client at
    /// ``accessoryProfilePath``, which is what BlueZ needs to look for that UUID on a device and
    /// connect to it; otherwise `Role` is `server` and only accessories connect.
    package var connectsOut: Bool
    /// Whether a connection needs a paired (authenticated) link (`RequireAuthentication`).
    package var requireAuthentication: Bool
    /// Whether BlueZ asks its agent before handing over a connection of a device that is not
    /// trusted (`RequireAuthorization`); off by default, so a paired accessory is enough.
    package var requireAuthorization: Bool
    /// The service's name in its SDP record.
    package var serviceName: String
    /// Only connections through this adapter (e.g. `hci0`); nil for any.
    package var adapter: String?
    /// The object path the profile is served at.
    package var profilePath: String
    /// How long each call to BlueZ may take (connecting out includes the SDP search and paging).
    package var callTimeout: Duration
    /// Whether to serve a pairing agent too (``BluetoothAgent``: Just Works accepted, as a host
    /// without a screen does), for machines where no other agent (a desktop's) answers BlueZ.
    package var registersAgent: Bool

    /// Options; every parameter has the default a host usually wants.
    package init(busAddress: String? = nil, channel: UInt16 = 0, connectsOut: Bool = false, requireAuthentication: Bool = true,
                requireAuthorization: Bool = false, serviceName: String = "iAP2", adapter: String? = nil,
                profilePath: String = "/org/accessoryhost/iap2", callTimeout: Duration = .seconds(30), registersAgent: Bool = false) {
        self.registersAgent = registersAgent
        self.busAddress = busAddress
        self.channel = channel
        self.connectsOut = connectsOut
        self.requireAuthentication = requireAuthentication
        self.requireAuthorization = requireAuthorization
        self.serviceName = serviceName
        self.adapter = adapter
        self.profilePath = profilePath
        self.callTimeout = callTimeout
    }

    /// The object path of the client profile for the accessories' UUID (with ``connectsOut``):
    /// ``profilePath`` with `/accessory` after it.
    package var accessoryProfilePath: String { profilePath + "/accessory" }

    /// The `RegisterProfile` options of the client profile for the accessories' UUID: `Role`
    /// `client` (no SDP record, no RFCOMM server of the host's under that UUID: BlueZ searches
    /// the device's SDP records for it and connects to the channel found), the name and the
    /// security of ``registrationOptions``.
    package var accessoryRegistrationOptions: BusValue {
        .dictionary([
            "Name": .string(serviceName + " (accessory)"),
            "Role": .string("client"),
            "RequireAuthentication": .bool(requireAuthentication),
            "RequireAuthorization": .bool(requireAuthorization),
            "AutoConnect": .bool(false),
        ])
    }

    /// The `RegisterProfile` options (BlueZ's `org.bluez.ProfileManager1`).
    package var registrationOptions: BusValue {
        var options: [String: BusValue] = [
            "Name": .string(serviceName),
            "Channel": .uint16(channel),
            "RequireAuthentication": .bool(requireAuthentication),
            "RequireAuthorization": .bool(requireAuthorization),
            "AutoConnect": .bool(false),
        ]
        if !connectsOut { options["Role"] = .string("server") }
        return .dictionary(options)
    }
}

/// A Bluetooth device BlueZ knows.
package struct BlueZDevice: Sendable, Hashable {
    /// Its address.
    package var address: BluetoothAddress
    /// Its name (or alias), as BlueZ has it.
    package var name: String
    /// Whether it is paired.
    package var paired: Bool
    /// Whether it is connected now (any profile).
    package var connected: Bool
    /// Whether its SDP records (as BlueZ last read them) offer iAP2 under either UUID: the
    /// accessory's own (``BluetoothProfile/accessoryIAP2UUID``, what accessories advertise) or
    /// ``BluetoothProfile/iAP2UUID``.
    package var offersIAP2: Bool { !iAP2ServiceUUIDs.isEmpty }
    /// The iAP2 UUIDs among its service UUIDs, lower-case, the accessory's own first: what
    /// ``BluetoothProfile/connect(to:)`` connects to, in this order.
    package var iAP2ServiceUUIDs: [String]
    /// BlueZ's object for it.
    package var path: String
}

/// The iAP2 service registered with BlueZ over D-Bus (`org.bluez.ProfileManager1.RegisterProfile`
/// with UUID ``iAP2UUID``, and a client profile for ``accessoryIAP2UUID`` when the host connects
/// out), serving `org.bluez.Profile1`: BlueZ hands each accessory connection
/// over as a socket (`NewConnection`), which becomes a ``BluetoothTransport`` given to the
/// owner; `RequestDisconnection` closes that device's transports; `Release` means BlueZ
/// dropped the profile.
///
/// Leaving the bus unregisters the profile (BlueZ watches its owner), so ``stop()`` only closes
/// the connection and the transports. Thread safety: any thread; the profile's work runs on
/// the bus connection's queue.
package final class BluetoothProfile: Sendable {
    /// iAP2's SDP service class UUID of PROTOCOL.md §2 (the wireless CarPlay sources', where the
    /// head unit connects to the phone): the service this host registers and serves, to which
    /// accessories connect in.
    package static let iAP2UUID = "00000000-deca-fade-deca-deafdecacafe"
    /// The UUID accessories advertise their iAP service under, in their extended inquiry
    /// response and SDP record ("Wireless iAP", PROTOCOL.md §7.11: the Double 2 robot's
    /// capture shows only this one): the service the Apple device, and so this host, connects
    /// out to.
    package static let accessoryIAP2UUID = "00000000-deca-fade-deca-deafdecacaff"
    /// Both iAP2 UUIDs in the order ``connect(to:)`` tries them: the accessory's own first.
    package static let iAP2UUIDs = [accessoryIAP2UUID, iAP2UUID]
    /// The BlueZ service's bus name.
    package static let bluezService = "org.bluez"

    /// The options it was registered with.
    package let options: BluetoothProfileOptions
    /// The bus connection it runs on.
    package let bus: BusConnection
    private let state = Mutex(State())

    private struct State {
        var transports: [String: [ObjectIdentifier: BluetoothTransport]] = [:]
        var released = false
        var stopped = false
        /// The unique bus name of the BlueZ the profile was registered with.
        var bluezOwner: String?
    }

    private init(options: BluetoothProfileOptions, bus: BusConnection) {
        self.options = options
        self.bus = bus
    }

    /// Connects to the bus, checks that BlueZ runs and has a powered adapter, serves the profile
    /// object and registers it; `connection` then runs on `queue` for every accessory BlueZ
    /// hands over (the transport is not activated yet).
    ///
    /// - Throws: ``BlueZError`` with the fix: no bus, BlueZ not running, no adapter, adapter
    ///   off, the D-Bus policy, the profile registered by another program.
    package static func register(options: BluetoothProfileOptions = BluetoothProfileOptions(), queue: DispatchQueue,
                                connection: @escaping @Sendable (BluetoothTransport) -> Void) async throws(BlueZError) -> BluetoothProfile {
        var registrations = [Registration(path: options.profilePath, uuid: iAP2UUID, options: options.registrationOptions,
                                          what: "registering the iAP2 profile")]
        if options.connectsOut {
            registrations.append(Registration(path: options.accessoryProfilePath, uuid: accessoryIAP2UUID,
                                              options: options.accessoryRegistrationOptions,
                                              what: "registering the client profile for accessories' iAP2 UUID \(accessoryIAP2UUID)"))
        }
        return try await register(options: options, registrations: registrations, queue: queue, connection: connection)
    }

    /// One profile object to serve and register: its path, UUID and `RegisterProfile` options,
    /// and what registering it is called in an error.
    struct Registration {
        var path: String
        var uuid: String
        var options: BusValue
        var what: String
    }

    /// Connects, checks the adapters, serves each registration's object and registers it; every
    /// object's connections go to `connection`.
    static func register(options: BluetoothProfileOptions, registrations: [Registration], queue: DispatchQueue,
                         connection: @escaping @Sendable (BluetoothTransport) -> Void) async throws(BlueZError) -> BluetoothProfile {
        let address = options.busAddress ?? BusConnection.systemBusAddress
        let bus: BusConnection
        do { bus = try await BusConnection.connect(address: address, queue: queue) } catch { throw BlueZError.bus(error, address: address) }
        let profile = BluetoothProfile(options: options, bus: bus)
        do throws(BlueZError) {
            try await profile.checkAdapters()
            if options.registersAgent { try await BluetoothAgent.register(on: bus, timeout: options.callTimeout) }
            for registration in registrations {
                do {
                    try bus.export(path: registration.path) { [weak profile] call in
                        profile?.handle(call, deliver: connection) ?? .error(name: "org.bluez.Error.Rejected", message: "the host stopped")
                    }
                } catch {
                    throw BlueZError(.failed, "cannot serve the profile at \(registration.path): \(error)",
                                         advice: "choose another profile path", busError: error)
                }
                do {
                    _ = try await bus.call(destination: bluezService, path: "/org/bluez", interface: "org.bluez.ProfileManager1", member: "RegisterProfile",
                                           arguments: [.objectPath(registration.path), .string(registration.uuid), registration.options],
                                           timeout: options.callTimeout)
                } catch {
                    throw BlueZError.bluez(error, doing: registration.what)
                }
            }
        } catch {
            bus.close()
            throw error
        }
        if case let .owner(name) = await profile.bluezOwner() { profile.state.withLock { $0.bluezOwner = name } }
        return profile
    }

    /// Who owns `org.bluez` on the bus now.
    private enum Owner { case owner(String), none, unknown }

    /// The unique name that owns `org.bluez` now: `.none` when the bus says nobody does,
    /// `.unknown` when the question failed otherwise (a timeout).
    private func bluezOwner() async -> Owner {
        do {
            let reply = try await bus.call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
                                           member: "GetNameOwner", arguments: [.string(Self.bluezService)], timeout: options.callTimeout)
            return reply.first?.string.map(Owner.owner) ?? .unknown
        } catch where error.name == "org.freedesktop.DBus.Error.NameHasNoOwner" {
            return .none
        } catch {
            return .unknown
        }
    }

    /// Whether the registration still stands with the BlueZ running now: false once BlueZ
    /// released the profile, the bus connection dropped, or bluetoothd stopped or restarted
    /// since (a BlueZ that restarts forgets every profile without calling `Release`); the
    /// profile then counts as released (``isReleased``) and a new registration is needed.
    package func checkRegistration() async -> Bool {
        guard !isReleased else { return false }
        let current = bus.isConnected ? await bluezOwner() : .none
        return state.withLock { state in
            switch current {
            case .none:
                state.released = true
            case let .owner(name):
                // An owner not learnt at registration (the question failed then) is taken as
                // the one registered with.
                if state.bluezOwner == nil { state.bluezOwner = name }
                if name != state.bluezOwner { state.released = true }
            case .unknown:
                break // a question that failed says nothing either way
            }
            return !state.released
        }
    }

    /// The adapters (controllers) BlueZ has: at least one, and the one asked for, powered.
    private func checkAdapters() async throws(BlueZError) {
        let objects = try await managedObjects(doing: "listing adapters")
        var adapters: [(name: String, powered: Bool)] = []
        for (path, interfaces) in objects {
            guard let adapter = interfaces["org.bluez.Adapter1"]?.dictionary else { continue }
            adapters.append((String(path.split(separator: "/").last ?? ""), adapter["Powered"]?.bool ?? false))
        }
        adapters.sort { $0.name < $1.name }
        if let wanted = options.adapter {
            guard let adapter = adapters.first(where: { $0.name == wanted }) else {
                throw BlueZError(.noAdapter, "BlueZ has no adapter \(wanted)" + (adapters.isEmpty ? "" : " (it has \(adapters.map(\.name).joined(separator: ", ")))"),
                                     advice: "bluetoothctl list shows the adapters; plug the adapter in, or name one of those")
            }
            guard adapter.powered else {
                throw BlueZError(.adapterOff, "the Bluetooth adapter \(wanted) is powered off",
                                     advice: "power it on: bluetoothctl select \(wanted), then bluetoothctl power on (rfkill unblock bluetooth if it is blocked)")
            }
        } else {
            guard !adapters.isEmpty else {
                throw BlueZError(.noAdapter, "BlueZ has no Bluetooth adapter",
                                     advice: "plug one in (bluetoothctl list shows them; rfkill list shows a blocked one: rfkill unblock bluetooth)")
            }
            guard adapters.contains(where: \.powered) else {
                throw BlueZError(.adapterOff, "the Bluetooth adapter is powered off (\(adapters.map(\.name).joined(separator: ", ")))",
                                     advice: "power it on: bluetoothctl power on (rfkill unblock bluetooth if it is blocked)")
            }
        }
    }

    /// BlueZ's objects: path → interface → properties.
    func managedObjects(doing what: String) async throws(BlueZError) -> [String: [String: BusValue]] {
        let reply: [BusValue]
        do {
            reply = try await bus.call(destination: Self.bluezService, path: "/", interface: "org.freedesktop.DBus.ObjectManager",
                                       member: "GetManagedObjects", timeout: options.callTimeout)
        } catch {
            throw BlueZError.bluez(error, doing: what)
        }
        var objects: [String: [String: BusValue]] = [:]
        for (path, interfaces) in reply.first?.dictionary ?? [:] {
            var byName: [String: BusValue] = [:]
            for (name, properties) in interfaces.dictionary ?? [:] { byName[name] = properties }
            objects[path] = byName
        }
        return objects
    }

    /// The devices BlueZ knows (on ``BluetoothProfileOptions/adapter`` when set), sorted by address.
    ///
    /// - Throws: ``BlueZError`` when BlueZ cannot be asked.
    package func devices() async throws(BlueZError) -> [BlueZDevice] {
        let objects = try await managedObjects(doing: "listing devices")
        var devices: [BlueZDevice] = []
        for (path, interfaces) in objects {
            guard let device = interfaces["org.bluez.Device1"]?.dictionary,
                  let address = device["Address"]?.string.flatMap({ BluetoothAddress($0) }) ?? BluetoothAddress(devicePath: path)
            else { continue }
            if let adapter = options.adapter, !path.hasPrefix("/org/bluez/\(adapter)/") { continue }
            let uuids = (device["UUIDs"]?.elements ?? []).compactMap(\.string).map { $0.lowercased() }
            devices.append(BlueZDevice(address: address, name: device["Alias"]?.string ?? device["Name"]?.string ?? "",
                                           paired: device["Paired"]?.bool ?? false, connected: device["Connected"]?.bool ?? false,
                                           iAP2ServiceUUIDs: Self.iAP2UUIDs.filter(uuids.contains), path: path))
        }
        return devices.sorted { $0.address < $1.address }
    }

    /// Connects out to the paired accessory at `address` that offers iAP2 (BlueZ's
    /// `Device1.ConnectProfile`: an SDP search for the UUID, then RFCOMM to its channel). The
    /// connection arrives like an incoming one, through the registration's handler.
    ///
    /// The UUID is the one the device lists: the accessory's own (``accessoryIAP2UUID``, what
    /// accessories advertise, PROTOCOL.md §7.11) before ``iAP2UUID``. A device whose services
    /// BlueZ has not read yet (or that lists neither) is tried with both in that order; the
    /// second is tried only when BlueZ says the first is not available there.
    ///
    /// - Returns: the UUID connected through.
    /// - Throws: ``BlueZError``: not known or not paired (with the `bluetoothctl` commands),
    ///   pairing refused, iAP2 not offered, not answering; or the profile registered without
    ///   ``BluetoothProfileOptions/connectsOut``.
    @discardableResult
    package func connect(to address: BluetoothAddress) async throws(BlueZError) -> String {
        guard options.connectsOut else {
            throw BlueZError(.failed, "the iAP2 profile was registered to accept connections only",
                                 advice: "start Bluetooth with connectsOut (iapctl --bluetooth-connect does)")
        }
        let known = try await devices()
        guard let device = known.first(where: { $0.address == address }) else {
            throw BlueZError(.unknownDevice, "BlueZ knows no device \(address)",
                                 advice: "pair it first: bluetoothctl scan on, then bluetoothctl pair \(address) and bluetoothctl trust \(address)")
        }
        guard device.paired else {
            throw BlueZError(.notPaired, "\(address) (\(device.name)) is not paired",
                                 advice: "pair it: bluetoothctl pair \(address), then bluetoothctl trust \(address)")
        }
        let uuids = device.offersIAP2 ? device.iAP2ServiceUUIDs : Self.iAP2UUIDs
        var refusals: [String] = []
        for uuid in uuids {
            var attempt = 1
            while true {
                do {
                    _ = try await bus.call(destination: Self.bluezService, path: device.path, interface: "org.bluez.Device1", member: "ConnectProfile",
                                           arguments: [.string(uuid)], timeout: options.callTimeout)
                    return uuid
                } catch {
                    if attempt < Self.connectAttempts, Self.isTransientRefusal(error.message) {
                        // Refused for now (seen just after pairing, while the pairing's own
                        // link goes down): a phone tries again, and so does the host.
                        attempt += 1
                        try? await Task.sleep(for: .milliseconds(500))
                        continue
                    }
                    let failure = BlueZError.bluez(error, doing: "connecting to \(address) (service \(uuid))", device: address)
                    guard failure.kind == .notAdvertised else { throw failure }
                    refusals.append("\(uuid): \(error.message)")
                    if uuid == uuids.last {
                        throw BlueZError(.notAdvertised, "\(address) (\(device.name)) offers no iAP2 service BlueZ can connect to (\(refusals.joined(separator: "; ")))",
                                         advice: "check that the accessory is on and in iAP2 mode; bluetoothctl info \(address) lists its "
                                             + "service UUIDs (accessories advertise \(Self.accessoryIAP2UUID)); if it was paired before "
                                             + "it advertised one, pair it again: bluetoothctl remove \(address), then bluetoothctl pair \(address)",
                                         busError: error)
                    }
                    break
                }
            }
        }
        throw BlueZError(.notAdvertised, "\(address) offers no iAP2 service", advice: "check that the accessory is in iAP2 mode")
    }

    /// How many times a connection the device refused for now is tried (`isTransientRefusal`),
    /// half a second apart.
    package static let connectAttempts = 3

    /// BlueZ's reasons for a refused connection that may well succeed a moment later
    /// (`br-connection-refused`, `br-connection-busy`).
    static func isTransientRefusal(_ message: String) -> Bool {
        message.contains("br-connection-refused") || message.contains("br-connection-busy")
    }

    /// Whether BlueZ released the profile (`Release`): no more connections come.
    package var isReleased: Bool { state.withLock { $0.released } }

    /// The devices with a connection BlueZ handed over that is still open (identified or not
    /// yet), sorted.
    package var connectedAddresses: [BluetoothAddress] {
        state.withLock { state in state.transports.keys.compactMap { BluetoothAddress(devicePath: $0) } }.sorted()
    }

    /// Leaves the bus and keeps the connections already handed over open: for a registration
    /// BlueZ no longer holds (``checkRegistration()`` false) that a new one replaces; the
    /// RFCOMM sockets are the kernel's and outlive a restarted bluetoothd.
    package func retire() {
        state.withLock { $0.released = true }
        bus.close()
    }

    /// Closes every transport and leaves the bus (BlueZ then drops the profile).
    package func stop() {
        let transports = state.withLock { state -> [BluetoothTransport] in
            state.stopped = true
            defer { state.transports.removeAll() }
            return state.transports.values.flatMap(\.values)
        }
        for transport in transports { transport.cancel() }
        bus.close()
    }

    // MARK: org.bluez.Profile1, on the bus's queue

    private func handle(_ call: BusMethodCall, deliver: @Sendable (BluetoothTransport) -> Void) -> BusReply {
        switch (call.interface, call.member) {
        case ("org.bluez.Profile1", "NewConnection"), ("", "NewConnection"):
            return newConnection(call.arguments, deliver: deliver)
        case ("org.bluez.Profile1", "RequestDisconnection"), ("", "RequestDisconnection"):
            guard let path = call.arguments.first?.string else { return .error(name: "org.bluez.Error.InvalidArguments", message: "no device") }
            let transports = state.withLock { $0.transports.removeValue(forKey: path).map { Array($0.values) } ?? [] }
            for transport in transports { transport.cancel() }
            return .empty
        case ("org.bluez.Profile1", "Release"), ("", "Release"):
            state.withLock { $0.released = true }
            return .empty
        default:
            return .error(name: BusError.unknownMethod, message: "no method \(call.member) of \(call.interface)")
        }
    }

    private func newConnection(_ arguments: [BusValue], deliver: @Sendable (BluetoothTransport) -> Void) -> BusReply {
        guard arguments.count >= 2, let path = arguments[0].string, case let .unixFD(descriptor) = arguments[1] else {
            return .error(name: "org.bluez.Error.InvalidArguments", message: "expected (object device, fd, dict properties)")
        }
        guard let address = BluetoothAddress(devicePath: path) else {
            return .error(name: "org.bluez.Error.Rejected", message: "\(path) is not a device")
        }
        if let adapter = options.adapter, !path.hasPrefix("/org/bluez/\(adapter)/") {
            return .error(name: "org.bluez.Error.Rejected", message: "only connections through \(adapter) are taken")
        }
        let version = arguments.count > 2 ? arguments[2].dictionary?["Version"]?.integer.flatMap(UInt16.init(exactly:)) : nil
        guard !state.withLock({ $0.stopped }), let socket = descriptor.take() else {
            return .error(name: "org.bluez.Error.Rejected", message: "the host stopped")
        }
        let box = TransportKey()
        let transport: BluetoothTransport
        do {
            transport = try BluetoothTransport(descriptor: socket, peer: BluetoothPeer(address: address, devicePath: path, profileVersion: version)) {
                [weak self] in
                guard let self, let key = box.key.withLock({ $0 }) else { return }
                state.withLock { state in
                    state.transports[path]?.removeValue(forKey: key)
                    if state.transports[path]?.isEmpty == true { state.transports.removeValue(forKey: path) }
                }
            }
        } catch {
            return .error(name: "org.bluez.Error.Rejected", message: error.description)
        }
        box.key.withLock { $0 = ObjectIdentifier(transport) }
        state.withLock { $0.transports[path, default: [:]][ObjectIdentifier(transport)] = transport }
        deliver(transport)
        return .empty
    }
}

/// The key a transport's close handler removes it by, set once the transport exists: set on the
/// bus queue, read on the transport's, so under a lock.
private final class TransportKey: Sendable {
    let key = Mutex<ObjectIdentifier?>(nil)
}
