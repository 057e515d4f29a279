import Dispatch
import Foundation
import Glibc

/// A D-Bus daemon of a test's own (`dbus-daemon --session --nofork --print-address`), so that
/// D-Bus code runs against a real bus without the machine's system bus. Debian's `dbus-daemon`
/// package provides it (tools/ensure-deps.sh installs it); a machine without it fails the test
/// with a message that says so.
public final class PrivateBus: @unchecked Sendable {
    // Sendability: immutable after start.
    /// The bus's address, e.g. `unix:path=/tmp/dbus-XXXX,guid=…`.
    public let address: String
    private let process: Process

    private init(address: String, process: Process) {
        self.address = address
        self.process = process
    }

    deinit { stop() }

    /// What went wrong starting the daemon.
    public struct StartError: Error, CustomStringConvertible {
        /// Why, and what to install.
        public var description: String
    }

    /// Starts a daemon and waits (on a Dispatch queue of its own, not the caller's thread) until
    /// it printed its address.
    public static func start() async throws -> PrivateBus {
        let result = await withCheckedContinuation { (continuation: CheckedContinuation<Result<PrivateBus, StartError>, Never>) in
            DispatchQueue(label: "PrivateBus.start").async { continuation.resume(returning: launch()) }
        }
        return try result.get()
    }

    private static func launch() -> Result<PrivateBus, StartError> {
        let candidates = ["/usr/bin/dbus-daemon", "/bin/dbus-daemon"]
        guard let executable = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
            return .failure(StartError(description: "no dbus-daemon: run tools/ensure-deps.sh dbus-daemon (apt-get install dbus-daemon)"))
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = ["--session", "--nofork", "--nopidfile", "--print-address=1"]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        do { try process.run() } catch {
            return .failure(StartError(description: "cannot start dbus-daemon: \(error)"))
        }
        var line: [UInt8] = []
        let handle = output.fileHandleForReading
        while true {
            let chunk = handle.readData(ofLength: 1)
            guard let byte = chunk.first else { break }
            if byte == UInt8(ascii: "\n") { break }
            line.append(byte)
        }
        let address = String(decoding: line, as: UTF8.self)
        guard address.hasPrefix("unix:") else {
            process.terminate()
            return .failure(StartError(description: "dbus-daemon printed no address"))
        }
        return .success(PrivateBus(address: address, process: process))
    }

    /// Stops the daemon (every connection to it ends). Idempotent.
    ///
    /// SIGKILL, not SIGTERM: a process started from a Dispatch thread inherits its blocked
    /// signals, SIGTERM among them, and dbus-daemon would never see it.
    public func stop() {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }
}
