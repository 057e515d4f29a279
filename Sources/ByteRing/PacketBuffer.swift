/// A buffer one outgoing packet is laid out in, finished in and kept in until the peer
/// acknowledges it: the zero-copy OUT path. A writer appends the payload after the header's
/// headroom (the one copy of the way out), the link writes the header and checksum around it
/// where it lies, and the transport submits the buffer's memory as it is. When the memory is the
/// device memory usbfs maps for DMA (a ``PacketBufferPool`` over a USB allocator), the kernel
/// reads the packet from there: no copy in user space or in the kernel.
///
/// A buffer is an object: the pool that made it knows it is free again when it holds the only
/// reference (`isKnownUniquelyReferenced`), so whoever keeps the packet (the link until the
/// acknowledgement, the transport until its transfer completes) keeps the memory.
///
/// Confinement: filled, finished, submitted and evacuated on one queue (for USB, the context's
/// event queue, where the link runs); it may be released anywhere. This is one of the few types
/// that hold unsafe pointers.
package final class PacketBuffer: @unchecked Sendable {
    // Sendability: `base`, `count`, `owned` and `pendingTransmissions` change only on the
    // queue the buffer is confined to; ARC's atomic reference count is all other threads touch.
    private var base: UnsafeMutableRawPointer
    /// Memory of the buffer's own (the heap), freed with it; nil while it uses a pool's memory.
    private var owned: UnsafeMutableRawPointer?
    /// Whether the memory is the allocator's (device memory), not the heap.
    package private(set) var isExternal: Bool
    /// The bytes the buffer can hold.
    package let capacity: Int
    /// The bytes laid out so far.
    package private(set) var count = 0
    /// Transmissions of this buffer a transport has taken and not yet finished (queued or in
    /// flight). While it is not 0 the memory may be read by the kernel at any moment, so the
    /// packet must not be rewritten (a retransmission with a newer acknowledgement waits).
    /// Kept by the transport (hence `package`); read by the link.
    package var pendingTransmissions = 0

    /// A buffer of `capacity` bytes on the heap.
    package init(capacity: Int) {
        precondition(capacity > 0, "a packet buffer needs room for at least one byte")
        self.capacity = capacity
        let memory = UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: 64)
        base = memory
        owned = memory
        isExternal = false
    }

    /// A buffer over `memory` of `capacity` bytes that its maker (a ``PacketBufferPool``) owns
    /// and keeps valid until it ``evacuate()``s the buffer.
    init(external memory: UnsafeMutableRawPointer, capacity: Int) {
        self.capacity = capacity
        base = memory
        owned = nil
        isExternal = true
    }

    deinit { owned?.deallocate() }

    /// Room left after what is laid out.
    package var freeCapacity: Int { capacity - count }

    /// Empties the buffer (the memory stays).
    package func removeAll() { count = 0 }

    /// Appends `count` zero bytes (header headroom, a checksum's place). Precondition: they fit.
    package func appendZeros(_ count: Int) {
        precondition(count >= 0 && count <= freeCapacity, "\(count) bytes do not fit in \(freeCapacity) free")
        (base + self.count).initializeMemory(as: UInt8.self, repeating: 0, count: count)
        self.count += count
    }

    /// Appends one byte. Precondition: it fits.
    package func append(_ byte: UInt8) {
        precondition(count < capacity, "a byte does not fit in a full packet buffer")
        base.storeBytes(of: byte, toByteOffset: count, as: UInt8.self)
        count += 1
    }

    /// Copies `bytes` after what is laid out. Precondition: they fit.
    package func append(_ bytes: RawSpan) {
        let length = bytes.byteCount
        precondition(length <= freeCapacity, "\(length) bytes do not fit in \(freeCapacity) free")
        bytes.withUnsafeBytes { source in
            if let start = source.baseAddress, length > 0 { (base + count).copyMemory(from: start, byteCount: length) }
        }
        count += length
    }

    /// Lets `body` initialise up to `capacity` bytes after what is laid out, through an output
    /// span; the bytes it initialised are appended. Precondition: `capacity` fits.
    package func append<Result>(upTo capacity: Int, _ body: (inout OutputSpan<UInt8>) -> Result) -> Result {
        precondition(capacity >= 0 && capacity <= freeCapacity, "\(capacity) bytes do not fit in \(freeCapacity) free")
        let tail = UnsafeMutableBufferPointer(start: (base + count).bindMemory(to: UInt8.self, capacity: capacity), count: capacity)
        var output = OutputSpan(buffer: tail, initializedCount: 0)
        let result = body(&output)
        count += output.finalize(for: tail)
        return result
    }

    /// Runs `body` with the bytes laid out, in place.
    package func withSpan<Result>(_ body: (RawSpan) throws -> Result) rethrows -> Result {
        try body(RawSpan(_unsafeBytes: UnsafeRawBufferPointer(start: base, count: count)))
    }

    /// Runs `body` with the bytes laid out, in place, to rewrite them (a header). Precondition:
    /// no transmission is pending (the kernel may be reading the memory).
    package func withMutableSpan<Result>(_ body: (inout MutableRawSpan) throws -> Result) rethrows -> Result {
        precondition(pendingTransmissions == 0, "a packet rewritten while a transport is sending it")
        var span = MutableRawSpan(_unsafeBytes: UnsafeMutableRawBufferPointer(start: base, count: count))
        return try body(&span)
    }

    /// The bytes laid out, for the transport that submits them (a USB transfer's buffer). Valid
    /// while the buffer is alive and not evacuated; the transport holds a reference meanwhile.
    package var unsafeBytes: UnsafeMutableRawBufferPointer { UnsafeMutableRawBufferPointer(start: base, count: count) }

    /// A copy of the bytes laid out, as an array (for a transport that takes arrays).
    package func copiedBytes() -> [UInt8] { withSpan { $0.withUnsafeBytes { Array($0) } } }

    /// Moves the bytes out of the pool's memory into memory of the buffer's own (one copy of
    /// what is laid out; room for the whole capacity), so the pool can give its memory back
    /// while the link still holds the packet. Returns the bytes copied. The pool's call.
    @discardableResult
    func evacuate() -> Int {
        guard owned == nil else { return 0 }
        let memory = UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: 64)
        if count > 0 { memory.copyMemory(from: base, byteCount: count) }
        base = memory
        owned = memory
        isExternal = false
        return count
    }
}

