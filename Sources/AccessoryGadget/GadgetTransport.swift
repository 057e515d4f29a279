public import AccessorySimulator
public import Dispatch
public import IAPTransport
internal import Glibc
internal import Synchronization
internal import SystemCalls

/// Where the gadget's link to the host stands, as the events on `ep0` tell it.
public enum GadgetConnection: String, Sendable, Hashable {
    /// Not bound to a USB device controller (before the first BIND, or after UNBIND).
    case unbound
    /// Bound, but the host has not configured the function (or it was reset: DISABLE). Frames
    /// sent now are dropped.
    case bound
    /// The host configured the function (ENABLE): the endpoints carry data.
    case enabled
    /// The bus is suspended; RESUME returns to the state before.
    case suspended
}

/// What a ``GadgetTransport`` has done so far.
public struct GadgetTransportStatistics: Sendable, Hashable {
    /// Frames written to the IN endpoint completely.
    public var framesSent = 0
    /// Bytes of those frames.
    public var bytesSent = 0
    /// Frames written as two writes (all but the last byte, then the last byte) so that the
    /// transfer ends with a short packet.
    public var shortPacketSplits = 0
    /// Frames dropped because the endpoints were down (not enabled, or a write failed).
    public var framesDropped = 0
    /// Reads from the OUT endpoint that returned data.
    public var reads = 0
    /// Bytes those reads returned.
    public var bytesReceived = 0
    /// Reads or writes that failed because the endpoint was down (each waits for the next ENABLE).
    public var endpointErrors = 0
    /// ``GadgetTransport/stallIn()`` requests performed (a `read()` on the IN endpoint).
    public var inHaltRequests = 0
    /// Of those, how many the kernel confirmed (`EBADMSG`: the endpoint is halted).
    public var inHalts = 0
    /// Events read from `ep0`.
    public var events = 0
    /// Control requests (SETUP events) answered: host-to-device ones acknowledged, device-to-host
    /// ones stalled.
    public var setupRequests = 0

    /// All zero.
    public init() {}
}

/// The simulated accessory's end of a USB cable: the iAP2 bulk pipes of a FunctionFS function,
/// with this machine as the USB device (``TransportKind/gadget``).
///
/// ``init(functionDirectory:nativeTransportProtocols:superSpeedMaxBurst:)`` opens `ep0` of a
/// mounted FunctionFS instance, writes ``FunctionFSDescriptors`` (descriptors, then strings),
/// opens the endpoint files the kernel then creates (`ep1`, bulk IN: written to send to the
/// host; `ep2`, bulk OUT: read to receive from it) and starts the **ep0 thread**, which reads
/// the function's events (BIND, ENABLE, DISABLE, SETUP…) and keeps ``connection``. The UDC can
/// be bound from then on (``USBGadget`` does that).
///
/// ``activate(queue:handler:)`` starts two more threads:
/// - the **reader** blocks in `read()` on the OUT endpoint (64 KiB at a time: a multiple of
///   every speed's packet size, so the kernel never receives more than was asked for, and more
///   than a link packet, which the host sends one per transfer) and delivers each read as
///   `.received` on the queue, in the array it was read into;
/// - the **writer** takes the frames given to ``send(_:)`` in order and `write()`s each to the
///   IN endpoint, ending every transfer with a short packet (see ``send(_:)``).
///
/// While the function is not enabled (no host, unbound, reset), endpoint I/O fails (`EAGAIN`,
/// `ESHUTDOWN`…): the reader then waits for the next ENABLE the ep0 thread sees instead of
/// retrying, and frames sent meanwhile are dropped: the iAP2 link retransmits what matters.
/// `.closed` comes only after ``cancel()`` (`.closed(nil)`) or when `ep0` itself fails (the
/// function is gone); never for a host that comes and goes.
///
/// ``cancel()`` stops all three threads and waits for them before it closes the files, so no
/// thread or descriptor outlives it. Threads blocked in the kernel are woken with `SIGURG`,
/// sent to those threads only (``interruptSignal``); the transport installs a handler that does
/// nothing for it unless the process already handles that signal, and never sets `SA_RESTART`.
///
/// The EA native-transport interfaces' endpoint files (``FunctionFSDescriptors/endpoints``
/// from `ep3` on) are not opened here.
public final class GadgetTransport: Transport {
    /// What a person reads, e.g. `usb gadget /dev/ffs-iap2`.
    public let description: String
    /// Always ``TransportKind/gadget``.
    public var kind: TransportKind { .gadget }
    /// The mounted FunctionFS directory, or `nil` for descriptors handed in directly.
    public let functionDirectory: String?
    /// The descriptors written to `ep0`, or `nil` for descriptors handed in directly.
    public let descriptors: FunctionFSDescriptors?

    /// The signal that wakes the transport's threads from blocking calls when it closes.
    public static var interruptSignal: Int32 { SIGURG }

    private let core: GadgetCore

