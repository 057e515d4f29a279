internal import ByteRing
public import Dispatch
public import IAPLink

/// A state machine an ``EndpointDriver`` can run: fed bytes and time, asked for output and for
/// when to wake next. ``IAP2Endpoint`` is one; the simulator's accessory is another.
public protocol DrivenMachine: SendableMetatype {
    /// Begins the machine's work at `now`, queuing what it sends first (an accessory's detect,
    /// for example): called once by ``EndpointDriver/start(update:closed:)``, and for a machine
    /// that replaces another (``EndpointDriver/replaceMachine(_:)``).
    mutating func start(now: LinkTime)
    /// Bytes that arrived from the transport at `now`, in any chunks (a frame may be split across
    /// calls, or several frames share one); what they cause is queued as output and events.
    mutating func receive(_ bytes: [UInt8], now: LinkTime)
    /// Bytes read in place (a USB ring slot); the default copies them into an array.
    mutating func receive(_ bytes: RawSpan, now: LinkTime)
    /// Bytes lent by the transport beyond the call (a USB IN slot), which the machine may keep
    /// views of; the default reads them in place.
    mutating func receive(lent bytes: LentBytes, now: LinkTime)
    /// Lets time pass to `now`: retransmissions, acknowledgement and answer timeouts that are due
    /// run here. The driver calls it when ``nextDeadline`` is reached (possibly a little later).
    mutating func advance(to now: LinkTime)
    /// When the machine next needs ``advance(to:)``, on the same clock as `now`; nil when nothing is
    /// pending (then the driver's timer sleeps).
    var nextDeadline: LinkTime? { get }
    /// ``DrivenMachine/nextDeadline`` read through exclusive access: the driver keeps the
    /// machine in a class property, and reading a getter of it there copies the whole machine
    /// first (a retain and release of every reference it holds, after every input); a mutating
    /// call borrows it in place. The default returns ``DrivenMachine/nextDeadline``.
    mutating func deadlineInPlace() -> LinkTime?
    /// Takes the frames to send, in order, and forgets them; empty when there are none: the
    /// simple form a machine of tests implements.
    mutating func takeOutput() -> [[UInt8]]
    /// Appends the frames to send to `frames` as they lie (transmit buffers as they are): what
    /// the driver takes each turn, into an array it keeps. The default appends
    /// ``DrivenMachine/takeOutput()``'s arrays (an array made per turn); the endpoints and the simulator
    /// append their own.
    mutating func takeFrames(into frames: inout [LinkFrame])
    /// ``DrivenMachine/takeFrames(into:)`` as the driver calls it before the owner's update:
    /// an acknowledgement the machine owes and has not sent may stay owed, so that the data the
    /// update queues carries it (the driver takes the frames again after the update, with
    /// ``DrivenMachine/takeFrames(into:)``). The default is ``DrivenMachine/takeFrames(into:)``.
    mutating func takeFramesBeforeUpdate(into frames: inout [LinkFrame])
    /// Told the transport's transmit buffers (``TransmitBuffers``), when it lends any, to lay
    /// outgoing packets out in; the default ignores them.
    mutating func useTransmitBuffers(_ buffers: TransmitBuffers)
    /// Told, before each ``DrivenMachine/advance(to:)``, how far a byte-stream transport has got with its
    /// output (its ``Transport/capability(_:)`` for ``TransportOutputProgress``), so that
    /// retransmission timers do not count time spent in the transport's queue; the default
    /// ignores it.
    mutating func noteOutputProgress(_ progress: TransportOutputProgress)
}

extension DrivenMachine {
    public mutating func takeFrames(into frames: inout [LinkFrame]) {
        for frame in takeOutput() { frames.append(.bytes(frame)) }
    }

    public mutating func takeFramesBeforeUpdate(into frames: inout [LinkFrame]) { takeFrames(into: &frames) }

    public mutating func useTransmitBuffers(_ buffers: TransmitBuffers) {}

    public mutating func noteOutputProgress(_ progress: TransportOutputProgress) {}

    public mutating func deadlineInPlace() -> LinkTime? { nextDeadline }

    public mutating func receive(_ bytes: RawSpan, now: LinkTime) {
        receive(bytes.withUnsafeBytes { Array($0) }, now: now)
    }

