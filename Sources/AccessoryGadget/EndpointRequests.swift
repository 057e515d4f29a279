internal import CKernelAIO
internal import Glibc

/// Several transfers queued on one FunctionFS endpoint file at once, with Linux's native AIO,
/// as a device's controller keeps them: while the host's transfer for one request moves, the
/// next requests are already queued, so the kernel never waits for a thread to wake and ask
/// again (a blocking `read()` or `write()` queues one request at a time, and with `dummy_hcd`
/// an endpoint with none queued waits for the controller's next frame).
///
/// Each request owns a slot of ``slotSize`` bytes: a read is made into its slot and handed out
/// from there; a write is copied into its slot first (the caller's array cannot be kept valid
/// beyond a call). Requests complete in the order they were queued (one endpoint's requests are
/// one queue in the controller) and are handed out in that order whatever order the kernel
/// reports them in.
///
/// Confinement: made, used and released by one thread (the gadget's reader or writer); not
/// `Sendable`. This is one of the few types that hold unsafe pointers: the slots and the
/// kernel's request blocks, which must stay valid until `io_destroy` has cancelled and waited
/// for every request still queued (``deinit``).
final class EndpointRequests {
    /// How a request ended, as ``takeCompleted(_:)`` hands it out.
    enum Completion {
        /// It moved these bytes: what a read received, what a write sent (valid during the call).
        case moved(UnsafeRawBufferPointer, writes: Int)
        /// It failed with this `errno` value (`ESHUTDOWN` when the host disabled the function);
        /// `tag` is what it was queued with (the gadget's enable generation).
        case failed(Int32, tag: UInt64)
    }

    /// Requests kept queued at most.
    let depth: Int
    /// The bytes of each request's slot: the longest read or write.
    let slotSize: Int
    private let descriptor: Int32
    private let writes: Bool
    private let context: aio_context_t
    private let memory: UnsafeMutableRawPointer
    /// Two request blocks per slot: a write that must end with a short packet goes as two.
    private let blocks: UnsafeMutablePointer<iocb>
    private let submission: UnsafeMutablePointer<UnsafeMutablePointer<iocb>?>
    private let events: UnsafeMutablePointer<io_event>
    /// Slots in flight, oldest first (a ring of `depth`).
    private var order: [Int]
    private var orderHead = 0
    private var queued = 0
    private var free: [Int]
    /// Per slot: pieces not yet completed, bytes moved so far, the first error, pieces queued.
    private var piecesLeft: [Int]
    private var moved: [Int]
    private var failure: [Int32]
    private var pieces: [Int]
    private var tags: [UInt64]

    /// Queues on `descriptor` (reads, or `writes`) up to `depth` requests of `slotSize` bytes;
    /// `nil` when the kernel offers no AIO context (built without AIO, or the system's limit of
    /// contexts is reached): the caller then moves bytes one blocking call at a time.
    init?(descriptor: Int32, writes: Bool, depth: Int = 4, slotSize: Int) {
        var made: aio_context_t = 0
        guard depth > 0, slotSize > 0, iap_aio_setup(UInt32(2 * depth), &made) == 0 else { return nil }
        self.descriptor = descriptor
        self.writes = writes
        self.depth = depth
        self.slotSize = slotSize
        context = made
        memory = UnsafeMutableRawPointer.allocate(byteCount: depth * slotSize, alignment: 4096)
        blocks = UnsafeMutablePointer<iocb>.allocate(capacity: 2 * depth)
        blocks.initialize(repeating: iocb(), count: 2 * depth)
        submission = UnsafeMutablePointer<UnsafeMutablePointer<iocb>?>.allocate(capacity: 2)
        submission.initialize(repeating: nil, count: 2)
        events = UnsafeMutablePointer<io_event>.allocate(capacity: 2 * depth)
        events.initialize(repeating: io_event(), count: 2 * depth)
        order = Array(repeating: 0, count: depth)
        free = Array((0..<depth).reversed())
        piecesLeft = Array(repeating: 0, count: depth)
        moved = Array(repeating: 0, count: depth)
        failure = Array(repeating: 0, count: depth)
        pieces = Array(repeating: 0, count: depth)
        tags = Array(repeating: 0, count: depth)
    }