    /// Configures the FunctionFS function mounted at `functionDirectory` and starts watching
    /// its `ep0`.
    ///
    /// - Parameters:
    ///   - functionDirectory: where the FunctionFS instance is mounted (it holds `ep0`).
    ///   - nativeTransportProtocols: EA protocol names that get a native-transport interface
    ///     each (see ``FunctionFSDescriptors``).
    ///   - superSpeedMaxBurst: `bMaxBurst` of the SuperSpeed companion descriptors.
    /// - Throws: ``TransportError`` naming the file that failed and what to do: mount FunctionFS
    ///   first (`ENOENT`), run as root (`EACCES`), stop the other program that configured the
    ///   function (`EBUSY`), or read the kernel log when the kernel refuses the descriptors.
    public convenience init(functionDirectory: String, nativeTransportProtocols: [String] = [],
                            superSpeedMaxBurst: UInt8 = 0) throws(TransportError) {
        let layout: FunctionFSDescriptors
        do {
            layout = try FunctionFSDescriptors(nativeTransportProtocols: nativeTransportProtocols,
                                               superSpeedMaxBurst: superSpeedMaxBurst)
        } catch {
            throw TransportError("cannot describe the USB function: \(error.message)")
        }
        let directory = functionDirectory.hasSuffix("/") ? String(functionDirectory.dropLast()) : functionDirectory
        let ep0 = try openEndpointFile(directory + "/ep0", flags: O_RDWR | O_CLOEXEC, stage: "ep0")
        var opened = [ep0]
        do throws(TransportError) {
            try writeSetupBlob(ep0, layout.descriptorsBlob, path: directory + "/ep0", what: "descriptors")
            try writeSetupBlob(ep0, layout.stringsBlob, path: directory + "/ep0", what: "strings")
            let inEndpoint = try openEndpointFile(directory + "/ep1", flags: O_RDWR | O_NONBLOCK | O_CLOEXEC, stage: "endpoint")
            opened.append(inEndpoint)
            let outEndpoint = try openEndpointFile(directory + "/ep2", flags: O_RDWR | O_NONBLOCK | O_CLOEXEC, stage: "endpoint")
            opened.append(outEndpoint)
            let core = try GadgetCore(
                ep0: ep0, inEndpoint: inEndpoint, outEndpoint: outEndpoint,
                maxPacket: nil, isFunctionFS: true, name: "usb gadget \(directory)",
                retryInterval: .milliseconds(500))
            self.init(core: core, description: "usb gadget \(directory)", functionDirectory: directory, descriptors: layout)
        } catch {
            for descriptor in opened { _ = Glibc.close(descriptor) }
            throw error
        }
    }

    /// Runs over descriptors opened elsewhere: what the tests use, with pipes or socket pairs in
    /// place of the endpoint files. The transport owns and closes all of them.
    ///
    /// - Parameters:
    ///   - ep0: where the 12-byte FunctionFS events come from, or `nil` for none (the
    ///     connection is then ``GadgetConnection/enabled`` for good, and any endpoint error
    ///     closes the transport).
    ///   - inEndpoint: written with the frames (the IN endpoint, `ep1`).
    ///   - outEndpoint: read for the host's bytes (the OUT endpoint, `ep2`).
    ///   - maxPacket: the IN endpoint's `wMaxPacketSize` for the short-packet rule (at least 2).
    ///   - isFunctionFS: whether these are FunctionFS files (a read of 0 bytes is then a
    ///     zero-length packet, not the end of the file, and the IN endpoint's packet size is
    ///     asked of the kernel after each ENABLE).
    ///   - retryInterval: how long an endpoint error waits for an ENABLE before trying again.
    convenience init(ep0: Int32?, inEndpoint: Int32, outEndpoint: Int32, maxPacket: Int, isFunctionFS: Bool = false,
         retryInterval: Duration = .milliseconds(500), description: String = "usb gadget (descriptors)") throws(TransportError) {
        let core = try GadgetCore(
            ep0: ep0, inEndpoint: inEndpoint, outEndpoint: outEndpoint, maxPacket: max(2, maxPacket),
            isFunctionFS: isFunctionFS, name: description, retryInterval: retryInterval)
        self.init(core: core, description: description, functionDirectory: nil, descriptors: nil)
    }

    private init(core: GadgetCore, description: String, functionDirectory: String?, descriptors: FunctionFSDescriptors?) {
        self.core = core
        self.description = description
        self.functionDirectory = functionDirectory
        self.descriptors = descriptors
    }

    deinit {
        // Released without cancel(): stop the threads and close the files, silently.
        core.teardown(reason: nil, deliver: false, waitIfBusy: false)
    }

    /// Where the link to the host stands now.
    public var connection: GadgetConnection { core.connection }

    /// Counts of what the transport did.
    public var statistics: GadgetTransportStatistics { core.statistics }

    /// Calls `handler` with every change of ``connection``, on the ep0 thread: it must return
    /// quickly and must not wait for the queue the transport was activated on. Handlers add up
    /// (a ``SimulatorRunner`` running over this transport has one) and are called in the order
    /// they were added; ``cancel()`` drops them.
    public func onConnectionChange(_ handler: @escaping @Sendable (GadgetConnection) -> Void) {
        core.addConnectionObserver(handler)
    }

