public import ByteRing
internal import CLibUSB
public import Dispatch

/// The main bulk interface of one USB function (an accessory's iAP2 interface) as a pipe of
/// frames out and bytes in; the `USBTransport` module makes it a `Transport`.
///
/// IN: ``USBOptions/inTransfers`` bulk IN transfers are always queued, each over a slot of a
/// ``ByteRing``; a completion publishes its slot and the bytes are handed to the event handler
/// in place: lent beyond the call (``Event/lent(_:)``, the slot resubmitted once the reader let
/// go, at most half the slots lent) or for the call only (``Event/borrowed(_:)``, the slot
/// resubmitted at once). OUT: one link packet
/// per transfer, copied into a ring slot, with a zero-length packet when its length is a
/// multiple of wMaxPacketSize; frames wait in order when every slot is in flight. A stall is
/// cleared and the pipe resumes; OUT timeouts back off; a vanished device ends the transport
/// with an error; ``cancel()`` cancels what is in flight, waits for libusb to give every transfer
/// back, then frees the slots, releases the interface and closes the device.
///
/// Confined to the context's event queue (every method runs there).
public final class USBAccessoryTransport: @unchecked Sendable {
    // Sendability: every stored var is touched on `queue` only.

    /// Something that happened on the bulk pair.
    public enum Event: Sendable {
        /// Bytes arrived, lent in place from the IN slot for the handler call only (when the
        /// handler runs on the context's queue).
        case borrowed(USBBorrowedBytes)
        /// Bytes arrived, lent whole from the IN slot beyond the handler call (when the pipe
        /// was activated with `lendingInSlots` and the handler runs on the context's queue):
        /// keep the lease for as long as the bytes are needed, read it on the context's queue
        /// only. The slot goes back to the kernel at the first IN completion after the last
        /// reference to the lease went; a reader that holds it while more than half the slots
        /// are lent gets its bytes moved out of the slot (copied) instead of stalling the pipe.
        case lent(SlotLease)
        /// Bytes arrived, copied (when the handler runs on another queue).
        case received([UInt8])
        /// The pipe closed: `nil` when asked to, otherwise why. No event follows.
        case closed(USBError?)
    }

    /// What a person reads, e.g. `usb 1-1.2 2ca3:1002`.
    public let description: String
    /// The device this transport talks to.
    public let device: USBDeviceInfo

    /// The open device: claims, alternate settings, halts, the reset, the close.
    let deviceHandle: USBDeviceHandle
    let queue: DispatchQueue
    private let interface: UInt8
    private let options: USBOptions
    /// The bulk pair's transfers and rings (the engine both bulk pipes share).
    private let pipe: BulkPipe
    /// A frame for the OUT pipe: an array to copy into a slot, or a transmit buffer to send
    /// from where it lies.
    private enum OutFrame {
        case bytes([UInt8])
        case buffer(PacketBuffer)
    }
    private var waiting: [OutFrame] = []
    /// A zero-length packet the kernel could not add to a frame is owed, before any other frame.
    private var zeroLengthPacketOwed = false
    private var waitingHead = 0
    private enum State { case idle, running, closing(USBError?), closed }
    private var state = State.idle
    private var handler: (@Sendable (Event) -> Void)?
    private var handlerQueue: DispatchQueue?
    /// IN slots are lent (``Event/lent(_:)``) rather than borrowed for the handler call.
    private var lending = false
    private var inHalted = false
    private var outHalted = false
    private var setupCallsInFlight = 0
    private var retryScheduled = false
    private var consecutiveErrors = 0
    private var outTimeout: UInt32
    private var keepAlive: Unmanaged<USBAccessoryTransport>?
    private var closeDeadline: DispatchWorkItem?
    private var closeScheduled = false
    private var onFinished: (() -> Void)?
    /// The native-transport interfaces of the configuration, and the pipes open on them.
    private let nativeInterfaces: [NativeInterfaceLocation]
    private var nativePipes: [UInt8: USBNativePipe] = [:]
    private var nativeOpening: Set<UInt8> = []
    /// Opens waiting for a closing pipe on the same interface to finish (a close, then an open).
    private var opensAfterClose: [UInt8: [() -> Void]] = [:]
    private var deviceWentAway = false
    /// A device reset is under way (``resetDevice(completion:)``): nothing is submitted until it
    /// ends; its completion, once the reset ran.
    private var pendingReset: (@Sendable (USBError?) -> Void)?
    private var resetting: Bool { pendingReset != nil }
    private var resetStarted = false

