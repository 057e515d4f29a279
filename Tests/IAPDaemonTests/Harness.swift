import TestSupport
import AccessoryHost
import AccessoryLogging
import AccessorySimulator
import Dispatch
import Foundation
import IAPDaemon
import IAPDaemonProtocol
import IAPTransport
import SystemCalls
import Testing

/// A daemon in this process: a manager (direct access) with the built-in multi-sensor
/// simulator (echo on `com.example.echo` and `com.example.telemetry`), served on a Unix socket
/// in a directory of its own.
final class DaemonHarness: Sendable {
    let manager: AccessoryManager
    let runner: SimulatorRunner
    let directory: String
    let socketPath: String
    let server: Locked<DaemonServer?>

    private init(manager: AccessoryManager, runner: SimulatorRunner, directory: String) {
        self.manager = manager
        self.runner = runner
        self.directory = directory
        self.socketPath = directory + "/iapd.sock"
        self.server = Locked(nil)
    }

    static func start(profile: String = "multi-sensor") async throws -> DaemonHarness {
        try await start(simulator: try #require(SimulatorProfile.builtIn(named: profile)))
    }

    /// A daemon serving an accessory of `simulator`'s profile.
    static func start(simulator: SimulatorProfile) async throws -> DaemonHarness {
        var configuration = AccessoryManager.Configuration()
        configuration.daemon = .never
        let manager = AccessoryManager(configuration: configuration)
        let runner = try SimulatorRunner(profile: simulator, attachment: .memory { host in manager.attach(host) })
        runner.start()
        _ = try #require(await manager.waitForAccessory(timeout: .seconds(20)))
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("iapd-test-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let harness = DaemonHarness(manager: manager, runner: runner, directory: directory)
        try harness.startServer()
        return harness
    }

    /// Starts (or restarts) the server on the socket.
    func startServer() throws {
        let descriptor = try UnixSocket.listen(path: socketPath).get()
        let server = DaemonServer(manager: manager, logger: Logger(label: "iapd-test", handler: NullLogHandler()))
        server.listen(descriptor: descriptor)
        self.server.withLock { $0 = server }
    }

    /// Stops the server (clients lose it); the accessories stay.
    func stopServer() {
        let server = self.server.withLock { server -> DaemonServer? in
            defer { server = nil }
            return server
        }
        server?.stop()
    }

    var current: DaemonServer { server.withLock { $0! } }

    /// A client manager connected to the daemon, and the accessory once it is announced.
    func client() async throws -> (AccessoryManager, Accessory) {
        var configuration = AccessoryManager.Configuration()
        configuration.daemonSocketPath = socketPath
        let client = AccessoryManager(configuration: configuration)
        try client.connectToDaemon()
        let accessory = try #require(await client.waitForAccessory(timeout: .seconds(20)))
        return (client, accessory)
    }

    func stop() {
        stopServer()
        manager.stop()
        runner.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }
}

/// A value behind a lock.
final class Locked<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value
    init(_ value: Value) { self.value = value }
    func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}

/// A client that speaks the protocol by hand, for what the library never sends.
struct RawClient: ~Copyable {
    let descriptor: Int32
    private var framer = MessageFramer(limit: DaemonProtocol.maximumReplyLength)
    private var descriptors: [Int32] = []

    init(path: String) throws {
        descriptor = try UnixSocket.connect(path: path).get()
    }

    deinit { _ = close(descriptor) }

    func send(_ bytes: [UInt8]) {
        _ = bytes.withUnsafeBytes { UnixSocket.send(descriptor, $0) }
    }

    func send(_ request: ClientRequest, id: UInt32 = 1) {
        send(MessageFramer.encode(ClientMessage(id: id, request: request)))
    }

    /// The next message (and a descriptor that came with it), waiting up to 20 s; nil at the end
    /// of the stream. Blocks its thread: for tests with `.ownThread`.
    /// The next message, and for `opened` the descriptors that came with it (the session's
    /// socket and shared memory).
    mutating func next() throws -> (DaemonMessage, [Int32])? {
        var scratch = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            if let message = try framer.next(DaemonMessage.self) {
                var passed: [Int32] = []
                if case .opened = message.reply {
                    passed = Array(descriptors.prefix(2))
                    descriptors.removeFirst(passed.count)
                }
                return (message, passed)
            }
            var poll = [pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)]
            guard case .success(let ready) = SystemCall.poll(&poll, timeout: 20_000), ready > 0 else {
                Issue.record("no message from the daemon within 20 s")
                return nil
            }
            let count = try scratch.withUnsafeMutableBytes { try UnixSocket.receive(descriptor, into: $0, descriptors: &descriptors).get() }
            if count == 0 { return nil }
            framer.append(scratch.prefix(count))
        }
    }
}

/// Bytes of a pattern no two offsets of which repeat soon.
func pattern(_ count: Int, seed: UInt8) -> [UInt8] {
    bytes(count) { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 8 &+ Int(seed)) }
}

/// Writes `payload` and reads the echo back concurrently; returns what came back.
func echo(_ payload: [UInt8], over session: AccessorySession) async throws -> [UInt8] {
    let writer = Task { try await session.write(payload) }
    var received: [UInt8] = []
    while received.count < payload.count, let chunk = try await session.read() { received += chunk }
    try await writer.value
    return received
}

