public import Dispatch
internal import Glibc
internal import IAPLink
internal import SystemCalls
internal import Synchronization

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
/// `_dispatch_event_merge_fd`, which hang-up tests hit every few runs.)
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
                    "cannot discard stale input on \(path): \(systemErrorText(code))",
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
                "cannot use file descriptor \(fileDescriptor) for \(description): \(systemErrorText(code))",
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

    // MARK: - Configuration and errors

    /// Raw mode, 8N1, no flow control, `CLOCAL | CREAD`, reads that return what is there.
    ///
    /// `VMIN` is 1 with `VTIME` 0: with `O_NONBLOCK` an empty line then reads as `EAGAIN`. (With
    /// `VMIN` 0 Linux returns 0 from an empty tty, which looks exactly like a hang-up.)
    private static func configureTerminal(_ descriptor: Int32, name: String, speed: speed_t?, baudRate: Int?) throws(TransportError) {
        var settings = termios()
        guard tcgetattr(descriptor, &settings) == 0 else {
            let code = errno
            if code == ENOTTY || code == EINVAL {
                throw TransportError(
                    "\(name) is not a terminal, so not a serial port",
                    kind: .unsupported,
                    errno: code,
                    advice: "name the adapter's serial device instead, e.g. /dev/ttyUSB0 (ls /dev/ttyUSB* /dev/ttyACM* lists them)"
                )
            }
            throw TransportError(
                "cannot read the serial settings of \(name): \(systemErrorText(code))",
                errno: code,
                advice: "unplug the adapter, plug it back in and try again"
            )
        }
        cfmakeraw(&settings)
        settings.c_cflag &= ~tcflag_t(CSIZE | PARENB | CSTOPB)
        settings.c_cflag &= ~tcflag_t(CRTSCTS)
        settings.c_cflag |= tcflag_t(CS8 | CLOCAL | CREAD)
        settings.c_iflag &= ~tcflag_t(IXON | IXOFF | IXANY)
        // c_cc is imported as a tuple; its bytes are indexed by the VMIN / VTIME constants.
        withUnsafeMutableBytes(of: &settings.c_cc) { controlCharacters in
            controlCharacters[Int(VMIN)] = 1
            controlCharacters[Int(VTIME)] = 0
        }
        if let speed {
            guard cfsetispeed(&settings, speed) == 0, cfsetospeed(&settings, speed) == 0 else {
                throw unsupportedSpeedError(name: name, baudRate: baudRate, errno: errno)
            }
        }
        guard tcsetattr(descriptor, TCSANOW, &settings) == 0 else {
            let code = errno
            if code == EINVAL, speed != nil {
                throw unsupportedSpeedError(name: name, baudRate: baudRate, errno: code)
            }
            throw TransportError(
                "cannot configure \(name): \(systemErrorText(code))",
                errno: code,
                advice: "unplug the adapter, plug it back in and try again"
            )
        }
        // tcsetattr succeeds when any one setting took; check the speed really did.
        if let speed {
            var applied = termios()
            if tcgetattr(descriptor, &applied) == 0, cfgetospeed(&applied) != speed {
                throw unsupportedSpeedError(name: name, baudRate: baudRate, errno: nil)
            }
        }
    }

    private static func unsupportedSpeedError(name: String, baudRate: Int?, errno code: Int32?) -> TransportError {
        let rate = baudRate.map(String.init) ?? "the requested rate"
        return TransportError(
            "\(name) does not accept baud rate \(rate)",
            kind: .unsupported,
            errno: code,
            advice: "try a lower rate, e.g. \(name):\(SerialPortSpec.defaultBaudRate); the accessory must use the same one"
        )
    }

    /// What to do about a device that cannot be opened, naming its real owner and group: a
    /// pseudo-terminal is its creator's (its group, `tty`, only lets others write to it), a
    /// serial adapter is usually the `dialout` group's, but some systems use `uucp` or a udev
    /// rule's own group.
    static func permissionAdvice(path: String) -> String {
        var status = stat()
        guard stat(path, &status) == 0 else {
            return "check who may open it: ls -l \(path)"
        }
        let owner = getpwuid(status.st_uid).map { String(cString: $0.pointee.pw_name) } ?? String(status.st_uid)
        let group = getgrgid(status.st_gid).map { String(cString: $0.pointee.gr_name) } ?? String(status.st_gid)
        let groupCanOpen = status.st_mode & 0o060 == 0o060
        if path.hasPrefix("/dev/pts/") || !groupCanOpen {
            return "\(path) is \(owner)'s alone (group \(group) may not open it for reading and writing): run as \(owner), "
                + "or create the pseudo-terminal as this user"
        }
        return "\(path) belongs to the group '\(group)': add your user to it (sudo usermod -aG \(group) $USER, then log in again), "
            + "or install a udev rule that gives the device to a group you are in"
    }

    private static func openError(path: String, errno code: Int32) -> TransportError {
        switch code {
        case ENOENT:
            TransportError(
                "cannot open \(path): no such device",
                kind: .notFound,
                errno: code,
                advice: "is the adapter plugged in? ls /dev/ttyUSB* /dev/ttyACM* lists the serial adapters"
            )
        case EACCES, EPERM:
            TransportError(
                "cannot open \(path): permission denied",
                kind: .permission,
                errno: code,
                advice: permissionAdvice(path: path)
            )
        case EBUSY:
            TransportError(
                "cannot open \(path): the device is busy",
                kind: .busy,
                errno: code,
                advice: "another program has it open (iapd, or another iapctl; fuser -v \(path) shows which): close it, or go through iapd (iapctl without --serial)"
            )
        case EIO:
            TransportError(
                "cannot open \(path): input/output error",
                errno: code,
                advice: "the adapter may be failing or half unplugged; unplug it, plug it back in and try again"
            )
        case ENXIO, ENODEV:
            TransportError(
                "cannot open \(path): no hardware behind this device node",
                kind: .notFound,
                errno: code,
                advice: "pick the port the adapter really is on (ls /dev/ttyUSB* /dev/ttyACM*, or dmesg | grep tty)"
            )
        default:
            TransportError(
                "cannot open \(path): \(systemErrorText(code))",
                errno: code,
                advice: "check the device path (ls /dev/ttyUSB* /dev/ttyACM*) and try again"
            )
        }
    }

    /// Most bytes kept waiting for the line: four full windows of 64 KiB packets. Only a peer
    /// that stopped reading (or a line far slower than what the link sends) fills it; the
    /// transport then closes with ``TransportError/Kind/stalled`` rather than grow. Output sent
    /// before ``activate(queue:handler:)`` is bounded by the same number: past it the transport
    /// closes, and its activation delivers `.closed` with why.
    public static let outputLimit = 8 << 20

    static func stalledError(name: String, waiting: Int) -> TransportError {
        TransportError(
            "\(name) stopped taking data: \(waiting) bytes were waiting to be written",
            kind: .stalled,
            advice: "the accessory is not reading its input (hung, or flow control holding the line); reset it and connect again"
        )
    }

    static func unactivatedError(name: String, waiting: Int) -> TransportError {
        TransportError(
            "\(name) was sent \(waiting) bytes before it was activated, more than the \(outputLimit) it keeps",
            kind: .stalled,
            advice: "activate the transport before sending this much (nothing is written until then); open the port again"
        )
    }

    static func hangUpError(name: String, errno code: Int32?) -> TransportError {
        TransportError(
            "\(name) hung up",
            kind: .hungUp,
            errno: code,
            advice: "the adapter was unplugged or the other end of the pseudo-terminal closed; reconnect it and open the port again"
        )
    }

    static func readError(name: String, errno code: Int32) -> TransportError {
        TransportError(
            "reading from \(name) failed: \(systemErrorText(code))",
            errno: code,
            advice: "open the port again; if this repeats, dmesg shows what the adapter's driver reports"
        )
    }

    static func writeError(name: String, errno code: Int32) -> TransportError {
        if code == EPIPE || code == EIO {
            return hangUpError(name: name, errno: code)
        }
        return TransportError(
            "writing to \(name) failed: \(systemErrorText(code))",
            errno: code,
            advice: "open the port again; if this repeats, dmesg shows what the adapter's driver reports"
        )
    }
}

