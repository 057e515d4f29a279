package import DBus

/// A BlueZ pairing agent with no input and no output (`org.bluez.Agent1`, capability
/// `NoInputNoOutput`), registered as the default agent: it accepts Just Works pairing and
/// authorizes services, refuses PIN codes and passkeys. What a headless host needs for
/// accessories that pair without a screen (as most iAP2 accessories do).
///
/// It serves while its bus connection is open; BlueZ drops it when the connection closes.
package enum BluetoothAgent {
    /// The path the agent is served at.
    package static let path = "/org/accessoryhost/agent"

    /// Serves the agent on `bus` and registers it with BlueZ as the default agent.
    ///
    /// - Throws: ``BlueZError``: BlueZ not running, the D-Bus policy, an agent at that path
    ///   registered already.
    package static func register(on bus: BusConnection, timeout: Duration = .seconds(30)) async throws(BlueZError) {
        do {
            try bus.export(path: path) { call in answer(call) }
        } catch {
            throw BlueZError(.failed, "cannot serve the pairing agent at \(path): \(error)", advice: "register it once per connection", busError: error)
        }
        do {
            _ = try await bus.call(destination: BluetoothProfile.bluezService, path: "/org/bluez", interface: "org.bluez.AgentManager1",
                                   member: "RegisterAgent", arguments: [.objectPath(path), .string("NoInputNoOutput")], timeout: timeout)
            _ = try await bus.call(destination: BluetoothProfile.bluezService, path: "/org/bluez", interface: "org.bluez.AgentManager1",
                                   member: "RequestDefaultAgent", arguments: [.objectPath(path)], timeout: timeout)
        } catch {
            throw BlueZError.bluez(error, doing: "registering the pairing agent")
        }
    }

    /// The agent's answer to BlueZ.
    static func answer(_ call: BusMethodCall) -> BusReply {
        switch call.member {
        case "Release", "Cancel", "DisplayPinCode", "DisplayPasskey":
            .empty
        case "RequestConfirmation", "RequestAuthorization", "AuthorizeService":
            // Just Works, and the service the accessory connects to.
            .empty
        case "RequestPinCode", "RequestPasskey":
            .error(name: "org.bluez.Error.Rejected", message: "this host has no input: pair with Just Works (no PIN, no passkey)")
        default:
            .error(name: BusError.unknownMethod, message: "no method \(call.member)")
        }
    }
}
