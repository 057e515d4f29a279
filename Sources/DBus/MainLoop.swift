internal import CDBus
internal import Dispatch
internal import Glibc

/// A libdbus watch (a socket it wants to read or write) as a Dispatch source on the
/// connection's queue. The source watches a duplicate of the socket, closed by its cancel
/// handler, so libdbus closing its own descriptor never leaves Dispatch watching a number
/// the process reuses. Stored in the watch itself (`dbus_watch_set_data`, retained).
final class WatchSource {
    private let watch: OpaquePointer
    private let flags: UInt32
    private let source: any DispatchSourceProtocol
    private var resumed = false
    private var cancelled = false

    private init(watch: OpaquePointer, flags: UInt32, source: any DispatchSourceProtocol) {
        self.watch = watch
        self.flags = flags
        self.source = source
    }

    /// Starts watching `watch` on `queue`; `handled` runs after libdbus handled an event.
    static func add(_ watch: OpaquePointer, queue: DispatchQueue, handled: @escaping () -> Void) -> Bool {
        let descriptor = fcntl(dbus_watch_get_unix_fd(watch), F_DUPFD_CLOEXEC, 0)
        guard descriptor >= 0 else { return false }
        let flags = dbus_watch_get_flags(watch)
        let readable = flags & DBUS_WATCH_READABLE.rawValue != 0
        let source: any DispatchSourceProtocol = readable
            ? DispatchSource.makeReadSource(fileDescriptor: descriptor, queue: queue)
            : DispatchSource.makeWriteSource(fileDescriptor: descriptor, queue: queue)
        let entry = WatchSource(watch: watch, flags: readable ? DBUS_WATCH_READABLE.rawValue : DBUS_WATCH_WRITABLE.rawValue, source: source)
        source.setEventHandler { [weak entry] in
            guard let entry, !entry.cancelled, dbus_watch_get_enabled(entry.watch) != 0 else { return }
            _ = dbus_watch_handle(entry.watch, entry.flags)
            handled()
        }
        source.setCancelHandler { _ = Glibc.close(descriptor) }
        dbus_watch_set_data(watch, Unmanaged.passRetained(entry).toOpaque(), nil)
        entry.update()
        return true
    }

    /// Stops watching (libdbus is done with the watch).
    static func remove(_ watch: OpaquePointer) {
        guard let data = dbus_watch_get_data(watch) else { return }
        dbus_watch_set_data(watch, nil, nil)
        let entry = Unmanaged<WatchSource>.fromOpaque(data).takeRetainedValue()
        entry.cancel()
    }

    /// Follows the watch's enabled flag.
    static func toggle(_ watch: OpaquePointer) {
        guard let data = dbus_watch_get_data(watch) else { return }
        Unmanaged<WatchSource>.fromOpaque(data).takeUnretainedValue().update()
    }

    private func update() {
        guard !cancelled else { return }
        let enabled = dbus_watch_get_enabled(watch) != 0
        if enabled, !resumed {
            resumed = true
            source.resume()
        } else if !enabled, resumed {
            resumed = false
            source.suspend()
        }
    }

    private func cancel() {
        guard !cancelled else { return }
        cancelled = true
        if !resumed { source.resume() }
        source.cancel()
    }
}

/// A libdbus timeout (a call's reply deadline) as a Dispatch timer on the connection's queue,
/// stored in the timeout itself (`dbus_timeout_set_data`, retained).
final class TimeoutSource {
    private let timeout: OpaquePointer
    private let timer: any DispatchSourceTimer
    private var resumed = false
    private var cancelled = false

    private init(timeout: OpaquePointer, timer: any DispatchSourceTimer) {
        self.timeout = timeout
        self.timer = timer
    }

    /// Starts timing `timeout` on `queue`; `handled` runs after libdbus handled it.
    static func add(_ timeout: OpaquePointer, queue: DispatchQueue, handled: @escaping () -> Void) {
        let timer = DispatchSource.makeTimerSource(queue: queue)
        let entry = TimeoutSource(timeout: timeout, timer: timer)
        timer.setEventHandler { [weak entry] in
            guard let entry, !entry.cancelled, dbus_timeout_get_enabled(entry.timeout) != 0 else { return }
            _ = dbus_timeout_handle(entry.timeout)
            handled()
        }
        dbus_timeout_set_data(timeout, Unmanaged.passRetained(entry).toOpaque(), nil)
        entry.update()
    }

    /// Stops the timer (libdbus is done with the timeout).
    static func remove(_ timeout: OpaquePointer) {
        guard let data = dbus_timeout_get_data(timeout) else { return }
        dbus_timeout_set_data(timeout, nil, nil)
        Unmanaged<TimeoutSource>.fromOpaque(data).takeRetainedValue().cancel()
    }

    /// Follows the timeout's enabled flag and interval (restarting the interval).
    static func toggle(_ timeout: OpaquePointer) {
        guard let data = dbus_timeout_get_data(timeout) else { return }
        Unmanaged<TimeoutSource>.fromOpaque(data).takeUnretainedValue().update()
    }

    private func update() {
        guard !cancelled else { return }
        if dbus_timeout_get_enabled(timeout) != 0 {
            let interval = DispatchTimeInterval.milliseconds(Int(max(1, dbus_timeout_get_interval(timeout))))
            timer.schedule(deadline: .now() + interval, repeating: interval)
            if !resumed {
                resumed = true
                timer.resume()
            }
        } else if resumed {
            resumed = false
            timer.suspend()
        }
    }

    private func cancel() {
        guard !cancelled else { return }
        cancelled = true
        if !resumed { timer.resume() }
        timer.cancel()
    }
}
