public import Dispatch
internal import Glibc
internal import Synchronization

/// iAP2 over a serial line: a UART, a USB-serial adapter (`/dev/ttyUSB*`, `/dev/ttyACM*`), or
/// either side of a ``PseudoTerminal``.
///
/// The descriptor is non-blocking and watched by Dispatch sources on the queue given to
/// ``activate(queue:handler:)``:
/// - incoming bytes are delivered as `.received` once per `read(2)` (a serial line is a byte
///   stream: frames arrive split and coalesced);
/// - ``send(_:)`` writes what the kernel takes at once and queues the rest, which a write source
///   drains; that source runs only while output is pending, so an idle line costs no wake-ups;
/// - a hang-up (the adapter was unplugged, the pseudo-terminal's peer closed) or a failed read or
///   write delivers `.closed(error)`; ``cancel()`` delivers `.closed(nil)`. Either comes once,
///   after the descriptor is closed (when this transport owns it), and nothing follows it.
///
/// Unsent output is discarded on close. Releasing a transport without ``cancel()`` closes the
/// descriptor too, but delivers nothing.
public final class SerialTransport: Transport {
    /// What a person reads, e.g. `serial /dev/ttyUSB0 @ 115200`.
    public let description: String
    /// Always ``TransportKind/serial``.
    public var kind: TransportKind { .serial }
    /// The port this transport opened, or `nil` when it wraps a descriptor opened elsewhere.
    public let spec: SerialPortSpec?

    /// Bytes read per `read(2)` at most.
    static let readBufferSize = 64 * 1024

