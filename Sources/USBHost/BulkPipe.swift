internal import USBDescriptors
internal import ByteRing
internal import CLibUSB
internal import Dispatch

/// The bulk-pipe engine: one bulk IN / bulk OUT endpoint pair of a claimed interface, with its
/// libusb transfers over the slots of two ``ByteRing``s. Both users of a bulk pair, the iAP2
/// transport (``USBAccessoryTransport``) and the native-transport pipes (``USBNativePipe``), run
/// their transfers through it; what differs between them (when an IN slot goes back to the
/// kernel, the OUT timeout, what an error or a stall means) is theirs to decide, told by the
/// ``Completion`` of every transfer. Their common lifecycle (state, keep-alive, clearing halts,
/// drain-then-free, the close) is ``BulkPipeLifecycle``'s.
///
/// Who may touch a transfer, and when (libusb's rules, kept in this one place):
/// - a transfer is submitted only while its slot is reserved in its ring and nothing else owns
///   it (`submitted` false); libusb owns it from a successful submit until its callback;
/// - the callback runs inside `libusb_handle_events`, on the context's event queue: it records
///   the outcome, updates the rings and hands the ``Completion`` to the owner; the owner must not
///   close the device handle from there (libusb's lock is held: ``BulkPipeLifecycle`` frees and
///   closes after the call returns);
/// - ``cancelAll()`` asks libusb to give every submitted transfer back; ``isIdle`` says when it
///   has; only then may ``releaseResources()`` free the slots (device memory first, while the
///   handle is open) and the transfers. Transfers the kernel never gives back are leaked, never
///   freed (libusb may still write to them).
///
/// Confined to the context's event queue, like its owner. Not an owner of the device handle or
/// the interface: the user claims and releases those (``USBDeviceHandle``).
final class BulkPipe: @unchecked Sendable {
    // Sendability: every stored var is touched on the context's event queue only.
    /// What a transfer's end says, after the rings were updated.
    enum Completion {
        /// An IN transfer ended: `length` bytes were committed to its slot (0 for none). The
        /// status says how it ended; for an overflow the bytes beyond the slot were lost.
        case received(length: Int, status: libusb_transfer_status)
        /// An OUT transfer of `length` bytes ended, `actual` of them taken by the device.
        case sent(length: Int, actual: Int, status: libusb_transfer_status)
    }

    /// What became of an OUT submit.
    enum SubmitResult: Equatable {
        /// Submitted. `zeroLengthPacketToSend`: the transfer needed a zero-length packet after
        /// it and this kernel cannot add one itself: the caller sends it, as an empty transfer of
        /// its own (as usbmuxd does), if its stream needs one.
        case submitted(zeroLengthPacketToSend: Bool)
        /// No free slot: every OUT transfer is in flight.
        case full
        /// libusb refused the transfer (the status); its slot is given back.
        case failed(Int32)
    }

    let description: String
    let inEndpoint: UInt8
    let outEndpoint: UInt8
    let inRing: ByteRing
    let outRing: ByteRing
    /// Buffers in the allocator's memory lent to the writer (the link) to lay whole frames out
    /// in and submit as they are (``submitOut(buffer:timeout:)``): nil when none were asked for
    /// or the allocator gave none.
    let transmitBuffers: PacketBufferPool?
    /// Transfer counters (the owners add what they judge: errors, stalls, timeouts, and a
    /// zero-length packet sent as a transfer of its own…).
    var statistics = USBPipeCounters()
    /// Whether every transfer could be allocated.
    let isComplete: Bool
    /// Told the end of every transfer, on the event queue.
    var onCompletion: ((Completion) -> Void)?

