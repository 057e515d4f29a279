internal import Dispatch
internal import Glibc
internal import IAPTransport
internal import Synchronization
internal import SystemCalls

/// Numbers the transports of the process (for their thread names).
private let transportSerial = Atomic<Int>(0)

/// Everything the threads and the transport share; it outlives the transport while threads run.
final class GadgetCore: Sendable {
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
    /// Requests kept queued on each FunctionFS endpoint (reads on OUT, writes on IN), as a
    /// device's controller keeps several transfers queued (``EndpointRequests``); 1: one
    /// blocking call at a time.
    let queuedRequests: Int
    /// The longest frame written through a queued request (longer ones are written directly).
    static let writeSlotSize = 64 * 1024
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
         retryInterval: Duration, queuedRequests: Int = 1) throws(TransportError) {
        self.name = name
        self.queuedRequests = isFunctionFS ? max(1, queuedRequests) : 1
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
                throw TransportError("cannot watch ep0 of \(name): \(SystemError(code).description)", errno: code,
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
            let byte: [UInt8] = [1]
            _ = byte.withUnsafeBytes { SystemCall.write(wakeWriter, $0) }
        }
    }

    var isClosing: Bool { state.withLock { $0.phase == .closing } }
}
