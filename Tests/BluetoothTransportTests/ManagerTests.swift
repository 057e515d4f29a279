import AccessoryHost
import AccessoryHostBluetooth
import AccessorySimulator
import BluetoothTransport
import Dispatch
import Glibc
import IAPLink
import IAPTransport
import TestSupport
import Testing

/// The whole path in process: the manager registers with the stand-in BlueZ, which hands it one
/// end of a socket pair as a new connection; the simulator runs on the other end.
@Suite("Accessories over Bluetooth (a stand-in bluetoothd handing over a socket pair)", .timeLimit(.minutes(2)))
struct BluetoothManagerTests {
    static func pattern(_ count: Int, seed: UInt64) -> [UInt8] {
        var generator = SplitMix64(seed: seed)
        return generator.bytes(count)
    }

    static func echo(_ session: AccessorySession, _ payload: [UInt8]) async throws -> [UInt8] {
        async let sent: Void = {
            var offset = 0
            while offset < payload.count {
                let end = min(payload.count, offset + 40_000)
                try await session.write(payload[offset..<end])
                offset = end
            }
        }()
        var received: [UInt8] = []
        while received.count < payload.count, let bytes = try await session.read(maxBytes: 1 << 16) { received += bytes }
        try await sent
        return received
    }

    /// A manager with Bluetooth started and a simulated accessory connected through the stand-in,
    /// with the manager's events subscribed to before the accessory connected.
    static func connect(declaring declared: BluetoothAddress?, bus: PrivateBus, bluez: FakeBlueZ, answerTimeout: Duration = .seconds(10))
        async throws -> (AccessoryManager, SimulatorRunner, AsyncStream<AccessoryEvent>) {
        var configuration = AccessoryManager.Configuration(supportedProtocols: ["com.example.echo"], answerTimeout: answerTimeout)
        configuration.daemon = .never
        let manager = AccessoryManager(configuration: configuration)
        try await manager.startBluetooth(options: BluetoothOptions(busAddress: bus.address, connectsOut: true))
        // Subscribed before the accessory exists: `events` carries only what happens after the
        // call, and the host may finish with the accessory before this task runs again.
        let events = manager.events
        let (runner, _) = try await accessory(declaring: declared, bluez: bluez)
        return (manager, runner, events)
    }

    /// A simulated accessory on a new socket pair, handed to the host through the stand-in;
    /// returns it and its end of the wire.
    static func accessory(declaring declared: BluetoothAddress?, bluez: FakeBlueZ) async throws -> (SimulatorRunner, SerialTransport) {
        let (hostEnd, accessoryEnd) = try socketPair()
        var profile = try #require(SimulatorProfile.builtIn(named: "multi-sensor"))
        profile.bluetoothAddress = declared?.bytes
        let wire = try SerialTransport(fileDescriptor: accessoryEnd, description: "accessory end")
        let runner = try SimulatorRunner(profile: profile, attachment: .transport(wire))
        runner.start()
        try await bluez.newConnection(device: pairedAccessory, descriptor: hostEnd)
        close(hostEnd)
        return (runner, wire)
    }

