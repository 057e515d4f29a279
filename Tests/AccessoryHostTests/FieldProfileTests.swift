import AccessoryHost
import AccessorySimulator
import Dispatch
import IAPLink
import IAPTransport
import Testing
import TestSupport

/// The simulator's profiles of real accessories' habits (PROTOCOL.md §7), through the public
/// API: what an application sees of an accessory that never confirms a session, asks for an app,
/// keeps one small packet in flight, or sends packets longer than the host asked for.
@Suite("Profiles of real accessories through the public API", .timeLimit(.minutes(2)))
struct FieldProfileTests {
    static func read(_ session: AccessorySession, count: Int) async throws -> [UInt8] {
        var received: [UInt8] = []
        while received.count < count, let bytes = try await session.read() { received += bytes }
        return received
    }

    static func echo(_ session: AccessorySession, _ payload: [UInt8]) async throws -> [UInt8] {
        async let sent: Void = session.write(payload)
        let received = try await read(session, count: payload.count)
        try await sent
        return received
    }

    @Test("thermal-camera: the app is asked for after identification; sessions open without a status and carry data at once")
    func thermalCamera() async throws {
        let manager = AccessoryManager()
        let events = manager.events
        let profile = try #require(SimulatorProfile.builtIn(named: "thermal-camera"))
        let runner = try SimulatorRunner(profile: profile, attachment: .memory { manager.attach($0) })
        defer { manager.stop(); runner.stop() }
        runner.start()
        var accessory: Accessory?
        var launch: AppLaunchRequest?
        for await event in events {
            switch event {
            case let .connected(connected): accessory = connected
            case let .appLaunchRequested(from, request):
                #expect(from === accessory)
                launch = request
            case .disconnected, .failed: Issue.record("\(event)")
            }
            if accessory != nil, launch != nil { break }
        }
        let thermal = try #require(accessory)
        #expect(launch?.bundleIdentifier == "com.example.thermal")
        #expect(!thermal.identity.messagesSent.contains(0xEA03), "the profile plays an accessory that never sends a session status")
        let config = try await thermal.openSession(for: "com.example.thermal.config")
        let request = Array("{\"type\":\"getOptions\"}\0".utf8)
        #expect(try await Self.echo(config, request) == request)
        let frames = try await thermal.openSession(for: "com.example.thermal.frame")
        let frame = try await Self.read(frames, count: 1 << 20)
        #expect(frame == SimulatedAccessory.sourcePattern(count: 1 << 20))
        let big = testPattern(1 << 20, seed: 3)
        #expect(try await Self.echo(config, big) == big)
    }

    @Test("borescope: one 4,096-byte packet in flight, a slow coprocessor, slow acknowledgements: byte-exact all the same")
    func borescope() async throws {
        let manager = AccessoryManager()
        let profile = try #require(SimulatorProfile.builtIn(named: "borescope"))
        let runner = try SimulatorRunner(profile: profile, attachment: .memory { manager.attach($0) })
        defer { manager.stop(); runner.stop() }
        runner.start()
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)))
        let control = try await accessory.openSession(for: "com.example.borescope.control")
        let payload = testPattern(256 << 10, seed: 4)
        #expect(try await Self.echo(control, payload) == payload)
        let video = try await accessory.openSession(for: "com.example.borescope.video")
        #expect(video.usesNativeTransport)
        let received = try await Self.read(video, count: 1 << 20)
        #expect(received == SimulatedAccessory.sourcePattern(count: 1 << 20))
    }

    @Test("a native source's first bytes reach the host with every clock standing still (no timer needed to start it)")
    func nativeSourceStartsWithoutATimer() async throws {
        // Before, the bytes a source wrote as its native session opened waited for the
        // accessory's next link event: 3 s of retransmission timer alone, and for ever on a link
        // with nothing else to do (a CI run's time limit).
        var profile = try #require(SimulatorProfile.builtIn(named: "borescope"))
        profile.habits.challengeResponseDelayMs = 0
        let clock = ManualLinkClock() // never advanced: no timer of either side ever fires
        var configuration = AccessoryManager.Configuration()
        configuration.clock = clock
        let manager = AccessoryManager(configuration: configuration)
        let runner = try SimulatorRunner(profile: profile, attachment: .memory { manager.attach($0) }, clock: clock)
        defer { manager.stop(); runner.stop() }
        runner.start()
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)))
        let video = try await accessory.openSession(for: "com.example.borescope.video")
        #expect(video.usesNativeTransport)
        let received = try await Self.read(video, count: 1 << 20)
        #expect(received == SimulatedAccessory.sourcePattern(count: 1 << 20))
    }

    @Test("a serial accessory that sends 65,535-byte packets to a host that advertised 2,880: every byte arrives")
    func oversizedPacketsOnASerialLine() async throws {
        // Issue 31: before, the host dropped them as too long and the accessory stalled for ever.
        var profile = try #require(SimulatorProfile.builtIn(named: "multi-sensor"))
        profile.link.maxPacketLength = 65_535
        profile.link.sendsPacketLength = 65_535
        let pty = try PseudoTerminal()
        let accessorySide = try pty.makeMasterTransport()
        let host = try SerialTransport(spec: try SerialPortSpec(parsing: pty.slavePath + ":115200"))
        pty.closeSlave()
        let manager = AccessoryManager()
        let runner = try SimulatorRunner(profile: profile, attachment: .transport(accessorySide))
        defer { manager.stop(); runner.stop(); _ = pty }
        runner.start()
        manager.attach(host)
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)))
        let source = try await accessory.openSession(for: "com.example.source")
        let received = try await Self.read(source, count: 1 << 20)
        #expect(received == SimulatedAccessory.sourcePattern(count: 1 << 20))
    }

    @Test("keyboard-case, telepresence-robot, photo-printer (PROTOCOL.md §7.6-7.8, played through the catalogue of deviations): each served through the public API")
    func catalogueProfiles() async throws {
        for name in ["keyboard-case", "telepresence-robot", "photo-printer"] {
            let manager = AccessoryManager()
            let profile = try #require(SimulatorProfile.builtIn(named: name))
            let runner = try SimulatorRunner(profile: profile, attachment: .memory { manager.attach($0) })
            defer { manager.stop(); runner.stop() }
            runner.start()
            let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)), "\(name) was not identified")
            let protocolName = try #require(profile.protocols.first?.name)
            let session = try await accessory.openSession(for: protocolName)
            let payload = testPattern(64 << 10, seed: 9)
            if profile.protocols.first?.behaviour == .sink {
                try await session.write(payload)
                try await session.drain()
            } else {
                #expect(try await Self.echo(session, payload) == payload, "\(name)")
            }
            #expect(session.usesNativeTransport == (profile.protocols.first?.native == true), "\(name)")
            session.close()
        }
    }
}