// MARK: - Core

/// The shared part of a ``SerialTransport``: state behind a lock, what the poller waits for,
/// and the read pass. The user's handler is never called with the lock held, so it may call back into
/// the transport.
final class SerialCore: Sendable {
    /// Bytes read per `read(2)` at most.
    static let readBufferSize = 64 * 1024

    let name: String
    let state: Mutex<State>

    init(descriptor: Int32, ownsDescriptor: Bool, name: String) {
        self.name = name
        self.state = Mutex(State(descriptor: descriptor, ownsDescriptor: ownsDescriptor))
    }

    var pendingOutputBytes: Int {
        state.withLock { $0.output.count - $0.outputStart }
    }

    var outputProgress: TransportOutputProgress {
        state.withLock { TransportOutputProgress(queuedBytes: $0.output.count - $0.outputStart, writtenBytes: $0.written) }
    }

    func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) {
        enum Outcome { case ignored, alreadyClosed(TransportError?), finish, watch }
        let outcome = state.withLock { state -> Outcome in
            guard !state.activated else { return .ignored }
            state.activated = true
            guard state.phase == .idle else { return .alreadyClosed(state.deliverClose ? state.closeReason : nil) }
            state.phase = .active
            state.queue = queue
            state.handler = handler
            guard SerialPoller.shared.isAvailable else {
                let code = SerialPoller.shared.setupError
                state.close(reason: TransportError(
                    "cannot watch \(name): \(systemErrorText(code))",
                    errno: code,
                    advice: "too many open files; close some (or raise ulimit -n) and open the port again"
                ), deliver: true)
                // Nothing watches the descriptor, so nothing else finishes the close.
                return .finish
            }
            state.readInterest = true
            state.readBuffer = [UInt8](repeating: 0, count: Self.readBufferSize)
            if state.outputStart < state.output.count {
                state.flushOutput(name: name)
            }
            return .watch
        }
        switch outcome {
        case .ignored:
            return
        case let .alreadyClosed(reason):
            queue.async { handler(.closed(reason)) }
        case .finish:
            finish()
        case .watch:
            // Watched by the one poller thread every serial transport shares.
            SerialPoller.shared.add(self)
        }
    }

    func send(_ frame: [UInt8]) {
        guard !frame.isEmpty else { return }
        state.withLock { state in
            switch state.phase {
            case .closed:
                return
            case .idle:
                // Nothing is written before activation; what waits is bounded all the same.
                let waiting = state.output.count - state.outputStart
                guard waiting + frame.count <= SerialTransport.outputLimit else {
                    state.close(reason: SerialTransport.unactivatedError(name: name, waiting: waiting + frame.count), deliver: true)
                    return
                }
                state.output.append(contentsOf: frame)
                return
            case .active:
                break
            }
            guard state.outputStart == state.output.count else {
                // Earlier output is still waiting; the watcher writes this after it, unless the
                // peer has stopped reading for so long that the backlog passed the bound.
                let waiting = state.output.count - state.outputStart
                guard waiting + frame.count <= SerialTransport.outputLimit else {
                    state.close(reason: SerialTransport.stalledError(name: name, waiting: waiting), deliver: true)
                    return
                }
                state.output.append(contentsOf: frame)
                return
            }
            let descriptor = state.descriptor, isSocket = state.isSocket
            let result = frame.withUnsafeBytes { writeAvailableBytes(descriptor, $0, socket: isSocket) }
            state.written &+= UInt64(result.written)
            if let code = result.errorCode {
                state.close(reason: SerialTransport.writeError(name: name, errno: code), deliver: true)
            } else if result.written < frame.count {
                state.output.append(contentsOf: frame[result.written...])
                // The watcher now needs to watch for writability too.
                state.wake()
            }
        }
    }

    func close(reason: TransportError?, deliver: Bool) {
        state.withLock { $0.close(reason: reason, deliver: deliver) }
    }

    func setReading(_ reading: Bool) {
        let readPass = state.withLock { state -> DispatchQueue? in
            guard state.readingPaused == reading else { return nil }
            state.readingPaused = !reading
            guard reading, state.phase == .active else { return nil }
            // A hang-up seen while stopped is no longer polled for: a read pass finds it now.
            if state.hangUpSeen, state.readInterest {
                state.readInterest = false
                return state.queue
            }
            // Otherwise the poller watches for input again.
            state.wake()
            return nil
        }
        readPass?.async { [self] in readAvailable() }
    }

    // MARK: Watched by the poller

    /// What the poller should wait for now: readable unless a read pass is under way, writable
    /// while output is pending. Nil once the transport closed (the poller then drops it and
    /// calls ``finish()``).
    func pollPlan() -> pollfd? {
        state.withLock { state -> pollfd? in
            guard state.phase == .active else { return nil }
            var events: Int16 = 0
            if state.readInterest, !state.readingPaused { events |= Int16(POLLIN) }
            if state.outputStart < state.output.count { events |= Int16(POLLOUT) }
            // After a hang-up poll(2) reports POLLHUP whatever was asked: ignore the
            // descriptor until the read pass under way sees the hang-up and closes.
            let watched = events != 0 && !state.hangUpSeen
            return pollfd(fd: watched ? state.descriptor : -1, events: events, revents: 0)
        }
    }

    /// The poller could not wait at all: close with why.
    func pollFailed(_ error: SystemError) {
        state.withLock { state in
            state.close(reason: TransportError("cannot watch \(name): \(error)", errno: error.code, advice: "open the port again"),
                        deliver: true)
        }
    }

    func handle(_ revents: Int32) {
        let readPass = state.withLock { state -> DispatchQueue? in
            guard state.phase == .active else { return nil }
            if revents & POLLNVAL != 0 {
                state.close(reason: TransportError(
                    "the descriptor of \(name) was closed behind the transport's back",
                    advice: "do not close a descriptor a transport owns; open the port again"
                ), deliver: true)
                return nil
            }
            if revents & POLLOUT != 0 {
                state.flushOutput(name: name)
            }
            guard state.phase == .active else { return nil }
            if revents & (POLLHUP | POLLERR) != 0 {
                state.hangUpSeen = true
            }
            guard revents & (POLLIN | POLLHUP | POLLERR) != 0, state.readInterest, !state.readingPaused else { return nil }
            state.readInterest = false
            return state.queue
        }
        readPass?.async { [self] in readAvailable() }
    }

    /// Closes the descriptor once the poller stopped polling it, then delivers the close.
    func finish() {
        let (queue, handler, reason) = state.withLock { state in
            state.releaseDescriptors()
            defer { state.handler = nil }
            return (state.queue, state.deliverClose ? state.handler : nil, state.closeReason)
        }
        guard let queue, let handler else { return }
        queue.async { handler(.closed(reason)) }
    }

    // MARK: Read pass (on the activation queue)

    private enum ReadStep {
        case delivered
        case stop
    }

    /// Reads until the kernel has nothing more (`EAGAIN`), delivering each read, then asks the
    /// watcher to wait for the next bytes.
    private func readAvailable() {
        while true {
            // Read under the lock, deliver outside it.
            let (step, bytes, handler) = state.withLock { state -> (ReadStep, [UInt8], (@Sendable (TransportEvent) -> Void)?) in
                guard state.phase == .active else { return (.stop, [], nil) }
                guard !state.readingPaused else {
                    // Stopped by setReading(false): the poller waits for input again once resumed.
                    state.readInterest = true
                    return (.stop, [], nil)
                }
                let descriptor = state.descriptor
                let result = state.readBuffer.withUnsafeMutableBytes { SystemCall.read(descriptor, into: $0) }
                if case .success(let count) = result, count > 0 {
                    return (.delivered, Array(state.readBuffer[..<count]), state.handler)
                }
                let code: Int32? = if case .failure(let error) = result { error.code } else { nil }
                switch code {
                case EAGAIN?, EWOULDBLOCK?:
                    if state.hangUpSeen {
                        // poll(2) said hang-up or error, yet there is nothing to read: the
                        // line will not recover.
                        state.close(reason: SerialTransport.hangUpError(name: name, errno: nil), deliver: true)
                    } else {
                        state.readInterest = true
                        state.wake()
                    }
                    return (.stop, [], nil)
                case nil, EIO?:
                    // read() returns 0 (a tty after hang-up, a socket whose peer closed) or EIO
                    // (a pty master whose slave closed) once the other end is gone.
                    state.close(reason: SerialTransport.hangUpError(name: name, errno: code), deliver: true)
                    return (.stop, [], nil)
                case let code?:
                    state.close(reason: SerialTransport.readError(name: name, errno: code), deliver: true)
                    return (.stop, [], nil)
                }
            }
            switch step {
            case .delivered: handler?(.received(bytes))
            case .stop: return
            }
        }
    }
}

