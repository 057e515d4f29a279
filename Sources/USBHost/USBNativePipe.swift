internal import USBDescriptors
internal import ByteRing
internal import CLibUSB
package import Dispatch

/// One companion interface of a USB function opened by its alternate setting (iAP's EA native
/// transport, FF/F0/01, PROTOCOL.md §4.3): a stream of raw bytes over its bulk pair.
///
/// ``USBAccessoryTransport/openNativePipe(for:queue:completion:)`` makes it: the interface is
/// claimed and its data alternate setting (1) selected before the pipe exists. Closing cancels
/// what is in flight, selects alternate setting 0 (which ends the session for the accessory)
/// and releases the interface. The device handle belongs to the iAP2 transport, which closes it
/// only after every pipe has finished.
///
/// IN: ``USBContextOptions/inTransfers`` bulk IN transfers over the slots of a ``ByteRing``; received
/// bytes stay in their slot until the reader consumes them through ``withReadableBytes(_:)``
/// (no copy), and a slot is resubmitted only once it is consumed. A reader that stops reading
/// therefore stops the IN transfers: the device is NAKed and its writes wait, and memory stays
/// at the ring's size. OUT: ``write(_:)`` copies into free OUT slots (one transfer each, with a
/// zero-length packet when the length is a multiple of wMaxPacketSize) and takes no more than
/// they hold; OUT transfers have no timeout, because a device that is not reading is holding
/// the stream off, not failing.
///
/// Nothing is silently lost: a transfer error, an OUT stall or an IN overflow ends the stream
/// with an error (``bytesDelivered`` says how far the accessory got); an IN stall is cleared and
/// the pipe resumes (the device sent nothing). Bytes received before the end stay readable.
///
/// Confined to the USB context's event queue: call ``withReadableBytes(_:)``, ``write(_:)`` and
/// the counters there (the manager's queue, for `AccessoryManager`).
package final class USBNativePipe: @unchecked Sendable {
    // Sendability: every stored var is touched on `queue` only.

    /// Something that happened on the pipe, delivered on the queue given to ``activate(queue:handler:)``.
    package enum Event: Sendable, Hashable {
        /// Bytes can be read (``readableByteCount`` went up from 0).
        case readable
        /// ``write(_:)`` takes bytes again after it took fewer than offered.
        case writable
        /// The pipe ended: `nil` when asked to, otherwise why. No event follows.
        case closed(USBHostError?)
    }

    /// What a person reads: the device, the interface and its name.
    package let description: String
    /// The interface this pipe owns.
    package let interfaceNumber: UInt8

    private let queue: DispatchQueue
    private let outPacketSize: Int
    /// The bulk pair's transfers and rings (the engine both bulk pipes share).
    private let pipe: BulkPipe
    /// The state, the handler, the keep-alive, halts and the close (shared with the iAP2 pipe).
    private let lifecycle: BulkPipeLifecycle<Event>
    private var activated = false
    private var readable = 0
    private var unsent = 0
    private var delivered = 0
    private var wantsWritable = false
    private var inHalted = false
    /// Whether closing selects alternate setting 0 (not when the device is gone).
    private var resetsAlternateSetting = true
    /// What was readable when the pipe closed (the ring's memory is given back then).
    private var leftover: [UInt8] = []
    private var leftoverHead = 0
    /// Set once the ring was emptied into ``leftover`` (from then on reads come from there).
    private var drained = false
    private var onFinished: ((USBNativePipe) -> Void)?

    /// Counters since the pipe opened.
    package var statistics: USBPipeCounters { pipe.statistics }

    init(device: USBDeviceHandle, location: NativeInterfaceLocation, options: USBContextOptions, inTransferSize: Int, description: String,
         onFinished: @escaping (USBNativePipe) -> Void) {
        queue = device.queue
        self.description = description
        self.onFinished = onFinished
        interfaceNumber = location.number
        outPacketSize = max(1, location.bulkOut.packetSize)
        // Twice the iAP2 pipe's IN transfers: a slot stays with the reader until it is consumed
        // (zero copy), so while the reader works on some the device still has others to fill.
        pipe = BulkPipe(device: device, inEndpoint: location.bulkIn.address, outEndpoint: location.bulkOut.address,
                        outPacketSize: location.bulkOut.packetSize, inCount: Self.inTransferCount(options), inSlotSize: inTransferSize,
                        outCount: options.outTransfers, outSlotSize: options.outTransferSize,
                        allocator: device.slotAllocator(enabled: options.useDeviceMemory), description: description)
        lifecycle = BulkPipeLifecycle(engine: pipe, device: device)
        lifecycle.policy = self
        pipe.onCompletion = { [unowned self] completion in self.completed(completion) }
        lifecycle.start(keeping: self) // libusb holds unretained pointers to the engine until the teardown ends
        if !pipe.isComplete {
            lifecycle.beginClosing(usbFailure("cannot allocate libusb transfers for \(description)"))
        }
    }

    private var state: BulkPipeLifecycle<Event>.State { lifecycle.state }
    private func emit(_ event: Event) { lifecycle.emit(event) }

    // MARK: Stream

    /// Starts delivering events to `handler` on `queue`; IN transfers start now.
    package func activate(queue handlerQueue: DispatchQueue, handler: @escaping @Sendable (Event) -> Void) {
        lifecycle.onQueue { [self] in
            guard !activated else { return }
            activated = true
            lifecycle.listen(queue: handlerQueue, handler: handler)
            switch state {
            case .running:
                refillIn()
            case .idle, .closing:
                break
            case .closed:
                // Closed before anyone listened (the parent went away): say so now.
                lifecycle.report(lifecycle.closedError)
            }
        }
    }

    /// Whether the pipe still runs (not closing or closed).
    var isOpen: Bool { lifecycle.isRunning }

    /// Lends the received bytes of the oldest IN slot to `body` in place (no copy) and returns what
    /// it returns; nil when nothing is readable. `body` says how many bytes it consumed (clamped to
    /// the view); the rest stays readable, and a slot consumed to its end goes back to the kernel.
    /// After the pipe ended, the bytes it had received are lent from memory of its own. Call on the
    /// context's queue; the view is valid only inside `body`.
    package func withReadableBytes<Result>(_ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        dispatchPrecondition(condition: .onQueue(queue))
        if drained {
            guard leftoverHead < leftover.count else { return nil }
            let view = leftover[leftoverHead...]
            let (consumed, result) = try view.withUnsafeBytes { try body(RawSpan(_unsafeBytes: $0)) }
            leftoverHead += min(max(0, consumed), view.count)
            return result
        }
        let inRing = pipe.inRing
        var consumed = 0
        let result = try inRing.withReadableBytes { span -> (consumed: Int, result: Result) in
            let outcome = try body(span)
            consumed = min(max(0, outcome.consumed), span.byteCount)
            return (consumed, outcome.result)
        }
        if consumed > 0 {
            readable -= consumed
            _ = inRing.peek() // hands a slot consumed to its end back to the producer
            refillIn()
        }
        return result
    }

    /// IN transfers of a native pipe: twice ``USBContextOptions/inTransfers``.
    static func inTransferCount(_ options: USBContextOptions) -> Int { 2 * max(1, options.inTransfers) }

    /// Bytes received and not consumed yet (in the ring, or kept after the end). Call on the
    /// context's queue.
    package var readableByteCount: Int {
        if drained { return leftover.count - leftoverHead }
        return readable
    }

    /// Whether ``write(_:)`` would take bytes now: the pipe runs and an OUT slot is free. When a
    /// write took fewer bytes than offered, ``Event/writable`` says when to write again.
    package var isWritable: Bool {
        guard case .running = state else { return false }
        return pipe.outRing.freeSlots > 0
    }

    /// Bytes ``write(_:)`` took whose OUT transfers have not completed yet.
    package var unsentByteCount: Int { unsent }

    /// Bytes the accessory took: what completed OUT transfers carried (including the part of a
    /// cancelled transfer that went out). After an error, this is how far the stream is known to
    /// have got.
    package var bytesDelivered: Int { delivered }

    /// Copies as much of `bytes` as free OUT slots hold into bulk OUT transfers and returns how many
    /// bytes it took (0 when every slot is in flight, or the pipe has ended: ``Event/closed(_:)``
    /// says why). Taking fewer than offered arms ``Event/writable``. Call on the context's queue.
    package func write(_ bytes: ArraySlice<UInt8>) -> Int {
        dispatchPrecondition(condition: .onQueue(queue))
        guard case .running = state, !bytes.isEmpty else { return 0 }
        let slotCapacity = pipe.outRing.slotCapacity
        var taken = 0
        while taken < bytes.count {
            // Within a write that goes on past this slot, a full transfer is one byte short of the
            // slot (65535 of 65536): it ends with a short packet, so a long stream needs no
            // zero-length packet after every transfer. A write that fits is sent whole (with a
            // zero-length packet when its length is a multiple of the packet size).
            var count = min(slotCapacity, bytes.count - taken)
            if count == slotCapacity, count % outPacketSize == 0, bytes.count - taken > count { count -= 1 }
            let start = bytes.startIndex + taken
            // OUT transfers have no timeout: a device that does not read holds the stream off.
            let result = bytes[start..<(start + count)].withUnsafeBytes { pipe.submitOut($0, timeout: 0) }
            switch result {
            case .full:
                wantsWritable = true
                return taken
            case let .failed(status):
                if status == LIBUSB_ERROR_NO_DEVICE.rawValue {
                    fail(gone, deviceGone: true)
                } else {
                    fail(usbFailure("cannot queue a bulk OUT transfer on \(description): \(errorName(status))",
                                        advice: "close the session and open it again"))
                }
                return taken
            case .submitted:
                // Where the kernel cannot add a zero-length packet, a raw stream goes without.
                taken += count
                unsent += count
            }
        }
        return taken
    }

    /// Ends the stream: cancels the transfers in flight, selects alternate setting 0 (the accessory's
    /// end of the session), releases the interface and then delivers ``Event/closed(_:)`` with nil.
    /// Bytes already received stay readable. Callable from any thread; nothing happens when the pipe
    /// has already ended.
    package func close() {
        lifecycle.onQueue { [self] in
            guard case .running = state else { return }
            lifecycle.beginClosing(nil)
        }
    }

    /// The iAP2 transport is closing (the device went away, or the host closed it): end the
    /// stream with `error`.
    func parentClosing(_ error: USBHostError?, deviceGone: Bool) {
        if deviceGone { resetsAlternateSetting = false }
        guard case .running = state else { return }
        lifecycle.beginClosing(error ?? usbFailure("\(description): the accessory's main interface was closed"))
    }

    // MARK: Transfers

    private var gone: USBHostError { usbFailure("\(description): the accessory was disconnected", kind: .noDevice) }

    private func refillIn() {
        guard case .running = state, activated, !inHalted else { return }
        guard let status = pipe.refillIn() else { return }
        if status == LIBUSB_ERROR_NO_DEVICE.rawValue {
            fail(gone, deviceGone: true)
        } else {
            fail(usbFailure("cannot queue a bulk IN transfer on \(description): \(errorName(status))",
                                advice: "close the session and open it again"))
        }
    }

    private func completed(_ completion: BulkPipe.Completion) {
        switch completion {
        case let .received(length, status): inCompleted(length: length, status: status)
        case let .sent(length, actual, status): outCompleted(length: length, actual: actual, status: status)
        }
    }

    private func inCompleted(length: Int, status: libusb_transfer_status) {
        var failure: (error: USBHostError, deviceGone: Bool)?
        switch status {
        case LIBUSB_TRANSFER_COMPLETED, LIBUSB_TRANSFER_CANCELLED:
            break
        case LIBUSB_TRANSFER_OVERFLOW:
            let capacity = pipe.inRing.slotCapacity
            failure = (usbFailure("\(description): the accessory sent more than a \(capacity)-byte transfer holds, and the rest was lost",
                                      advice: "close the session and open it again; the accessory's firmware sends packets larger than its endpoint declares"), false)
        case LIBUSB_TRANSFER_STALL:
            inHalted = true
        case LIBUSB_TRANSFER_NO_DEVICE:
            failure = (gone, true)
        default:
            pipe.statistics.errors += 1
            failure = (usbFailure("\(description): a bulk IN transfer failed (\(transferStatusName(status)))",
                                      advice: "close the session and open it again; if it keeps happening, try another cable or port"), false)
        }
        readable += length
        _ = pipe.inRing.peek() // an empty slot goes straight back
        if length > 0, case .running = state { emit(.readable) }
        if let failure { fail(failure.error, deviceGone: failure.deviceGone) }
        switch state {
        case .running:
            if inHalted { clearInHaltWhenIdle() } else { refillIn() }
        case .closing: lifecycle.finishIfDrained()
        case .idle, .closed: break
        }
    }

    private func outCompleted(length: Int, actual: Int, status: libusb_transfer_status) {
        switch status {
        case LIBUSB_TRANSFER_COMPLETED:
            delivered += actual
            unsent -= length
        case LIBUSB_TRANSFER_CANCELLED:
            delivered += actual // part of it may have gone out before the cancel
        case LIBUSB_TRANSFER_NO_DEVICE:
            delivered += actual
            fail(gone, deviceGone: true)
        case LIBUSB_TRANSFER_STALL:
            pipe.statistics.stalls += 1
            fail(usbFailure("\(description): the accessory stalled a bulk OUT transfer after taking \(delivered) bytes; what followed was not delivered",
                                advice: "close the session and open it again, and resume from the bytes delivered"))
        default:
            pipe.statistics.errors += 1
            fail(usbFailure("\(description): a bulk OUT transfer failed (\(transferStatusName(status))) after \(delivered) bytes were delivered",
                                advice: "close the session and open it again, and resume from the bytes delivered"))
        }
        switch state {
        case .running:
            if wantsWritable, pipe.outRing.freeSlots > 0 {
                wantsWritable = false
                emit(.writable)
            } else if unsent == 0, status == LIBUSB_TRANSFER_COMPLETED {
                emit(.writable) // everything written so far was delivered: a flush may finish
            }
        case .closing: lifecycle.finishIfDrained()
        case .idle, .closed: break
        }
    }

    /// Clears an IN stall once no IN transfer is in flight (a control transfer: on the setup
    /// queue), then resumes. Nothing was lost: a stalled IN transfer carried nothing.
    private func clearInHaltWhenIdle() {
        let endpoint = pipe.inEndpoint
        lifecycle.clearHaltWhenIdle(endpoint, failed: { [self] status in
            if status == LIBUSB_ERROR_NO_DEVICE.rawValue { return fail(gone, deviceGone: true) }
            fail(usbFailure("\(description): cannot clear the stall on endpoint 0x\(String(endpoint, radix: 16)): \(errorName(status))",
                                advice: "unplug and replug the accessory"))
        }, cleared: { [self] in
            inHalted = false
            refillIn()
        })
    }

    // MARK: Teardown

    /// Ends the stream with `error`. `deviceGone`: the accessory was disconnected, so there is
    /// no alternate setting to select on the way out.
    private func fail(_ error: USBHostError, deviceGone: Bool = false) {
        guard case .running = state else { return }
        if deviceGone { resetsAlternateSetting = false }
        lifecycle.beginClosing(error)
    }
}

