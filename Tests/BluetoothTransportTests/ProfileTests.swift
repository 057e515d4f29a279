import BluetoothTransport
import DBus
import Dispatch
import Glibc
import IAPTransport
import Synchronization
import TestSupport
import TestThreads
import Testing

let hostAdapter = FakeBlueZ.Adapter(name: "hci0", address: BluetoothAddress("00:AA:01:00:00:01")!, powered: true)
let pairedAccessory = FakeBlueZ.Device(adapter: "hci0", address: BluetoothAddress("00:1A:7D:DA:71:13")!, name: "Multi Sensor", paired: true,
                                       uuids: [BluetoothProfile.iAP2UUID])
/// An accessory as the field has them (PROTOCOL.md §7.11): its SDP record and EIR name only the
/// accessory's own UUID, `…caff`.
let wirelessIAPAccessory = FakeBlueZ.Device(adapter: "hci0", address: BluetoothAddress("00:1A:7D:DA:71:15")!, name: "Double 10-011105",
                                            paired: true, uuids: ["00001101-0000-1000-8000-00805f9b34fb", BluetoothProfile.accessoryIAP2UUID])
/// A paired device whose services BlueZ has not read (no UUIDs yet).
let unresolvedDevice = FakeBlueZ.Device(adapter: "hci0", address: BluetoothAddress("00:1A:7D:DA:71:16")!, name: "Unresolved", paired: true, uuids: [])
let strangerDevice = FakeBlueZ.Device(adapter: "hci0", address: BluetoothAddress("00:1A:7D:DA:71:14")!, name: "Stranger", paired: false, uuids: [])

/// A connected pair of stream sockets: (one end, the other end).
func socketPair() throws -> (Int32, Int32) {
    var ends: [Int32] = [-1, -1]
    guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &ends) == 0 else {
        throw BlueZError(.failed, "socketpair failed", advice: "")
    }
    return (ends[0], ends[1])
}

/// Waits for the first value `register` hands to its callback.
func firstValue<Value: Sendable>(_ register: (@escaping @Sendable (Value) -> Void) -> Void) async -> Value {
    await withCheckedContinuation { (continuation: CheckedContinuation<Value, Never>) in
        let done = Mutex(false)
        register { value in
            if !done.withLock({ state in defer { state = true }; return state }) { continuation.resume(returning: value) }
        }
    }
}

@Suite("Bluetooth addresses")
struct BluetoothAddressTests {
    @Test("parses, prints and names BlueZ's device objects")
    func parsing() throws {
        let address = try #require(BluetoothAddress("00:1a:7d:da:71:13"))
        #expect(address.description == "00:1A:7D:DA:71:13")
        #expect(address.bytes == [0x00, 0x1A, 0x7D, 0xDA, 0x71, 0x13])
        #expect(address.devicePathElement == "dev_00_1A_7D_DA_71_13")
        #expect(BluetoothAddress(devicePath: "/org/bluez/hci0/dev_00_1A_7D_DA_71_13") == address)
        #expect(BluetoothAddress(devicePath: "/org/bluez/hci0") == nil)
        for bad in ["", "00:1A:7D:DA:71", "00:1A:7D:DA:71:13:00", "0:1A:7D:DA:71:13", "00:1A:7D:DA:71:1G", "001A7DDA7113"] {
            #expect(BluetoothAddress(bad) == nil, "\(bad)")
        }
        #expect(address.matches(declared: [0x00, 0x1A, 0x7D, 0xDA, 0x71, 0x13]))
        #expect(address.matches(declared: [0x13, 0x71, 0xDA, 0x7D, 0x1A, 0x00]))
        #expect(!address.matches(declared: [0x00, 0x1A, 0x7D, 0xDA, 0x71, 0x14]))
    }
}

@Suite("The iAP2 profile with BlueZ (a stand-in bluetoothd on a private bus)", .timeLimit(.minutes(2)))
struct ProfileTests {
    private func options(_ bus: PrivateBus, connectsOut: Bool = false) -> BluetoothProfileOptions {
        BluetoothProfileOptions(busAddress: bus.address, connectsOut: connectsOut, callTimeout: .seconds(20))
    }