/// A non-blocking, close-on-exec pipe: `(read end, write end)`; `nil` with `errno` set. What the
/// transports of this package that block in their own threads or sources wake up through.
package func makeWakePipe() -> (Int32, Int32)? {
    var ends: [Int32] = [-1, -1]
    let made = ends.withUnsafeMutableBufferPointer { pipe($0.baseAddress) }
    guard made == 0 else { return nil }
    for end in ends {
        let flags = fcntl(end, F_GETFL)
        guard flags >= 0,
              fcntl(end, F_SETFL, flags | O_NONBLOCK) == 0,
              fcntl(end, F_SETFD, FD_CLOEXEC) == 0
        else {
            let code = errno
            _ = Glibc.close(ends[0])
            _ = Glibc.close(ends[1])
            errno = code
            return nil
        }
    }
    return (ends[0], ends[1])
}

// MARK: - State

enum Phase {
    /// Open, not yet activated: output is queued.
    case idle
    /// Being watched.
    case active
    /// No more events; the descriptor is closed, or is about to be by the watcher.
    case closed
}

struct State {
    var phase = Phase.idle
    /// Whether activate(queue:handler:) was called (it takes effect once).
    var activated = false
    var descriptor: Int32
    let ownsDescriptor: Bool
    /// Whether the descriptor is a socket (an RFCOMM channel, a socket pair): written with
    /// `send(MSG_NOSIGNAL)`, so a peer that went away is `EPIPE`, not a SIGPIPE that kills the
    /// process.
    let isSocket: Bool
    var queue: DispatchQueue?
    var handler: (@Sendable (TransportEvent) -> Void)?
    /// Whether the watcher should wait for readability (false while a read pass is scheduled).
    var readInterest = false
    /// poll(2) reported a hang-up or an error condition.
    var hangUpSeen = false
    /// Reading stopped by ``SerialTransport/setReading(_:)``.
    var readingPaused = false
    /// Output not yet written: `output[outputStart...]`.
    var output: [UInt8] = []
    var outputStart = 0
    /// Bytes handed to the kernel since the transport opened.
    var written: UInt64 = 0
    /// Reused for every read; allocated on activation.
    var readBuffer: [UInt8] = []
    /// Why it closed, and whether the handler is told.
    var closeReason: TransportError?
    var deliverClose = false