extension USBNativePipe: BulkPipePolicy {
    /// Keeps what was readable (the ring's memory goes next).
    func willFree() {
        let inRing = pipe.inRing
        while let view = inRing.peek() {
            leftover.append(contentsOf: view)
            inRing.consume(view.count)
        }
        drained = true
        readable = 0
    }

    /// Selects alternate setting 0 (the accessory's end of the session) unless the device is
    /// gone, releases the interface and reports the close.
    func freed(_ error: USBHostError?) {
        guard resetsAlternateSetting else { return released(error) }
        lifecycle.device.selectAlternateSetting(0, of: interfaceNumber) { [self] _ in released(error) }
    }

    private func released(_ error: USBHostError?) {
        lifecycle.device.releaseInterface(interfaceNumber)
        lifecycle.report(error) { [self] in
            let finished = onFinished
            onFinished = nil
            finished?(self)
        }
    }
}

/// libusb's name for a transfer status, for messages.
func transferStatusName(_ status: libusb_transfer_status) -> String {
    switch status {
    case LIBUSB_TRANSFER_COMPLETED: "completed"
    case LIBUSB_TRANSFER_ERROR: "error"
    case LIBUSB_TRANSFER_TIMED_OUT: "timed out"
    case LIBUSB_TRANSFER_CANCELLED: "cancelled"
    case LIBUSB_TRANSFER_STALL: "stall"
    case LIBUSB_TRANSFER_NO_DEVICE: "no device"
    case LIBUSB_TRANSFER_OVERFLOW: "overflow"
    default: "status \(status.rawValue)"
    }
}
