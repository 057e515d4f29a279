public import Dispatch
internal import Glibc
internal import IAPLink
internal import SystemCalls

/// iAP2 over a serial line: a UART, a USB-serial adapter (`/dev/ttyUSB*`, `/dev/ttyACM*`), or
/// either side of a ``PseudoTerminal``.
///
/// The descriptor is non-blocking. Once activated:
/// - incoming bytes are read on the queue given to ``activate(queue:handler:)`` and delivered
///   as `.received`, once per `read(2)` (a serial line is a byte stream: frames arrive split
///   and coalesced);
/// - ``send(_:)`` writes what the kernel takes at once and queues the rest, which is written
///   as the line drains; the descriptor is watched for writability only while output is
///   pending, so an idle line costs no wake-ups;
/// - a hang-up (the adapter was unplugged, the pseudo-terminal's peer closed) or a failed read or
///   write delivers `.closed(error)`; ``cancel()`` delivers `.closed(nil)`. Either comes once,
///   after the descriptor is closed (when this transport owns it), and nothing follows it.
///
/// Unsent output is discarded on close. Releasing a transport without ``cancel()`` closes the
/// descriptor too, but delivers nothing.
///
/// One thread of the process, the serial poller, waits in `poll(2)` for every active transport
/// (no thread per port: a thousand accessories cost one thread); it only says when to read or
/// write, and each transport reads on its own queue. (Dispatch read and write sources are not
/// used: on Linux, a hang-up makes libdispatch free its record of the descriptor on the
/// handler's thread while its event thread is still using it, and the process crashes in
/// `_dispatch_event_merge_fd`.)
public final class SerialTransport: Transport {
    /// What a person reads, e.g. `serial /dev/ttyUSB0 @ 115200`.
    public let description: String
    /// Always ``TransportKind/serial``.
    public var kind: TransportKind { .serial }
    /// The port this transport opened, or `nil` when it wraps a descriptor opened elsewhere.
    public let spec: SerialPortSpec?

    /// Its ``SerialPortSpec`` (for a port opened by path) and its ``TransportOutputProgress``
    /// (read now).
    public func capability<Value>(_ type: Value.Type) -> Value? {
        if type == SerialPortSpec.self { return spec as? Value }
        if type == TransportOutputProgress.self { return core.outputProgress as? Value }
        return nil
    }

    /// Everything the watcher thread and the queue share; it outlives this object while the
    /// watcher runs.
    private let core: SerialCore

    /// Opens and configures the serial device named by `spec`.
    ///
    /// The device is opened `O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC` and put in raw mode:
    /// 8 data bits, no parity, 1 stop bit, no hardware or software flow control, the modem
    /// lines ignored (`CLOCAL`), the receiver on, `spec.baudRate` both ways. Stale input the
    /// adapter buffered before the open is discarded.
    ///
    /// - Throws: ``TransportError`` saying what to do: plug the adapter in (`ENOENT`), join the
    ///   `dialout` group (`EACCES`), close the other program using it (`EBUSY`), replug it
    ///   (`EIO`), or name a serial device instead of a file that is not a terminal (`ENOTTY`).
    public convenience init(spec: SerialPortSpec) throws(TransportError) {
        let path = spec.path
        let descriptor: Int32
        switch SystemCall.open(path, O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC) {
        case .success(let opened): descriptor = opened
        case .failure(let error): throw Self.openError(path: path, errno: error.code)
        }
        // One owner at a time: an advisory lock every AccessoryHost process takes (root
        // included), and the terminal's exclusive mode for other programs (TIOCEXCL; root
        // passes it). Two owners of one line would each break the other's link.
        if flock(descriptor, LOCK_EX | LOCK_NB) != 0 {
            let code = errno
            _ = close(descriptor)
            throw Self.openError(path: path, errno: code == EWOULDBLOCK ? EBUSY : code)
        }
        _ = ioctl(descriptor, UInt(TIOCEXCL))
        do throws(TransportError) {
            try Self.configureTerminal(descriptor, name: path, speed: spec.speed, baudRate: spec.baudRate)
            if tcflush(descriptor, TCIFLUSH) != 0 {
                let code = errno
                throw TransportError(
                    "cannot discard stale input on \(path): \(SystemError(code).description)",
                    errno: code,
                    advice: "unplug the adapter, plug it back in and try again"
                )
            }
        } catch {
            _ = close(descriptor)
            throw error
        }
        self.init(
            descriptor: descriptor,
            description: "serial \(path) @ \(spec.baudRate)",
            spec: spec,
            ownsDescriptor: true
        )
    }

