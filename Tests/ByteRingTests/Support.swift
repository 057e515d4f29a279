import TestSupport
import ByteRing
import Synchronization

/// Byte `offset` of what the producer writes in cycle `cycle`: every cycle writes different bytes
/// at every offset, so a slot that still holds an earlier cycle's bytes (or another slot's) shows.
func patternByte(cycle: Int, offset: Int) -> UInt8 {
    UInt8(truncatingIfNeeded: cycle &* 73 &+ offset &* 5 &+ 11)
}

/// The first `length` bytes of cycle `cycle`'s pattern.
func pattern(cycle: Int, length: Int) -> [UInt8] {
    bytes(length) { patternByte(cycle: cycle, offset: $0) }
}

/// Byte `position` of the stream the two-thread tests push through a ring.
@inline(__always)
func streamByte(_ position: Int) -> UInt8 {
    UInt8(truncatingIfNeeded: position &* 31 &+ 7)
}

extension ByteRing {
    /// Reserves a slot, fills it with `bytes` and commits it; the slot index, or nil when full.
    @discardableResult
    func push(_ bytes: [UInt8]) -> Int? {
        guard let slot = reserve() else { return nil }
        fill(slot, with: bytes)
        commit(slot, length: bytes.count)
        return slot
    }

    /// Copies `bytes` to the start of reserved slot `slot`.
    func fill(_ slot: Int, with bytes: [UInt8]) {
        let memory = writableBytes(of: slot)
        precondition(bytes.count <= memory.count, "test bug: \(bytes.count) bytes for a slot of \(memory.count)")
        memory.copyBytes(from: bytes)
    }

    /// What ``peek()`` shows, copied; nil when nothing is readable.
    func peekBytes() -> [UInt8]? {
        peek().map { Array($0) }
    }
}

/// A ``SlotAllocator`` that serves the calls whose ordinals (0, 1, …) are in `served` and declines
/// the others, and records every call.
final class RecordingAllocator: SlotAllocator {
    // Unchecked: the pointers are only compared and freed, always under the mutex.
    struct State: @unchecked Sendable {
        var allocateCalls: [Int] = []
        /// Memory handed out and not yet given back, with its size.
        var live: [UnsafeMutableRawPointer: Int] = [:]
        /// Every pointer ever handed out, in order.
        var served: [UnsafeMutableRawPointer] = []
        var deallocateCalls: [(pointer: UnsafeMutableRawPointer, byteCount: Int)] = []
        /// Deallocations of memory this allocator did not hand out (or handed out and got back).
        var strayDeallocations = 0
    }

    private let serve: @Sendable (Int) -> Bool
    private let state = Mutex(State())

    init(serving serve: @escaping @Sendable (_ ordinal: Int) -> Bool) {
        self.serve = serve
    }

    func allocate(byteCount: Int) -> UnsafeMutableRawPointer? {
        state.withLock { state in
            let ordinal = state.allocateCalls.count
            state.allocateCalls.append(byteCount)
            guard serve(ordinal) else { return nil }
            let pointer = UnsafeMutableRawPointer.allocate(byteCount: byteCount, alignment: 16)
            state.live[pointer] = byteCount
            state.served.append(pointer)
            return pointer
        }
    }

    func deallocate(_ pointer: UnsafeMutableRawPointer, byteCount: Int) {
        state.withLock { state in
            state.deallocateCalls.append((pointer, byteCount))
            guard state.live.removeValue(forKey: pointer) != nil else {
                state.strayDeallocations += 1
                return
            }
            pointer.deallocate()
        }
    }

    var snapshot: State { state.withLock { $0 } }

    deinit {
        // Whatever the ring did not give back is freed here so the test process does not leak.
        state.withLock { state in
            for pointer in state.live.keys { pointer.deallocate() }
        }
    }
}