    /// Starts the reader and writer threads; events go to `handler` on `queue` (serial).
    ///
    /// Activating again does nothing; activating a transport that was cancelled first delivers
    /// `.closed(nil)`.
    public func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) {
        core.activate(queue: queue, handler: handler)
    }

    /// Queues one frame for the IN endpoint; the writer thread writes frames in order. Never
    /// blocks.
    ///
    /// Zero-length-packet rule: the host keeps IN transfers of 16 or 64 KiB queued, and a USB transfer
    /// ends only at a packet shorter than `wMaxPacketSize` (or when its buffer is full). A frame
    /// whose length is a multiple of the packet size ends with a full packet, so the host's
    /// transfer would stay open and the frame would sit in the host controller until the next
    /// write. FunctionFS cannot ask for a zero-length packet, so such a frame is written in two
    /// writes: all but its last byte (which ends with a short packet), then the last byte alone.
    /// The host's frame scanner joins the two. The packet size is the one the kernel reports for
    /// the speed in use (64 when it cannot say: every larger bulk size is a multiple of it).
    ///
    /// Frames sent while the function is not enabled, or whose write fails, are dropped.
    public func send(_ frame: [UInt8]) {
        core.send(frame)
    }

    /// Halts the IN endpoint once, after the frames already sent: the host's next IN transfer
    /// ends with a STALL, and writes work again after the host clears the halt
    /// (`CLEAR_FEATURE(ENDPOINT_HALT)`, which libusb sends for `libusb_clear_halt`).
    ///
    /// FunctionFS halts an endpoint when it is used against its direction: the writer thread
    /// `read()`s the IN endpoint file, which the kernel answers with `EBADMSG` once the halt is
    /// set (``GadgetTransportStatistics/inHalts``). It is done between two writes, because
    /// most controllers refuse to halt an IN endpoint with a transfer queued. Does nothing while
    /// the function is not enabled.
    public func stallIn() {
        core.stallIn()
    }

    /// Closes the transport: wakes and joins the three threads, closes the files, then delivers
    /// `.closed(nil)` unless a close was already delivered. Frames not yet written are dropped.
    /// Returns once the threads have ended. Calling it again does nothing.
    public func cancel() {
        core.teardown(reason: nil, deliver: true, waitIfBusy: true)
    }

    // Test hooks.

    /// Threads started and not yet ended.
    var runningThreads: Int { core.runningThreads.load(ordering: .acquiring) }

    /// The start of this transport's thread names (`gadget<n>`; then `-ep0`, `-in`, `-out`).
    var threadNamePrefix: String { core.threadPrefix }

    /// Every descriptor the transport holds: the three endpoints and its wake pipe's two ends
    /// (-1 where there is none); `cancel()` closes them all.
    var fileDescriptors: [Int32] { [core.ep0, core.inEndpoint, core.outEndpoint, core.wakeReader, core.wakeWriter] }

    /// Calls `handler` on the reader or writer thread after each endpoint error is counted.
    func onEndpointError(_ handler: @escaping @Sendable () -> Void) {
        core.state.withLock { $0.endpointErrorObserver = handler }
    }
}

// MARK: - Opening

/// Opens a FunctionFS file with `flags`; the error says what a person can do about a failure.
private func openEndpointFile(_ path: String, flags: Int32, stage: String) throws(TransportError) -> Int32 {
    switch SystemCall.open(path, flags) {
    case .success(let descriptor):
        return descriptor
    case .failure(let error):
        let code = error.code
        let advice: String
        switch code {
        case ENOENT where stage == "ep0":
            advice = "mount FunctionFS there first (mount -t functionfs <instance> <directory>, after modprobe usb_f_fs), or let iapctl simulate --gadget do it"
        case ENOENT:
            advice = "the kernel made no endpoint files, so it did not take the descriptors; see dmesg"
        case EACCES, EPERM:
            advice = "run as root, or mount FunctionFS with uid=<your uid>"
        case EBUSY:
            advice = "the function is closing; unmount and mount it again"
        default:
            advice = "check that FunctionFS is mounted there and that no other program uses it"
        }
        throw TransportError("cannot open \(path): \(error)", errno: code, advice: advice)
    }
}

/// Writes one setup blob to `ep0` in a single `write()`, as FunctionFS requires.
private func writeSetupBlob(_ ep0: Int32, _ blob: [UInt8], path: String, what: String) throws(TransportError) {
    let result = blob.withUnsafeBytes { SystemCall.write(ep0, $0) }
    if case .success(blob.count) = result { return }
    let code = if case .failure(let error) = result { error.code } else { EIO }
    let advice: String
    switch code {
    case EINVAL:
        advice = "the kernel refused them; dmesg says why (an old kernel without SuperSpeed support in FunctionFS refuses HAS_SS_DESC)"
    case EBADFD, EBUSY:
        advice = "another program already configured this function; stop it, or unmount and mount FunctionFS again"
    default:
        advice = "unmount and mount FunctionFS again, then retry"
    }
    throw TransportError("cannot write the USB \(what) to \(path): \(gadgetErrorText(code))", errno: code, advice: advice)
}

/// `FUNCTIONFS_ENDPOINT_DESC`: `_IOR('g', 130, struct usb_endpoint_descriptor)` (9 bytes). It
/// reads back the endpoint descriptor of the speed the host connected at.
private let functionFSEndpointDescriptorRequest: UInt = (2 << 30) | (9 << 16) | (UInt(UInt8(ascii: "g")) << 8) | 130

