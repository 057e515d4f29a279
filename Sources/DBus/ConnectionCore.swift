internal import CDBus
internal import Dispatch
internal import Glibc
internal import QueueConfinement
internal import Synchronization

/// Everything of one libdbus connection, confined to its queue: the only type that holds
/// libdbus pointers (with ``WatchSource`` and ``TimeoutSource``, which it owns).
///
/// Unsafe pointers here, and why: libdbus's connection, messages, watches, timeouts and pending
/// calls are C objects; its callbacks get this object back as an opaque pointer
/// (`Unmanaged`, unretained: the core outlives the libdbus connection, which it closes and
/// releases in ``close()`` on the queue, and libdbus calls back only from calls made on the queue).
final class ConnectionCore: @unchecked Sendable {
    // Sendability: every stored var is touched on `queue` only; `connected` is atomic.

    let queue: DispatchQueue
    let connected = Atomic<Bool>(true)
    private var raw: OpaquePointer?
    private var objects: [String: @Sendable (BusMethodCall) -> BusReply] = [:]
    private var pending: [Int: (call: OpaquePointer, completion: @Sendable (Result<[BusValue], BusError>) -> Void)] = [:]
    private var nextCall = 0
    private var disconnectHandlers: [@Sendable () -> Void] = []
    private var dispatchScheduled = false

    init(raw: OpaquePointer, queue: DispatchQueue) {
        self.raw = raw
        self.queue = queue
        QueueMark.mark(queue)
    }

    private var opaqueSelf: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

    static func from(_ data: UnsafeMutableRawPointer?) -> ConnectionCore {
        Unmanaged<ConnectionCore>.fromOpaque(data!).takeUnretainedValue()
    }

    /// Hands libdbus its main loop: watches and timeouts as Dispatch sources, dispatching
    /// scheduled on the queue, the filter that notices the end of the connection.
    func install() {
        dispatchPrecondition(condition: .onQueue(queue))
        guard let raw else { return }
        _ = dbus_connection_set_watch_functions(raw, { watch, data in
            ConnectionCore.from(data).addWatch(watch!)
        }, { watch, _ in
            WatchSource.remove(watch!)
        }, { watch, _ in
            WatchSource.toggle(watch!)
        }, opaqueSelf, nil)
        _ = dbus_connection_set_timeout_functions(raw, { timeout, data in
            ConnectionCore.from(data).addTimeout(timeout!)
        }, { timeout, _ in
            TimeoutSource.remove(timeout!)
        }, { timeout, _ in
            TimeoutSource.toggle(timeout!)
        }, opaqueSelf, nil)
        dbus_connection_set_dispatch_status_function(raw, { _, status, data in
            if status == DBUS_DISPATCH_DATA_REMAINS { ConnectionCore.from(data).scheduleDispatch() }
        }, opaqueSelf, nil)
        _ = dbus_connection_add_filter(raw, { _, message, data in
            if dbus_message_is_signal(message, "org.freedesktop.DBus.Local", "Disconnected") != 0 {
                ConnectionCore.from(data).ended()
            }
            return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
        }, opaqueSelf, nil)
        scheduleDispatch()
    }

    // MARK: Main loop

    private func addWatch(_ watch: OpaquePointer) -> dbus_bool_t {
        WatchSource.add(watch, queue: queue) { [weak self] in self?.dispatchAll() } ? 1 : 0
    }

    private func addTimeout(_ timeout: OpaquePointer) -> dbus_bool_t {
        TimeoutSource.add(timeout, queue: queue) { [weak self] in self?.dispatchAll() }
        return 1
    }

    func scheduleDispatch() {
        guard !dispatchScheduled else { return }
        dispatchScheduled = true
        queue.async { [weak self] in
            self?.dispatchScheduled = false
            self?.dispatchAll()
        }
    }

    /// Runs every message libdbus has read (replies, method calls, signals).
    func dispatchAll() {
        while let raw, dbus_connection_get_dispatch_status(raw) == DBUS_DISPATCH_DATA_REMAINS {
            _ = dbus_connection_dispatch(raw)
        }
    }

    // MARK: Calls out