    /// Wraps a descriptor that is already open, such as ``PseudoTerminal/masterDescriptor``.
    ///
    /// The descriptor is made non-blocking. When it is a terminal it is also put in raw mode
    /// (8N1, no flow control) with its speed left as it is; anything else (a pipe, a socket) is
    /// used as it is.
    ///
    /// - Parameters:
    ///   - fileDescriptor: an open descriptor, readable and writable.
    ///   - description: what a person reads in `iapctl list`.
    ///   - ownsDescriptor: when `true` the transport closes the descriptor when it closes (or is
    ///     released); when `false` the caller closes it, after the `.closed` event.
    /// - Throws: ``TransportError`` when the descriptor is not open or cannot be configured. The
    ///   descriptor then stays the caller's, whatever `ownsDescriptor` says.
    public convenience init(fileDescriptor: Int32, description: String, ownsDescriptor: Bool = true) throws(TransportError) {
        let flags = fcntl(fileDescriptor, F_GETFL)
        guard flags >= 0, fcntl(fileDescriptor, F_SETFL, flags | O_NONBLOCK) == 0 else {
            let code = errno
            throw TransportError(
                "cannot use file descriptor \(fileDescriptor) for \(description): \(SystemError(code).description)",
                errno: code,
                advice: "pass a descriptor that is open for reading and writing"
            )
        }
        if isatty(fileDescriptor) == 1 {
            try Self.configureTerminal(fileDescriptor, name: description, speed: nil, baudRate: nil)
        }
        self.init(descriptor: fileDescriptor, description: description, spec: nil, ownsDescriptor: ownsDescriptor)
    }

    private init(descriptor: Int32, description: String, spec: SerialPortSpec?, ownsDescriptor: Bool) {
        self.description = description
        self.spec = spec
        self.core = SerialCore(descriptor: descriptor, ownsDescriptor: ownsDescriptor, name: description)
    }

    deinit {
        // Released without cancel(): stop watching and close the descriptor, silently.
        core.close(reason: nil, deliver: false)
    }

    /// Bytes accepted by ``send(_:)`` that the kernel has not taken yet (0 once closed).
    public var pendingOutputBytes: Int {
        core.pendingOutputBytes
    }

    /// Starts watching the descriptor: events go to `handler` on `queue`, which must be serial.
    ///
    /// Output sent before activation is written now. Activating again does nothing; activating
    /// a transport that was cancelled before its first activation delivers `.closed(nil)`.
    public func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) {
        core.activate(queue: queue, handler: handler)
    }

    /// Writes `frame` now as far as the kernel takes it and queues the rest; never blocks.
    ///
    /// Bytes go out in the order they were sent. Sending on a closed transport does nothing.
    public func send(_ frame: [UInt8]) {
        core.send(frame)
    }

    /// Writes `frame` before the output already waiting, once the frame being written is whole
    /// (frames are never interleaved): a bare ACK does not wait behind a window of data in
    /// this transport's queue. Never blocks.
    public func sendAhead(_ frame: [UInt8]) {
        core.send(frame, ahead: true)
    }

    /// Closes the transport: the handler receives `.closed(nil)` (after the descriptor is
    /// closed) unless it already received a close; nothing follows. Unsent output is dropped.
    public func cancel() {
        core.close(reason: nil, deliver: true)
    }

    /// Stops reading the descriptor (`false`) or starts again (`true`; the default once
    /// activated). While stopped, what the peer writes stays in the kernel, whose buffer fills
    /// until the peer's writes wait: a pseudo-terminal's accessory side that stops reading, as
    /// the hostile-accessory tests play it. A hang-up is noticed once reading resumes.
    package func setReading(_ reading: Bool) {
        core.setReading(reading)
    }

    /// Most bytes kept waiting for the line: four full windows of 64 KiB packets. Only a peer
    /// that stopped reading (or a line far slower than what the link sends) fills it; the
    /// transport then closes with ``TransportError/Kind/stalled`` rather than grow. Output sent
    /// before ``activate(queue:handler:)`` is bounded by the same number: past it the transport
    /// closes, and its activation delivers `.closed` with why.
    public static let outputLimit = 8 << 20
}
