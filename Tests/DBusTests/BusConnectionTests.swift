import DBus
import Dispatch
import Glibc
import Synchronization
import TestSupport
import Testing

/// The libdbus wrapper over a private bus (a dbus-daemon the test starts).
@Suite("D-Bus connection over a private bus", .timeLimit(.minutes(2)))
struct BusConnectionTests {
    private func connect(_ bus: PrivateBus, _ label: String) async throws -> BusConnection {
        try await BusConnection.connect(address: bus.address, queue: DispatchQueue(label: label))
    }

    @Test("connects, has a unique name, and calls the bus itself")
    func callsTheBus() async throws {
        let bus = try await PrivateBus.start()
        let connection = try await connect(bus, "a")
        #expect(connection.uniqueName.hasPrefix(":"))
        let names = try await connection.call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                              interface: "org.freedesktop.DBus", member: "ListNames")
        let list = try #require(names.first?.elements).compactMap(\.string)
        #expect(list.contains(connection.uniqueName))
        #expect(list.contains("org.freedesktop.DBus"))
        connection.close()
    }

    @Test("an exported object gets every argument type the Bluetooth code needs, and its reply comes back")
    func exportedObjectRoundTrip() async throws {
        let bus = try await PrivateBus.start()
        let server = try await connect(bus, "server")
        let client = try await connect(bus, "client")
        try await server.requestName("org.example.Fake")
        let received = Mutex<BusMethodCall?>(nil)
        try server.export(path: "/org/example/object") { call in
            received.withLock { $0 = call }
            guard call.member == "Echo" else { return .error(name: "org.example.Error.Unknown", message: "no \(call.member)") }
            return .values(call.arguments.filter { if case .unixFD = $0 { false } else { true } } + [.uint32(7)])
        }
        var pair: [Int32] = [-1, -1]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
        defer { close(pair[1]) }
        let sent = BusFileDescriptor(owning: pair[0])
        let options = BusValue.dictionary(["Name": .string("iAP2"), "Channel": .uint16(0), "RequireAuthentication": .bool(true)])
        let reply = try await client.call(
            destination: "org.example.Fake", path: "/org/example/object", interface: "org.example.Test", member: "Echo",
            arguments: [.objectPath("/org/bluez/hci0/dev_00_11_22_33_44_55"), .unixFD(sent), options, .string("héllo"), .bool(false), .uint16(65535)])
        #expect(reply == [.objectPath("/org/bluez/hci0/dev_00_11_22_33_44_55"), options, .string("héllo"), .bool(false), .uint16(65535), .uint32(7)])
        let call = try #require(received.withLock { $0 })
        #expect(call.interface == "org.example.Test")
        #expect(call.sender == client.uniqueName)
        #expect(call.arguments[2].dictionary?["Channel"] == .uint16(0))
        #expect(call.arguments[2].dictionary?["Name"]?.string == "iAP2")
        // The descriptor that arrived is a new one for the same socket: bytes written into it come
        // out at the other end of the pair.
        guard case let .unixFD(arrived) = call.arguments[1], let descriptor = arrived.value else {
            Issue.record("no descriptor arrived: \(call.arguments)")
            return
        }
        #expect(descriptor != pair[0])
        let bytes: [UInt8] = [1, 2, 3]
        #expect(write(descriptor, bytes, 3) == 3)
        var back = [UInt8](repeating: 0, count: 3)
        #expect(read(pair[1], &back, 3) == 3)
        #expect(back == bytes)

        await #expect(throws: BusError(name: "org.example.Error.Unknown", message: "no Other")) {
            _ = try await client.call(destination: "org.example.Fake", path: "/org/example/object", interface: "org.example.Test", member: "Other")
        }
        server.close()
        client.close()
    }

    @Test("a name nobody owns is ServiceUnknown; an address nobody listens at is an error, not a crash")
    func unknownServiceAndAddress() async throws {
        let bus = try await PrivateBus.start()
        let client = try await connect(bus, "client")
        do {
            _ = try await client.call(destination: "org.bluez", path: "/", interface: "org.freedesktop.DBus.ObjectManager", member: "GetManagedObjects")
            Issue.record("the call succeeded")
        } catch {
            #expect(error.name == BusError.serviceUnknown)
        }
        do {
            _ = try await BusConnection.connect(address: "unix:path=/nonexistent/accessoryhost-test-bus", queue: DispatchQueue(label: "x"))
            Issue.record("connected to nothing")
        } catch {
            #expect([BusError.fileNotFound, BusError.noServer].contains(error.name), "\(error)")
        }
        client.close()
    }

    @Test("values libdbus would abort on are refused with InvalidArgs")
    func invalidValuesAreErrors() async throws {
        let bus = try await PrivateBus.start()
        let client = try await connect(bus, "client")
        let taken = BusFileDescriptor(owning: dup(0))
        if let descriptor = taken.take() { close(descriptor) }
        let bad: [(String, String, String, [BusValue])] = [
            ("/ok", "org.example.I", "M", [.string("nul\0inside")]),
            ("not a path", "org.example.I", "M", []),
            ("/ok", "no-dots", "M", []),
            ("/ok", "org.example.I", "bad member", []),
            ("/ok", "org.example.I", "M", [.objectPath("/trailing/")]),
            ("/ok", "org.example.I", "M", [.array("s", [.uint16(1)])]),
            ("/ok", "org.example.I", "M", [.dictionaryEntry(.string("k"), .string("v"))]),
            ("/ok", "org.example.I", "M", [.array("{vs}", [.dictionaryEntry(.variant(.string("k")), .string("v"))])]),
            ("/ok", "org.example.I", "M", [.signature("a{")]),
            ("/ok", "org.example.I", "M", [.unixFD(taken)]),
        ]
        for (path, interface, member, arguments) in bad {
            do {
                _ = try await client.call(destination: "org.freedesktop.DBus", path: path, interface: interface, member: member, arguments: arguments)
                Issue.record("sent \(path) \(interface).\(member) \(arguments)")
            } catch {
                #expect(error.name == BusError.invalidArgs, "\(path) \(interface).\(member) \(arguments): \(error)")
            }
        }
        #expect(throws: BusError.self) { try client.export(path: "bad path") { _ in .empty } }
        client.close()
    }

    @Test("a peer that does not answer in time is NoReply")
    func timeout() async throws {
        let bus = try await PrivateBus.start()
        let serverQueue = DispatchQueue(label: "server")
        let server = try await BusConnection.connect(address: bus.address, queue: serverQueue)
        let client = try await connect(bus, "client")
        try server.export(path: "/slow") { _ in .empty }
        // The server's queue is held: the call reaches its socket but is never dispatched.
        serverQueue.suspend()
        do {
            _ = try await client.call(destination: server.uniqueName, path: "/slow", interface: "org.example.I", member: "M", timeout: .milliseconds(200))
            Issue.record("answered")
        } catch {
            #expect(error.name == BusError.noReply, "\(error)")
        }
        serverQueue.resume()
        server.close()
        client.close()
    }

    @Test("the bus going away ends the connection: pending calls fail, disconnect handlers run")
    func busGoesAway() async throws {
        let bus = try await PrivateBus.start()
        let serverQueue = DispatchQueue(label: "server")
        let server = try await BusConnection.connect(address: bus.address, queue: serverQueue)
        let client = try await connect(bus, "client")
        try server.export(path: "/held") { _ in .empty }
        serverQueue.suspend()
        async let pending: [BusValue] = client.call(destination: server.uniqueName, path: "/held", interface: "org.example.I", member: "M")
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            client.onDisconnect { continuation.resume() }
            bus.stop()
        }
        #expect(!client.isConnected)
        do {
            _ = try await pending
            Issue.record("answered")
        } catch {
            #expect((error as? BusError)?.name == BusError.disconnected, "\(error)")
        }
        await #expect(throws: BusError.self) {
            _ = try await client.call(destination: "org.freedesktop.DBus", path: "/", interface: "org.example.I", member: "M")
        }
        serverQueue.resume()
        server.close()
    }
}