    /// Counters since activation.
    public var statistics: USBPipeStatistics {
        var statistics = pipe.statistics
        statistics.transmitBuffers = pipe.transmitBuffers?.bufferCount ?? 0
        return statistics
    }

    init(device: USBDeviceInfo, handle deviceHandle: USBDeviceHandle, location: USBFunctionLocation, options: USBOptions,
         description: String, onFinished: @escaping () -> Void) {
        self.onFinished = onFinished
        self.device = device
        self.deviceHandle = deviceHandle
        queue = deviceHandle.queue
        self.options = options
        self.description = description
        interface = location.interface.number
        outTimeout = options.outTimeoutMilliseconds
        nativeInterfaces = location.nativeInterfaces
        let allocator = deviceHandle.slotAllocator(enabled: options.useDeviceMemory)
        pipe = BulkPipe(device: deviceHandle, inEndpoint: location.bulkIn.address, outEndpoint: location.bulkOut.address,
                        outPacketSize: location.bulkOut.packetSize,
                        inCount: options.inTransfers, inSlotSize: options.inTransferSize ?? USBOptions.splitInTransferSize,
                        outCount: options.outTransfers, outSlotSize: options.outTransferSize, allocator: allocator,
                        transmitBufferCount: options.transmitBuffers, description: description)
        pipe.onCompletion = { [unowned self] completion in self.completed(completion) }
    }

    deinit {
        // Dropped without ever being activated (an open nobody used): give everything back.
        // Once activated, the teardown does this and `keepAlive` holds the transport until then.
        guard case .idle = state else { return }
        pipe.releaseResources()
        deviceHandle.releaseInterface(interface)
        deviceHandle.close()
        if let onFinished {
            let carried = Unchecked(value: onFinished) // runs on the context's queue, where it was made
            queue.async { carried.value() }
        }
    }

    // MARK: Pipe

    /// Starts delivering events to `handler` on `queue` and queues the IN transfers; frames sent
    /// before go out now.
    ///
    /// - Parameters:
    ///   - handlerQueue: (`queue:`) where `handler` runs; the context's own queue spares a hop
    ///     per event.
    ///   - lendingInSlots: when that queue is the context's, received bytes come as
    ///     ``Event/lent(_:)`` (kept without a copy as long as the handler likes) rather than
    ///     ``Event/borrowed(_:)`` (valid for the call only). At most half the IN slots stay lent:
    ///     past that, the oldest lease's bytes are copied out of its slot so the pipe keeps going.
    ///   - handler: gets every event of the pipe, in order, until ``Event/closed(_:)``.
    public func activate(queue handlerQueue: DispatchQueue, lendingInSlots: Bool = false, handler: @escaping @Sendable (Event) -> Void) {
        onQueue { [self] in
            guard case .idle = state else { return }
            self.handler = handler
            self.handlerQueue = handlerQueue === queue ? nil : handlerQueue
            lending = lendingInSlots && handlerQueue === queue
            keepAlive = Unmanaged.passRetained(self) // libusb holds unretained pointers to self until teardown ends
            state = .running
            guard pipe.isComplete else {
                fail(usbFailure("cannot allocate libusb transfers for \(description)"))
                return
            }
            refillIn()
            drainWaiting() // frames sent before activation
        }
    }