    @Test("an accessory that advertises only …caff is connected to, identified and echoes; one that connects in is served beside it")
    func connectingOutToTheAccessorysOwnUUID() async throws {
        let bus = try await PrivateBus.start()
        let bluez = try await FakeBlueZ.start(on: bus, adapters: [hostAdapter], devices: [pairedAccessory, wirelessIAPAccessory])
        var configuration = AccessoryManager.Configuration(supportedProtocols: ["com.example.echo"])
        configuration.daemon = .never
        let manager = AccessoryManager(configuration: configuration)
        defer { manager.stop(); bluez.stop() }
        try await manager.startBluetooth(options: BluetoothOptions(busAddress: bus.address, connectsOut: true))
        let listed = try await manager.bluetoothDevices()
        #expect(listed.first { $0.address == wirelessIAPAccessory.address }?.offersIAP2 == true)

        // The accessory advertising only …caff: BlueZ connects to its record and hands the
        // socket to the host's client profile for that UUID.
        let (hostEnd, accessoryEnd) = try socketPair()
        var profile = try #require(SimulatorProfile.builtIn(named: "multi-sensor"))
        profile.bluetoothAddress = wirelessIAPAccessory.address.bytes
        profile.accessory.serialNumber = "CAFF-1"
        let wire = try SerialTransport(fileDescriptor: accessoryEnd, description: "accessory end")
        let outgoing = try SimulatorRunner(profile: profile, attachment: .transport(wire))
        outgoing.start()
        defer { outgoing.stop() }
        bluez.state.withLock { $0.outgoing[wirelessIAPAccessory.path] = hostEnd }
        try await manager.connectBluetooth(to: wirelessIAPAccessory.address)
        #expect(bluez.state.withLock { $0.connectProfileCalls.map(\.uuid) } == [BluetoothProfile.accessoryIAP2UUID])
        let reached = try #require(await manager.waitForAccessory(timeout: .seconds(30)) { $0.serialNumber == "CAFF-1" })
        #expect(reached.transportKind == .bluetooth && reached.bluetoothAddress == wirelessIAPAccessory.address)

        // An accessory connecting in to the host's …cafe service is still served.
        let (incoming, _) = try await Self.accessory(declaring: pairedAccessory.address, bluez: bluez)
        defer { incoming.stop() }
        let cameIn = try #require(await manager.waitForAccessory(timeout: .seconds(30)) { $0.serialNumber != "CAFF-1" })
        #expect(cameIn.bluetoothAddress == pairedAccessory.address)

        for (accessory, seed) in [(reached, UInt64(11)), (cameIn, 12)] {
            let session = try await accessory.openSession(for: "com.example.echo")
            let payload = Self.pattern(256 << 10, seed: seed)
            #expect(try await Self.echo(session, payload) == payload)
            session.close()
        }
        #expect(Set(manager.bluetoothConnections) == [pairedAccessory.address, wirelessIAPAccessory.address])
    }

