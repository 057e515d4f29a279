package import USBDescriptors
package import ByteRing
internal import CLibUSB
package import Dispatch
internal import QueueConfinement

/// The main bulk interface of one USB function (an accessory's iAP2 interface) as a pipe of
/// frames out and bytes in; the `USBTransport` module makes it a `Transport`.
///
/// IN: ``USBContextOptions/inTransfers`` bulk IN transfers are always queued, each over a slot of a
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
package final class USBAccessoryTransport: @unchecked Sendable {
    // Sendability: every stored var is touched on `queue` only.

    /// Something that happened on the bulk pair.
    package enum Event: Sendable {
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
        case closed(USBHostError?)
    }

    /// What a person reads, e.g. `usb 1-1.2 2ca3:1002`.
    package let description: String
    /// The device this transport talks to.
    package let device: USBDeviceInfo

    /// The open device: claims, alternate settings, halts, the reset, the close.
    let deviceHandle: USBDeviceHandle
    let queue: DispatchQueue
    private let interface: UInt8
    // Internal, not private, where the opening of native pipes (USBNativeOpening.swift) uses it.
    let options: USBContextOptions
    /// The bulk pair's transfers and rings (the engine both bulk pipes share).
    let pipe: BulkPipe
    /// The state, the handler, the keep-alive, halts and the close (shared with the native pipes).
    let lifecycle: BulkPipeLifecycle<Event>
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
    /// IN slots are lent (``Event/lent(_:)``) rather than borrowed for the handler call.
    private var lending = false
    private var inHalted = false
    private var outHalted = false
    private var retryScheduled = false
    private var consecutiveErrors = 0
    private var outTimeout: UInt32
    private var onFinished: (() -> Void)?
    /// The native-transport interfaces of the configuration, and the pipes open on them.
    let nativeInterfaces: [NativeInterfaceLocation]
    var nativePipes: [UInt8: USBNativePipe] = [:]
    /// Native interfaces claimed whose alternate setting is being selected.
    var nativeOpening: Set<UInt8> = []
    /// Opens waiting for a closing pipe on the same interface to finish (a close, then an open).
    var opensAfterClose: [UInt8: [() -> Void]] = [:]
    private var deviceWentAway = false
    /// A device reset is under way (``resetDevice(completion:)``): nothing is submitted until it
    /// ends; its completion, once the reset ran.
    private var pendingReset: (@Sendable (USBHostError?) -> Void)?
    private var resetting: Bool { pendingReset != nil }
    private var resetStarted = false

    /// Counters since activation.
    package var statistics: USBPipeCounters {
        var statistics = pipe.statistics
        statistics.transmitBuffers = pipe.transmitBuffers?.bufferCount ?? 0
        return statistics
    }

    init(device: USBDeviceInfo, handle deviceHandle: USBDeviceHandle, location: USBFunctionLocation, options: USBContextOptions,
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
                        inCount: options.inTransfers, inSlotSize: options.inTransferSize ?? USBContextOptions.splitInTransferSize,
                        outCount: options.outTransfers, outSlotSize: options.outTransferSize, allocator: allocator,
                        transmitBufferCount: options.transmitBuffers, description: description)
        lifecycle = BulkPipeLifecycle(engine: pipe, device: deviceHandle)
        lifecycle.policy = self
        pipe.onCompletion = { [unowned self] completion in self.completed(completion) }
    }

    deinit {
        // Dropped without ever being activated (an open nobody used): give everything back.
        // Once activated, the teardown does this and the lifecycle holds the transport until then.
        guard case .idle = state else { return }
        pipe.releaseResources()
        deviceHandle.releaseInterface(interface)
        deviceHandle.close()
        if let onFinished {
            let carried = QueueBound(onFinished, on: queue) // runs on the context's queue, where it was made
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
    package func activate(queue handlerQueue: DispatchQueue, lendingInSlots: Bool = false, handler: @escaping @Sendable (Event) -> Void) {
        lifecycle.onQueue { [self] in
            guard case .idle = state else { return }
            lifecycle.listen(queue: handlerQueue, handler: handler)
            lending = lendingInSlots && handlerQueue === queue
            lifecycle.start(keeping: self) // libusb holds unretained pointers to the engine until teardown ends
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
    private func onQueue(_ body: @escaping () -> Void) { lifecycle.onQueue(body) }

    /// Where the transport is in its life.
    var state: BulkPipeLifecycle<Event>.State { lifecycle.state }

    /// Takes one frame; on the context's queue (where the manager calls it) it is submitted at
    /// once, from elsewhere it hops there first.
    package func send(_ frame: [UInt8]) {
        onQueue { [self] in enqueue(.bytes(frame)) }
    }

    /// Buffers in device memory to lay frames out in and hand to ``send(buffer:)``, which sends
    /// them without a copy: nil without device memory (or with ``USBContextOptions/transmitBuffers``
    /// 0). A buffer is free again once nobody holds it. Use them on the context's queue.
    package var transmitBuffers: PacketBufferPool? { pipe.transmitBuffers }

    /// Sends the frame laid out in `buffer` (one of ``transmitBuffers``) from where it lies, in
    /// one bulk OUT transfer, in order with the frames sent by ``send(_:)``. The buffer counts
    /// one more ``PacketBuffer/pendingTransmissions`` until the transfer ends (or the frame is
    /// dropped at close): until then its memory must not be rewritten. Call on the context's
    /// queue.
    package func send(buffer: PacketBuffer) {
        dispatchPrecondition(condition: .onQueue(queue))
        buffer.pendingTransmissions += 1
        enqueue(.buffer(buffer))
    }

    /// Cancels what is in flight and closes the device; the handler then gets `.closed(nil)`.
    package func cancel() {
        queue.async { [self] in
            switch state {
            case .idle:
                lifecycle.start(keeping: self)
                lifecycle.beginClosing(nil)
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
        case .closing: lifecycle.finishIfDrained()
        case .idle, .closed: break
        }
    }

    /// Hands every committed byte to the handler in place, then frees the slots (or, lending,
    /// those whose leases ended).
    private func deliver() {
        if lending {
            while let lease = pipe.lendNextIn() {
                if case .running = state { lifecycle.emit(.lent(lease)) }
            }
            pipe.reclaimLentIn(maximumLent: pipe.inRing.slotCount / 2)
            return
        }
        let inRing = pipe.inRing
        while let view = inRing.peek() {
            if case .running = state {
                // Copied for another queue, lent in place for a call here.
                lifecycle.emit(lifecycle.handlerQueue != nil ? .received(Array(view)) : .borrowed(USBBorrowedBytes(view)))
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
        case .closing: lifecycle.finishIfDrained()
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

    /// A transfer failed. The transfers in flight when one fails fail together (an accessory
    /// that left the bus fails every one with an error before the kernel reports it gone): they
    /// count as one error in a row, and the next round goes after the back-off. The limit thus
    /// spans rounds, about 2.3 s with the default 8: long enough for the kernel to report a
    /// device that left, whose next submit then says so (found in the USB rig, where a gadget
    /// that unbinds fails four IN transfers at once with EPROTO).
    private func transferError() {
        pipe.statistics.errors += 1
        guard !retryScheduled else { return } // this round's error is counted already
        consecutiveErrors += 1
        if consecutiveErrors >= options.maxConsecutiveErrors {
            fail(usbFailure("\(description): \(consecutiveErrors) transfer errors in a row",
                                advice: "unplug and replug the accessory; if it keeps happening, try another cable or port"))
        } else {
            scheduleRetry()
        }
    }

    /// Waits (20 ms after the first error in a row, doubling with each to 1 s) before submitting again.
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

    /// The device left the bus: the transport closes, saying so.
    func deviceGone() {
        deviceWentAway = true
        fail(usbFailure("\(description) left the bus (unplugged, or the accessory disconnected itself)", kind: .noDevice,
                        advice: "it is opened again when it comes back"))
    }

    /// Clears a stalled endpoint once none of its transfers is in flight (on the setup queue:
    /// it is a control transfer the kernel waits for), then resumes the pipe.
    private func clearHaltWhenIdle(_ endpoint: UInt8) {
        lifecycle.clearHaltWhenIdle(endpoint, failed: { [self] status in
            if status == LIBUSB_ERROR_NO_DEVICE.rawValue { return deviceGone() }
            fail(usbFailure("cannot clear the stall on endpoint 0x\(String(endpoint, radix: 16)) of \(description): \(errorName(status))",
                                advice: "unplug and replug the accessory"))
        }, cleared: { [self] in
            if endpoint & 0x80 != 0 {
                inHalted = false
                refillIn()
            } else {
                outHalted = false
                drainWaiting()
            }
        })
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
    package func resetDevice(completion: @escaping @Sendable (USBHostError?) -> Void) {
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
        lifecycle.setupCall({ deviceHandle.reset(completion: $0) }) { [self] status in
            let completion = pendingReset
            pendingReset = nil
            resetStarted = false
            guard case .running = state else {
                lifecycle.finishIfDrained()
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

    private func fail(_ error: USBHostError) {
        guard case .running = state else { return }
        beginClosing(error)
    }

    private func beginClosing(_ error: USBHostError?) {
        lifecycle.beginClosing(error, deadlineMilliseconds: options.teardownTimeoutMilliseconds) {
            for frame in waiting[waitingHead...] { drop(frame) }
            waiting.removeAll()
            waitingHead = 0
            zeroLengthPacketOwed = false
            for native in nativePipes.values { native.parentClosing(error, deviceGone: deviceWentAway) }
        }
    }
}

extension USBAccessoryTransport: BulkPipePolicy {
    /// The native pipes still closing: they use the device handle.
    var closersPending: Int { nativePipes.count }

    /// Releases the interface, closes the device and reports the close.
    func freed(_ error: USBHostError?) {
        deviceHandle.releaseInterface(interface)
        deviceHandle.close()
        report(error)
    }

    /// Reports the close, leaking the device handle with the transfers, and keeps the context
    /// running: the kernel still owns them.
    func abandoned(_ error: USBHostError?) {
        onFinished = nil
        report(error ?? usbFailure("\(description): transfers did not finish within \(options.teardownTimeoutMilliseconds) ms of closing"))
    }

    private func report(_ error: USBHostError?) {
        lifecycle.report(error) { [self] in
            let finished = onFinished
            onFinished = nil
            finished?()
        }
    }
}