    /// Runs `body` now when called on the context's queue (where the manager calls), else hops
    /// there: a frame sent right after activation must find the transport running.
    private func onQueue(_ body: @escaping () -> Void) { deviceHandle.onQueue(body) }

    /// Takes one frame; on the context's queue (where the manager calls it) it is submitted at
    /// once, from elsewhere it hops there first.
    public func send(_ frame: [UInt8]) {
        onQueue { [self] in enqueue(.bytes(frame)) }
    }

    /// Buffers in device memory to lay frames out in and hand to ``send(buffer:)``, which sends
    /// them without a copy: nil without device memory (or with ``USBOptions/transmitBuffers``
    /// 0). A buffer is free again once nobody holds it. Use them on the context's queue.
    public var transmitBuffers: PacketBufferPool? { pipe.transmitBuffers }

    /// Sends the frame laid out in `buffer` (one of ``transmitBuffers``) from where it lies, in
    /// one bulk OUT transfer, in order with the frames sent by ``send(_:)``. The buffer counts
    /// one more ``PacketBuffer/pendingTransmissions`` until the transfer ends (or the frame is
    /// dropped at close): until then its memory must not be rewritten. Call on the context's
    /// queue.
    public func send(buffer: PacketBuffer) {
        dispatchPrecondition(condition: .onQueue(queue))
        buffer.pendingTransmissions += 1
        enqueue(.buffer(buffer))
    }

    /// Cancels what is in flight and closes the device; the handler then gets `.closed(nil)`.
    public func cancel() {
        queue.async { [self] in
            switch state {
            case .idle:
                state = .closing(nil)
                keepAlive = Unmanaged.passRetained(self)
                finishIfDrained()
            case .running: beginClosing(nil)
            case .closing, .closed: break
            }
        }
    }

    // MARK: IN

    private func refillIn() {
        guard case .running = state, !inHalted, !retryScheduled, !resetting else { return }
        // A slot whose submit failed stays reserved in the engine and goes first next time.
        if let status = pipe.refillIn() { submitFailed(status, what: "cannot queue a bulk IN transfer") }
    }

    private func completed(_ completion: BulkPipe.Completion) {
        switch completion {
        case let .received(_, status): inCompleted(status: status)
        case let .sent(_, actual, status): outCompleted(status: status, actual: actual)
        }
        if resetting { resetWhenIdle() }
    }

    private enum Outcome { case fine, halted, gone, failed }

    private func inCompleted(status: libusb_transfer_status) {
        var outcome = Outcome.fine
        switch status {
        case LIBUSB_TRANSFER_COMPLETED: consecutiveErrors = 0
        // OVERFLOW: the device sent more than the slot holds; the excess is lost. The scanner
        // resyncs and the link retransmits what was lost.
        case LIBUSB_TRANSFER_OVERFLOW, LIBUSB_TRANSFER_CANCELLED: break
        case LIBUSB_TRANSFER_STALL: outcome = .halted
        case LIBUSB_TRANSFER_NO_DEVICE: outcome = .gone
        default: outcome = .failed // ERROR: what arrived is kept; retry
        }
        deliver()
        switch outcome {
        case .fine: break
        case .halted: inHalted = true
        case .gone: deviceGone()
        case .failed: transferError()
        }
        switch state {
        case .running:
            if inHalted, !resetting { clearHaltWhenIdle(pipe.inEndpoint) } else { refillIn() }
        case .closing: finishIfDrained()
        case .idle, .closed: break
        }
    }

    /// Hands every committed byte to the handler in place, then frees the slots (or, lending,
    /// those whose leases ended).
    private func deliver() {
        if lending {
            while let lease = pipe.lendNextIn() {
                if case .running = state, let handler { handler(.lent(lease)) }
            }
            pipe.reclaimLentIn(maximumLent: pipe.inRing.slotCount / 2)
            return
        }
        let inRing = pipe.inRing
        while let view = inRing.peek() {
            if case .running = state, let handler {
                if let handlerQueue {
                    let copy = Array(view)
                    handlerQueue.async { handler(.received(copy)) }
                } else {
                    handler(.borrowed(USBBorrowedBytes(view)))
                }
            }
            inRing.consume(view.count)
        }
    }

