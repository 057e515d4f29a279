internal import Synchronization

/// Where a ``ByteRing`` gets the memory of its slots.
///
/// The USB layer hands out memory that usbfs maps for DMA (`libusb_dev_mem_alloc`), so a bulk
/// transfer lands directly in the slot the reader looks at. Any slot the allocator cannot serve
/// (`allocate` returns nil) comes from one ordinary heap block instead.
package protocol SlotAllocator: AnyObject, Sendable {
    /// Memory for one slot of `byteCount` bytes, or nil to use the heap for this slot.
    func allocate(byteCount: Int) -> UnsafeMutableRawPointer?
    /// Gives back what ``allocate(byteCount:)`` returned.
    func deallocate(_ pointer: UnsafeMutableRawPointer, byteCount: Int)
}

/// A fixed pool of equal slots over memory allocated once: the zero-copy buffer between a
/// producer that fills slots (a USB completion, a frame writer) and a consumer that reads them
/// in place (the frame scanner, a USB submission).
///
/// The protocol, single producer and single consumer, each on one thread at a time:
/// - the producer ``reserve()``s a slot (the oldest free one), fills the memory that
///   ``writableBytes(of:)`` gives, and ``commit(_:length:)``s it. Several slots may be reserved at
///   once (transfers in flight) and committed in any order; the consumer sees them in
///   reservation order, each as soon as every earlier slot is committed too.
/// - the consumer looks at the oldest committed slot with ``withReadableBytes(_:)`` or
///   ``peek()``, ``consume(_:)``s any part of it, and the slot is free again for the producer
///   once it is consumed completely (an empty commit is skipped).
///
/// Only two counters are shared between the threads, as `Atomic`s: how many slots were published
/// and how many were released. Everything else belongs to one side. Nothing is allocated after
/// `init`.
///
/// Its one user today, USB's bulk pipe, runs both sides of both its rings on the context's queue
/// (a completion commits, the scanner consumes, in the same turn). The ring stays safe for a
/// producer and a consumer on two threads (its tests run it so, under ThreadSanitizer) so that a
/// reader on a queue of its own needs no change to it; on one queue the two atomics are
/// uncontended and cost what plain loads and stores do.
///
/// This is one of the few types that hold unsafe pointers; the memory stays valid until the ring
/// is deinitialised or ``releaseMemory()`` is called, and the views it hands out are valid only
/// while the slot is reserved (producer) or until it is consumed (consumer).
package final class ByteRing: @unchecked Sendable {
    // Sendability: `published` and `released` are atomics; `slotAddresses`, `external` and the
    // memory are written only in `init`/`releaseMemory`; `lengths[i]` is written by the producer
    // before the release-store of `published` that makes slot i visible, and read by the
    // consumer after its acquire-load; the `producer*` fields belong to the producer and
    // `consumer*` to the consumer.

    /// Number of slots.
    package let slotCount: Int
    /// Bytes per slot.
    package let slotCapacity: Int

    private let heap: UnsafeMutableRawPointer?
    private let slotAddresses: UnsafeMutablePointer<UnsafeMutableRawPointer>
    private let external: UnsafeMutablePointer<Bool>
    private let lengths: UnsafeMutablePointer<Int>
    private let committed: UnsafeMutablePointer<Bool>
    private let allocator: (any SlotAllocator)?
    private var memoryReleased = false

    /// Slots made visible to the consumer (monotonic).
    private let published = Atomic<Int>(0)
    /// Slots given back by the consumer (monotonic).
    private let released = Atomic<Int>(0)

    private var producerReserved = 0
    private var consumerOffset = 0

    /// How many slots got their memory from the allocator rather than the heap.
    package let externalSlotCount: Int

    /// Creates a ring of `slotCount` slots of `slotCapacity` bytes.
    ///
    /// - Parameters:
    ///   - slotCount: how many slots (at least 1): how many transfers can be in flight or
    ///     held by readers at once.
    ///   - slotCapacity: bytes per slot (at least 1), the largest transfer a slot carries.
    ///   - allocator: asked once per slot; slots it declines come from one heap block. Nil puts
    ///     every slot on the heap.
    ///   - alignment: alignment of the heap block and of each heap slot's capacity rounding.
    package init(slotCount: Int, slotCapacity: Int, allocator: (any SlotAllocator)? = nil, alignment: Int = 64) {
        precondition(slotCount > 0 && slotCapacity > 0, "a ByteRing needs at least one slot of at least one byte")
        self.slotCount = slotCount
        self.slotCapacity = slotCapacity
        self.allocator = allocator
        slotAddresses = .allocate(capacity: slotCount)
        external = .allocate(capacity: slotCount)
        lengths = .allocate(capacity: slotCount)
        lengths.initialize(repeating: 0, count: slotCount)
        committed = .allocate(capacity: slotCount)
        committed.initialize(repeating: false, count: slotCount)
        var fromAllocator: [UnsafeMutableRawPointer?] = []
        fromAllocator.reserveCapacity(slotCount)
        for _ in 0..<slotCount { fromAllocator.append(allocator?.allocate(byteCount: slotCapacity)) }
        let heapSlots = fromAllocator.count { $0 == nil }
        let stride = (slotCapacity + alignment - 1) / alignment * alignment
        heap = heapSlots > 0 ? .allocate(byteCount: stride * heapSlots, alignment: alignment) : nil
        var nextHeap = 0
        for index in 0..<slotCount {
            if let pointer = fromAllocator[index] {
                (slotAddresses + index).initialize(to: pointer)
                (external + index).initialize(to: true)
            } else {
                (slotAddresses + index).initialize(to: heap! + nextHeap * stride)
                (external + index).initialize(to: false)
                nextHeap += 1
            }
        }
        externalSlotCount = slotCount - heapSlots
    }

    deinit {
        releaseMemory()
        slotAddresses.deallocate()
        external.deallocate()
        lengths.deallocate()
        committed.deallocate()
    }

    /// Gives the slots' memory back (to the allocator and the heap) now rather than at deinit;
    /// the ring is unusable afterwards. The USB layer calls this before it closes the device
    /// whose memory the slots are. Idempotent.
    package func releaseMemory() {
        guard !memoryReleased else { return }
        memoryReleased = true
        for index in 0..<slotCount where external[index] {
            allocator?.deallocate(slotAddresses[index], byteCount: slotCapacity)
        }
        heap?.deallocate()
    }

    /// Whether slot `index` lives in allocator memory (for USB: memory the kernel maps for DMA).
    package func isExternal(_ index: Int) -> Bool { external[index] }

    // MARK: Producer

    /// Reserves the oldest free slot, or nil when every slot is reserved or unread.
    package func reserve() -> Int? {
        guard !memoryReleased, producerReserved - released.load(ordering: .acquiring) < slotCount else { return nil }
        let index = producerReserved % slotCount
        producerReserved += 1
        committed[index] = false
        return index
    }

    /// How many more slots ``reserve()`` would hand out now.
    package var freeSlots: Int { slotCount - (producerReserved - released.load(ordering: .acquiring)) }

    /// Slots reserved and not yet committed.
    package var reservedSlots: Int { producerReserved - published.load(ordering: .relaxed) }

    /// The memory of reserved slot `index`, to fill.
    package func writableBytes(of index: Int) -> UnsafeMutableRawBufferPointer {
        UnsafeMutableRawBufferPointer(start: slotAddresses[index], count: slotCapacity)
    }

    /// Marks reserved slot `index` as holding `length` bytes. The consumer sees it once every
    /// slot reserved before it is committed too.
    package func commit(_ index: Int, length: Int) {
        precondition(length >= 0 && length <= slotCapacity, "commit of \(length) bytes into a slot of \(slotCapacity)")
        lengths[index] = length
        committed[index] = true
        var next = published.load(ordering: .relaxed)
        while next < producerReserved, committed[next % slotCount] {
            committed[next % slotCount] = false
            next += 1
        }
        published.store(next, ordering: .releasing)
    }

    // MARK: Consumer

    /// Slots committed and not yet consumed.
    package var readableSlots: Int { published.load(ordering: .acquiring) - released.load(ordering: .relaxed) }

    /// The unread bytes of the oldest committed slot, or nil when none is committed. Skips empty
    /// slots. The view stays valid until those bytes are consumed.
    package func peek() -> UnsafeRawBufferPointer? {
        while true {
            let front = released.load(ordering: .relaxed)
            guard front < published.load(ordering: .acquiring) else { return nil }
            let index = front % slotCount
            let length = lengths[index]
            if consumerOffset >= length {
                consumerOffset = 0
                released.store(front + 1, ordering: .releasing)
                continue
            }
            return UnsafeRawBufferPointer(start: slotAddresses[index] + consumerOffset, count: length - consumerOffset)
        }
    }

    /// Runs `body` with the unread bytes of the oldest committed slot and consumes as many as it
    /// returns; nil (and `body` is not called) when no slot is committed.
    package func withReadableBytes<Result>(_ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        guard let view = peek() else { return nil }
        let outcome = try body(RawSpan(_unsafeBytes: view))
        if outcome.consumed > 0 { consume(outcome.consumed) }
        return outcome.result
    }

    /// Consumes `count` bytes of the oldest committed slot; the slot is released when none are
    /// left.
    package func consume(_ count: Int) {
        let front = released.load(ordering: .relaxed)
        precondition(front < published.load(ordering: .acquiring), "consume with nothing committed")
        let length = lengths[front % slotCount]
        precondition(count >= 0 && consumerOffset + count <= length, "consume of \(count) bytes with \(length - consumerOffset) left")
        consumerOffset += count
        if consumerOffset == length {
            consumerOffset = 0
            released.store(front + 1, ordering: .releasing)
        }
    }

    /// Index of the slot ``peek()`` looks at (for a consumer that hands slots back whole, such as
    /// a USB OUT completion), or nil when none is committed.
    package var frontSlot: Int? {
        let front = released.load(ordering: .relaxed)
        return front < published.load(ordering: .acquiring) ? front % slotCount : nil
    }

    /// The committed length of slot `index`.
    package func length(of index: Int) -> Int { lengths[index] }

    /// The committed bytes of slot `index` whole (not advanced by ``consume(_:)``): for a consumer
    /// that submits the slot as it is.
    package func committedBytes(of index: Int) -> UnsafeRawBufferPointer {
        UnsafeRawBufferPointer(start: slotAddresses[index], count: lengths[index])
    }

    /// Releases the oldest committed slot whole, whatever was consumed of it.
    package func releaseFront() {
        let front = released.load(ordering: .relaxed)
        precondition(front < published.load(ordering: .acquiring), "release with nothing committed")
        consumerOffset = 0
        released.store(front + 1, ordering: .releasing)
    }
}

