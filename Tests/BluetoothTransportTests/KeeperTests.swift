import AccessoryHost
import AccessoryHostBluetooth
import AccessoryLogging
import AccessorySimulator
import BluetoothTransport
import Foundation
import IAPDaemon
import IAPTransport
import SystemCalls
import TestSupport
import Testing

/// A log handler that hands every record to an `AsyncStream`, so a test waits for what the code
/// under test logs instead of for time to pass.
private final class StreamingLogHandler: LogHandler {
    let records: AsyncStream<LogRecord>
    private let continuation: AsyncStream<LogRecord>.Continuation

    init() { (records, continuation) = AsyncStream.makeStream(of: LogRecord.self) }
    func log(_ record: LogRecord) { continuation.yield(record) }
}

/// iapd's Bluetooth keeper against the stand-in bluetoothd: started before BlueZ is there,
/// registering once it is, connecting out, and registering again with a BlueZ that restarted.
@Suite("iapd keeps its Bluetooth service registered", .timeLimit(.minutes(2)))
struct BluetoothKeeperTests {
    @Test("registered once BlueZ appears (the failure before logged once), connected out, registered again after BlueZ restarts; the open connection is kept")
    func registersConnectsAndRegistersAgain() async throws {
        let bus = try await PrivateBus.start()
        let logs = StreamingLogHandler()
        var configuration = AccessoryManager.Configuration(supportedProtocols: ["com.example.echo"])
        configuration.daemon = .never
        let manager = AccessoryManager(configuration: configuration)
        defer { manager.stop() }
        let keeper = BluetoothKeeper(manager: manager, options: BluetoothOptions(busAddress: bus.address), targets: [pairedAccessory.address],
                                     interval: .milliseconds(50), logger: Logger(label: "iapd", logLevel: .debug, handler: logs))
        defer { keeper.stop() }
        var records = logs.records.makeAsyncIterator()
        /// The next record that `matches`, with the records skipped on the way.
        func next(_ matches: (LogRecord) -> Bool) async -> (LogRecord?, [LogRecord]) {
            var skipped: [LogRecord] = []
            while let record = await records.next() {
                if matches(record) { return (record, skipped) }
                skipped.append(record)
            }
            return (nil, skipped)
        }

        // No BlueZ yet: the failure is an error once, then debug on every later try.
        keeper.start()
        let (failure, _) = await next { $0.level == .error }
        #expect(failure?.message.contains("BlueZ (bluetoothd) is not running") == true, "\(String(describing: failure))")
        let (_, quiet) = await next { $0.level == .debug && $0.message == failure?.message }
        #expect(!quiet.contains { $0.level == .error })
        #expect(keeper.registrationCount == 0)
        #expect(await !manager.isBluetoothRegistered())

        // BlueZ comes up: the profile is registered, then the configured accessory connected out to.
        let bluez = try await FakeBlueZ.start(on: bus, adapters: [hostAdapter], devices: [pairedAccessory])
        let (registered, _) = await next { $0.level == .notice }
        #expect(registered?.message.contains("registered with BlueZ") == true)
        #expect(try bluez.requireRegistration().uuid == BluetoothProfile.iAP2UUID)
        #expect(try bluez.requireRegistration().options["Role"] == nil, "connecting out needs both roles")
        let (connected, _) = await next { $0.message.contains("connected to \(pairedAccessory.address)") }
        #expect(connected != nil)
        #expect(bluez.state.withLock { $0.connectProfileCalls.contains { $0.device == pairedAccessory.path && $0.uuid == BluetoothProfile.iAP2UUID } })

        // BlueZ's connection arrives (a socket pair; the simulator on the other end) and is identified.
        let (hostEnd, accessoryEnd) = try socketPair()
        var profile = try #require(SimulatorProfile.builtIn(named: "multi-sensor"))
        profile.bluetoothAddress = pairedAccessory.address.bytes
        let runner = try SimulatorRunner(profile: profile, attachment: .transport(try SerialTransport(fileDescriptor: accessoryEnd, description: "accessory end")))
        runner.start()
        defer { runner.stop() }
        try await bluez.newConnection(device: pairedAccessory, descriptor: hostEnd)
        close(hostEnd)
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)), "not identified")
        #expect(accessory.bluetoothAddress == pairedAccessory.address)
        #expect(manager.bluetoothConnections == [pairedAccessory.address])

        // bluetoothd restarts (a new owner of org.bluez, which knows no profile): registered again.
        try await bluez.stopReleasingName()
        let restarted = try await FakeBlueZ.start(on: bus, adapters: [hostAdapter], devices: [pairedAccessory])
        defer { restarted.stop() }
        let (again, _) = await next { $0.level == .notice }
        #expect(again?.message.contains("registered with BlueZ") == true)
        #expect(keeper.registrationCount == 2)
        #expect(try restarted.requireRegistration().uuid == BluetoothProfile.iAP2UUID)
        #expect(await manager.isBluetoothRegistered())
        // The RFCOMM connection is the kernel's, not bluetoothd's: it stays, counts as connected
        // (so it is not connected out to again), and works.
        #expect(accessory.isConnected)
        #expect(manager.bluetoothConnections == [pairedAccessory.address])
        let session = try await accessory.openSession(for: "com.example.echo")
        let payload = BluetoothManagerTests.pattern(64 << 10, seed: 11)
        #expect(try await BluetoothManagerTests.echo(session, payload) == payload)
        session.close()

        // Through the daemon, a client sees it on Bluetooth, with its address.
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("iapd-bt-\(getpid())-\(UInt32.random(in: 0...UInt32.max))").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let server = DaemonServer(manager: manager, logger: Logger(label: "iapd-test", handler: NullLogHandler()))
        defer { server.stop() }
        server.listen(descriptor: try UnixSocket.listen(path: directory + "/iapd.sock").get())
        var clientConfiguration = AccessoryManager.Configuration()
        clientConfiguration.daemonSocketPath = directory + "/iapd.sock"
        let client = AccessoryManager(configuration: clientConfiguration)
        defer { client.stop() }
        try client.connectToDaemon()
        let remote = try #require(await client.waitForAccessory(timeout: .seconds(20)), "the daemon's client saw no accessory")
        #expect(remote.transportKind == .bluetooth)
        #expect(remote.bluetoothAddress == pairedAccessory.address)
        #expect(remote.location == accessory.location)
        let remoteSession = try await remote.openSession(for: "com.example.echo")
        #expect(try await BluetoothManagerTests.echo(remoteSession, payload) == payload)
        remoteSession.close()
    }
}