    @Test("registers the iAP2 UUID as a server with an RFCOMM channel BlueZ picks")
    func registration() async throws {
        let bus = try await PrivateBus.start()
        let bluez = try await FakeBlueZ.start(on: bus, adapters: [hostAdapter])
        let profile = try await BluetoothProfile.register(options: options(bus), queue: DispatchQueue(label: "host")) { _ in }
        let registration = try #require(bluez.state.withLock { $0.registrations.first })
        #expect(registration.uuid == "00000000-deca-fade-deca-deafdecacafe")
        #expect(registration.path == "/org/accessoryhost/iap2")
        #expect(registration.sender == profile.bus.uniqueName)
        #expect(registration.options["Role"] == .string("server"))
        #expect(registration.options["Channel"] == .uint16(0))
        #expect(registration.options["RequireAuthentication"] == .bool(true))
        #expect(registration.options["Name"] == .string("iAP2"))
        #expect(bluez.state.withLock { $0.registrations.count } == 1, "a host that only serves registers no client profile")
        // Connecting out needs the client role too: no Role option then.
        let both = BluetoothProfileOptions(busAddress: bus.address, connectsOut: true, profilePath: "/second").registrationOptions
        #expect(both.dictionary?["Role"] == nil)
        profile.stop()
        bluez.stop()
    }

    @Test("the pairing agent: registered as the default, NoInputNoOutput, Just Works accepted, PIN codes refused")
    func agent() async throws {
        let bus = try await PrivateBus.start()
        let bluez = try await FakeBlueZ.start(on: bus, adapters: [hostAdapter], devices: [pairedAccessory])
        var withAgent = options(bus)
        withAgent.registersAgent = true
        let profile = try await BluetoothProfile.register(options: withAgent, queue: DispatchQueue(label: "host")) { _ in }
        let agents = bluez.state.withLock { $0.agents }
        #expect(agents.map { $0.capability } == ["NoInputNoOutput"])
        #expect(agents.map { $0.sender } == [profile.bus.uniqueName])
        #expect(bluez.state.withLock { $0.defaultAgent } == BluetoothAgent.path)
        let device = BusValue.objectPath(pairedAccessory.path)
        #expect(try await bluez.askAgent("RequestConfirmation", arguments: [device, .uint32(123_456)]).isEmpty)
        #expect(try await bluez.askAgent("RequestAuthorization", arguments: [device]).isEmpty)
        #expect(try await bluez.askAgent("AuthorizeService", arguments: [device, .string(BluetoothProfile.iAP2UUID)]).isEmpty)
        do {
            _ = try await bluez.askAgent("RequestPinCode", arguments: [device])
            Issue.record("gave a PIN code")
        } catch {
            #expect((error as? BusError)?.name == "org.bluez.Error.Rejected")
        }
        profile.stop()
        bluez.stop()
    }