/// The IN endpoint's `wMaxPacketSize` at the connected speed, or `nil` when the kernel cannot say.
private func activeMaxPacketSize(_ descriptor: Int32) -> Int? {
    var bytes = [UInt8](repeating: 0, count: 9)
    let result = bytes.withUnsafeMutableBytes { ioctl(descriptor, functionFSEndpointDescriptorRequest, $0.baseAddress!) }
    guard result == 0, bytes[0] >= 7, bytes[1] == 0x05 else { return nil }
    let size = Int(UInt16(bytes[4]) | UInt16(bytes[5]) << 8) & 0x07FF
    return size >= 8 ? size : nil
}

/// `strerror(3)` text with the errno's name, e.g. "No such file or directory (ENOENT)".
func gadgetErrorText(_ code: Int32) -> String {
    SystemError(code).description
}

// MARK: - Threads

/// Installs a handler that does nothing for ``GadgetTransport/interruptSignal``, without
/// `SA_RESTART`, so that a thread the signal is sent to returns from a blocking call with
/// `EINTR`. A handler someone else installed stays.
private let interruptHandlerInstalled: Bool = {
    var current = sigaction()
    guard sigaction(SIGURG, nil, &current) == 0 else { return false }
    // sa_handler shares its storage with sa_sigaction. 0 is SIG_DFL and 1 is SIG_IGN: nobody
    // else uses the signal. Anything else is someone's handler, which is left alone.
    let existing = unsafeBitCast(current.__sigaction_handler.sa_handler, to: UInt.self)
    guard existing <= 1 else { return true }
    var action = sigaction()
    action.__sigaction_handler.sa_handler = { _ in }
    sigemptyset(&action.sa_mask)
    action.sa_flags = 0
    return sigaction(SIGURG, &action, nil) == 0
}()

/// Wakes `thread` from a blocking call with the interrupt signal, repeating in case the signal
/// came just before the call, and joins it.
func interruptAndJoin(_ thread: WorkerThread) {
    repeat {
        pthread_kill(thread.handle, SIGURG)
    } while thread.finished.wait(timeout: .now() + .milliseconds(20)) == .timedOut
    pthread_join(thread.handle, nil)
}

/// A thread of the transport: its handle, and a semaphore signalled when its body returned.
final class WorkerThread: Sendable {
    let name: String
    let handle: pthread_t
    let finished: DispatchSemaphore

    init(name: String, handle: pthread_t, finished: DispatchSemaphore) {
        self.name = name
        self.handle = handle
        self.finished = finished
    }
}

/// The body of a new thread, handed through `pthread_create`'s context pointer.
private final class ThreadStart: Sendable {
    let name: String
    let body: @Sendable () -> Void
    let started = DispatchSemaphore(value: 0)
    let finished: DispatchSemaphore

    init(name: String, body: @escaping @Sendable () -> Void, finished: DispatchSemaphore) {
        self.name = name
        self.body = body
        self.finished = finished
    }
}

/// Names the calling thread (what `ps -L` and /proc show; 15 bytes at most) by writing its
/// `comm` file: `pthread_setname_np` is a GNU extension Swift does not see.
private func nameCurrentThread(_ name: String) {
    let descriptor = open("/proc/thread-self/comm", O_WRONLY | O_CLOEXEC)
    guard descriptor >= 0 else { return }
    let bytes = Array(name.utf8.prefix(15))
    _ = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
    _ = close(descriptor)
}

/// Starts a joinable thread with ``GadgetTransport/interruptSignal`` unblocked, and returns once
/// it runs and carries its name; fails when the system has no more threads to give.
func spawnThread(name: String, body: @escaping @Sendable () -> Void) -> Result<WorkerThread, TransportError> {
    _ = interruptHandlerInstalled
    let finished = DispatchSemaphore(value: 0)
    let start = ThreadStart(name: name, body: body, finished: finished)
    let context = Unmanaged.passRetained(start).toOpaque()
    var handle = pthread_t()
    let result = pthread_create(&handle, nil, { context in
        let start = Unmanaged<ThreadStart>.fromOpaque(context!).takeRetainedValue()
        nameCurrentThread(start.name)
        var signals = sigset_t()
        sigemptyset(&signals)
        sigaddset(&signals, SIGURG)
        pthread_sigmask(SIG_UNBLOCK, &signals, nil)
        start.started.signal()
        start.body()
        start.finished.signal()
        return nil
    }, context)
    guard result == 0 else {
        Unmanaged<ThreadStart>.fromOpaque(context).release()
        return .failure(TransportError(
            "cannot start the \(name) thread: \(gadgetErrorText(result))", errno: result,
            advice: "the system is out of threads or memory; close something and try again"))
    }
    start.started.wait()
    return .success(WorkerThread(name: name, handle: handle, finished: finished))
}

// MARK: - Core

/// Numbers the transports of the process (for their thread names).
private let transportSerial = Atomic<Int>(0)