    // MARK: OUT

    private func enqueue(_ frame: OutFrame) {
        if case .idle = state {
            waiting.append(frame) // sent on activation
            return
        }
        guard case .running = state, !resetting else {
            // While the device resets, a frame is lost as on a line that dropped it (the link
            // sends again what matters).
            drop(frame)
            return
        }
        if case let .bytes(bytes) = frame, bytes.count > pipe.outRing.slotCapacity {
            fail(usbFailure("a frame of \(bytes.count) bytes exceeds the \(pipe.outRing.slotCapacity)-byte OUT slots of \(description)"))
            return
        }
        if waitingHead < waiting.count || zeroLengthPacketOwed || outHalted || retryScheduled || !submitOut(frame) {
            waiting.append(frame)
            pipe.statistics.queuedFrames += 1
            if waiting.count - waitingHead > options.maxQueuedFrames {
                fail(usbFailure("\(description): \(options.maxQueuedFrames) frames waiting for the OUT pipe; the accessory stopped reading",
                                    advice: "unplug and replug the accessory"))
            }
        }
    }

    /// A frame that will never be submitted: a transmit buffer is one transmission fewer.
    private func drop(_ frame: OutFrame) {
        if case let .buffer(buffer) = frame { buffer.pendingTransmissions -= 1 }
    }

    /// Submits `frame`, copied into a free OUT slot or from its transmit buffer; false when no
    /// slot is free.
    private func submitOut(_ frame: OutFrame) -> Bool {
        let result = switch frame {
        case let .bytes(bytes): bytes.withUnsafeBytes { pipe.submitOut($0, timeout: outTimeout) }
        case let .buffer(buffer): pipe.submitOut(buffer: buffer, timeout: outTimeout)
        }
        switch result {
        case .full:
            return false
        case let .failed(status):
            submitFailed(status, what: "cannot queue a bulk OUT transfer")
            return true // the frame is dropped (the link retransmits it); not queued again
        case let .submitted(zeroLengthPacketToSend):
            // This kernel cannot add the zero-length packet itself: it goes as a transfer of its
            // own (as usbmuxd does), ending the frame for the accessory; when no slot is free it
            // is owed, and goes before the next frame.
            if zeroLengthPacketToSend { sendOwedZeroLengthPacket(owed: true) }
            return true
        }
    }

    /// Sends the zero-length packet that ends the last frame; false (and still owed) when no OUT
    /// slot is free.
    @discardableResult
    private func sendOwedZeroLengthPacket(owed: Bool) -> Bool {
        zeroLengthPacketOwed = zeroLengthPacketOwed || owed
        guard zeroLengthPacketOwed else { return true }
        switch pipe.submitOut(UnsafeRawBufferPointer(start: nil, count: 0), timeout: outTimeout) {
        case .full:
            return false
        case let .failed(status):
            zeroLengthPacketOwed = false
            submitFailed(status, what: "cannot queue a zero-length packet")
            return true
        case .submitted:
            zeroLengthPacketOwed = false
            pipe.statistics.zeroLengthOut += 1
            return true
        }
    }

