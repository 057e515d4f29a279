internal import USBDescriptors
internal import CLibUSB
internal import Dispatch

/// The events of a bulk pipe, whose last one says that it closed.
protocol BulkPipeEvent: Sendable {
    /// The pipe closed: `nil` when asked to, otherwise why.
    static func closed(_ error: USBHostError?) -> Self
}

/// What a bulk pipe's owner decides at its end; the ``BulkPipeLifecycle`` asks.
protocol BulkPipePolicy: AnyObject {
    /// Others the close waits for besides the engine's transfers and the setup calls (the iAP2
    /// transport's native pipes, which use its device handle).
    var closersPending: Int { get }
    /// The engine gave every transfer back and is about to free its memory: take what is kept
    /// of it now.
    func willFree()
    /// The engine's memory and transfers are freed: release what the policy holds, then
    /// ``BulkPipeLifecycle/report(_:then:)``.
    func freed(_ error: USBHostError?)
    /// The teardown deadline passed with transfers or calls still out (the engine is leaked,
    /// deaf): report the close anyway.
    func abandoned(_ error: USBHostError?)
}

extension BulkPipePolicy {
    var closersPending: Int { 0 }
    func willFree() {}
    func abandoned(_ error: USBHostError?) {}
}

/// The lifecycle both bulk pipes share, over their ``BulkPipe``: the state (idle, running,
/// closing, closed), the handler and the queue it runs on, the owner kept alive while libusb may
/// call back into the engine, setup calls in flight (clearing a halt, a reset, an alternate
/// setting), the hop to the context's queue, and the close: cancel everything, wait until libusb
/// gave every transfer back and no setup call runs, then free (after the current libusb call
/// returns) and report. What a completion means is the owner's, its ``BulkPipePolicy``.
///
/// Confined to the context's event queue, like its owner.
final class BulkPipeLifecycle<Event: BulkPipeEvent>: @unchecked Sendable {
    // Sendability: every stored var is touched on the context's event queue only.
    enum State { case idle, running, closing(USBHostError?), closed }

    /// Where the pipe is in its life.
    private(set) var state = State.idle
    /// The transfer engine.
    let engine: BulkPipe
    /// The device the pipe's interface belongs to.
    let device: USBDeviceHandle
    /// The owner, told of the close.
    weak var policy: (any BulkPipePolicy)?
    /// Where the handler runs when that is not the context's queue (nil: called in place).
    private(set) var handlerQueue: DispatchQueue?
    private var handler: (@Sendable (Event) -> Void)?
    /// Why the pipe closed, once closed.
    private(set) var closedError: USBHostError?
    private var setupCallsInFlight = 0
    /// The owner, while libusb may still call back into the engine (it holds unretained
    /// pointers to it): from ``start(keeping:)`` until the close is reported.
    private var keepAlive: AnyObject?
    private var closeScheduled = false
    private var closeDeadline: DispatchWorkItem?

    init(engine: BulkPipe, device: USBDeviceHandle) {
        self.engine = engine
        self.device = device
    }

    /// Whether the pipe runs (not idle, closing or closed).
    var isRunning: Bool {
        if case .running = state { return true }
        return false
    }

    /// Runs `body` now when called on the context's queue, else hops there.
    func onQueue(_ body: @escaping () -> Void) { device.onQueue(body) }

    /// The pipe runs; `owner` is kept alive until the close is reported.
    func start(keeping owner: AnyObject) {
        keepAlive = owner
        state = .running
    }

    /// Events go to `handler` on `handlerQueue` from now on.
    func listen(queue handlerQueue: DispatchQueue, handler: @escaping @Sendable (Event) -> Void) {
        self.handler = handler
        self.handlerQueue = handlerQueue === device.queue ? nil : handlerQueue
    }

    /// Hands `event` to the handler, if there is one: in place, or on its queue.
    func emit(_ event: Event) {
        guard let handler else { return }
        if let handlerQueue {
            handlerQueue.async { handler(event) }
        } else {
            handler(event)
        }
    }