/// Everything the threads and the transport share; it outlives the transport while threads run.
private final class GadgetCore: Sendable {
    let name: String
    /// The start of its threads' names: `gadget<n>` for the n-th transport of the process, so
    /// `gadget<n>-ep0`, `gadget<n>-in` (the writer), `gadget<n>-out` (the reader).
    let threadPrefix: String
    let ep0: Int32
    let inEndpoint: Int32
    let outEndpoint: Int32
    let isFunctionFS: Bool
    let retryInterval: Duration
    /// The self-pipe that wakes the ep0 thread from poll(2): (read end, write end), or -1s.
    let wakeReader: Int32
    let wakeWriter: Int32
    let readerWake = DispatchSemaphore(value: 0)
    let writerWake = DispatchSemaphore(value: 0)
    /// Signalled once when a teardown finished (and again by every waiter, so all get through).
    let tornDown = DispatchSemaphore(value: 0)
    let runningThreads = Atomic<Int>(0)
    let state: Mutex<State>

    /// 64 KiB: a multiple of 64, 512 and 1024 (so the kernel never receives more than was asked
    /// for), and more than any link packet, so one read returns one whole OUT transfer (the host
    /// sends one link packet per transfer) and the accessory's frame scanner never reassembles.
    static let readSize = 64 * 1024
    /// Reads shorter than this are copied into an array of their size; longer ones are handed
    /// on in the array they were read into (no copy), and the next read gets a new one.
    static let compactBelow = 8 * 1024

    enum Phase {
        /// Open, not activated.
        case idle
        /// Activated: reader and writer run.
        case active
        /// A teardown is under way or done.
        case closing
    }

    enum Outgoing {
        case frame([UInt8])
        case stall
    }

    struct State {
        var phase = Phase.idle
        var activated = false
        var queue: DispatchQueue?
        var handler: (@Sendable (TransportEvent) -> Void)?
        var observers: [@Sendable (GadgetConnection) -> Void] = []
        var endpointErrorObserver: (@Sendable () -> Void)?
        var bound: Bool
        var enabled: Bool
        var suspended = false
        /// Incremented by every ENABLE: I/O that failed in one generation waits for the next.
        var enableGeneration: UInt64 = 0
        /// The generation in which the reader's last read failed, until it may try again.
        var readerFailedGeneration: UInt64?
        /// The IN endpoint's packet size, and the generation it was learned in.
        var maxPacket: Int
        var maxPacketGeneration: UInt64 = 0
        var outgoing: [Outgoing] = []
        var outgoingHead = 0
        var threads: [WorkerThread] = []
        var statistics = GadgetTransportStatistics()
        var teardownFinished = false

        var connection: GadgetConnection {
            if !bound { return .unbound }
            if suspended { return .suspended }
            return enabled ? .enabled : .bound
        }

        mutating func popOutgoing() -> Outgoing? {
            guard outgoingHead < outgoing.count else { return nil }
            let item = outgoing[outgoingHead]
            outgoingHead += 1
            if outgoingHead == outgoing.count {
                outgoing.removeAll(keepingCapacity: outgoing.count <= 1024)
                outgoingHead = 0
            }
            return item
        }

        /// Drops queued frames (the endpoints went down); returns how many.
        mutating func dropOutgoing() {
            for item in outgoing[outgoingHead...] {
                if case .frame = item { statistics.framesDropped += 1 }
            }
            outgoing = []
            outgoingHead = 0
        }
    }

    init(ep0: Int32?, inEndpoint: Int32, outEndpoint: Int32, maxPacket: Int?, isFunctionFS: Bool, name: String,
         retryInterval: Duration) throws(TransportError) {
        self.name = name
        threadPrefix = "gadget\(transportSerial.add(1, ordering: .relaxed).newValue % 100_000)"
        self.ep0 = ep0 ?? -1
        self.inEndpoint = inEndpoint
        self.outEndpoint = outEndpoint
        self.isFunctionFS = isFunctionFS
        self.retryInterval = retryInterval
        var ends: (Int32, Int32) = (-1, -1)
        if ep0 != nil {
            guard let made = makeWakePipe() else {
                let code = errno
                throw TransportError("cannot watch ep0 of \(name): \(gadgetErrorText(code))", errno: code,
                                     advice: "too many open files; close some (or raise ulimit -n) and try again")
            }
            ends = made
        }
        wakeReader = ends.0
        wakeWriter = ends.1
        // Without ep0 nothing ever reports the state: the endpoints are simply usable.
        state = Mutex(State(bound: ep0 == nil, enabled: ep0 == nil, maxPacket: maxPacket ?? 64))
        guard ep0 != nil else { return }
        let started = state.withLock { state -> TransportError? in
            spawn("\(threadPrefix)-ep0", into: &state) { [self] in watchEndpointZero() }
        }
        if let started {
            for descriptor in [wakeReader, wakeWriter] { _ = Glibc.close(descriptor) }
            throw started
        }
    }

    /// Starts a thread and records it; call with the state locked.
    private func spawn(_ name: String, into state: inout State, body: @escaping @Sendable () -> Void) -> TransportError? {
        runningThreads.add(1, ordering: .acquiringAndReleasing)
        let outcome = spawnThread(name: name) { [self] in
            body()
            runningThreads.subtract(1, ordering: .acquiringAndReleasing)
        }
        switch outcome {
        case let .success(thread):
            state.threads.append(thread)
            return nil
        case let .failure(error):
            runningThreads.subtract(1, ordering: .acquiringAndReleasing)
            return error
        }
    }