    func call(destination: String?, path: String, interface: String, member: String, arguments: [BusValue],
              timeout: Duration, completion: @escaping @Sendable (Result<[BusValue], BusError>) -> Void) {
        guard let raw, connected.load(ordering: .acquiring) else {
            return completion(.failure(BusError(name: BusError.disconnected, message: "the connection to the bus is closed")))
        }
        do throws(BusError) {
            if let destination { try Validation.busName(destination) }
            try Validation.path(path)
            try Validation.interface(interface)
            try Validation.member(member)
            for argument in arguments { try Validation.value(argument) }
            if arguments.contains(where: \.carriesDescriptor), dbus_connection_can_send_type(raw, Int32(UInt8(ascii: "h"))) == 0 {
                throw BusError(name: BusError.invalidArgs, message: "this bus connection cannot pass file descriptors")
            }
        } catch {
            return completion(.failure(error))
        }
        guard let message = dbus_message_new_method_call(destination, path, interface, member) else {
            return completion(.failure(BusError(name: "org.freedesktop.DBus.Error.NoMemory", message: "out of memory")))
        }
        defer { dbus_message_unref(message) }
        guard MessageCoding.append(arguments, to: message) else {
            return completion(.failure(BusError(name: "org.freedesktop.DBus.Error.NoMemory", message: "out of memory")))
        }
        let (seconds, attoseconds) = timeout.components
        let milliseconds = Int32(clamping: seconds * 1000 + attoseconds / 1_000_000_000_000_000)
        var call: OpaquePointer?
        guard dbus_connection_send_with_reply(raw, message, &call, max(1, milliseconds)) != 0, let call else {
            return completion(.failure(BusError(name: BusError.disconnected, message: "the connection to the bus is closed")))
        }
        nextCall += 1
        let id = nextCall
        pending[id] = (call, completion)
        let token = Unmanaged.passRetained(CallToken(core: self, id: id)).toOpaque()
        _ = dbus_pending_call_set_notify(call, { _, data in
            let token = Unmanaged<CallToken>.fromOpaque(data!).takeUnretainedValue()
            token.core?.completed(token.id)
        }, token, { data in
            Unmanaged<CallToken>.fromOpaque(data!).release()
        })
    }

    private func completed(_ id: Int) {
        guard let (call, completion) = pending.removeValue(forKey: id) else { return }
        let reply = dbus_pending_call_steal_reply(call)
        dbus_pending_call_unref(call)
        guard let reply else {
            return completion(.failure(BusError(name: BusError.noReply, message: "no reply")))
        }
        defer { dbus_message_unref(reply) }
        let values = MessageCoding.arguments(of: reply)
        if dbus_message_get_type(reply) == DBUS_MESSAGE_TYPE_ERROR {
            let name = dbus_message_get_error_name(reply).map { String(cString: $0) } ?? BusError.failed
            completion(.failure(BusError(name: name, message: values.first?.string ?? "")))
        } else {
            completion(.success(values))
        }
    }

    // MARK: Objects

    func export(path: String, handler: @escaping @Sendable (BusMethodCall) -> BusReply) throws(BusError) {
        dispatchPrecondition(condition: .onQueue(queue))
        try Validation.path(path)
        guard let raw else { throw BusError(name: BusError.disconnected, message: "the connection to the bus is closed") }
        guard objects[path] == nil else { throw BusError(name: "org.freedesktop.DBus.Error.ObjectPathInUse", message: "\(path) is exported already") }
        var vtable = DBusObjectPathVTable()
        vtable.message_function = { _, message, data in
            ConnectionCore.from(data).handle(message!)
        }
        var error = CDBus.DBusError()
        dbus_error_init(&error)
        guard dbus_connection_try_register_object_path(raw, path, &vtable, opaqueSelf, &error) != 0 else {
            throw BusError(taking: &error, otherwise: "cannot export \(path)")
        }
        objects[path] = handler
    }

    func unexport(path: String) {
        guard objects.removeValue(forKey: path) != nil, let raw else { return }
        _ = dbus_connection_unregister_object_path(raw, path)
    }