extension ByteRing {
    /// The index of the `position`-th committed slot not yet released, counting from the oldest
    /// (0 is ``frontSlot``), or nil when fewer are committed: for a consumer that lends slots
    /// whole (``SlotLease``) and releases them later, in order.
    package func committedSlot(at position: Int) -> Int? {
        guard !memoryReleased else { return nil }
        let front = released.load(ordering: .relaxed)
        guard position >= 0, front + position < published.load(ordering: .acquiring) else { return nil }
        return (front + position) % slotCount
    }
}

/// Bytes of a ring slot lent to a reader beyond the call that delivered them, so that the reader
/// keeps them without copying: the received bytes of a USB IN transfer stay in the slot the
/// kernel wrote them to until the reader is done with them.
///
/// A lease is an object, so whoever keeps a view of the bytes keeps the lease alive, and the
/// lender knows the reader is done when it holds the only reference again
/// (`isKnownUniquelyReferenced`); only then does the slot go back to the producer. A lender that
/// needs the slot back earlier (its reader lags, or it is closing) calls `evacuate()`: the
/// bytes move to memory the lease owns (one copy) and every view of them stays valid.
///
/// Confinement: a lease is read, lent and evacuated on one queue, its lender's (for USB, the
/// context's event queue, where the link and its sessions run); it may be released anywhere.
/// This is one of the few types that hold unsafe pointers.
package final class SlotLease: @unchecked Sendable {
    // Sendability: `base`, `count` and `owned` change only on the lender's queue, where every
    // reader runs; ARC's atomic reference count is all other threads touch.
    private var base: UnsafeRawPointer?
    /// The number of bytes lent.
    package private(set) var count = 0
    /// Memory of the lease's own after ``evacuate()``, freed with the lease.
    private var owned: UnsafeMutableRawPointer?

    /// A lease lending nothing yet.
    package init() {}

    deinit { owned?.deallocate() }

    /// Lends `bytes` (a slot's memory, valid until the lender takes the slot back). Only the
    /// lender calls it (hence `package`), and only on a lease nobody else holds: a reader that
    /// could re-point a lease would pull the bytes from under every other view of it.
    package func lend(_ bytes: UnsafeRawBufferPointer) {
        owned?.deallocate()
        owned = nil
        base = bytes.baseAddress
        count = bytes.count
    }

    /// Runs `body` with the lent bytes in place.
    package func withUnsafeBytes<Result>(_ body: (UnsafeRawBufferPointer) throws -> Result) rethrows -> Result {
        try body(UnsafeRawBufferPointer(start: base, count: count))
    }

    /// Runs `body` with the lent bytes in place, as a span.
    package func withSpan<Result>(_ body: (RawSpan) throws -> Result) rethrows -> Result {
        try body(RawSpan(_unsafeBytes: UnsafeRawBufferPointer(start: base, count: count)))
    }

    /// Whether the bytes were moved out of the slot into the lease's own memory.
    package var isEvacuated: Bool { owned != nil }

    /// Moves the bytes out of the slot into memory of the lease's own (one copy), so that the
    /// lender can take the slot back while readers still hold views of them. Returns the bytes
    /// copied (0 when already evacuated). The lender's call.
    @discardableResult
    package func evacuate() -> Int {
        guard owned == nil, count > 0, let base else { return 0 }
        let copy = UnsafeMutableRawPointer.allocate(byteCount: count, alignment: 16)
        copy.copyMemory(from: base, byteCount: count)
        owned = copy
        self.base = UnsafeRawPointer(copy)
        return count
    }
}