    private func outCompleted(status: libusb_transfer_status, actual: Int) {
        switch status {
        case LIBUSB_TRANSFER_COMPLETED:
            outTimeout = options.outTimeoutMilliseconds
            consecutiveErrors = 0
        case LIBUSB_TRANSFER_TIMED_OUT:
            // The frame is lost (the link retransmits it); the next ones get longer.
            pipe.statistics.timeouts += 1
            outTimeout = min(outTimeout * 2, options.maxOutTimeoutMilliseconds)
        case LIBUSB_TRANSFER_STALL: outHalted = true
        case LIBUSB_TRANSFER_NO_DEVICE: deviceGone()
        case LIBUSB_TRANSFER_CANCELLED: break
        default: transferError()
        }
        switch state {
        case .running:
            if outHalted, !resetting { clearHaltWhenIdle(pipe.outEndpoint) } else { drainWaiting() }
        case .closing: finishIfDrained()
        case .idle, .closed: break
        }
    }

    private func drainWaiting() {
        while case .running = state, !outHalted, !retryScheduled, !resetting, sendOwedZeroLengthPacket(owed: false), waitingHead < waiting.count {
            guard submitOut(waiting[waitingHead]) else { break }
            waiting[waitingHead] = .bytes([]) // a submitted buffer is the engine's now: no second hold on it
            waitingHead += 1
        }
        if waitingHead == waiting.count {
            waiting.removeAll(keepingCapacity: true)
            waitingHead = 0
        }
    }

    // MARK: Errors, stalls, retries

    private func submitFailed(_ status: Int32, what: String) {
        if status == LIBUSB_ERROR_NO_DEVICE.rawValue {
            deviceGone()
        } else {
            transferError()
            scheduleRetry()
        }
    }

    private func transferError() {
        pipe.statistics.errors += 1
        consecutiveErrors += 1
        if consecutiveErrors >= options.maxConsecutiveErrors {
            fail(usbFailure("\(description): \(consecutiveErrors) transfer errors in a row",
                                advice: "unplug and replug the accessory; if it keeps happening, try another cable or port"))
        } else {
            scheduleRetry()
        }
    }

    /// Waits (10 ms doubling to 1 s with each error in a row) before submitting again.
    private func scheduleRetry() {
        guard case .running = state, !retryScheduled else { return }
        retryScheduled = true
        let delay = min(1_000, 10 << min(consecutiveErrors, 7))
        queue.asyncAfter(deadline: .now() + .milliseconds(delay)) { [self] in
            retryScheduled = false
            refillIn()
            drainWaiting()
        }
    }

    private func deviceGone() {
        deviceWentAway = true
        fail(usbFailure("\(description) left the bus (unplugged, or the accessory disconnected itself)", kind: .noDevice,
                        advice: "it is opened again when it comes back"))
    }

    /// Clears a stalled endpoint once none of its transfers is in flight (on the setup queue:
    /// it is a control transfer the kernel waits for), then resumes the pipe.
    private func clearHaltWhenIdle(_ endpoint: UInt8) {
        let isIn = endpoint & 0x80 != 0
        guard isIn ? pipe.inIdle : pipe.outIdle else { return }
        setupCallsInFlight += 1
        deviceHandle.clearHalt(endpoint) { [self] status in
                setupCallsInFlight -= 1
                guard case .running = state else { return finishIfDrained() }
                if status != 0, status != LIBUSB_ERROR_NOT_FOUND.rawValue {
                    if status == LIBUSB_ERROR_NO_DEVICE.rawValue { return deviceGone() }
                    return fail(usbFailure("cannot clear the stall on endpoint 0x\(String(endpoint, radix: 16)) of \(description): \(errorName(status))",
                                               advice: "unplug and replug the accessory"))
                }
                pipe.statistics.stalls += 1
                if isIn {
                    inHalted = false
                    refillIn()
                } else {
                    outHalted = false
                    drainWaiting()
                }
        }
    }

    // MARK: Device reset