    deinit {
        // Cancels what is still queued and waits for it: only then may the slots go.
        _ = iap_aio_destroy(context)
        events.deallocate()
        submission.deallocate()
        blocks.deallocate()
        memory.deallocate()
    }

    /// Requests queued and not yet handed out by ``takeCompleted(_:)``.
    var inFlight: Int { queued }

    /// Whether another request may be queued.
    var hasRoom: Bool { !free.isEmpty }

    /// Queues a read of a whole slot, tagged with `tag` (handed back if it fails). `nil`, or the
    /// `errno` value that refused it (`EAGAIN` or `ESHUTDOWN` while the function is not enabled).
    func queueRead(tag: UInt64 = 0) -> Int32? {
        precondition(!writes, "a read queued on a writer's requests")
        guard let slot = free.last else { return EAGAIN }
        return queue(slot: slot, ranges: [0..<slotSize], tag: tag)
    }

    /// Copies `bytes` (at most ``slotSize``) into a free slot and queues it written: as two writes
    /// when `splitBeforeLast` is set (all but the last byte, then the last byte alone). `nil`, or
    /// the `errno` value that refused it.
    func queueWrite(_ bytes: UnsafeRawBufferPointer, splitBeforeLast: Bool, tag: UInt64 = 0) -> Int32? {
        precondition(writes, "a write queued on a reader's requests")
        precondition(bytes.count <= slotSize && (!splitBeforeLast || bytes.count >= 2), "a write that does not fit a slot")
        guard let slot = free.last else { return EAGAIN }
        if let base = bytes.baseAddress { (memory + slot * slotSize).copyMemory(from: base, byteCount: bytes.count) }
        let ranges = splitBeforeLast ? [0..<(bytes.count - 1), (bytes.count - 1)..<bytes.count] : [0..<bytes.count]
        return queue(slot: slot, ranges: ranges, tag: tag)
    }

    private func queue(slot: Int, ranges: [Range<Int>], tag: UInt64) -> Int32? {
        let start = memory + slot * slotSize
        for (index, range) in ranges.enumerated() {
            let block = blocks + 2 * slot + index
            iap_aio_prepare(block, descriptor, writes ? 1 : 0, start + range.lowerBound, range.count, UInt64(slot))
            submission[index] = block
        }
        let taken = Int(iap_aio_submit(context, ranges.count, submission))
        if taken <= 0 { return taken == 0 ? EAGAIN : errno }
        free.removeLast()
        piecesLeft[slot] = taken
        pieces[slot] = taken
        tags[slot] = tag
        moved[slot] = 0
        // The piece the kernel did not take (of a split write) counts as failed.
        failure[slot] = taken < ranges.count ? EAGAIN : 0
        order[(orderHead + queued) % depth] = slot
        queued += 1
        return nil
    }

    /// Collects completions from the kernel: waits for at least one when `wait` is set (and a
    /// request is queued). `nil`, or the `errno` value of a failed wait (`EINTR`: a signal woke
    /// the thread).
    func collect(wait: Bool) -> Int32? {
        guard queued > 0 else { return nil }
        let count = iap_aio_getevents(context, wait ? 1 : 0, 2 * depth, events)
        if count < 0 { return errno }
        for event in UnsafeBufferPointer(start: events, count: Int(count)) {
            let slot = Int(event.data)
            guard slot >= 0, slot < depth, piecesLeft[slot] > 0 else { continue }
            piecesLeft[slot] -= 1
            if event.res < 0 {
                if failure[slot] == 0 { failure[slot] = Int32(clamping: -event.res) }
            } else {
                moved[slot] += Int(event.res)
            }
        }
        return nil
    }

    /// Hands out the completed requests at the head of the queue, oldest first, and frees their
    /// slots once `body` returns; stops at the first request still in flight.
    func takeCompleted(_ body: (Completion) -> Void) {
        while queued > 0 {
            let slot = order[orderHead]
            guard piecesLeft[slot] == 0 else { return }
            if failure[slot] != 0 {
                body(.failed(failure[slot], tag: tags[slot]))
            } else {
                body(.moved(UnsafeRawBufferPointer(start: memory + slot * slotSize, count: moved[slot]), writes: pieces[slot]))
            }
            orderHead = (orderHead + 1) % depth
            queued -= 1
            free.append(slot)
        }
    }
}