    @Test("the connection dropping mid-transfer ends the session with an error; the host goes on, and a new connection identifies again")
    func dropAndReconnect() async throws {
        let bus = try await PrivateBus.start()
        let bluez = try await FakeBlueZ.start(on: bus, adapters: [hostAdapter], devices: [pairedAccessory])
        var configuration = AccessoryManager.Configuration(supportedProtocols: ["com.example.echo"])
        configuration.daemon = .never
        let manager = AccessoryManager(configuration: configuration)
        defer { manager.stop(); bluez.stop() }
        try await manager.startBluetooth(options: BluetoothOptions(busAddress: bus.address))
        let (first, wire) = try await Self.accessory(declaring: pairedAccessory.address, bluez: bluez)
        defer { first.stop() }
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)))
        let session = try await accessory.openSession(for: "com.example.echo")
        let payload = Self.pattern(16 << 20, seed: 5)
        let writer = Task {
            var offset = 0
            while offset < payload.count {
                let end = min(payload.count, offset + 40_000)
                try await session.write(payload[offset..<end])
                offset = end
            }
        }
        // Some of the echo came back: the transfer is under way. Then the accessory's side of
        // the link goes, as when its controller is removed.
        var received: [UInt8] = []
        while received.count < 256 << 10, let bytes = try await session.read(maxBytes: 1 << 16) { received += bytes }
        #expect(received == Array(payload[..<received.count]))
        first.queue.async { wire.cancel() }
        var ended: (any Error)?
        do {
            while try await session.read(maxBytes: 1 << 16) != nil {}
        } catch { ended = error }
        let failure = await writer.result
        #expect(ended != nil || (try? failure.get()) == nil, "neither the read nor the write saw the connection go")
        #expect(await manager.waitUntilNoAccessory(timeout: .seconds(30)))
        #expect(!accessory.isConnected)

        // BlueZ hands over the next connection: a new accessory, identified again.
        let (second, _) = try await Self.accessory(declaring: pairedAccessory.address, bluez: bluez)
        defer { second.stop() }
        let again = try #require(await manager.waitForAccessory(timeout: .seconds(30)))
        #expect(again.connectionID != accessory.connectionID)
        #expect(again.bluetoothAddress == pairedAccessory.address)
        let echo = try await again.openSession(for: "com.example.echo")
        let small = Self.pattern(64 << 10, seed: 6)
        #expect(try await Self.echo(echo, small) == small)
    }

    @Test("identified with its Bluetooth address; two EA sessions echo byte-exact at once")
    func identifiedAndTwoSessions() async throws {
        let bus = try await PrivateBus.start()
        let bluez = try await FakeBlueZ.start(on: bus, adapters: [hostAdapter], devices: [pairedAccessory])
        let (manager, runner, _) = try await Self.connect(declaring: pairedAccessory.address, bus: bus, bluez: bluez)
        defer { manager.stop(); runner.stop(); bluez.stop() }
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)))
        #expect(accessory.transportKind == .bluetooth)
        #expect(accessory.bluetoothAddress == pairedAccessory.address)
        #expect(accessory.location == "bluetooth 00:1A:7D:DA:71:13 (hci0)")
        #expect(accessory.name == "Multi Sensor")
        #expect(accessory.serialNumber == "SIM-MS-0001")
        #expect(accessory.firmwareRevision == "2.1.0")
        let component = try #require(accessory.identity.transportComponents.first { $0.kind == 17 })
        #expect(component.bluetoothAddress == pairedAccessory.address.bytes)
        #expect(component.supportsIAP2)

        let echo = try await accessory.openSession(for: "com.example.echo")
        let telemetry = try await accessory.openSession(for: "com.example.telemetry")
        let first = Self.pattern(1 << 20, seed: 22), second = Self.pattern(768 << 10, seed: 23)
        async let one = Self.echo(echo, first)
        async let two = Self.echo(telemetry, second)
        #expect(try await one == first)
        #expect(try await two == second)

        let devices = try await manager.bluetoothDevices()
        #expect(devices.first?.address == pairedAccessory.address)
        try await manager.connectBluetooth(to: pairedAccessory.address)
        #expect(bluez.state.withLock { $0.connectProfileCalls.count } == 1)
    }

    @Test("an accessory whose BluetoothTransportComponent names another address is rejected, and the failure says so")
    func wrongAddressRejected() async throws {
        let bus = try await PrivateBus.start()
        let bluez = try await FakeBlueZ.start(on: bus, adapters: [hostAdapter], devices: [pairedAccessory])
        let (manager, runner, stream) = try await Self.connect(declaring: BluetoothAddress("00:1A:7D:DA:71:99"), bus: bus, bluez: bluez,
                                                               answerTimeout: .seconds(2))
        defer { manager.stop(); runner.stop(); bluez.stop() }
        var events = stream.makeAsyncIterator()
        while let event = await events.next() {
            switch event {
            case let .failed(location, reason):
                #expect(location.hasPrefix("bluetooth 00:1A:7D:DA:71:13"))
                #expect(reason.contains("identification rejected"), "\(reason)")
                #expect(reason.contains("no BluetoothTransportComponent has the connection's address 00:1A:7D:DA:71:13"), "\(reason)")
                return
            case let .connected(accessory):
                Issue.record("identified: \(accessory)")
                return
            case .disconnected, .appLaunchRequested:
                continue
            }
        }
        Issue.record("no event")
    }

    @Test("Bluetooth that cannot start is a typed error, and the manager goes on")
    func startFailure() async throws {
        let bus = try await PrivateBus.start()
        var configuration = AccessoryManager.Configuration()
        configuration.daemon = .never
        let manager = AccessoryManager(configuration: configuration)
        defer { manager.stop() }
        do {
            try await manager.startBluetooth(options: BluetoothOptions(busAddress: bus.address))
            Issue.record("started without BlueZ")
        } catch {
            #expect(error.kind == .bluezNotRunning)
        }
        await #expect(throws: BluetoothError.self) { try await manager.connectBluetooth(to: pairedAccessory.address) }
    }
}