    @Test("each thing that stops Bluetooth is a typed error with the command that fixes it")
    func actionableErrors() async throws {
        let bus = try await PrivateBus.start()
        func attempt(_ options: BluetoothProfileOptions) async -> BlueZError? {
            do {
                let profile = try await BluetoothProfile.register(options: options, queue: DispatchQueue(label: "host")) { _ in }
                profile.stop()
                return nil
            } catch { return error }
        }
        // No bus at all.
        var error = await attempt(BluetoothProfileOptions(busAddress: "unix:path=/nonexistent/accessoryhost-bus"))
        #expect(error?.kind == .busUnavailable)
        #expect(error?.advice.contains("systemctl start dbus") == true)
        // The bus, but no bluetoothd on it.
        error = await attempt(options(bus))
        #expect(error?.kind == .bluezNotRunning)
        #expect(error?.advice.contains("systemctl start bluetooth") == true)
        // bluetoothd would be started on demand, and that failed (the system bus without systemd).
        var bluez = try await FakeBlueZ.start(on: bus, adapters: [])
        bluez.fail("GetManagedObjects", with: "org.freedesktop.DBus.Error.Spawn.ChildExited", message: "Launch helper exited with unknown return code 1")
        error = await attempt(options(bus))
        #expect(error?.kind == .bluezNotRunning)
        #expect(error?.advice.contains("systemctl start bluetooth") == true)
        try await bluez.stopReleasingName()
        // No adapter; an adapter powered off; the one named missing.
        bluez = try await FakeBlueZ.start(on: bus, adapters: [])
        error = await attempt(options(bus))
        #expect(error?.kind == .noAdapter)
        try await bluez.stopReleasingName()
        bluez = try await FakeBlueZ.start(on: bus, adapters: [FakeBlueZ.Adapter(name: "hci0", address: hostAdapter.address, powered: false)])
        error = await attempt(options(bus))
        #expect(error?.kind == .adapterOff)
        #expect(error?.advice.contains("bluetoothctl power on") == true)
        var named = options(bus)
        named.adapter = "hci7"
        error = await attempt(named)
        #expect(error?.kind == .noAdapter)
        #expect(error?.message.contains("hci0") == true)
        try await bluez.stopReleasingName()
        // The policy refuses; another program holds the UUID.
        bluez = try await FakeBlueZ.start(on: bus, adapters: [hostAdapter])
        bluez.fail("RegisterProfile", with: BusError.accessDenied, message: "Rejected send message")
        error = await attempt(options(bus))
        #expect(error?.kind == .permission)
        #expect(error?.advice.contains("bluetooth group") == true)
        bluez.fail("RegisterProfile", with: "org.bluez.Error.NotPermitted", message: "UUID already registered")
        error = await attempt(options(bus))
        #expect(error?.kind == .profileInUse)
        #expect(error?.description.contains("UUID already registered") == true)
        bluez.stop()
    }

    @Test("NewConnection becomes a Bluetooth transport whose bytes flow both ways; RequestDisconnection closes it", .ownThread)
    func newConnection() async throws {
        let bus = try await PrivateBus.start()
        let bluez = try await FakeBlueZ.start(on: bus, adapters: [hostAdapter], devices: [pairedAccessory])
        let queue = DispatchQueue(label: "host")
        let delivered = Mutex<[BluetoothTransport]>([])
        let profile = try await BluetoothProfile.register(options: options(bus), queue: queue) { transport in
            delivered.withLock { $0.append(transport) }
        }
        let (hostEnd, accessoryEnd) = try socketPair()
        defer { close(accessoryEnd) }
        try await bluez.newConnection(device: pairedAccessory, descriptor: hostEnd)
        close(hostEnd) // BlueZ gave its duplicate away; the profile holds its own
        let transport = try #require(delivered.withLock { $0.first })
        #expect(transport.kind == .bluetooth)
        #expect(transport.peer.address == pairedAccessory.address)
        #expect(transport.peer.adapter == "hci0")
        #expect(transport.peer.profileVersion == 0x0100)
        #expect(transport.description == "bluetooth 00:1A:7D:DA:71:13 (hci0)")
        #expect(transport.capability(BluetoothPeer.self)?.devicePath == pairedAccessory.path)

        let events = AsyncStream<TransportEvent>.makeStream()
        transport.activate(queue: queue) { events.continuation.yield($0) }
        queue.sync { transport.send([1, 2, 3]) }
        var back = [UInt8](repeating: 0, count: 3)
        #expect(read(accessoryEnd, &back, 3) == 3)
        #expect(back == [1, 2, 3])
        let reply: [UInt8] = [9, 8]
        #expect(write(accessoryEnd, reply, 2) == 2)
        var iterator = events.stream.makeAsyncIterator()
        guard case let .received(bytes)? = await iterator.next() else { Issue.record("no bytes"); return }
        #expect(bytes == [9, 8])

        try await bluez.requestDisconnection(device: pairedAccessory)
        guard case let .closed(reason)? = await iterator.next() else { Issue.record("not closed"); return }
        #expect(reason == nil)
        // The accessory's end sees the connection go.
        #expect(read(accessoryEnd, &back, 3) == 0)
        try await bluez.release()
        #expect(profile.isReleased)
        profile.stop()
        bluez.stop()
    }

