import AccessoryHost
import AccessoryLogging
import CLIKit
import Dispatch
import Glibc
import IAPInspect
import IAPLink
import IAPTransport
import Synchronization

enum ListCommand {
    static func run(_ command: ParsedCommand) throws -> ExitCode {
        let session = try HostContext(command)
        defer { session.shutdown() }
        let accessories = try discover(session, command: command)
        // Devices that could not be opened are not accessories we can list, but a person needs
        // to know why one they plugged in is missing.
        let failed = session.reportFailures()
        if command.flag("json") {
            StandardOutput.write(accessories.map(JSONOutput.accessoryLine).joined())
            return accessories.isEmpty && failed ? .unavailable : .success
        }
        guard !accessories.isEmpty else {
            StandardOutput.write("no accessories found\n")
            return failed ? .unavailable : .success
        }
        StandardOutput.write(accessories.map(listLine).joined())
        return .success
    }
}

enum InfoCommand {
    static func run(_ command: ParsedCommand) throws -> ExitCode {
        let session = try HostContext(command)
        defer { session.shutdown() }
        let accessory = try chooseAccessory(session, command: command)
        let identity = accessory.identity
        if command.flag("json") {
            var fields: [(String, JSONValue)] = [("accessory", json(accessory))]
            fields.append(("protocols", .array(identity.protocols.map { item in
                .object([("identifier", .int(Int(item.identifier))), ("name", .string(item.name)),
                         ("matchAction", .int(Int(item.matchAction))),
                         ("native", .bool(item.nativeTransportComponentIdentifier != nil)),
                         ("nativeInterface", nativeInterface(of: item.name, on: accessory).map { .int(Int($0)) } ?? .null)])
            })))
            fields.append(("languages", .array(identity.supportedLanguages.map { .string($0) })))
            fields.append(("maximumCurrentDrawnFromDevice", .int(Int(identity.maximumCurrentDrawnFromDevice))))
            StandardOutput.write(JSONOutput.line(fields))
            return .success
        }
        // Every string the accessory chose is escaped: it must not act on the terminal.
        var out = "connection \(accessory.connectionID) on \(accessory.location.escapedForTerminal) (\(accessory.transportKind.rawValue))\n"
        out += "  protocol:          \(accessory.protocolVersion.rawValue)\n"
        out += "  name:              \(identity.name.escapedForTerminal)\n"
        out += "  manufacturer:      \(identity.manufacturer.escapedForTerminal)\n"
        out += "  model:             \(identity.modelIdentifier.escapedForTerminal)\n"
        out += "  serial number:     \(identity.serialNumber.escapedForTerminal)\n"
        out += "  firmware revision: \(identity.firmwareVersion.escapedForTerminal)\n"
        out += "  hardware revision: \(identity.hardwareVersion.escapedForTerminal)\n"
        out += "  languages:         \(identity.currentLanguage.escapedForTerminal) "
            + "(supports \(identity.supportedLanguages.map(\.escapedForTerminal).joined(separator: ", ")))\n"
        out += "  current drawn:     up to \(identity.maximumCurrentDrawnFromDevice) mA\n"
        out += authenticationText(accessory.authentication)
        out += "  protocols:\n"
        for item in identity.protocols {
            let transport = item.nativeTransportComponentIdentifier.map { component in
                "native transport (component \(component)" + (nativeInterface(of: item.name, on: accessory).map { ", USB interface \($0)" } ?? "") + ")"
            } ?? (accessory.protocolVersion == .iap1 ? "iAP1 data sessions" : "on the iAP2 link")
            out += "    \(item.name.escapedForTerminal)  (id \(item.identifier), \(transport))\n"
        }
        out += "  transport components:\n"
        for component in identity.transportComponents {
            let address = component.bluetoothAddress.map { bytes in
                ", MAC " + bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16, uppercase: true) }.joined(separator: ":")
            } ?? ""
            out += "    \(component.kindName) \(component.identifier) \"\(component.name.escapedForTerminal)\"\(component.supportsIAP2 ? ", iAP2" : "")\(address)\n"
        }
        StandardOutput.write(out)
        return .success
    }
}

