import BluetoothTransport
import DBus
import Dispatch
import Glibc
import Synchronization
import TestSupport
import IAPTransport

/// A stand-in for bluetoothd on a private bus: owns `org.bluez`, answers
/// `ObjectManager.GetManagedObjects` with the adapters and devices the test sets, takes
/// `ProfileManager1.RegisterProfile`, `Device1.ConnectProfile`, and calls the registered profile's
/// `NewConnection` / `RequestDisconnection` / `Release` when the test says so.
final class FakeBlueZ: Sendable {
    struct Adapter: Sendable {
        var name: String
        var address: BluetoothAddress
        var powered: Bool
    }

    struct Device: Sendable {
        var adapter: String
        var address: BluetoothAddress
        var name: String
        var paired: Bool
        var uuids: [String]
        var path: String { "/org/bluez/\(adapter)/\(address.devicePathElement)" }
    }

    struct Registration: Sendable {
        var sender: String
        var path: String
        var uuid: String
        var options: [String: BusValue]
    }

    struct State: Sendable {
        var adapters: [Adapter] = []
        var devices: [Device] = []
        var registrations: [Registration] = []
        var connectProfileCalls: [(device: String, uuid: String)] = []
        /// Agents registered: (sender, path, capability), and the default one's path.
        var agents: [(sender: String, path: String, capability: String)] = []
        var defaultAgent: String?
        /// Methods answered with an error instead: member → (error name, message).
        var failures: [String: (String, String)] = [:]
        /// Sockets handed to the registered client profile of the UUID connected to, as BlueZ
        /// does once `ConnectProfile` reached the device: device path → descriptor (taken once).
        var outgoing: [String: Int32] = [:]
    }

    let bus: BusConnection
    let state = Mutex(State())

    private init(bus: BusConnection) { self.bus = bus }

    static func start(on privateBus: PrivateBus, adapters: [Adapter], devices: [Device] = []) async throws -> FakeBlueZ {
        let bus = try await BusConnection.connect(address: privateBus.address, queue: DispatchQueue(label: "FakeBlueZ"))
        let fake = FakeBlueZ(bus: bus)
        fake.state.withLock {
            $0.adapters = adapters
            $0.devices = devices
        }
        try bus.export(path: "/") { [weak fake] call in fake?.root(call) ?? .empty }
        try bus.export(path: "/org/bluez") { [weak fake] call in fake?.manager(call) ?? .empty }
        for device in devices {
            try bus.export(path: device.path) { [weak fake] call in fake?.device(call) ?? .empty }
        }
        try await bus.requestName("org.bluez")
        return fake
    }

    func fail(_ member: String, with name: String, message: String = "refused by the test") {
        state.withLock { $0.failures[member] = (name, message) }
    }

    private func failure(_ member: String) -> BusReply? {
        state.withLock { $0.failures[member] }.map { .error(name: $0.0, message: $0.1) }
    }

    private func root(_ call: BusMethodCall) -> BusReply {
        guard call.member == "GetManagedObjects" else { return .error(name: BusError.unknownMethod, message: call.member) }
        if let failure = failure(call.member) { return failure }
        let (adapters, devices) = state.withLock { ($0.adapters, $0.devices) }
        var entries: [BusValue] = []
        for adapter in adapters {
            let properties = BusValue.dictionary(["Address": .string(adapter.address.description), "Powered": .bool(adapter.powered),
                                                  "Name": .string(adapter.name)])
            entries.append(.dictionaryEntry(.objectPath("/org/bluez/\(adapter.name)"),
                                            .array("{sa{sv}}", [.dictionaryEntry(.string("org.bluez.Adapter1"), properties)])))
        }
        for device in devices {
            let properties = BusValue.dictionary([
                "Address": .string(device.address.description), "Alias": .string(device.name), "Paired": .bool(device.paired),
                "Connected": .bool(false), "UUIDs": .array("s", device.uuids.map { .string($0) }),
            ])
            entries.append(.dictionaryEntry(.objectPath(device.path), .array("{sa{sv}}", [.dictionaryEntry(.string("org.bluez.Device1"), properties)])))
        }
        return .values([.array("{oa{sa{sv}}}", entries)])
    }

