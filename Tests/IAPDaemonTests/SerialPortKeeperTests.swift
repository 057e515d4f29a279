import AccessoryHost
import AccessoryLogging
import AccessorySimulator
import Foundation
import IAPDaemon
import IAPTransport
import Testing

/// iapd's serial ports over pseudo-terminals behind a symbolic link (the configured path), so a
/// test can "unplug" (the accessory's side closes, the line hangs up) and "plug in again" (a new
/// line behind the same path).
@Suite("iapd keeps its serial ports open")
struct SerialPortKeeperTests {
    /// A simulated accessory on the master side of a new pseudo-terminal, its slave behind `link`.
    private static func plugIn(at link: String) throws -> (PseudoTerminal, SimulatorRunner) {
        let pty = try PseudoTerminal()
        _ = unlink(link)
        #expect(symlink(pty.slavePath, link) == 0)
        let runner = try SimulatorRunner(profile: try #require(SimulatorProfile.builtIn(named: "multi-sensor")),
                                         attachment: .transport(try pty.makeMasterTransport()))
        runner.start()
        return (pty, runner)
    }

    @Test("a port missing at start, unplugged and plugged in again is served each time it is there; the open port is left alone")
    func missingUnpluggedAndBack() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("keeper-\(getpid())-\(UInt32.random(in: 0...UInt32.max))").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let link = directory + "/tty"
        let logs = InMemoryLogHandler()
        let manager = AccessoryManager()
        defer { manager.stop() }
        let keeper = SerialPortKeeper(manager: manager, specs: [try SerialPortSpec(parsing: link)], interval: .milliseconds(50),
                                      logger: Logger(label: "iapd", logLevel: .debug, handler: logs))
        defer { keeper.stop() }
        keeper.start()

        // The keeper starts before the port exists; it opens it once it is there.
        let (firstPty, firstRunner) = try Self.plugIn(at: link)
        defer { firstRunner.stop() }
        let first = try #require(await manager.waitForAccessory(timeout: .seconds(30)), "not identified on the first line")
        // The keeper keeps trying the port it holds; the accessory is not disturbed by it.
        let session = try await first.openSession(for: "com.example.echo")
        let payload = pattern(256 << 10, seed: 7)
        #expect(try await echo(payload, over: session) == payload)
        #expect(keeper.openCount == 1)

        // Unplugged: the line hangs up and the accessory goes.
        firstRunner.stop()
        withExtendedLifetime(firstPty) {}
        #expect(await manager.waitUntilNoAccessory(timeout: .seconds(30)) { $0.connectionID == first.connectionID },
                "the accessory did not go when its line hung up")
        // Plugged in again behind the same path: served again without being told.
        let (secondPty, secondRunner) = try Self.plugIn(at: link)
        defer { secondRunner.stop() }
        let found = await manager.waitForAccessory(timeout: .seconds(30)) { $0.connectionID != first.connectionID }
        let second = try #require(found, "not identified again after the replug (log: \(logs.messages.suffix(8)))")
        #expect(!first.isConnected)
        #expect(second.isConnected)
        #expect(keeper.openCount == 2)
        withExtendedLifetime(secondPty) {}
    }
}