    public mutating func receive(lent bytes: LentBytes, now: LinkTime) {
        bytes.withSpan { receive($0, now: now) }
    }
}

extension IAP2Endpoint: DrivenMachine {
    public mutating func useTransmitBuffers(_ buffers: TransmitBuffers) { transmitBuffers = buffers.pool }
}
extension IAPEndpoint: DrivenMachine {
    public mutating func useTransmitBuffers(_ buffers: TransmitBuffers) { transmitBuffers = buffers.pool }
}

/// Runs a ``DrivenMachine`` over a ``Transport`` on one serial Dispatch queue: the event loop.
///
/// Received bytes and the one timer arrive on the queue; after each, the machine's output goes to
/// the transport, the owner's `update` hook runs (to take events and act on them), and the timer
/// is moved to the machine's next deadline. When no deadline is set the timer sleeps: an idle
/// link costs no wake-ups. All state is confined to the queue.
public final class EndpointDriver<Machine: DrivenMachine>: @unchecked Sendable {
    // Confinement: every stored property below is read and written on `queue` only (checked with
    // dispatchPrecondition in the entry points), which is what makes the class Sendable.
    /// The serial queue the machine, the transport's events and the timer run on; every method that
    /// says "Must be called on queue" means this one.
    public let queue: DispatchQueue
    /// The transport the machine runs over (activated by ``start(update:closed:)``, cancelled by
    /// ``stop()``).
    public let transport: any Transport
    /// The clock the machine's time and the timer run on (a ``ManualLinkClock`` in tests).
    public let clock: any LinkClock
    private var machine: Machine
    /// The clock's time when the driver was made: the machine's time starts at zero there.
    private let origin: LinkTime
    private var timer: (any LinkTimer)?
    private var running = false
    private var update: ((inout Machine, LinkTime) -> Void)?
    private var closed: ((TransportError?) -> Void)?
    /// The array frames are taken into, kept across turns (no allocation per turn).
    private var frameScratch = ReusableArray<LinkFrame>()
    /// Set while ``perform(_:)`` lends the machine out.
    private var performing = false
    /// The deadline the timer is set for, so an unchanged one is not set again.
    private var scheduledDeadline: LinkTime?

    /// Creates a driver; nothing happens until ``start(update:closed:)``.
    ///
    /// - Parameters:
    ///   - machine: the state machine the driver runs (an endpoint).
    ///   - transport: the wire it runs over.
    ///   - queue: the serial queue everything happens on.
    ///   - clock: the time the machine runs on; the system's clock unless a test passes a
    ///     ``ManualLinkClock``.
    public init(machine: Machine, transport: any Transport, queue: DispatchQueue, clock: any LinkClock = SystemLinkClock()) {
        self.machine = machine
        self.transport = transport
        self.queue = queue
        self.clock = clock
        self.origin = clock.now
    }

    /// The current time on the machine's clock: zero when the driver was made.
    public var now: LinkTime { clock.now - origin }

    /// Starts the transport and the machine. Must be called on ``queue``.
    ///
    /// - Parameters:
    ///   - update: runs on the queue after every input, with the machine and the time.
    ///   - closed: runs once when the transport closes (with its error, nil when cancelled).
    public func start(update: @escaping (inout Machine, LinkTime) -> Void, closed: @escaping (TransportError?) -> Void) {
        dispatchPrecondition(condition: .onQueue(queue))
        guard !running else { return }
        running = true
        self.update = update
        self.closed = closed
        timer = clock.makeTimer(queue: queue) { [weak self] in self?.timerFired() }
        scheduledDeadline = nil
        transport.activate(queue: queue) { [weak self] event in self?.handle(event) }
        if let pool = transport.capability(PacketBufferPool.self) { machine.useTransmitBuffers(TransmitBuffers(pool)) }
        let now = self.now
        machine.start(now: now)
        settle(now: now)
    }

    /// Runs `body` with the machine (to open sessions, write, read…), then flushes output and
    /// reschedules the timer. Must be called on ``queue``.
    @discardableResult
    public func perform<Result>(_ body: (inout Machine, LinkTime) throws -> Result) rethrows -> Result {
        dispatchPrecondition(condition: .onQueue(queue))
        precondition(!performing, "a call into the endpoint from inside another (for example, a session call from inside withNextChunk's body): finish the first call, then make the second")
        performing = true
        defer { performing = false }
        let now = self.now
        let result = try body(&machine, now)
        if running { settle(now: now) }
        return result
    }

