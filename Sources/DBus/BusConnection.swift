package import Dispatch
internal import CDBus
internal import Glibc
internal import QueueConfinement
internal import Synchronization

/// A private connection to a D-Bus bus (the system bus, or any address), driven by Dispatch on
/// one serial queue: libdbus's sockets are Dispatch read and write sources and its timeouts
/// Dispatch timers on that queue, so no thread ever waits inside libdbus (only ``connect(address:queue:)``
/// blocks, for the connect and the `Hello` round trip, on a Dispatch queue of its own).
///
/// What it does: method calls out (``call(destination:path:interface:member:arguments:timeout:)``,
/// the answer as a value or a ``BusError``), objects exported (``export(path:handler:)``: method
/// calls in, answered by a handler on the queue), well-known names (``requestName(_:)``), and
/// the end of the connection (``onDisconnect(_:)``). Values are ``BusValue``s, file descriptors
/// included (`h`, passed over the bus's socket).
///
/// Thread safety: every method may be called from any thread; libdbus is only touched on
/// ``queue``. Handlers and completions run on ``queue``. ``close()`` (or releasing the
/// connection) ends it: pending calls fail with ``BusError/disconnected``.
package final class BusConnection: Sendable {
    /// The queue every handler and completion runs on, and the only one that touches libdbus.
    package let queue: DispatchQueue
    /// This connection's unique name on the bus, e.g. `:1.42`.
    package let uniqueName: String
    private let core: ConnectionCore

    private init(core: ConnectionCore, uniqueName: String) {
        self.core = core
        self.queue = core.queue
        self.uniqueName = uniqueName
    }

    deinit {
        let core = self.core
        core.queue.async { core.close() }
    }

    /// The system bus's address: `DBUS_SYSTEM_BUS_ADDRESS` from the environment, else
    /// `unix:path=/var/run/dbus/system_bus_socket`.
    package static var systemBusAddress: String {
        if let value = getenv("DBUS_SYSTEM_BUS_ADDRESS"), let address = String(validatingCString: value), !address.isEmpty {
            return address
        }
        return "unix:path=/var/run/dbus/system_bus_socket"
    }

    /// Connects to the bus at `address` (a D-Bus address such as `unix:path=/run/dbus/system_bus_socket`)
    /// and registers with it; the connection then runs on `queue` (serial).
    ///
    /// The connect and the `Hello` call block a Dispatch queue of their own (not the caller's
    /// thread): local sockets, a few milliseconds.
    ///
    /// - Throws: ``BusError``: ``BusError/fileNotFound`` or ``BusError/noServer`` when no bus
    ///   listens there, ``BusError/accessDenied`` when its socket refuses this user.
    package static func connect(address: String, queue: DispatchQueue) async throws(BusError) -> BusConnection {
        let result = await withCheckedContinuation { (continuation: CheckedContinuation<Result<BusConnection, BusError>, Never>) in
            DispatchQueue(label: "DBus.connect").async {
                continuation.resume(returning: open(address: address, queue: queue))
            }
        }
        return try result.get()
    }

    private static func open(address: String, queue: DispatchQueue) -> Result<BusConnection, BusError> {
        _ = dbus_threads_init_default()
        var error = CDBus.DBusError()
        dbus_error_init(&error)
        guard let raw = dbus_connection_open_private(address, &error) else {
            return .failure(BusError(taking: &error, otherwise: "cannot connect to the bus at \(address)"))
        }
        dbus_connection_set_exit_on_disconnect(raw, 0)
        guard dbus_bus_register(raw, &error) != 0, let name = dbus_bus_get_unique_name(raw) else {
            let failure = BusError(taking: &error, otherwise: "the bus at \(address) did not register this connection")
            dbus_connection_close(raw)
            dbus_connection_unref(raw)
            return .failure(failure)
        }
        let connection = BusConnection(core: ConnectionCore(raw: raw, queue: queue), uniqueName: String(cString: name))
        queue.sync { connection.core.install() }
        return .success(connection)
    }

    /// Calls `member` of `interface` on the object at `path` of `destination` (a bus name, or nil
    /// on a peer-to-peer connection); `completion` gets the reply's values or the error, on
    /// ``queue``, within `timeout` (then ``BusError/noReply``).
    package func call(destination: String?, path: String, interface: String, member: String, arguments: [BusValue] = [],
                     timeout: Duration = .seconds(25), completion: @escaping @Sendable (Result<[BusValue], BusError>) -> Void) {
        let core = self.core
        queue.async {
            core.call(destination: destination, path: path, interface: interface, member: member, arguments: arguments,
                      timeout: timeout, completion: completion)
        }
    }

    /// ``call(destination:path:interface:member:arguments:timeout:completion:)`` for async code:
    /// suspends (never blocks) until the reply.
    package func call(destination: String?, path: String, interface: String, member: String, arguments: [BusValue] = [],
                     timeout: Duration = .seconds(25)) async throws(BusError) -> [BusValue] {
        let result = await withCheckedContinuation { (continuation: CheckedContinuation<Result<[BusValue], BusError>, Never>) in
            call(destination: destination, path: path, interface: interface, member: member, arguments: arguments, timeout: timeout) {
                continuation.resume(returning: $0)
            }
        }
        return try result.get()
    }

    /// Asks the bus for the well-known `name` (e.g. `org.bluez` for a stand-in service in tests).
    ///
    /// - Throws: ``BusError`` when the bus refuses it (policy) or another connection owns it
    ///   (name `org.freedesktop.DBus.Error.AddressInUse`).
    package func requestName(_ name: String) async throws(BusError) {
        let reply = try await call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
                                   member: "RequestName", arguments: [.string(name), .uint32(4 /* DBUS_NAME_FLAG_DO_NOT_QUEUE */)])
        // 1: the primary owner now; 4: this connection owned it already.
        guard let code = reply.first?.integer, code == 1 || code == 4 else {
            throw BusError(name: "org.freedesktop.DBus.Error.AddressInUse", message: "\(name) is owned by another connection")
        }
    }

    /// Serves the object at `path`: every method call to it (or below it) runs `handler` on
    /// ``queue``, whose answer is sent back (unless the caller asked for none).
    ///
    /// - Throws: ``BusError`` when `path` is not a valid object path or is exported already.
    package func export(path: String, handler: @escaping @Sendable (BusMethodCall) -> BusReply) throws(BusError) {
        let core = self.core
        try onQueue { () throws(BusError) in try core.export(path: path, handler: handler) }
    }

    /// Stops serving the object at `path` (calls to it are then answered UnknownObject).
    package func unexport(path: String) {
        let core = self.core
        queue.async { core.unexport(path: path) }
    }

    /// Runs `handler` on ``queue`` once, when the connection ends (the bus went away, or
    /// ``close()``); at once (on the queue) when it has ended already.
    package func onDisconnect(_ handler: @escaping @Sendable () -> Void) {
        let core = self.core
        queue.async { core.addDisconnectHandler(handler) }
    }

    /// Whether the connection is still up.
    package var isConnected: Bool { core.connected.load(ordering: .acquiring) }

    /// Ends the connection: pending calls fail with ``BusError/disconnected``, exported objects
    /// go away, the disconnect handlers run. Idempotent.
    package func close() {
        let core = self.core
        queue.async { core.close() }
    }

    private func onQueue<Result>(_ body: () throws(BusError) -> Result) throws(BusError) -> Result {
        if QueueMark.isCurrent(queue) {
            return try body()
        }
        let outcome: Swift.Result<Result, BusError> = queue.sync {
            do throws(BusError) { return .success(try body()) } catch { return .failure(error) }
        }
        return try outcome.get()
    }
}

extension BusError {
    /// The error libdbus set in `error` (freed here), or a generic one saying `otherwise`.
    init(taking error: inout CDBus.DBusError, otherwise: String) {
        if dbus_error_is_set(&error) != 0 {
            self.init(name: error.name.map { String(cString: $0) } ?? BusError.failed,
                      message: error.message.map { String(cString: $0) } ?? otherwise)
            dbus_error_free(&error)
        } else {
            self.init(name: BusError.failed, message: otherwise)
        }
    }
}