    var connection: GadgetConnection { state.withLock { $0.connection } }
    var statistics: GadgetTransportStatistics { state.withLock { $0.statistics } }

    func addConnectionObserver(_ observer: @escaping @Sendable (GadgetConnection) -> Void) {
        state.withLock { $0.observers.append(observer) }
    }

    // MARK: Entry points

    func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) {
        enum Outcome { case ignored, alreadyClosed, started, failed(TransportError) }
        let outcome = state.withLock { state -> Outcome in
            guard !state.activated else { return .ignored }
            state.activated = true
            guard state.phase == .idle else { return .alreadyClosed }
            state.phase = .active
            state.queue = queue
            state.handler = handler
            if let error = spawn("\(threadPrefix)-out", into: &state, body: { [self] in readLoop() }) { return .failed(error) }
            if let error = spawn("\(threadPrefix)-in", into: &state, body: { [self] in writeLoop() }) { return .failed(error) }
            return .started
        }
        switch outcome {
        case .ignored, .started:
            return
        case .alreadyClosed:
            queue.async { handler(.closed(nil)) }
        case let .failed(error):
            fail(error)
        }
    }

    func send(_ frame: [UInt8]) {
        guard !frame.isEmpty else { return }
        let queued = state.withLock { state -> Bool in
            guard state.phase != .closing else { return false }
            guard state.enabled else {
                state.statistics.framesDropped += 1
                return false
            }
            state.outgoing.append(.frame(frame))
            return true
        }
        if queued { writerWake.signal() }
    }

    func stallIn() {
        let queued = state.withLock { state -> Bool in
            guard state.phase != .closing, state.enabled else { return false }
            state.outgoing.append(.stall)
            return true
        }
        if queued { writerWake.signal() }
    }

    /// Closes the transport from one of its threads (an unrecoverable error): the teardown runs
    /// elsewhere, since it joins the thread that asks for it.
    func fail(_ error: TransportError) {
        // On a queue of its own, not the global one: the teardown joins threads, and on Linux the
        // global queue shares its threads with Swift's tasks (as many as cores; a blocked one is
        // made up for only after about a second).
        DispatchQueue(label: "GadgetTransport teardown").async { [self] in
            teardown(reason: error, deliver: true, waitIfBusy: false)
        }
    }

    /// Stops and joins the threads, closes the files and delivers `.closed(reason)` (when
    /// `deliver` is set and the transport was activated). Only the first call does it; later
    /// calls wait for it to finish when `waitIfBusy` is set.
    func teardown(reason: TransportError?, deliver: Bool, waitIfBusy: Bool) {
        let threads = state.withLock { state -> [WorkerThread]? in
            guard state.phase != .closing else { return nil }
            state.phase = .closing
            state.dropOutgoing()
            return state.threads
        }
        guard let threads else {
            if waitIfBusy {
                let finished = state.withLock { $0.teardownFinished }
                if !finished {
                    tornDown.wait()
                    tornDown.signal()
                }
            }
            return
        }
        wakeAll()
        let me = pthread_self()
        for thread in threads {
            if pthread_equal(thread.handle, me) != 0 {
                // Released on its own thread: it ends by itself once this returns.
                pthread_detach(thread.handle)
                continue
            }
            interruptAndJoin(thread) // woken from a blocking read or write
        }
        for descriptor in [ep0, inEndpoint, outEndpoint, wakeReader, wakeWriter] where descriptor >= 0 {
            _ = Glibc.close(descriptor)
        }
        let (queue, handler) = state.withLock { state in
            defer {
                state.handler = nil
                state.observers = []
                state.endpointErrorObserver = nil
                state.queue = nil
                state.threads = []
                state.teardownFinished = true
            }
            return (state.queue, deliver ? state.handler : nil)
        }
        tornDown.signal()
        if let queue, let handler {
            queue.async { handler(.closed(reason)) }
        }
    }

    private func wakeAll() {
        readerWake.signal()
        writerWake.signal()
        if wakeWriter >= 0 {
            var byte: UInt8 = 1
            _ = write(wakeWriter, &byte, 1)
        }
    }

    private var isClosing: Bool { state.withLock { $0.phase == .closing } }

    // MARK: ep0 thread

    private func watchEndpointZero() {
        var buffer = [UInt8](repeating: 0, count: 4 * FunctionFSEvent.size)
        var pending: [UInt8] = []
        var drain = [UInt8](repeating: 0, count: 16)
        while !isClosing {
            var watched = [pollfd(fd: ep0, events: Int16(POLLIN), revents: 0),
                           pollfd(fd: wakeReader, events: Int16(POLLIN), revents: 0)]
            if case .failure(let error) = SystemCall.poll(&watched, retry: { !isClosing }) {
                if error.kind == .interrupted || error.kind == .wouldBlock { continue }
                let code = error.code
                fail(TransportError("cannot watch ep0 of \(name): \(gadgetErrorText(code))", errno: code,
                                    advice: "start the gadget again"))
                return
            }
            if watched[1].revents != 0 {
                while drain.withUnsafeMutableBytes({ read(wakeReader, $0.baseAddress, $0.count) }) > 0 {}
                continue
            }
            guard watched[0].revents != 0 else { continue }
            let result = buffer.withUnsafeMutableBytes { SystemCall.read(ep0, into: $0, retry: { !isClosing }) }
            if case .success(let count) = result, count > 0 {
                pending += buffer[..<count]
                var offset = 0
                while pending.count - offset >= FunctionFSEvent.size {
                    if let event = FunctionFSEvent(pending[offset..<(offset + FunctionFSEvent.size)]) {
                        handle(event)
                    }
                    offset += FunctionFSEvent.size
                }
                pending.removeFirst(offset)
                continue
            }
            let code: Int32? = if case .failure(let error) = result { error.code } else { nil }
            switch code {
            case EINTR?, EAGAIN?, EIDRM?:
                // EIDRM: the host abandoned a control request before it was answered.
                continue
            case nil:
                if isClosing { return }
                fail(TransportError("ep0 of \(name) was closed", advice: "start the gadget again"))
                return
            case let code?:
                if isClosing { return }
                fail(TransportError(
                    "reading the USB function's events from ep0 of \(name) failed: \(gadgetErrorText(code))", errno: code,
                    advice: "the FunctionFS instance went away (unmounted, or the gadget was removed); start the gadget again"))
                return
            }
        }
    }

    private func handle(_ event: FunctionFSEvent) {
        guard let kind = event.kind else {
            state.withLock { $0.statistics.events += 1 }
            return
        }
        if kind == .setup {
            answer(event.setup)
        }
        let change = state.withLock { state -> (GadgetConnection, [@Sendable (GadgetConnection) -> Void])? in
            state.statistics.events += 1
            let before = state.connection
            switch kind {
            case .bind:
                state.bound = true
            case .unbind:
                state.bound = false
                state.enabled = false
                state.suspended = false
                state.dropOutgoing()
            case .enable:
                state.bound = true
                state.enabled = true
                state.suspended = false
                state.enableGeneration &+= 1
            case .disable:
                state.enabled = false
                state.suspended = false
                state.dropOutgoing()
            case .suspend:
                state.suspended = state.bound
            case .resume:
                state.suspended = false
            case .setup:
                state.statistics.setupRequests += 1
            }
            let after = state.connection
            return after == before ? nil : (after, state.observers)
        }
        readerWake.signal()
        writerWake.signal()
        if let (connection, observers) = change {
            for observer in observers { observer(connection) }
        }
    }

    /// Answers a control request addressed to the function. Nothing here implements one, so
    /// host-to-device requests are acknowledged (their data is read and discarded) and
    /// device-to-host requests are stalled; with FunctionFS both are a `read()` of `ep0`.
    private func answer(_ setup: USBSetupRequest) {
        var data = [UInt8](repeating: 0, count: max(1, Int(setup.length)))
        _ = data.withUnsafeMutableBytes { SystemCall.read(ep0, into: $0, retry: { !isClosing }) }
    }

    // MARK: Reader thread

    private enum ReadStep {
        case stop
        case wait(Duration?)
        case read(generation: UInt64)
    }

    private func readLoop() {
        while true {
            let step = state.withLock { state -> ReadStep in
                guard state.phase == .active else { return .stop }
                guard state.enabled else { return .wait(nil) }
                if let failed = state.readerFailedGeneration {
                    if failed == state.enableGeneration { return .wait(retryInterval) }
                    state.readerFailedGeneration = nil
                }
                return .read(generation: state.enableGeneration)
            }
            switch step {
            case .stop:
                return
            case .wait(nil):
                readerWake.wait()
                continue
            case let .wait(interval?):
                if readerWake.wait(timeout: .now() + dispatchInterval(interval)) == .timedOut {
                    // No ENABLE came: the endpoint may work again without one (a transient error).
                    state.withLock { $0.readerFailedGeneration = nil }
                }
                continue
            case let .read(generation):
                var result: Result<Int, SystemError> = .success(0)
                var bytes = [UInt8](unsafeUninitializedCapacity: Self.readSize) { buffer, initialized in
                    result = SystemCall.read(outEndpoint, into: UnsafeMutableRawBufferPointer(buffer), retry: { !isClosing })
                    initialized = (try? result.get()) ?? 0
                }
                let count = (try? result.get()) ?? -1
                if count > 0 {
                    // (Through a buffer pointer: an Array made from a whole-array slice would
                    // keep the 64 KiB storage.)
                    if count < Self.compactBelow { bytes = bytes.withUnsafeBufferPointer { Array($0) } }
                    let delivery = state.withLock { state -> (DispatchQueue, @Sendable (TransportEvent) -> Void)? in
                        guard state.phase == .active, let queue = state.queue, let handler = state.handler else { return nil }
                        state.statistics.reads += 1
                        state.statistics.bytesReceived += count
                        return (queue, handler)
                    }
                    if let (queue, handler) = delivery {
                        let received = bytes
                        queue.async { handler(.received(received)) }
                    }
                    continue
                }
                if count == 0 {
                    // FunctionFS: a zero-length packet ended a transfer that filled the last read.
                    if isFunctionFS { continue }
                    if !isClosing {
                        fail(TransportError("the OUT endpoint of \(name) reached its end (its other side closed)",
                                            advice: "start the gadget again"))
                    }
                    return
                }
                guard case .failure(let error) = result, error.kind != .interrupted else { continue }
                if !endpointFailed(error.code, generation: generation, direction: "reading the OUT endpoint") { return }
                state.withLock { state in
                    if state.readerFailedGeneration == nil { state.readerFailedGeneration = generation }
                }
            }
        }
    }

    /// Counts an endpoint error; `false` (after closing the transport) when it cannot be waited
    /// out: a descriptor that is not usable at all, or no ep0 to say when it works again.
    private func endpointFailed(_ code: Int32, generation: UInt64, direction: String) -> Bool {
        let recoverable = ep0 >= 0 && code != EBADF && code != EFAULT && code != EINVAL
        let observer = state.withLock { state in
            state.statistics.endpointErrors += 1
            return state.endpointErrorObserver
        }
        observer?()
        if recoverable { return true }
        if !isClosing {
            fail(TransportError("\(direction) of \(name) failed: \(gadgetErrorText(code))", errno: code,
                                advice: "start the gadget again"))
        }
        return false
    }

    // MARK: Writer thread

    private enum WriteStep {
        case stop
        case wait
        case again
        case frame([UInt8], generation: UInt64, maxPacket: Int, knownSize: Bool)
        case stall
    }

    private func writeLoop() {
        while true {
            let step = state.withLock { state -> WriteStep in
                guard state.phase == .active else { return .stop }
                guard let item = state.popOutgoing() else { return .wait }
                guard state.enabled else {
                    if case .frame = item { state.statistics.framesDropped += 1 }
                    return .again
                }
                switch item {
                case let .frame(bytes):
                    return .frame(bytes, generation: state.enableGeneration, maxPacket: state.maxPacket,
                                  knownSize: !isFunctionFS || state.maxPacketGeneration == state.enableGeneration)
                case .stall:
                    return .stall
                }
            }
            switch step {
            case .stop:
                return
            case .wait:
                writerWake.wait()
            case .again:
                continue
            case .stall:
                halt()
            case .frame(let frame, let generation, var maxPacket, let knownSize):
                if !knownSize {
                    // A new ENABLE: ask the kernel which packet size the host connected at.
                    maxPacket = activeMaxPacketSize(inEndpoint) ?? 64
                    state.withLock { state in
                        state.maxPacket = maxPacket
                        state.maxPacketGeneration = generation
                    }
                }
                if !writeFrame(frame, maxPacket: maxPacket, generation: generation) { return }
            }
        }
    }

    /// Writes one frame with the short-packet rule; `false` when the writer must stop.
    private func writeFrame(_ frame: [UInt8], maxPacket: Int, generation: UInt64) -> Bool {
        guard !frame.isEmpty else { return true } // nothing to send (and no split of nothing)
        let split = frame.count % maxPacket == 0
        let pieces = split ? [0..<(frame.count - 1), (frame.count - 1)..<frame.count] : [0..<frame.count]
        for piece in pieces {
            let result = frame.withUnsafeBytes {
                SystemCall.writeAll(inEndpoint, UnsafeRawBufferPointer(rebasing: $0[piece]), retry: { !isClosing })
            }
            if case .failure(let error) = result {
                if error.kind == .interrupted { return false }
                if !endpointFailed(error.code, generation: generation, direction: "writing the IN endpoint") { return false }
                state.withLock { $0.statistics.framesDropped += 1 }
                return true
            }
        }
        state.withLock { state in
            state.statistics.framesSent += 1
            state.statistics.bytesSent += frame.count
            if split { state.statistics.shortPacketSplits += 1 }
        }
        return true
    }

    /// Halts the IN endpoint: FunctionFS sets the halt when its IN file is read.
    private func halt() {
        var byte: UInt8 = 0
        let result = read(inEndpoint, &byte, 1)
        let code = result < 0 ? errno : 0
        state.withLock { state in
            state.statistics.inHaltRequests += 1
            if code == EBADMSG { state.statistics.inHalts += 1 }
        }
    }
}

/// A Dispatch interval from a Duration (whole milliseconds, at least one).
private func dispatchInterval(_ duration: Duration) -> DispatchTimeInterval {
    let (seconds, attoseconds) = duration.components
    return .milliseconds(max(1, Int(seconds) * 1_000 + Int(attoseconds / 1_000_000_000_000_000)))
}

extension GadgetTransport: HostReconnectingWire {
    /// ``connection`` as the simulator's runner sees it: unbound and bound are no host.
    public var hostConnection: HostConnectionState { HostConnectionState(connection) }

    /// Calls `handler` with every change of ``hostConnection`` (see ``onConnectionChange(_:)``).
    public func onHostConnectionChange(_ handler: @escaping @Sendable (HostConnectionState) -> Void) {
        onConnectionChange { handler(HostConnectionState($0)) }
    }
}

extension HostConnectionState {
    init(_ connection: GadgetConnection) {
        switch connection {
        case .unbound, .bound: self = .absent
        case .enabled: self = .configured
        case .suspended: self = .suspended
        }
    }
}