    // All mutable state lives behind this lock. The Dispatch handlers run on the activation
    // queue, but the lock also makes `send`, `cancel` and `pendingOutputBytes` safe from any
    // thread (tests read `pendingOutputBytes` from theirs). The event handler is never called
    // with the lock held, so it may call back into the transport.
    private let state: Mutex<State>

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
        let descriptor = open(path, O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC)
        guard descriptor >= 0 else { throw Self.openError(path: path, errno: errno) }
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
        self.state = Mutex(State(descriptor: descriptor, ownsDescriptor: ownsDescriptor))
    }

    deinit {
        // Released without cancel(): stop the sources and close the descriptor, silently.
        state.withLock { $0.beginClose(reason: nil, deliver: false) }
    }

    /// Bytes accepted by ``send(_:)`` that the kernel has not taken yet (0 once closed).
    public var pendingOutputBytes: Int {
        state.withLock { $0.output.count - $0.outputStart }
    }

    /// Starts watching the descriptor: events go to `handler` on `queue` (a serial queue).
    ///
    /// Output sent before activation is written now. Activating again does nothing; activating
    /// a transport that was cancelled before its first activation delivers `.closed(nil)`.
    public func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) {
        let alreadyClosed = state.withLock { state -> Bool in
            guard !state.activated else { return false }
            state.activated = true
            switch state.phase {
            case .closed: return true
            case .active: return false
            case .idle: break
            }
            let descriptor = state.descriptor
            let readSource = DispatchSource.makeReadSource(fileDescriptor: descriptor, queue: queue)
            let writeSource = DispatchSource.makeWriteSource(fileDescriptor: descriptor, queue: queue)
            // The descriptor is closed only once both cancel handlers have run (see beginClose),
            // so no source ever watches a closed, possibly reused, descriptor number.
            let sourcesCancelled = DispatchGroup()
            sourcesCancelled.enter()
            sourcesCancelled.enter()
            readSource.setEventHandler { [weak self] in self?.readAvailable() }
            readSource.setCancelHandler { sourcesCancelled.leave() }
            writeSource.setEventHandler { [weak self] in self?.writeAvailable() }
            writeSource.setCancelHandler { sourcesCancelled.leave() }
            state.phase = .active
            state.queue = queue
            state.handler = handler
            state.readSource = readSource
            state.writeSource = writeSource
            state.sourcesCancelled = sourcesCancelled
            state.readBuffer = [UInt8](repeating: 0, count: Self.readBufferSize)
            readSource.activate()
            // The write source stays inactive until output is pending.
            if state.outputStart < state.output.count {
                state.flushOutput(name: description)
            }
            return false
        }
        if alreadyClosed {
            queue.async { handler(.closed(nil)) }
        }
    }

    /// Writes `frame` now as far as the kernel takes it and queues the rest; never blocks.
    ///
    /// Bytes go out in the order they were sent. Sending on a closed transport does nothing.
    public func send(_ frame: [UInt8]) {
        guard !frame.isEmpty else { return }
        state.withLock { state in
            switch state.phase {
            case .closed:
                return
            case .idle:
                state.output.append(contentsOf: frame)
                return
            case .active:
                break
            }
            guard state.outputStart == state.output.count else {
                // Earlier output is still waiting; the write source is running and takes this too.
                state.output.append(contentsOf: frame)
                return
            }
            let descriptor = state.descriptor
            let result = frame.withUnsafeBytes { writeAvailableBytes(descriptor, $0) }
            if let code = result.errorCode {
                state.beginClose(reason: Self.writeError(name: description, errno: code), deliver: true)
            } else if result.written < frame.count {
                state.output.append(contentsOf: frame[result.written...])
                state.resumeWriter()
            }
        }
    }

    /// Closes the transport: the handler receives `.closed(nil)` (after the descriptor is
    /// closed) unless it already received a close; nothing follows. Unsent output is dropped.
    public func cancel() {
        state.withLock { $0.beginClose(reason: nil, deliver: true) }
    }

    // MARK: - Source handlers (on the activation queue)

    private enum ReadStep {
        case delivered
        case again
        case stop
    }

    private func readAvailable() {
        while true {
            // Read under the lock, deliver outside it (the handler may call send or cancel).
            let (step, bytes, handler) = state.withLock { state -> (ReadStep, [UInt8], (@Sendable (TransportEvent) -> Void)?) in
                guard state.phase == .active else { return (.stop, [], nil) }
                let descriptor = state.descriptor
                let count = state.readBuffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
                if count > 0 {
                    return (.delivered, Array(state.readBuffer[..<count]), state.handler)
                }
                let code = count == 0 ? nil : errno
                switch code {
                case EAGAIN?, EWOULDBLOCK?:
                    return (.stop, [], nil)
                case EINTR?:
                    return (.again, [], nil)
                case nil, EIO?:
                    // read() returns 0 (a tty after hang-up) or EIO (a pty master whose slave
                    // closed) once the other end is gone: the descriptor will never read again.
                    state.beginClose(reason: Self.hangUpError(name: description, errno: code), deliver: true)
                    return (.stop, [], nil)
                case let code?:
                    state.beginClose(reason: Self.readError(name: description, errno: code), deliver: true)
                    return (.stop, [], nil)
                }
            }
            switch step {
            case .delivered: handler?(.received(bytes))
            case .again: continue
            case .stop: return
            }
        }
    }

    private func writeAvailable() {
        state.withLock { state in
            guard state.phase == .active else { return }
            state.flushOutput(name: description)
        }
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
            errno: code,
            advice: "try a lower rate, e.g. \(name):\(SerialPortSpec.defaultBaudRate); the accessory must use the same one"
        )
    }

    private static func openError(path: String, errno code: Int32) -> TransportError {
        switch code {
        case ENOENT:
            TransportError(
                "cannot open \(path): no such device",
                errno: code,
                advice: "is the adapter plugged in? ls /dev/ttyUSB* /dev/ttyACM* lists the serial adapters"
            )
        case EACCES, EPERM:
            TransportError(
                "cannot open \(path): permission denied",
                errno: code,
                advice: "add your user to the dialout group: sudo usermod -aG dialout $USER, then log in again"
            )
        case EBUSY:
            TransportError(
                "cannot open \(path): the device is busy",
                errno: code,
                advice: "another program has it open (fuser -v \(path) shows which); close it and try again"
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

    fileprivate static func hangUpError(name: String, errno code: Int32?) -> TransportError {
        TransportError(
            "\(name) hung up",
            errno: code,
            advice: "the adapter was unplugged or the other end of the pseudo-terminal closed; reconnect it and open the port again"
        )
    }

    private static func readError(name: String, errno code: Int32) -> TransportError {
        TransportError(
            "reading from \(name) failed: \(systemErrorText(code))",
            errno: code,
            advice: "open the port again; if this repeats, dmesg shows what the adapter's driver reports"
        )
    }

    fileprivate static func writeError(name: String, errno code: Int32) -> TransportError {
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

// MARK: - State

private enum Phase {
    /// Open, not yet activated: output is queued.
    case idle
    /// Sources running.
    case active
    /// No more events; the descriptor is closed or about to be (after the sources' cancel handlers).
    case closed
}

private struct State {
    var phase = Phase.idle
    /// Whether activate(queue:handler:) was called (it takes effect once).
    var activated = false
    /// -1 once closing began.
    var descriptor: Int32
    let ownsDescriptor: Bool
    var queue: DispatchQueue?
    var handler: (@Sendable (TransportEvent) -> Void)?
    var readSource: (any DispatchSourceRead)?
    var writeSource: (any DispatchSourceWrite)?
    /// Whether the write source is resumed (it starts inactive, which counts as not running).
    var writerRunning = false
    var sourcesCancelled: DispatchGroup?
    /// Output not yet written: `output[outputStart...]`.
    var output: [UInt8] = []
    var outputStart = 0
    /// Reused for every read; allocated on activation.
    var readBuffer: [UInt8] = []

    init(descriptor: Int32, ownsDescriptor: Bool) {
        self.descriptor = descriptor
        self.ownsDescriptor = ownsDescriptor
    }

    mutating func resumeWriter() {
        guard !writerRunning, let writeSource else { return }
        writerRunning = true
        writeSource.resume()
    }

    mutating func pauseWriter() {
        guard writerRunning, let writeSource else { return }
        writerRunning = false
        writeSource.suspend()
    }

    /// Writes pending output until the kernel stops taking it; runs the write source only while
    /// something is left.
    mutating func flushOutput(name: String) {
        let descriptor = self.descriptor
        let start = outputStart
        let result = output.withUnsafeBytes { writeAvailableBytes(descriptor, UnsafeRawBufferPointer(rebasing: $0[start...])) }
        outputStart += result.written
        if let code = result.errorCode {
            beginClose(reason: SerialTransport.writeError(name: name, errno: code), deliver: true)
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
            pauseWriter()
        } else {
            if outputStart >= 64 * 1024, outputStart * 2 >= output.count {
                output.removeSubrange(0..<outputStart)
                outputStart = 0
            }
            resumeWriter()
        }
    }

    /// Stops everything once. With sources running, the descriptor is closed (when owned) after
    /// both cancel handlers ran, and then `.closed(reason)` is delivered when `deliver` is set.
    mutating func beginClose(reason: TransportError?, deliver: Bool) {
        guard phase != .closed else { return }
        let wasActive = phase == .active
        phase = .closed
        let descriptor = self.descriptor
        let owns = ownsDescriptor
        self.descriptor = -1
        output = []
        outputStart = 0
        readBuffer = []
        let handler = deliver ? self.handler : nil
        self.handler = nil
        guard wasActive, let queue, let sourcesCancelled else {
            // Never activated: no source watches the descriptor and no one listens yet.
            if owns, descriptor >= 0 { _ = close(descriptor) }
            return
        }
        sourcesCancelled.notify(queue: queue) {
            if owns { _ = close(descriptor) }
            handler?(.closed(reason))
        }
        readSource?.cancel()
        writeSource?.cancel()
        // A suspended or never-activated source runs its cancel handler only once resumed.
        resumeWriter()
        readSource = nil
        writeSource = nil
        self.sourcesCancelled = nil
        self.queue = nil
    }
}

/// How far one non-blocking write burst got.
private struct WriteResult {
    var written: Int
    /// Set when the write failed for another reason than a full kernel buffer.
    var errorCode: Int32?
}

/// Writes `bytes` to a non-blocking descriptor until done or the kernel buffer is full.
private func writeAvailableBytes(_ descriptor: Int32, _ bytes: UnsafeRawBufferPointer) -> WriteResult {
    var written = 0
    while written < bytes.count {
        let count = write(descriptor, bytes.baseAddress.map { $0 + written }, bytes.count - written)
        if count > 0 {
            written += count
            continue
        }
        if count == 0 { break }
        let code = errno
        if code == EINTR { continue }
        if code == EAGAIN || code == EWOULDBLOCK { break }
        return WriteResult(written: written, errorCode: code)
    }
    return WriteResult(written: written, errorCode: nil)
}

/// `strerror(3)` text for an errno value.
func systemErrorText(_ code: Int32) -> String {
    guard let text = strerror(code) else { return "error \(code)" }
    return String(cString: text)
}
