import AccessoryHost
import AccessoryLogging
import CLIKit
import Dispatch
import IAPInspect
import USBHost

/// `iapctl wait`: blocks until an accessory matching the filter is connected (or, with
/// `--gone`, until none is), for scripts that upgrade firmware or wait for a device to come back.
enum WaitCommand {
    static let usage = "iapctl wait [--name NAME] [--serial-number SERIAL] [--protocol PROTOCOL] [--usb-id VID:PID] [--firmware VERSION] [--gone] [--timeout SECONDS] [--json]"
    /// `--timeout` when not given: longer than the 3 s other commands wait for identification,
    /// since a reboot or a re-enumeration takes that long.
    static let defaultTimeout = 30.0

    static func run(_ command: ParsedCommand) throws -> ExitCode {
        let filter = try filter(command)
        let seconds = try timeout(command)
        let timeout = Duration.milliseconds(Int(seconds * 1_000))
        let json = command.flag("json")
        let session = try HostContext(command)
        defer { session.shutdown() }
        let manager = session.manager
        let predicate: @Sendable (Accessory) -> Bool = { filter.matches($0) }

        if command.flag("gone") {
            // Accessories already on the wires identify first (within the timeout), or the wait
            // would declare gone what was merely not identified yet.
            let start = ContinuousClock.now
            let settled = try blockingAwait { await manager.waitUntilSettled(timeout: timeout) }
            guard settled else {
                throw ToolError(description: "cannot tell within \(format(seconds)) s: accessories are still being identified "
                                    + "(one that matches \(filter) may be among them)", exitCode: .tempFail)
            }
            let remaining = max(.zero, timeout - (ContinuousClock.now - start))
            let gone = try blockingAwait { await manager.waitUntilNoAccessory(timeout: remaining, where: predicate) }
            guard gone else {
                let still = manager.connectedAccessories.filter(predicate)
                throw ToolError(description: "still connected after \(format(seconds)) s, matching \(filter): "
                                    + still.map(summary).joined(separator: "; "), exitCode: .tempFail)
            }
            if json {
                StandardOutput.write(JSONOutput.line([("gone", .bool(true)), ("filter", .string(filter.description))]))
            } else {
                StandardOutput.write("no accessory matches \(String(describing: filter).escapedForTerminal)\n")
            }
            return .success
        }

        let found = try blockingAwait { await manager.waitForAccessory(timeout: timeout, where: predicate) }
        guard let accessory = found else {
            _ = session.reportFailures()
            let connected = manager.connectedAccessories
            let seen = connected.isEmpty ? "no accessories connected" : "connected: " + connected.map(summary).joined(separator: "; ")
            throw ToolError(description: "no accessory matching \(filter) within \(format(seconds)) s; \(seen)", exitCode: .tempFail)
        }
        if json {
            StandardOutput.write(JSONOutput.accessoryLine(accessory))
        } else {
            StandardOutput.write(listLine(accessory))
        }
        return .success
    }

    /// The filter the options describe.
    static func filter(_ command: ParsedCommand) throws -> AccessoryFilter {
        var filter = AccessoryFilter(names: command.values("name"), serialNumbers: command.values("serial-number"),
                                     firmwareRevisions: command.values("firmware"), protocols: command.values("protocol"))
        for text in command.values("usb-id") {
            guard let id = USBID(parsing: text) else {
                throw UsageError("invalid value '\(text)' for --usb-id: expected VID:PID in hex, e.g. 1209:0001",
                                 usage: usage, commandPath: command.path)
            }
            filter.usbIDs.append(id)
        }
        return filter
    }

    /// `--timeout` in seconds (``defaultTimeout`` when not given).
    static func timeout(_ command: ParsedCommand) throws -> Double {
        guard command.count("timeout") > 0, let text = command.value("timeout") else { return defaultTimeout }
        guard let seconds = Double(text), seconds.isFinite, seconds >= 0, seconds <= 86_400 else {
            throw UsageError("invalid value '\(text)' for --timeout: expected seconds between 0 and 86400",
                             usage: usage, commandPath: command.path)
        }
        return seconds
    }

    static func summary(_ accessory: Accessory) -> String {
        "\(accessory.connectionID) \(accessory.name) (serial \(accessory.serialNumber), firmware \(accessory.firmwareRevision)"
            + (accessory.usbDevice.map { ", USB \($0.usbID)" } ?? "") + ")"
    }

    static func format(_ seconds: Double) -> String {
        seconds == seconds.rounded() ? String(Int(seconds)) : String(seconds)
    }
}