    private func manager(_ call: BusMethodCall) -> BusReply {
        if let failure = failure(call.member) { return failure }
        switch call.member {
        case "RegisterProfile":
            guard call.arguments.count == 3, let path = call.arguments[0].string, let uuid = call.arguments[1].string,
                  let options = call.arguments[2].dictionary
            else { return .error(name: "org.bluez.Error.InvalidArguments", message: "Invalid arguments in method call") }
            let taken = state.withLock { state -> Bool in
                if state.registrations.contains(where: { $0.uuid == uuid }) { return true }
                state.registrations.append(Registration(sender: call.sender, path: path, uuid: uuid, options: options))
                return false
            }
            return taken ? .error(name: "org.bluez.Error.NotPermitted", message: "UUID already registered") : .empty
        case "RegisterAgent":
            guard let path = call.arguments.first?.string, let capability = call.arguments.last?.string else {
                return .error(name: "org.bluez.Error.InvalidArguments", message: "Invalid arguments in method call")
            }
            state.withLock { $0.agents.append((call.sender, path, capability)) }
            return .empty
        case "RequestDefaultAgent":
            let path = call.arguments.first?.string
            let known = state.withLock { state -> Bool in
                guard state.agents.contains(where: { $0.path == path && $0.sender == call.sender }) else { return false }
                state.defaultAgent = path
                return true
            }
            return known ? .empty : .error(name: "org.bluez.Error.DoesNotExist", message: "Does Not Exist")
        case "UnregisterProfile":
            state.withLock { state in state.registrations.removeAll { $0.sender == call.sender } }
            return .empty
        default:
            return .error(name: BusError.unknownMethod, message: call.member)
        }
    }

    private func device(_ call: BusMethodCall) -> BusReply {
        guard call.member == "ConnectProfile", let uuid = call.arguments.first?.string else {
            return failure(call.member) ?? .error(name: BusError.unknownMethod, message: call.member)
        }
        if let failure = failure(call.member) {
            state.withLock { $0.connectProfileCalls.append((call.path, uuid)) }
            return failure
        }
        // As bluetoothd: a profile connects out only when one registered for the UUID in a
        // client role and the device's SDP records list it; else "not available".
        let (available, socket) = state.withLock { state -> (Bool, Int32?) in
            state.connectProfileCalls.append((call.path, uuid))
            let registered = state.registrations.contains { $0.uuid == uuid && $0.options["Role"] != .string("server") }
            let listed = state.devices.contains { $0.path == call.path && $0.uuids.contains { $0.lowercased() == uuid.lowercased() } }
            guard registered && listed else { return (false, nil) }
            return (true, state.outgoing.removeValue(forKey: call.path))
        }
        guard available else { return .error(name: "org.bluez.Error.NotAvailable", message: "br-connection-profile-unavailable") }
        if let socket, let device = state.withLock({ $0.devices.first { $0.path == call.path } }) {
            Task {
                try? await self.newConnection(device: device, descriptor: socket, uuid: uuid)
                close(socket)
            }
        }
        return .empty
    }

    /// Hands `descriptor` (which stays the caller's) to the registered profile as BlueZ does
    /// for a new connection of `device`.
    func newConnection(device: Device, descriptor: Int32, version: UInt16? = 0x0100, uuid: String = BluetoothProfile.iAP2UUID) async throws {
        let registration = try requireRegistration(uuid: uuid)
        let properties: [String: BusValue] = version.map { ["Version": .uint16($0)] } ?? [:]
        _ = try await bus.call(destination: registration.sender, path: registration.path, interface: "org.bluez.Profile1", member: "NewConnection",
                               arguments: [.objectPath(device.path), .unixFD(BusFileDescriptor(owning: dup(descriptor))), .dictionary(properties)])
    }

    func requestDisconnection(device: Device) async throws {
        let registration = try requireRegistration()
        _ = try await bus.call(destination: registration.sender, path: registration.path, interface: "org.bluez.Profile1",
                               member: "RequestDisconnection", arguments: [.objectPath(device.path)])
    }

    /// Calls `member` of the default agent, as bluetoothd does while pairing.
    func askAgent(_ member: String, arguments: [BusValue]) async throws -> [BusValue] {
        guard let agent = state.withLock({ state in state.agents.last(where: { $0.path == state.defaultAgent }) }) else { throw NotRegistered() }
        return try await bus.call(destination: agent.sender, path: agent.path, interface: "org.bluez.Agent1", member: member, arguments: arguments)
    }

    func release() async throws {
        let registration = try requireRegistration()
        _ = try await bus.call(destination: registration.sender, path: registration.path, interface: "org.bluez.Profile1", member: "Release")
    }

    struct NotRegistered: Error {}

    /// The last registration of `uuid` (the host's iAP2 service by default).
    func requireRegistration(uuid: String = BluetoothProfile.iAP2UUID) throws -> Registration {
        guard let registration = state.withLock({ $0.registrations.last { $0.uuid == uuid } }) else { throw NotRegistered() }
        return registration
    }

    func stop() { bus.close() }

    /// Gives `org.bluez` back (answered once the bus has let go of it), then leaves the bus: the
    /// next stand-in can take the name at once.
    func stopReleasingName() async throws {
        _ = try await bus.call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
                               member: "ReleaseName", arguments: [.string("org.bluez")])
        bus.close()
    }
}