    /// Runs `body` with the machine for a look that changes nothing (a session's counters):
    /// unlike ``perform(_:)``, no frames are sent, no owner update runs and the timer is not
    /// looked at afterwards. Must be called on ``queue``.
    public func inspect<Result>(_ body: (inout Machine) throws -> Result) rethrows -> Result {
        dispatchPrecondition(condition: .onQueue(queue))
        precondition(!performing, "a call into the endpoint from inside another: finish the first call, then make the second")
        performing = true
        defer { performing = false }
        return try body(&machine)
    }

    /// Replaces the machine with `machine` and starts it, keeping the transport: what a device
    /// does when it reboots behind a wire that stays (a serial line). Must be called on ``queue``.
    public func replaceMachine(_ machine: Machine) {
        dispatchPrecondition(condition: .onQueue(queue))
        self.machine = machine
        guard running else { return }
        if let pool = transport.capability(PacketBufferPool.self) { self.machine.useTransmitBuffers(TransmitBuffers(pool)) }
        let now = self.now
        self.machine.start(now: now)
        settle(now: now)
    }

    /// Stops: cancels the timer and the transport, and lets go of the owner's closures (neither
    /// runs again: the transport's close after a stop is not reported). Must be called on
    /// ``queue``.
    public func stop() {
        dispatchPrecondition(condition: .onQueue(queue))
        guard running else { return }
        running = false
        timer?.cancel()
        timer = nil
        // Kept, they would keep whatever they hold for as long as the driver lives, and an owner
        // that holds the driver and is held by its closure never went away (the transport, the
        // machine and its buffers with it: about 84 KiB per stopped accessory in the tests).
        update = nil
        closed = nil
        transport.cancel()
    }

    private func handle(_ event: TransportEvent) {
        guard running else { return }
        // The clock is read once per turn (a system call on some machines, a slow one under
        // emulation): the input and the owner's update share the time.
        let now = self.now
        switch event {
        case let .received(bytes):
            machine.receive(bytes, now: now)
            settle(now: now)
        case let .borrowed(bytes):
            bytes.withSpan { machine.receive($0, now: now) }
            settle(now: now)
        case let .lent(bytes):
            machine.receive(lent: bytes, now: now)
            settle(now: now)
        case let .closed(error):
            running = false
            timer?.cancel()
            timer = nil
            let closed = self.closed
            self.closed = nil
            self.update = nil
            closed?(error)
        }
    }

    private func timerFired() {
        guard running else { return }
        scheduledDeadline = nil // a one-shot timer: whatever comes next must be set again
        if let progress = transport.capability(TransportOutputProgress.self) { machine.noteOutputProgress(progress) }
        let now = self.now
        machine.advance(to: now)
        settle(now: now)
    }

    /// Sends the machine's output, lets the owner react (take events, write, read), sends what
    /// that produced, then moves the timer.
    private func settle(now: LinkTime) {
        sendOutput(beforeUpdate: update != nil)
        update?(&machine, now)
        sendOutput()
        reschedule()
    }

    private func sendOutput(beforeUpdate: Bool = false) {
        var frames = frameScratch.take()
        if beforeUpdate { machine.takeFramesBeforeUpdate(into: &frames) } else { machine.takeFrames(into: &frames) }
        for frame in frames {
            // A bare ACK goes ahead of data a byte stream still holds (the others send in order).
            if case let .bytes(bytes) = frame, LinkFrame.isBareAcknowledgement(bytes) {
                transport.sendAhead(bytes)
            } else {
                transport.send(frame: frame)
            }
        }
        frameScratch.putBack(&frames)
    }

    private func reschedule() {
        guard let timer else { return }
        let next = machine.deadlineInPlace()
        // Setting a timer allocates in Dispatch: the timer is moved only when the machine needs
        // it sooner. A later deadline lets the timer fire early; the fire finds nothing due and
        // sets it again.
        if let scheduled = scheduledDeadline, next.map({ $0 >= scheduled }) ?? true { return }
        scheduledDeadline = next
        timer.schedule(at: next.map { $0 + origin })
    }
}