    private let backend: any USBBackend
    private let handle: OpaquePointer
    private let outPacketSize: Int
    private var inTransfers: [UnsafeMutablePointer<libusb_transfer>] = []
    private var outTransfers: [UnsafeMutablePointer<libusb_transfer>] = []
    /// Each transfer's direction and slot, so that a completion finds its slot at once.
    private var transferSlots: [UnsafeMutablePointer<libusb_transfer>: TransferSlot] = [:]
    private var inSubmitted: [Bool]
    private var outSubmitted: [Bool]
    private var outDone: [Bool]
    /// An IN slot reserved whose submit failed: it goes first next time, so transfers reach the
    /// kernel in ring order (the order their data arrives in).
    private var unsubmittedIn: Int?
    /// This kernel refused LIBUSB_TRANSFER_ADD_ZERO_PACKET.
    private(set) var zeroLengthFlagUnsupported = false
    /// Transmit buffers made at open (the rest as needed, up to the limit).
    static let initialTransmitBuffers = 8
    /// The transmit buffer each OUT transfer sends from, held until it completes (nil for a
    /// transfer over its own slot).
    private var outHeld: [PacketBuffer?]
    /// One lease per IN slot, reused while nobody else holds it (see ``lendNextIn()``).
    private var leases: [SlotLease]
    /// How many of the oldest committed IN slots are lent (not yet released).
    private var lentSlots = 0

    /// - Parameters:
    ///   - inCount, inSlotSize, outCount, outSlotSize: the transfers each way and their slots.
    ///   - allocator: usbfs device memory for the slots (zero copy in the kernel), or nil.
    ///   - transmitBufferCount: the most transmit buffers of `outSlotSize` bytes to make from
    ///     `allocator`, ``initialTransmitBuffers`` of them now and the rest as the link needs them
    ///     (none without an allocator: heap buffers would save nothing, usbfs copies them).
    init(device: USBDeviceHandle, inEndpoint: UInt8, outEndpoint: UInt8, outPacketSize: Int,
         inCount: Int, inSlotSize: Int, outCount: Int, outSlotSize: Int, allocator: (any SlotAllocator)?,
         transmitBufferCount: Int = 0, description: String) {
        backend = device.backend
        handle = device.handle
        self.inEndpoint = inEndpoint
        self.outEndpoint = outEndpoint
        self.outPacketSize = max(1, outPacketSize)
        self.description = description
        inRing = ByteRing(slotCount: inCount, slotCapacity: inSlotSize, allocator: allocator)
        outRing = ByteRing(slotCount: outCount, slotCapacity: outSlotSize, allocator: allocator)
        inSubmitted = Array(repeating: false, count: inCount)
        outSubmitted = Array(repeating: false, count: outCount)
        outDone = Array(repeating: false, count: outCount)
        outHeld = Array(repeating: nil, count: outCount)
        if let allocator, transmitBufferCount > 0 {
            let pool = PacketBufferPool(initial: min(Self.initialTransmitBuffers, transmitBufferCount), limit: transmitBufferCount,
                                        capacity: outSlotSize, allocator: allocator)
            transmitBuffers = pool.bufferCount > 0 ? pool : nil
        } else {
            transmitBuffers = nil
        }
        leases = (0..<inCount).map { _ in SlotLease() }
        statistics.inTransferSize = inSlotSize
        statistics.deviceMemorySlots = inRing.externalSlotCount + outRing.externalSlotCount
        statistics.heapSlots = inRing.slotCount + outRing.slotCount - statistics.deviceMemorySlots
        var complete = true
        for _ in 0..<inCount {
            guard let transfer = backend.allocateTransfer() else { complete = false; break }
            transferSlots[transfer] = .inbound(inTransfers.count)
            inTransfers.append(transfer)
        }
        for _ in 0..<outCount {
            guard let transfer = backend.allocateTransfer() else { complete = false; break }
            transferSlots[transfer] = .outbound(outTransfers.count)
            outTransfers.append(transfer)
        }
        isComplete = complete
        // libusb holds an unretained pointer to the engine: its owner keeps it alive until the
        // teardown has ended (``isIdle``).
        let me = Unmanaged.passUnretained(self).toOpaque()
        for transfer in inTransfers { prepare(transfer, endpoint: inEndpoint, user: me) }
        for transfer in outTransfers { prepare(transfer, endpoint: outEndpoint, user: me) }
    }

