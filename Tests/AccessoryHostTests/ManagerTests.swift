import AccessoryHost
import IAPLink
import IAPTransport
import Testing

@Suite("AccessoryManager over the in-memory transport")
struct ManagerTests {
    /// A manager with one echo accessory attached.
    static func connected(supported: [String] = ["com.acme.echo"]) async throws -> (AccessoryManager, EchoAccessory, Accessory) {
        let manager = AccessoryManager(configuration: .init(supportedProtocols: supported))
        let (host, device) = MemoryTransport.pair()
        let accessory = EchoAccessory(transport: device)
        manager.attach(host)
        accessory.start()
        let found = try #require(await manager.waitForAccessory(timeout: .seconds(10)))
        return (manager, accessory, found)
    }

    @Test func anAccessoryIsAnnouncedWithItsIdentity() async throws {
        let (manager, echo, accessory) = try await Self.connected()
        defer { manager.stop(); echo.stop() }
        #expect(accessory.connectionID != 0)
        #expect(accessory.isConnected)
        #expect(accessory.name == "Echo Box")
        #expect(accessory.manufacturer == "Acme")
        #expect(accessory.modelNumber == "EB-2")
        #expect(accessory.serialNumber == "EB000042")
        #expect(accessory.firmwareRevision == "2.0.1")
        #expect(accessory.hardwareRevision == "B")
        #expect(accessory.protocolStrings == ["com.acme.echo", "com.acme.other"])
        #expect(accessory.transportKind == .memory)
        #expect(accessory.supportsConfiguredProtocols)
        #expect(manager.connectedAccessories.map(\.connectionID) == [accessory.connectionID])
    }

    @Test func accessoriesWithoutOurProtocolsAreListedButMarked() async throws {
        let (manager, echo, accessory) = try await Self.connected(supported: ["com.somebody.else"])
        defer { manager.stop(); echo.stop() }
        #expect(!accessory.supportsConfiguredProtocols)
        #expect(manager.connectedAccessories.count == 1)
    }

    @Test func aSessionEchoesBytesExactly() async throws {
        let (manager, echo, accessory) = try await Self.connected()
        defer { manager.stop(); echo.stop() }
        let session = try await accessory.openSession(for: "com.acme.echo")
        let payload = testPattern(300_000)
        async let sent: Void = session.write(payload)
        var received: [UInt8] = []
        while received.count < payload.count, let chunk = try await session.read() { received += chunk }
        try await sent
        #expect(received == payload)
    }

    @Test func oneSessionPerProtocolAndOnlyDeclaredProtocols() async throws {
        let (manager, echo, accessory) = try await Self.connected()
        defer { manager.stop(); echo.stop() }
        let session = try await accessory.openSession(for: "com.acme.echo")
        await #expect(throws: AccessoryError.protocolInUse("com.acme.echo")) { _ = try await accessory.openSession(for: "com.acme.echo") }
        await #expect(throws: AccessoryError.unsupportedProtocol("com.nope", available: ["com.acme.echo", "com.acme.other"])) {
            _ = try await accessory.openSession(for: "com.nope")
        }
        let other = try await accessory.openSession(for: "com.acme.other")
        session.close()
        other.close()
        // Closed: the protocol can be opened again.
        let again = try await accessory.openSession(for: "com.acme.echo")
        try await again.write([1, 2, 3])
        #expect(try await again.read() == [1, 2, 3])
    }

    @Test func disconnectWhileAReaderWaits() async throws {
        let (host, device) = MemoryTransport.pair()
        let manager = AccessoryManager()
        let echo = EchoAccessory(transport: device)
        defer { manager.stop(); echo.stop() }
        let events = manager.events
        manager.attach(host)
        echo.start()
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(10)))
        let session = try await accessory.openSession(for: "com.acme.echo")
        try await session.write([9, 9, 9])
        var echoed: [UInt8] = []
        while echoed.count < 3, let chunk = try await session.read() { echoed += chunk }
        #expect(echoed == [9, 9, 9])
        let waiting = Task { try await session.read() }
        device.vanish()
        host.cancel()
        #expect(try await waiting.value == nil) // the stream ends
        await #expect(throws: AccessoryError.self) { try await session.write([1]) }
        #expect(!accessory.isConnected)
        var sequence: [String] = []
        for await event in events {
            switch event {
            case .connected: sequence.append("connected")
            case .disconnected: sequence.append("disconnected")
            case .failed: sequence.append("failed")
            }
            if sequence.count == 2 { break }
        }
        #expect(sequence == ["connected", "disconnected"])
    }

    @Test func bytesReceivedBeforeADisconnectStayReadable() async throws {
        let (host, device) = MemoryTransport.pair()
        let manager = AccessoryManager()
        let echo = EchoAccessory(transport: device)
        defer { manager.stop(); echo.stop() }
        manager.attach(host)
        echo.start()
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(10)))
        let session = try await accessory.openSession(for: "com.acme.echo")
        // Wait for the first echoed bytes without reading them.
        let available = AsyncStream<Void>.makeStream()
        session.setEventHandler(queue: .global()) { event in
            if event == .hasBytesAvailable { available.continuation.yield() }
        }
        try await session.write(testPattern(10_000))
        var iterator = available.stream.makeAsyncIterator()
        _ = await iterator.next()
        device.vanish()
        host.cancel()
        var received: [UInt8] = []
        while let chunk = try await session.read() { received += chunk }
        #expect(received == Array(testPattern(10_000).prefix(received.count)))
        #expect(!received.isEmpty)
    }
}