    /// Resets the device: a USB port reset (`libusb_reset_device`, `USBDEVFS_RESET`), after which
    /// the kernel enumerates it again at the same address with the same configuration, and
    /// libusb claims this transport's interface again. What a host tries once when an accessory
    /// is stuck (its link never comes up) and only a re-plug would otherwise free it.
    ///
    /// In flight transfers are cancelled first and frames waiting to go out are dropped, then
    /// the reset runs on the setup queue (it waits for the device); the pipe then carries data
    /// again. `completion` gets nil then, or why not, on the context's queue. When the device
    /// did not come back as the same device (its descriptors changed, or it left the bus) the
    /// transport closes as disconnected: the context finds the device again when it returns.
    /// Refused while a native-transport session is open on the device.
    public func resetDevice(completion: @escaping @Sendable (USBError?) -> Void) {
        onQueue { [self] in
            guard case .running = state else { return completion(usbFailure("\(description) is closed")) }
            guard !resetting else { return completion(usbFailure("\(description) is being reset already")) }
            guard nativePipes.isEmpty, nativeOpening.isEmpty else {
                return completion(usbFailure("\(description) has a native-transport session open; close it before resetting the device"))
            }
            pendingReset = completion
            resetStarted = false
            for frame in waiting[waitingHead...] { drop(frame) }
            waiting.removeAll()
            waitingHead = 0
            zeroLengthPacketOwed = false
            pipe.cancelAll()
            resetWhenIdle()
        }
    }

    /// Runs the reset once libusb gave every transfer back.
    private func resetWhenIdle() {
        guard resetting, !resetStarted, pipe.isIdle else { return }
        guard case .running = state else {
            let completion = pendingReset
            pendingReset = nil
            completion?(usbFailure("\(description) closed before it was reset"))
            return
        }
        resetStarted = true
        setupCallsInFlight += 1
        deviceHandle.reset { [self] status in
            setupCallsInFlight -= 1
            let completion = pendingReset
            pendingReset = nil
            resetStarted = false
            guard case .running = state else {
                finishIfDrained()
                completion?(usbFailure("\(description) closed while it was reset"))
                return
            }
            guard status == 0 else {
                // NOT_FOUND: it came back as another device (or not at all), or an interface
                // could not be claimed again; NO_DEVICE: it left.
                let error = usbFailure("resetting \(description) failed: \(errorName(status))", kind: .noDevice,
                                       advice: "unplug and replug the accessory")
                if status == LIBUSB_ERROR_NOT_FOUND.rawValue || status == LIBUSB_ERROR_NO_DEVICE.rawValue {
                    deviceWentAway = true
                }
                fail(error)
                completion?(error)
                return
            }
            pipe.statistics.deviceResets += 1
            inHalted = false
            outHalted = false
            consecutiveErrors = 0
            refillIn()
            drainWaiting()
            completion?(nil)
        }
    }

    // MARK: Teardown

    private func fail(_ error: USBError) {
        guard case .running = state else { return }
        beginClosing(error)
    }

    private func beginClosing(_ error: USBError?) {
        state = .closing(error)
        for frame in waiting[waitingHead...] { drop(frame) }
        waiting.removeAll()
        waitingHead = 0
        zeroLengthPacketOwed = false
        for native in nativePipes.values { native.parentClosing(error, deviceGone: deviceWentAway) }
        pipe.cancelAll()
        let deadline = DispatchWorkItem { [self] in abandonInFlight() }
        closeDeadline = deadline
        queue.asyncAfter(deadline: .now() + .milliseconds(options.teardownTimeoutMilliseconds), execute: deadline)
        finishIfDrained()
    }

    /// Once libusb has given every transfer back and no setup call runs: frees the slots
    /// (device memory first, while the handle is open), releases the interface, closes the
    /// device, frees the transfers, and reports the close.
    ///
    /// The closing itself runs after the current libusb call returns: this is usually reached
    /// from a transfer callback inside `libusb_handle_events`, and `libusb_close` there
    /// deadlocks on libusb's own lock (found on the real kernel in the USB rig).
    private func finishIfDrained() {
        guard case let .closing(error) = state, pipe.isIdle, setupCallsInFlight == 0, nativePipes.isEmpty, !closeScheduled else { return }
        closeScheduled = true
        closeDeadline?.cancel()
        closeDeadline = nil
        queue.async { [self] in
            pipe.releaseResources()
            deviceHandle.releaseInterface(interface)
            deviceHandle.close()
            report(error)
        }
    }