    init(descriptor: Int32, ownsDescriptor: Bool) {
        self.descriptor = descriptor
        self.ownsDescriptor = ownsDescriptor
        var status = stat()
        isSocket = fstat(descriptor, &status) == 0 && status.st_mode & S_IFMT == S_IFSOCK
    }

    /// Makes the poller look at the state again.
    func wake() {
        SerialPoller.shared.wake()
    }

    /// Writes pending output until the kernel stops taking it.
    mutating func flushOutput(name: String) {
        let descriptor = self.descriptor, isSocket = self.isSocket
        let start = outputStart
        let result = output.withUnsafeBytes { writeAvailableBytes(descriptor, UnsafeRawBufferPointer(rebasing: $0[start...]), socket: isSocket) }
        outputStart += result.written
        written &+= UInt64(result.written)
        if let code = result.errorCode {
            close(reason: SerialTransport.writeError(name: name, errno: code), deliver: true)
            return
        }
        if outputStart == output.count {
            // Keep a modest buffer for the next burst; give back a big one.
            if output.capacity > 256 * 1024 {
                output = []
            } else {
                output.removeAll(keepingCapacity: true)
            }
            outputStart = 0
        } else if outputStart >= 64 * 1024, outputStart * 2 >= output.count {
            output.removeSubrange(0..<outputStart)
            outputStart = 0
        }
    }