    private func prepare(_ transfer: UnsafeMutablePointer<libusb_transfer>, endpoint: UInt8, user: UnsafeMutableRawPointer) {
        transfer.pointee.dev_handle = handle
        transfer.pointee.endpoint = endpoint
        transfer.pointee.type = UInt8(LIBUSB_TRANSFER_TYPE_BULK.rawValue)
        transfer.pointee.user_data = user
        transfer.pointee.callback = bulkTransferCompleted
    }

    // MARK: IN

    /// Submits an IN transfer over every free IN slot. Returns the status of a submit libusb
    /// refused (that slot stays reserved and goes first next time), or nil.
    func refillIn() -> Int32? {
        while let index = unsubmittedIn ?? inRing.reserve() {
            let transfer = inTransfers[index]
            let slot = inRing.writableBytes(of: index)
            transfer.pointee.buffer = slot.baseAddress!.assumingMemoryBound(to: UInt8.self)
            transfer.pointee.length = Int32(slot.count)
            transfer.pointee.timeout = 0
            transfer.pointee.flags = 0
            let status = backend.submit(transfer)
            guard status == 0 else {
                unsubmittedIn = index
                return status
            }
            unsubmittedIn = nil
            inSubmitted[index] = true
        }
        return nil
    }

    /// Whether no IN transfer is in flight (a stall on IN may be cleared then).
    var inIdle: Bool { !inSubmitted.contains(true) }
    /// Whether no OUT transfer is in flight.
    var outIdle: Bool { !outSubmitted.contains(true) }
    /// Whether libusb holds no transfer of this pipe.
    var isIdle: Bool { inIdle && outIdle }
    /// Transfers libusb still holds.
    var transfersInFlight: Int { inSubmitted.count { $0 } + outSubmitted.count { $0 } }

    // MARK: IN slots lent beyond the delivery

    /// Lends the next committed IN slot not yet lent, whole: the reader may keep the lease (and
    /// views of its bytes) as long as it likes, and the slot goes back to the kernel once it has
    /// let go (``reclaimLentIn(maximumLent:)``). Nil when every committed slot is lent. Empty
    /// slots are skipped (and reclaimed with the others).
    func lendNextIn() -> SlotLease? {
        while let index = inRing.committedSlot(at: lentSlots) {
            lentSlots += 1
            let bytes = inRing.committedBytes(of: index)
            guard bytes.count > 0 else { continue }
            // The slot's lease is free here: the slot was reserved again only after its lease
            // was reclaimed or replaced.
            assert(isKnownUniquelyReferenced(&leases[index]), "a lease lent again while a reader holds it")
            leases[index].lend(bytes)
            statistics.inSlotsLent += 1
            return leases[index]
        }
        return nil
    }

    /// Gives lent IN slots back to the ring, oldest first, once their readers let go; when more
    /// than `maximumLent` are still lent, the bytes of the oldest move out of their slots into
    /// memory of their lease's own (one copy, counted in ``USBPipeCounters/bytesEvacuated``),
    /// so that at least `slotCount − maximumLent` transfers keep the pipe busy however slowly
    /// the reader reads. Call before ``refillIn()``.
    func reclaimLentIn(maximumLent: Int) {
        while lentSlots > 0, let front = inRing.frontSlot {
            if !isKnownUniquelyReferenced(&leases[front]) {
                guard lentSlots > maximumLent else { return }
                statistics.bytesEvacuated += leases[front].evacuate()
                statistics.inSlotsEvacuated += 1
                leases[front] = SlotLease() // the old one now lives on with its readers
            }
            inRing.releaseFront()
            lentSlots -= 1
        }
    }

    /// IN slots lent and not yet back.
    var lentInSlots: Int { lentSlots }