    /// The kernel did not give transfers back in time: report the close anyway and leak them
    /// (and the device handle) rather than free memory libusb may still write to.
    private func abandonInFlight() {
        guard case let .closing(error) = state else { return }
        pipe.statistics.abandonedTransfers = pipe.transfersInFlight + setupCallsInFlight + nativePipes.count
        onFinished = nil // the context must keep libusb running: the kernel still owns these
        // The kernel may still complete them, into the engine: it is leaked on purpose, deaf.
        pipe.onCompletion = nil
        _ = Unmanaged.passRetained(pipe)
        report(error ?? usbFailure("\(description): transfers did not finish within \(options.teardownTimeoutMilliseconds) ms of closing"))
    }

    private func report(_ error: USBError?) {
        state = .closed
        let handler = self.handler
        self.handler = nil
        if let handlerQueue {
            handlerQueue.async { handler?(.closed(error)) }
        } else {
            handler?(.closed(error))
        }
        let finished = onFinished
        onFinished = nil
        finished?()
        keepAlive?.release()
        keepAlive = nil
    }
}

// MARK: - Native transports

extension USBAccessoryTransport {
    /// The names of the accessory's native-transport interfaces (their iInterface strings, by
    /// convention the EA protocol each carries), in interface order.
    public var nativeProtocolNames: [String] {
        nativeInterfaces.compactMap { device.nativeInterfaceNames[$0.number] }
    }

    /// Opens the native-transport interface that carries `protocolName`: the one whose name
    /// (iInterface) is the protocol, or the only one there is. It is claimed, and alternate
    /// setting 1 is selected on the setup queue (SET_INTERFACE is a control transfer the kernel
    /// waits for); `completion` then gets a ``USBNativePipe`` (not yet activated), on `queue`.
    ///
    /// Fails, saying what to do, when the configuration has no such interface, when it is
    /// already open, when another program holds it, or when the accessory refuses the
    /// alternate setting.
    public func openNativePipe(for protocolName: String, queue replyQueue: DispatchQueue,
                               completion: @escaping @Sendable (Result<USBNativePipe, USBError>) -> Void) {
        let reply: @Sendable (Result<USBNativePipe, USBError>) -> Void = { [queue] result in
            if replyQueue === queue { completion(result) } else { replyQueue.async { completion(result) } }
        }
        queue.async { [self] in openNative(protocolName, reply: reply) }
    }

    /// The interface for `protocolName`: by name, else the only one.
    static func nativeInterface(for protocolName: String, among interfaces: [NativeInterfaceLocation],
                                names: [UInt8: String], device: String) -> Result<NativeInterfaceLocation, USBError> {
        if let named = interfaces.first(where: { names[$0.number] == protocolName }) { return .success(named) }
        if interfaces.count == 1, let only = interfaces.first { return .success(only) }
        if interfaces.isEmpty {
            return .failure(usbFailure("\(device) declares '\(protocolName)' on a native transport but has no native-transport interface (FF/F0/01 with a bulk pair) in its configuration",
                                           advice: "the accessory's descriptors and its identification disagree; ask its maker, or use a protocol it carries on the iAP2 link"))
        }
        let listed = interfaces.map { "\($0.number) (\(names[$0.number].map { "'\($0)'" } ?? "unnamed"))" }.joined(separator: ", ")
        return .failure(usbFailure("\(device) has \(interfaces.count) native-transport interfaces, \(listed), and none is named '\(protocolName)'",
                                       advice: "the accessory should name each native interface after its protocol (iInterface)"))
    }