    /// Stops everything once. An active transport's watcher then closes the descriptors and
    /// delivers `.closed(reason)` (when `deliver` is set); one never activated closes at once.
    mutating func close(reason: TransportError?, deliver: Bool) {
        guard phase != .closed else { return }
        let wasActive = phase == .active
        phase = .closed
        closeReason = reason
        deliverClose = deliver
        output = []
        outputStart = 0
        readBuffer = []
        if wasActive {
            wake()
        } else {
            releaseDescriptors()
            handler = nil
        }
    }

    /// Closes the descriptor (when owned).
    mutating func releaseDescriptors() {
        if ownsDescriptor, descriptor >= 0 { _ = Glibc.close(descriptor) }
        descriptor = -1
    }
}

/// How far one non-blocking write burst got.
private struct WriteResult {
    var written: Int
    /// Set when the write failed for another reason than a full kernel buffer.
    var errorCode: Int32?
}

/// Writes `bytes` to a non-blocking descriptor until done or the kernel buffer is full.
private func writeAvailableBytes(_ descriptor: Int32, _ bytes: UnsafeRawBufferPointer, socket: Bool) -> WriteResult {
    var written = 0
    while written < bytes.count {
        let rest = UnsafeRawBufferPointer(rebasing: bytes[written...])
        switch socket ? UnixSocket.send(descriptor, rest) : SystemCall.write(descriptor, rest) {
        case .success(0):
            return WriteResult(written: written, errorCode: nil)
        case .success(let count):
            written += count
        case .failure(let error) where error.kind == .wouldBlock:
            return WriteResult(written: written, errorCode: nil)
        case .failure(let error):
            return WriteResult(written: written, errorCode: error.code)
        }
    }
    return WriteResult(written: written, errorCode: nil)
}