/// A set of ``PacketBuffer``s (for USB: over usbfs device memory, from the same
/// ``SlotAllocator`` as the pipe's rings), lent to the link for the packets it sends and free
/// again once nobody holds them. It starts with a few buffers and grows when every one is held,
/// up to its limit, so it holds about as many as there are packets queued and in flight (the
/// sessions' buffers and the link's window bound those). Once the allocator declines (the
/// kernel's usbfs memory limit), it grows no more.
///
/// Confined to one queue, like its buffers.
package final class PacketBufferPool: @unchecked Sendable {
    // Sendability: every stored var is touched on the owner's queue only.
    private var buffers: [PacketBuffer]
    private var memory: [UnsafeMutableRawPointer]
    private let allocator: (any SlotAllocator)?
    private var released = false
    /// The allocator declined once: no more growing.
    private var declined = false
    /// The most buffers the pool grows to.
    package let limit: Int
    /// Where the search for a free buffer starts (the one after the last handed out: buffers
    /// come back in about the order they went out).
    private var cursor = 0
    /// Bytes per buffer.
    package let bufferCapacity: Int
    /// Buffers the pool holds.
    package var bufferCount: Int { buffers.count }
    /// Buffers handed out by ``take()``, and the times none was free.
    package private(set) var taken = 0
    /// Times ``take()`` returned nil: every buffer was held and the pool could not grow (at its
    /// limit, or its allocator declined); the caller lays that packet out in an array instead.
    package private(set) var exhausted = 0
    /// Bytes moved out of the pool's memory at ``releaseMemory()`` because the link still held
    /// the packet.
    package private(set) var bytesEvacuated = 0

    /// A pool of buffers of `capacity` bytes, `initial` of them made now, growing to `limit`,
    /// each from `allocator` (on the heap when it is nil). When the allocator declines, the pool
    /// stays the size it has (possibly empty).
    package init(initial: Int, limit: Int, capacity: Int, allocator: (any SlotAllocator)?) {
        bufferCapacity = capacity
        self.limit = max(0, limit)
        self.allocator = allocator
        buffers = []
        memory = []
        for _ in 0..<min(max(0, initial), self.limit) {
            if grow() == nil { break }
        }
    }

    /// A pool of `count` buffers made now, as ``init(initial:limit:capacity:allocator:)`` with
    /// both at `count`.
    package convenience init(count: Int, capacity: Int, allocator: (any SlotAllocator)?) {
        self.init(initial: count, limit: count, capacity: capacity, allocator: allocator)
    }

    /// Makes one more buffer and returns its index, or nil when the allocator declines.
    private func grow() -> Int? {
        guard !declined, buffers.count < limit else { return nil }
        if let allocator {
            guard let pointer = allocator.allocate(byteCount: bufferCapacity) else {
                declined = true
                return nil
            }
            memory.append(pointer)
            buffers.append(PacketBuffer(external: pointer, capacity: bufferCapacity))
        } else {
            buffers.append(PacketBuffer(capacity: bufferCapacity))
        }
        return buffers.count - 1
    }

    deinit { releaseMemory() }

    /// A free buffer, emptied (a new one when every buffer is held and the pool may grow), or
    /// nil when none is free (or the memory was released).
    package func take() -> PacketBuffer? {
        guard !released else { return nil }
        for step in 0..<buffers.count {
            let index = (cursor + step) % buffers.count
            if isKnownUniquelyReferenced(&buffers[index]) {
                return handOut(index)
            }
        }
        if let index = grow() { return handOut(index) }
        exhausted += 1
        return nil
    }

    private func handOut(_ index: Int) -> PacketBuffer {
        cursor = index + 1
        taken += 1
        let buffer = buffers[index]
        buffer.removeAll()
        return buffer
    }

    /// Buffers held outside the pool right now.
    package var buffersInUse: Int {
        var held = 0
        for index in buffers.indices where !isKnownUniquelyReferenced(&buffers[index]) { held += 1 }
        return held
    }

    /// Gives the memory back to the allocator now (the USB layer does it before it closes the
    /// device whose memory it is); buffers still held get their bytes moved to the heap first,
    /// so every holder's packet stays valid. The pool hands out nothing afterwards. Idempotent.
    package func releaseMemory() {
        guard !released else { return }
        released = true
        for index in buffers.indices where !isKnownUniquelyReferenced(&buffers[index]) {
            bytesEvacuated += buffers[index].evacuate()
        }
        buffers.removeAll()
        for pointer in memory { allocator?.deallocate(pointer, byteCount: bufferCapacity) }
        memory.removeAll()
    }
}