    // MARK: OUT

    /// Copies `bytes` into a free OUT slot (the one copy of the way out on USB) and submits them
    /// as one transfer, with a zero-length packet after it when its length is a multiple of
    /// wMaxPacketSize (see ``SubmitResult/submitted(zeroLengthPacketToSend:)`` where the kernel
    /// cannot add it).
    func submitOut(_ bytes: UnsafeRawBufferPointer, timeout: UInt32) -> SubmitResult {
        guard let index = outRing.reserve() else { return .full }
        let slot = outRing.writableBytes(of: index)
        if bytes.count > 0 { slot.copyMemory(from: bytes) }
        statistics.bytesCopiedOut += bytes.count
        return submitOut(index: index, from: slot.baseAddress!, count: bytes.count, timeout: timeout)
    }

    /// Submits a frame laid out in one of ``transmitBuffers`` from where it lies: no copy (a
    /// buffer in heap memory is copied by usbfs, and counted so). Unless the result is
    /// ``SubmitResult/full``, the engine has taken the buffer: it holds it until the transfer
    /// ends, then takes one off its ``PacketBuffer/pendingTransmissions`` (which the caller
    /// counted before the call).
    func submitOut(buffer: PacketBuffer, timeout: UInt32) -> SubmitResult {
        guard buffer.count <= outRing.slotCapacity else {
            buffer.pendingTransmissions -= 1
            return .failed(LIBUSB_ERROR_OVERFLOW.rawValue)
        }
        guard let index = outRing.reserve() else { return .full }
        outHeld[index] = buffer
        if buffer.isExternal {
            statistics.bytesSentInPlace += buffer.count
        } else {
            statistics.bytesCopiedOut += buffer.count
        }
        return submitOut(index: index, from: buffer.unsafeBytes.baseAddress!, count: buffer.count, timeout: timeout)
    }

    /// Submits OUT slot `index`'s transfer over `count` bytes at `memory` (the slot's own, or a
    /// transmit buffer the engine holds for it).
    private func submitOut(index: Int, from memory: UnsafeMutableRawPointer, count: Int, timeout: UInt32) -> SubmitResult {
        outRing.commit(index, length: count)
        let transfer = outTransfers[index]
        transfer.pointee.buffer = memory.assumingMemoryBound(to: UInt8.self)
        transfer.pointee.length = Int32(count)
        transfer.pointee.timeout = timeout
        let needsZeroLengthPacket = count > 0 && count % outPacketSize == 0
        transfer.pointee.flags = needsZeroLengthPacket && !zeroLengthFlagUnsupported ? UInt8(LIBUSB_TRANSFER_ADD_ZERO_PACKET.rawValue) : 0
        var status = backend.submit(transfer)
        if status == LIBUSB_ERROR_NOT_SUPPORTED.rawValue, needsZeroLengthPacket, !zeroLengthFlagUnsupported {
            zeroLengthFlagUnsupported = true
            transfer.pointee.flags = 0
            status = backend.submit(transfer)
        }
        guard status == 0 else {
            letGoOfBuffer(index)
            outDone[index] = true
            releaseFinishedOutSlots()
            return .failed(status)
        }
        outSubmitted[index] = true
        if needsZeroLengthPacket, !zeroLengthFlagUnsupported { statistics.zeroLengthOut += 1 }
        return .submitted(zeroLengthPacketToSend: needsZeroLengthPacket && zeroLengthFlagUnsupported)
    }

    /// Drops the transmit buffer OUT slot `index` held, if any: one transmission of it fewer.
    private func letGoOfBuffer(_ index: Int) {
        guard let buffer = outHeld[index] else { return }
        buffer.pendingTransmissions -= 1
        outHeld[index] = nil
    }

    /// OUT completions arrive in order on one endpoint; a failed submit can finish a slot early.
    private func releaseFinishedOutSlots() {
        while let front = outRing.frontSlot, outDone[front] {
            outDone[front] = false
            outRing.releaseFront()
        }
    }