/// `strerror(3)` text with the errno's name, e.g. "No such file or directory (ENOENT)".
func systemErrorText(_ code: Int32) -> String {
    SystemError(code).description
}

// MARK: - The poller

/// One thread that waits in `poll(2)` for every active serial transport of the process, so an
/// accessory costs no thread of its own (a thread per port once exhausted Dispatch's pool at 255
/// ports). It wakes through a pipe whenever a transport's interest changes (output queued, a read
/// pass finished, a close), rebuilds its list, and hands each ready descriptor to its transport,
/// which reads on its own queue. Started on the first activation; it runs for the life of the
/// process, parked in `poll(2)` when there is nothing to do.
final class SerialPoller: Sendable {
    static let shared = SerialPoller()

    private let members = Mutex<[SerialCore]>([])
    private let wakeReader: Int32
    private let wakeWriter: Int32
    /// The errno of a failed setup (no pipe), else 0.
    let setupError: Int32
    private let started = Mutex(false)

    private init() {
        if let (reader, writer) = makeWakePipe() {
            (wakeReader, wakeWriter, setupError) = (reader, writer, 0)
        } else {
            (wakeReader, wakeWriter, setupError) = (-1, -1, errno)
        }
    }

    /// Whether the poller can run (its wake-up pipe exists).
    var isAvailable: Bool { wakeWriter >= 0 }

    /// Starts watching `core` (its state is already active).
    func add(_ core: SerialCore) {
        members.withLock { $0.append(core) }
        let start = started.withLock { started -> Bool in
            defer { started = true }
            return !started
        }
        if start {
            DispatchQueue(label: "SerialTransport poller").async { [self] in run() }
        } else {
            wake()
        }
    }

    /// Makes the poller look at every transport again.
    func wake() {
        guard wakeWriter >= 0 else { return }
        var byte: UInt8 = 1
        // A full pipe already holds a wake-up, so a failed write loses nothing.
        _ = write(wakeWriter, &byte, 1)
    }

    private func run() {
        var drain = [UInt8](repeating: 0, count: 256)
        var watched: [pollfd] = []
        var polled: [SerialCore] = []
        while true {
            let current = members.withLock { $0 }
            watched.removeAll(keepingCapacity: true)
            polled.removeAll(keepingCapacity: true)
            watched.append(pollfd(fd: wakeReader, events: Int16(POLLIN), revents: 0))
            var finished: Set<ObjectIdentifier> = []
            for core in current {
                if let plan = core.pollPlan() {
                    watched.append(plan)
                    polled.append(core)
                } else {
                    finished.insert(ObjectIdentifier(core))
                }
            }
            if !finished.isEmpty {
                let gone = members.withLock { members -> [SerialCore] in
                    let gone = members.filter { finished.contains(ObjectIdentifier($0)) }
                    members.removeAll { finished.contains(ObjectIdentifier($0)) }
                    return gone
                }
                for core in gone { core.finish() }
            }
            if case .failure(let error) = SystemCall.poll(&watched) {
                if error.kind == .wouldBlock { continue }
                // Cannot happen with valid arguments; fail the transports rather than spin.
                for core in polled { core.pollFailed(error) }
                continue
            }
            if watched[0].revents != 0 {
                while drain.withUnsafeMutableBytes({ read(wakeReader, $0.baseAddress, $0.count) }) > 0 {}
            }
            for (index, core) in polled.enumerated() where watched[index + 1].revents != 0 {
                core.handle(Int32(watched[index + 1].revents))
            }
        }
    }
}
