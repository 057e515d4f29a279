import AccessoryGadget
import AccessoryHost
import AccessorySimulator
import Dispatch
import IAPTransport
import Synchronization
import Testing

/// The accessory's end of a memory pair, as a gadget's wire whose host can reset it: a reset is
/// the host going (absent) and configuring the device again, as a USB reset looks to a gadget.
final class ResettableAccessoryWire: HostReconnectingWire, Sendable {
    let inner: MemoryTransport
    private let handler = Mutex<(@Sendable (HostConnectionState) -> Void)?>(nil)
    init(_ inner: MemoryTransport) { self.inner = inner }
    var description: String { inner.description }
    var kind: TransportKind { inner.kind }
    var hostConnection: HostConnectionState { .configured }
    func onHostConnectionChange(_ handler: @escaping @Sendable (HostConnectionState) -> Void) { self.handler.withLock { $0 = handler } }
    func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) { inner.activate(queue: queue, handler: handler) }
    func send(_ frame: [UInt8]) { inner.send(frame) }
    func cancel() { inner.cancel() }
    /// The bus reset as the gadget sees it.
    func reset() {
        let handler = self.handler.withLock { $0 }
        handler?(.absent)
        handler?(.configured)
    }
}

/// The host's end of the pair, offering `DeviceReset` as a USB transport does.
final class ResettableHostTransport: Transport, Sendable {
    let inner: MemoryTransport
    let accessory: ResettableAccessoryWire
    let resets = Mutex(0)
    init(_ inner: MemoryTransport, accessory: ResettableAccessoryWire) {
        self.inner = inner
        self.accessory = accessory
    }
    var description: String { "resettable \(inner.description)" }
    var kind: TransportKind { inner.kind }
    func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) { inner.activate(queue: queue, handler: handler) }
    func send(_ frame: [UInt8]) { inner.send(frame) }
    func cancel() { inner.cancel() }
    func capability<Value>(_ type: Value.Type) -> Value? {
        guard type == DeviceReset.self else { return nil }
        return DeviceReset { [self] done in
            resets.withLock { $0 += 1 }
            DispatchQueue.global().async {
                self.accessory.reset()
                done(nil)
            }
        } as? Value
    }
}

/// The manager's reset of an accessory that sticks after its handshake (StickingWire, the
/// TD300's habit), in process: the same policy and the same accessory as in the USB rig, over a
/// memory pair whose host side offers `DeviceReset`.
@Suite struct StuckAccessoryTests {
    static func start(stuckConnections: Int) throws -> (AccessoryManager, ResettableHostTransport, StickingWire, SimulatorRunner) {
        let (host, device) = MemoryTransport.pair(name: "stuck")
        let wire = ResettableAccessoryWire(device)
        let sticking = StickingWire(wire, stuckConnections: stuckConnections)
        let profile = try #require(SimulatorProfile.builtIn(named: "multi-sensor"))
        let runner = try SimulatorRunner(profile: profile, attachment: .transport(sticking))
        runner.start()
        let manager = AccessoryManager()
        let transport = ResettableHostTransport(host, accessory: wire)
        manager.attach(transport)
        return (manager, transport, sticking, runner)
    }

    /// The reasons of the manager's `failed` events, as they come, and the subscription.
    static func failureReasons(_ manager: AccessoryManager) -> (AsyncStream<String>, EventSubscription) {
        let failures = AsyncStream<String>.makeStream()
        let subscription = manager.onEvent(queue: manager.queue) { event in
            if case let .failed(_, reason) = event { failures.continuation.yield(reason) }
        }
        return (failures.stream, subscription)
    }

    @Test(.timeLimit(.minutes(1))) func aStuckAccessoryIsResetOnceAndIdentified() async throws {
        let (manager, transport, sticking, runner) = try Self.start(stuckConnections: 1)
        defer {
            manager.stop()
            runner.stop()
        }
        let (failures, subscription) = Self.failureReasons(manager)
        defer { subscription.cancel() }
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(30)), "identified after the reset")
        #expect(accessory.name == "Multi Sensor")
        #expect(transport.resets.withLock { $0 } == 1)
        #expect(sticking.stuckEpisodes.count == 1 && !sticking.isStuck)
        var said = failures.makeAsyncIterator()
        let reason = try #require(await said.next())
        #expect(reason.contains("did not come up within 2 s") && reason.contains("resetting the USB device once"))
        let session = try await accessory.openSession(for: "com.example.echo")
        try await session.write([1, 2, 3])
        #expect(try await session.read() == [1, 2, 3])
        session.close()
    }

    @Test(.timeLimit(.minutes(1))) func anAccessoryStuckAgainAfterTheResetIsGivenUpOnWithoutASecondReset() async throws {
        let (manager, transport, sticking, runner) = try Self.start(stuckConnections: 2)
        defer {
            manager.stop()
            runner.stop()
        }
        let (failures, subscription) = Self.failureReasons(manager)
        defer { subscription.cancel() }
        var said = failures.makeAsyncIterator()
        let first = try #require(await said.next())
        #expect(first.contains("resetting the USB device once"))
        let second = try #require(await said.next())
        #expect(second.contains("even after a USB reset") && second.contains("unplug the accessory and plug it in again"))
        #expect(transport.resets.withLock { $0 } == 1, "never a second reset")
        #expect(manager.connectedAccessories.isEmpty)
        #expect(sticking.isStuck, "the accessory is stuck again; the host left it so")
    }
}