    // MARK: Setup calls

    /// Runs a call on the setup queue (`call` starts it and passes its completion on); the close
    /// waits for it. `completion` runs on the context's queue, whatever the state then.
    func setupCall(_ call: (@escaping (Int32) -> Void) -> Void, completion: @escaping (Int32) -> Void) {
        setupCallsInFlight += 1
        call { [self] status in
            setupCallsInFlight -= 1
            completion(status)
        }
    }

    /// Clears a stalled `endpoint` once none of its direction's transfers is in flight (on the
    /// setup queue: a control transfer the kernel waits for). Then, while the pipe runs: `cleared`
    /// (counted as a stall), or `failed` with libusb's status; closing, the close goes on.
    func clearHaltWhenIdle(_ endpoint: UInt8, failed: @escaping (Int32) -> Void, cleared: @escaping () -> Void) {
        let isIn = endpoint & 0x80 != 0
        guard isIn ? engine.inIdle : engine.outIdle else { return }
        setupCall({ device.clearHalt(endpoint, completion: $0) }) { [self] status in
            guard case .running = state else { return finishIfDrained() }
            guard status == 0 || status == LIBUSB_ERROR_NOT_FOUND.rawValue else { return failed(status) }
            engine.statistics.stalls += 1
            cleared()
        }
    }

    // MARK: Close

    /// Closes with `error`: runs `prepare` once the state says closing, cancels what is in flight
    /// and finishes once drained. With a deadline (milliseconds), transfers the kernel has not
    /// given back by then are abandoned (``BulkPipePolicy/abandoned(_:)``).
    func beginClosing(_ error: USBHostError?, deadlineMilliseconds: Int? = nil, prepare: () -> Void = {}) {
        state = .closing(error)
        prepare()
        engine.cancelAll()
        if let deadlineMilliseconds {
            let deadline = DispatchWorkItem { [self] in abandonInFlight() }
            closeDeadline = deadline
            device.queue.asyncAfter(deadline: .now() + .milliseconds(deadlineMilliseconds), execute: deadline)
        }
        finishIfDrained()
    }

    /// Once libusb has given every transfer back, no setup call runs and no other closer is
    /// pending: frees the engine's slots (device memory first, while the handle is open) and
    /// transfers, then lets the policy release what it holds and report.
    ///
    /// The freeing runs after the current libusb call returns: this is usually reached from a
    /// transfer callback inside `libusb_handle_events`, and `libusb_close` there deadlocks on
    /// libusb's own lock (found on the real kernel in the USB rig).
    func finishIfDrained() {
        guard case let .closing(error) = state, engine.isIdle, setupCallsInFlight == 0, (policy?.closersPending ?? 0) == 0,
              !closeScheduled else { return }
        closeScheduled = true
        closeDeadline?.cancel()
        closeDeadline = nil
        device.queue.async { [self] in
            policy?.willFree()
            engine.releaseResources()
            policy?.freed(error)
        }
    }

    /// The kernel did not give transfers back in time: the engine is leaked, deaf, rather than
    /// memory freed that libusb may still write to; the policy reports the close.
    private func abandonInFlight() {
        guard case let .closing(error) = state else { return }
        engine.statistics.abandonedTransfers = engine.transfersInFlight + setupCallsInFlight + (policy?.closersPending ?? 0)
        // The kernel may still complete them, into the engine: it is leaked on purpose, deaf.
        engine.onCompletion = nil
        _ = Unmanaged.passRetained(engine)
        policy?.abandoned(error)
    }

    /// The pipe is closed: the handler gets ``BulkPipeEvent/closed(_:)`` (and nothing after),
    /// then `finished` runs, then the owner is no longer kept alive.
    func report(_ error: USBHostError?, then finished: (() -> Void)? = nil) {
        state = .closed
        closedError = error
        emit(.closed(error))
        handler = nil
        finished?()
        keepAlive = nil
    }
}

extension USBAccessoryTransport.Event: BulkPipeEvent {}
extension USBNativePipe.Event: BulkPipeEvent {}