/// The USB interface named after `protocolName` (its native transport), if the accessory is on USB.
func nativeInterface(of protocolName: String, on accessory: Accessory) -> UInt8? {
    accessory.usbDevice?.nativeInterfaceNames.first { $0.value == protocolName }?.key
}

enum WatchCommand {
    static func run(_ command: ParsedCommand) throws -> ExitCode {
        let json = command.flag("json")
        let limit = try command.integer("count", in: 1...1_000_000)
        let stop = DispatchSemaphore(value: 0)
        let seen = Mutex(0)
        let signal = DispatchSource.makeSignalSource(signal: SIGINT, queue: .global())
        Glibc.signal(SIGINT, SIG_IGN)
        signal.setEventHandler { stop.signal() }
        signal.resume()
        // Subscribed before the context starts any source: a simulated accessory is identified
        // (and may ask for an app) while the context is being built.
        let handler: @Sendable (AccessoryEvent) -> Void = { event in
            let line: String
            switch event {
            case let .connected(accessory):
                line = json ? JSONOutput.line([("event", .string("connected")), ("accessory", iapctlJSON(accessory))])
                    : "connected     \(accessory.connectionID)  \(accessory.name.escapedForTerminal) "
                        + "(\(accessory.serialNumber.escapedForTerminal)) on \(accessory.location.escapedForTerminal)"
            case let .disconnected(accessory, reason):
                line = json ? JSONOutput.line([("event", .string("disconnected")), ("accessory", iapctlJSON(accessory)),
                                               ("reason", .string(reason))])
                    : "disconnected  \(accessory.connectionID)  \(accessory.name.escapedForTerminal): \(reason.escapedForTerminal)"
            case let .failed(location, reason):
                line = json ? JSONOutput.line([("event", .string("failed")), ("location", .string(location)),
                                               ("reason", .string(reason))])
                    : "failed        \(location.escapedForTerminal): \(reason.escapedForTerminal)"
            case let .appLaunchRequested(accessory, request):
                line = json ? JSONOutput.line([("event", .string("appLaunchRequested")), ("accessory", iapctlJSON(accessory)),
                                               ("bundleIdentifier", .string(request.bundleIdentifier))])
                    : "app launch    \(accessory.connectionID)  \(accessory.name.escapedForTerminal) asks for "
                        + "\(request.description.escapedForTerminal)"
            }
            StandardOutput.write(json ? line : line + "\n")
            let count = seen.withLock { value -> Int in
                value += 1
                return value
            }
            if let limit, count >= limit { stop.signal() }
        }
        var hooks = HostContext.Hooks()
        hooks.events = (DispatchQueue(label: "iapctl.watch"), handler)
        let session = try HostContext(command, hooks: hooks)
        defer { session.shutdown() }
        stop.wait()
        session.commandSubscription?.cancel()
        signal.cancel()
        return .success
    }
}

/// An accessory as `iapctl list` prints it: a line, then its protocols. The accessory's strings
/// are escaped for the terminal.
func listLine(_ accessory: Accessory) -> String {
    var out = "\(accessory.connectionID)  \(accessory.name.escapedForTerminal)  "
        + "\(accessory.manufacturer.escapedForTerminal) \(accessory.modelNumber.escapedForTerminal)  "
    out += "serial \(accessory.serialNumber.escapedForTerminal)  firmware \(accessory.firmwareRevision.escapedForTerminal)  "
        + "on \(accessory.location.escapedForTerminal)"
    out += accessory.protocolVersion == .iap1 ? "  (iAP1)\n" : "\n"
    out += "    protocols: \(accessory.protocolStrings.map(\.escapedForTerminal).joined(separator: ", "))"
    out += accessory.supportsConfiguredProtocols ? "\n" : "  (none of the supported protocols)\n"
    out += authenticationListLine(accessory.authentication)
    return out
}

/// The JSON object of an accessory (`list --json`, `wait --json`…).
func iapctlJSON(_ accessory: Accessory) -> JSONValue { json(accessory) }