    private func handle(_ message: OpaquePointer) -> DBusHandlerResult {
        guard dbus_message_get_type(message) == DBUS_MESSAGE_TYPE_METHOD_CALL,
              let path = dbus_message_get_path(message).map({ String(cString: $0) }),
              let handler = objects[path]
        else { return DBUS_HANDLER_RESULT_NOT_YET_HANDLED }
        let call = BusMethodCall(
            path: path,
            interface: dbus_message_get_interface(message).map { String(cString: $0) } ?? "",
            member: dbus_message_get_member(message).map { String(cString: $0) } ?? "",
            sender: dbus_message_get_sender(message).map { String(cString: $0) } ?? "",
            arguments: MessageCoding.arguments(of: message))
        let reply = handler(call)
        guard dbus_message_get_no_reply(message) == 0, let raw else { return DBUS_HANDLER_RESULT_HANDLED }
        var answer: OpaquePointer?
        switch reply {
        case let .values(values):
            if values.allSatisfy({ (try? Validation.value($0)) != nil }), let made = dbus_message_new_method_return(message) {
                if MessageCoding.append(values, to: made) { answer = made } else { dbus_message_unref(made) }
            }
            if answer == nil { answer = dbus_message_new_error(message, BusError.failed, "the reply could not be encoded") }
        case let .error(name, text):
            let valid = (try? Validation.errorName(name)) != nil
            answer = dbus_message_new_error(message, valid ? name : BusError.failed, text.replacingNULs)
        }
        if let answer {
            _ = dbus_connection_send(raw, answer, nil)
            dbus_message_unref(answer)
        }
        return DBUS_HANDLER_RESULT_HANDLED
    }

    // MARK: The end

    func addDisconnectHandler(_ handler: @escaping @Sendable () -> Void) {
        if connected.load(ordering: .acquiring) { disconnectHandlers.append(handler) } else { handler() }
    }

    /// The bus went away (libdbus's local Disconnected signal), or ``close()``.
    private func ended() {
        guard connected.exchange(false, ordering: .acquiringAndReleasing) else { return }
        let calls = pending
        pending.removeAll()
        for (_, entry) in calls.sorted(by: { $0.key < $1.key }) {
            dbus_pending_call_cancel(entry.call)
            dbus_pending_call_unref(entry.call)
            entry.completion(.failure(BusError(name: BusError.disconnected, message: "the connection to the bus ended")))
        }
        let handlers = disconnectHandlers
        disconnectHandlers.removeAll()
        for handler in handlers { handler() }
    }

    func close() {
        dispatchPrecondition(condition: .onQueue(queue))
        guard let raw else { return }
        ended()
        for path in objects.keys { _ = dbus_connection_unregister_object_path(raw, path) }
        objects.removeAll()
        self.raw = nil
        dbus_connection_close(raw)
        // Dropping the last reference frees the connection; libdbus removes its watches and
        // timeouts (our sources are cancelled) before that.
        _ = dbus_connection_set_watch_functions(raw, nil, nil, nil, nil, nil)
        _ = dbus_connection_set_timeout_functions(raw, nil, nil, nil, nil, nil)
        dbus_connection_set_dispatch_status_function(raw, nil, nil, nil)
        dbus_connection_unref(raw)
    }
}

/// The core and the call a pending call's notification is for.
private final class CallToken {
    weak var core: ConnectionCore?
    let id: Int
    init(core: ConnectionCore, id: Int) {
        self.core = core
        self.id = id
    }
}

extension BusValue {
    var carriesDescriptor: Bool {
        switch self {
        case .unixFD: true
        case let .variant(inner): inner.carriesDescriptor
        case let .array(_, elements), let .structure(elements): elements.contains { $0.carriesDescriptor }
        case let .dictionaryEntry(key, value): key.carriesDescriptor || value.carriesDescriptor
        default: false
        }
    }
}

extension String {
    /// The text with NUL characters (which D-Bus strings cannot carry) as U+FFFD.
    var replacingNULs: String { contains("\0") ? replacingOccurrences(of: "\0", with: "\u{FFFD}") : self }

    private func replacingOccurrences(of target: String, with replacement: String) -> String {
        split(separator: Character(target), omittingEmptySubsequences: false).joined(separator: replacement)
    }
}