    // MARK: Completions

    fileprivate func completed(_ transfer: UnsafeMutablePointer<libusb_transfer>) {
        let status = transfer.pointee.status
        let actual = max(0, Int(transfer.pointee.actual_length))
        let slot = transferSlots[transfer]
        if case let .inbound(index)? = slot {
            inSubmitted[index] = false
            var length = 0
            switch status {
            case LIBUSB_TRANSFER_COMPLETED:
                length = actual
                statistics.inTransfers += 1
                statistics.bytesIn += actual
                if actual == 0 { statistics.zeroLengthIn += 1 }
            case LIBUSB_TRANSFER_OVERFLOW:
                length = min(actual, inRing.slotCapacity)
                statistics.overflows += 1
            case LIBUSB_TRANSFER_STALL, LIBUSB_TRANSFER_NO_DEVICE:
                break
            case LIBUSB_TRANSFER_CANCELLED:
                length = actual // what the device sent before the cancel is still the stream's
                statistics.bytesIn += actual
            default: // ERROR (IN transfers have no timeout): keep what arrived
                length = actual
            }
            inRing.commit(index, length: length)
            onCompletion?(.received(length: length, status: status))
        } else if case let .outbound(index)? = slot {
            outSubmitted[index] = false
            outDone[index] = true
            letGoOfBuffer(index)
            let length = outRing.length(of: index)
            switch status {
            case LIBUSB_TRANSFER_COMPLETED:
                statistics.outTransfers += 1
                statistics.bytesOut += actual
            case LIBUSB_TRANSFER_CANCELLED, LIBUSB_TRANSFER_NO_DEVICE:
                statistics.bytesOut += actual // part of it may have gone out first
            default:
                break
            }
            releaseFinishedOutSlots()
            onCompletion?(.sent(length: length, actual: actual, status: status))
        }
    }

    // MARK: Teardown

    /// Asks libusb to give back every transfer it holds; their completions follow (cancelled).
    func cancelAll() {
        for (index, transfer) in inTransfers.enumerated() where inSubmitted[index] { _ = backend.cancel(transfer) }
        for (index, transfer) in outTransfers.enumerated() where outSubmitted[index] { _ = backend.cancel(transfer) }
    }

    /// Frees the slots (device memory first: the handle must still be open) and the transfers.
    /// Only once ``isIdle``.
    func releaseResources() {
        precondition(isIdle, "the kernel still holds transfers of \(description)")
        // Readers may still hold leases on IN slots: their bytes move out before the memory goes.
        for index in leases.indices where !isKnownUniquelyReferenced(&leases[index]) {
            let moved = leases[index].evacuate()
            if moved > 0 { statistics.inSlotsEvacuated += 1 }
            statistics.bytesEvacuated += moved
            leases[index] = SlotLease()
        }
        lentSlots = 0
        // The link may still hold packets in transmit buffers: they move to the heap first.
        transmitBuffers?.releaseMemory()
        inRing.releaseMemory()
        outRing.releaseMemory()
        for transfer in inTransfers + outTransfers { backend.freeTransfer(transfer) }
        inTransfers = []
        outTransfers = []
        transferSlots = [:]
    }
}

/// Which of a ``BulkPipe``'s transfers one is: an IN or OUT transfer, and its slot.
private enum TransferSlot {
    case inbound(Int)
    case outbound(Int)
}

/// Where a bulk transfer's completion enters Swift: inside libusb_handle_events, on the
/// context's event queue. `user_data` is the engine, kept alive by its owner (through
/// ``BulkPipeLifecycle``) until the teardown ends.
private func bulkTransferCompleted(_ transfer: UnsafeMutablePointer<libusb_transfer>?) {
    guard let transfer, let user = transfer.pointee.user_data else { return }
    Unmanaged<BulkPipe>.fromOpaque(user).takeUnretainedValue().completed(transfer)
}