    /// A connection handed over through the stand-in, ended by the accessory closing its end
    /// (first with `unread` bytes it never read, when given: Linux then resets the connection,
    /// ECONNRESET, as RFCOMM does when the link drops); what the transport closed with.
    private func closeReason(unread: [UInt8] = []) async throws -> TransportError? {
        let bus = try await PrivateBus.start()
        let bluez = try await FakeBlueZ.start(on: bus, adapters: [hostAdapter], devices: [pairedAccessory])
        let queue = DispatchQueue(label: "host")
        let delivered = Mutex<BluetoothTransport?>(nil)
        let profile = try await BluetoothProfile.register(options: options(bus), queue: queue) { transport in delivered.withLock { $0 = transport } }
        defer { profile.stop(); bluez.stop() }
        let (hostEnd, accessoryEnd) = try socketPair()
        try await bluez.newConnection(device: pairedAccessory, descriptor: hostEnd)
        if !unread.isEmpty { #expect(write(hostEnd, unread, unread.count) == unread.count) }
        close(hostEnd)
        let transport = try #require(delivered.withLock { $0 })
        return await firstValue { (done: @escaping @Sendable (TransportError?) -> Void) in
            transport.activate(queue: queue) { event in if case let .closed(error) = event { done(error) } }
            close(accessoryEnd)
        }
    }

    @Test("the accessory hanging up ends the transport with Bluetooth advice")
    func hangUp() async throws {
        let reason = try await closeReason()
        #expect(reason?.kind == .hungUp)
        #expect(reason?.message.contains("Bluetooth connection to 00:1A:7D:DA:71:13 ended") == true)
        #expect(reason?.advice?.contains("--bluetooth-connect 00:1A:7D:DA:71:13") == true)
    }

    @Test("the link lost under the channel (ECONNRESET, as when the accessory's controller goes off) is a hang-up with Bluetooth advice")
    func linkLost() async throws {
        let reason = try await closeReason(unread: [1, 2, 3, 4])
        #expect(reason?.errno == ECONNRESET, "\(String(describing: reason))")
        #expect(reason?.kind == .hungUp)
        #expect(reason?.message.contains("Bluetooth connection to 00:1A:7D:DA:71:13 was lost") == true)
        #expect(reason?.advice?.contains("went out of range") == true)
    }

    @Test("connecting out registers a client profile for the accessories' own UUID …caff beside the iAP2 service")
    func clientProfileForTheAccessoriesUUID() async throws {
        let bus = try await PrivateBus.start()
        let bluez = try await FakeBlueZ.start(on: bus, adapters: [hostAdapter])
        let profile = try await BluetoothProfile.register(options: options(bus, connectsOut: true), queue: DispatchQueue(label: "host")) { _ in }
        let registrations = bluez.state.withLock { $0.registrations }
        #expect(registrations.map(\.uuid) == ["00000000-deca-fade-deca-deafdecacafe", "00000000-deca-fade-deca-deafdecacaff"])
        #expect(registrations.map(\.path) == ["/org/accessoryhost/iap2", "/org/accessoryhost/iap2/accessory"])
        #expect(registrations.allSatisfy { $0.sender == profile.bus.uniqueName })
        let client = try #require(registrations.last)
        #expect(client.options["Role"] == .string("client"), "no record or server of the host's under the accessories' UUID")
        #expect(client.options["Channel"] == nil && client.options["ServiceRecord"] == nil)
        #expect(client.options["RequireAuthentication"] == .bool(true) && client.options["AutoConnect"] == .bool(false))
        profile.stop()
        bluez.stop()
    }

    @Test("devices offering iAP2 under either UUID are listed as offering it, the accessory's own first; connecting out uses the one the device lists")
    func listingAndConnectingByTheAccessorysUUID() async throws {
        let bus = try await PrivateBus.start()
        var both = pairedAccessory
        both.address = BluetoothAddress("00:1A:7D:DA:71:17")!
        both.uuids = [BluetoothProfile.iAP2UUID, BluetoothProfile.accessoryIAP2UUID.uppercased()]
        let bluez = try await FakeBlueZ.start(on: bus, adapters: [hostAdapter],
                                              devices: [pairedAccessory, wirelessIAPAccessory, unresolvedDevice, both, strangerDevice])
        let profile = try await BluetoothProfile.register(options: options(bus, connectsOut: true), queue: DispatchQueue(label: "host")) { _ in }
        let devices = try await profile.devices()
        #expect(devices.map(\.address) == [pairedAccessory.address, strangerDevice.address, wirelessIAPAccessory.address, unresolvedDevice.address,
                                            both.address])
        #expect(devices.map(\.offersIAP2) == [true, false, true, false, true])
        #expect(devices.map(\.iAP2ServiceUUIDs) == [[BluetoothProfile.iAP2UUID], [], [BluetoothProfile.accessoryIAP2UUID], [],
                                                     [BluetoothProfile.accessoryIAP2UUID, BluetoothProfile.iAP2UUID]])

        #expect(try await profile.connect(to: wirelessIAPAccessory.address) == BluetoothProfile.accessoryIAP2UUID)
        #expect(try await profile.connect(to: both.address) == BluetoothProfile.accessoryIAP2UUID)
        #expect(try await profile.connect(to: pairedAccessory.address) == BluetoothProfile.iAP2UUID)
        var calls = bluez.state.withLock { $0.connectProfileCalls }
        #expect(calls.map(\.uuid) == [BluetoothProfile.accessoryIAP2UUID, BluetoothProfile.accessoryIAP2UUID, BluetoothProfile.iAP2UUID])
        #expect(calls.map(\.device) == [wirelessIAPAccessory.path, both.path, pairedAccessory.path])

        // Services not read yet: both UUIDs in turn, then what to do.
        bluez.state.withLock { $0.connectProfileCalls.removeAll() }
        var failure: BlueZError?
        do { try await profile.connect(to: unresolvedDevice.address) } catch { failure = error }
        calls = bluez.state.withLock { $0.connectProfileCalls }
        #expect(calls.map(\.uuid) == BluetoothProfile.iAP2UUIDs)
        #expect(failure?.kind == .notAdvertised)
        #expect(failure?.message.contains("offers no iAP2 service BlueZ can connect to") == true)
        #expect(failure?.advice.contains("accessories advertise 00000000-deca-fade-deca-deafdecacaff") == true)
        #expect(failure?.advice.contains("bluetoothctl remove 00:1A:7D:DA:71:16") == true)
        // A failure other than "not available" is not retried under the other UUID.
        bluez.state.withLock { $0.connectProfileCalls.removeAll() }
        bluez.fail("ConnectProfile", with: "org.bluez.Error.Failed", message: "Page Timeout")
        do { try await profile.connect(to: unresolvedDevice.address) } catch { failure = error }
        #expect(failure?.kind == .unreachable)
        #expect(bluez.state.withLock { $0.connectProfileCalls }.count == 1)
        // Refused for now (BlueZ's br-connection-refused): tried again, three times in all.
        bluez.state.withLock { $0.connectProfileCalls.removeAll() }
        bluez.fail("ConnectProfile", with: "org.bluez.Error.Failed", message: "br-connection-refused")
        failure = nil
        do { try await profile.connect(to: unresolvedDevice.address) } catch { failure = error }
        #expect(failure != nil)
        #expect(bluez.state.withLock { $0.connectProfileCalls }.count == BluetoothProfile.connectAttempts)
        profile.stop()
        bluez.stop()
    }

    @Test("the accessory side advertises only …caff: a server profile with its own record, RFCOMM channel and no authorization")
    func accessoryAdvertisement() async throws {
        let bus = try await PrivateBus.start()
        let accessoryAdapter = FakeBlueZ.Adapter(name: "hci1", address: BluetoothAddress("00:AA:01:00:00:02")!, powered: true)
        let bluez = try await FakeBlueZ.start(on: bus, adapters: [hostAdapter, accessoryAdapter])
        let connections = AsyncStream<BluetoothTransport>.makeStream()
        let service = try await BluetoothProfile.advertiseAccessory(channel: 9, busAddress: bus.address, queue: DispatchQueue(label: "accessory")) {
            connections.continuation.yield($0)
        }
        let registration = try bluez.requireRegistration(uuid: BluetoothProfile.accessoryRecordUUID)
        #expect(registration.path == "/org/accessoryhost/accessory")
        #expect(registration.options["Role"] == .string("server") && registration.options["Channel"] == .uint16(9))
        #expect(registration.options["RequireAuthorization"] == .bool(false) && registration.options["RequireAuthentication"] == .bool(false))
        let record = try #require(registration.options["ServiceRecord"]?.string)
        #expect(record.contains("<uuid value=\"00000000-deca-fade-deca-deafdecacaff\" />"))
        #expect(!record.contains("cafe"), "only the accessory's own UUID is advertised")
        #expect(record.contains("<uint8 value=\"0x09\" />") && record.contains("<uuid value=\"0x1002\" />") && record.contains("Wireless iAP"))
        #expect(bluez.state.withLock { $0.registrations.count } == 1)
        #expect(try await service.adapterAddresses() == ["hci0": hostAdapter.address, "hci1": accessoryAdapter.address])
        // A host connecting in on hci1 is handed over.
        let (ours, theirs) = try socketPair()
        let host = FakeBlueZ.Device(adapter: "hci1", address: hostAdapter.address, name: "Host", paired: true, uuids: [])
        try await bluez.newConnection(device: host, descriptor: ours, uuid: BluetoothProfile.accessoryRecordUUID)
        close(ours)
        var incoming = connections.stream.makeAsyncIterator()
        let transport = try #require(await incoming.next())
        #expect(transport.peer.address == hostAdapter.address && transport.peer.adapter == "hci1")
        transport.cancel()
        close(theirs)
        await #expect(throws: BlueZError.self) {
            try await BluetoothProfile.advertiseAccessory(channel: 31, busAddress: bus.address, queue: DispatchQueue(label: "x")) { _ in }
        }
        service.stop()
        bluez.stop()
    }

    @Test("connecting out: unknown, unpaired and refused devices say which bluetoothctl command to run")
    func connectingOut() async throws {
        let bus = try await PrivateBus.start()
        let bluez = try await FakeBlueZ.start(on: bus, adapters: [hostAdapter], devices: [pairedAccessory, strangerDevice])
        let serverOnly = try await BluetoothProfile.register(options: options(bus), queue: DispatchQueue(label: "host")) { _ in }
        await #expect(throws: BlueZError.self) { try await serverOnly.connect(to: pairedAccessory.address) }
        serverOnly.stop()
        bluez.state.withLock { $0.registrations.removeAll() }

        let profile = try await BluetoothProfile.register(options: options(bus, connectsOut: true), queue: DispatchQueue(label: "host")) { _ in }
        let devices = try await profile.devices()
        #expect(devices.map(\.address) == [pairedAccessory.address, strangerDevice.address])
        #expect(devices.map(\.offersIAP2) == [true, false])
        #expect(devices.map(\.paired) == [true, false])

        try await profile.connect(to: pairedAccessory.address)
        let calls = bluez.state.withLock { $0.connectProfileCalls }
        #expect(calls.map { $0.device } == [pairedAccessory.path])
        #expect(calls.map { $0.uuid } == [BluetoothProfile.iAP2UUID])

        func failure(_ address: BluetoothAddress) async -> BlueZError? {
            do { try await profile.connect(to: address) } catch { return error }
            return nil
        }
        var error = await failure(BluetoothAddress("11:22:33:44:55:66")!)
        #expect(error?.kind == .unknownDevice)
        #expect(error?.advice.contains("bluetoothctl pair 11:22:33:44:55:66") == true)
        error = await failure(strangerDevice.address)
        #expect(error?.kind == .notPaired)
        #expect(error?.advice.contains("bluetoothctl pair 00:1A:7D:DA:71:14") == true)
        bluez.fail("ConnectProfile", with: "org.bluez.Error.AuthenticationRejected")
        error = await failure(pairedAccessory.address)
        #expect(error?.kind == .pairingRefused)
        #expect(error?.advice.contains("bluetoothctl remove 00:1A:7D:DA:71:13") == true)
        bluez.fail("ConnectProfile", with: "org.bluez.Error.Failed", message: "Host is down")
        error = await failure(pairedAccessory.address)
        #expect(error?.kind == .unreachable)
        bluez.fail("ConnectProfile", with: "org.bluez.Error.NotAvailable", message: "Operation currently not available")
        error = await failure(pairedAccessory.address)
        #expect(error?.kind == .notAdvertised)
        profile.stop()
        bluez.stop()
    }
}