    private func openNative(_ protocolName: String, reply: @escaping @Sendable (Result<USBNativePipe, USBError>) -> Void) {
        guard case .running = state else {
            return reply(.failure(usbFailure("\(description) is closed")))
        }
        let target: NativeInterfaceLocation
        switch Self.nativeInterface(for: protocolName, among: nativeInterfaces, names: device.nativeInterfaceNames, device: description) {
        case let .success(found): target = found
        case let .failure(error): return reply(.failure(error))
        }
        let number = target.number
        if let closing = nativePipes[number], !closing.isOpen {
            // The previous session on this interface is still closing (alternate setting 0 and
            // the release are on their way): open once it has finished.
            opensAfterClose[number, default: []].append { [self] in openNative(protocolName, reply: reply) }
            return
        }
        guard nativePipes[number] == nil, !nativeOpening.contains(number) else {
            return reply(.failure(usbFailure("native-transport interface \(number) of \(description) already carries an open session",
                                                 advice: "close that session first")))
        }
        let claimed = deviceHandle.claimInterface(number)
        guard claimed == 0 else {
            let advice = claimed == LIBUSB_ERROR_BUSY.rawValue
                ? "another program holds it; stop it (find it with: fuser -v \(device.devicePath)) and try again"
                : "unplug and replug the accessory"
            return reply(.failure(usbFailure("cannot claim native-transport interface \(number) of \(description): \(errorName(claimed))", advice: advice)))
        }
        nativeOpening.insert(number)
        setupCallsInFlight += 1
        deviceHandle.selectAlternateSetting(target.alternateSetting, of: number) { [self] status in
            setupCallsInFlight -= 1
            nativeOpening.remove(number)
            guard case .running = state else {
                deviceHandle.releaseInterface(number)
                finishIfDrained()
                return reply(.failure(usbFailure("\(description) closed while '\(protocolName)' was opening")))
            }
            guard status == 0 else {
                deviceHandle.releaseInterface(number)
                if status == LIBUSB_ERROR_NO_DEVICE.rawValue { deviceGone() }
                // usbfs reports a stalled SET_INTERFACE as EPIPE, which libusb passes on as
                // LIBUSB_ERROR_OTHER (PIPE from other backends).
                let advice = status == LIBUSB_ERROR_PIPE.rawValue || status == LIBUSB_ERROR_OTHER.rawValue
                    ? "the accessory refused (stalled) SET_INTERFACE for the alternate setting. A Linux FunctionFS gadget cannot accept any alternate setting but 0 on kernels without FunctionFS's get_alt callback (added upstream in December 2023; Debian 12's 6.1 lacks it)"
                    : "unplug and replug the accessory"
                return reply(.failure(usbFailure("cannot select alternate setting \(target.alternateSetting) of native-transport interface \(number) of \(description): \(errorName(status))",
                                                     advice: advice)))
            }
            var pipeOptions = options
            pipeOptions.outTransferSize = USBOptions.largeInTransferSize
            let pipe = USBNativePipe(
                device: deviceHandle, location: target, options: pipeOptions, inTransferSize: pipe.statistics.inTransferSize,
                description: "\(device.location) interface \(number) ('\(protocolName)')",
                onFinished: { [weak self] pipe in
                    guard let self else { return }
                    if self.nativePipes[pipe.interfaceNumber] === pipe { self.nativePipes[pipe.interfaceNumber] = nil }
                    for open in self.opensAfterClose.removeValue(forKey: pipe.interfaceNumber) ?? [] { open() }
                    self.finishIfDrained()
                })
            // Tracked even when it failed to start: its teardown still uses the handle.
            nativePipes[number] = pipe
            guard pipe.isOpen else {
                return reply(.failure(usbFailure("cannot allocate libusb transfers for \(pipe.description)")))
            }
            reply(.success(pipe))
        }
    }

    /// The native pipes open now (tests).
    var openNativePipes: [USBNativePipe] { nativePipes.values.sorted { $0.interfaceNumber < $1.interfaceNumber } }
}
