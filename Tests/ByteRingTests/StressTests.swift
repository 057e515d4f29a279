import TestSupport
import ByteRing
import Dispatch
import Foundation
import Glibc
import Synchronization
import Testing
import TestThreads

/// A producer and a consumer on two threads of their own push a long deterministic stream
/// through a small ring. tools/test.sh also runs these with TSan, so every access across the
/// two threads must be ordered by the ring's atomics.
///
/// The test waits for its two threads, so it runs on a thread of its own (`.ownThread`), not on
/// one of the two of Swift's cooperative pool; and each side parks when it has to wait for the
/// other (``Doorbell``), so that a loaded machine costs a wake-up per wait, not a scheduler slice
/// per `sched_yield` (with two busy loops beside it, the six cases took 177 s instead of 1; now 2.5 s).
@Suite("ByteRing, two threads", .serialized, .ownThread)
struct StressTests {
    static let streamLength = 2_000_000

    /// What the two threads report; atomics, so reading it after they finish is ordered after
    /// their writes for TSan too (the semaphore inside DispatchGroup is not instrumented).
    final class Outcome: Sendable {
        let produced = Atomic<Int>(0)
        let emptyCommits = Atomic<Int>(0)
        let outOfOrderCommits = Atomic<Int>(0)
        let mostReserved = Atomic<Int>(0)
        let consumed = Atomic<Int>(0)
        let mismatches = Atomic<Int>(0)
        let firstMismatch = Atomic<Int>(-1)
        let producerDone = Atomic<Bool>(false)
        let consumerDone = Atomic<Bool>(false)
        let finished = Atomic<Int>(0)
        /// Rung by the producer after each commit and when it stops; the consumer waits on it.
        let committed = Doorbell()
        /// Rung by the consumer after each consume, when it finds nothing (looking may have
        /// released empty slots) and when it stops; the producer waits on it.
        let freed = Doorbell()
    }

    /// Where one thread waits for the other to make progress: a short spin first (on an idle
    /// machine the other side runs on the other core and answers within microseconds), then
    /// parked on a semaphore until the other side rings. Not `sched_yield`: on a loaded machine
    /// each yield hands the core to another process for a whole scheduler slice. The semaphore
    /// orders nothing for TSan (libdispatch is not instrumented): what the test checks is still
    /// ordered by the ring's atomics alone.
    final class Doorbell: Sendable {
        private let parked = Atomic<Bool>(false)
        private let bell = DispatchSemaphore(value: 0)

        /// Returns once `ready()` holds.
        func wait(until ready: () -> Bool) {
            var spins = 0
            while !ready() {
                if spins < 2_000 {
                    spins += 1
                    continue
                }
                // Announce the wait, then look again: with both fences, either this look sees
                // the other side's progress or the other side sees `parked` and rings.
                parked.store(true, ordering: .sequentiallyConsistent)
                atomicMemoryFence(ordering: .sequentiallyConsistent)
                if ready() {
                    parked.store(false, ordering: .relaxed)
                    return
                }
                // A ring ends the wait; the timeout only bounds the cost of a bug in this bell.
                _ = bell.wait(timeout: .now() + 1)
                parked.store(false, ordering: .relaxed)
            }
        }

        /// After progress: wakes the other side if it is parked.
        func ring() {
            atomicMemoryFence(ordering: .sequentiallyConsistent)
            if parked.exchange(false, ordering: .sequentiallyConsistent) { bell.signal() }
        }
    }

    /// Runs `producer` and `consumer` on two new threads and waits until both have returned.
    static func runOnTwoThreads(
        _ outcome: Outcome,
        producer: @escaping @Sendable () -> Void,
        consumer: @escaping @Sendable () -> Void
    ) {
        expectMayBlock("waiting for the producer and consumer threads")
        let group = DispatchGroup()
        for body in [producer, consumer] {
            group.enter()
            let thread = Thread {
                body()
                outcome.finished.add(1, ordering: .acquiringAndReleasing)
                group.leave()
            }
            thread.start()
        }
        group.wait()
        #expect(outcome.finished.load(ordering: .acquiring) == 2)
    }

    /// A commit length: often a full slot, sometimes empty, otherwise anything in between.
    static func commitLength(_ random: inout SplitMix64, capacity: Int) -> Int {
        switch random.next(below: 8) {
        case 0: return 0
        case 1, 2: return capacity
        default: return 1 + random.next(below: capacity)
        }
    }

    /// Fills reserved slot `slot` with the stream from `position` on; its length.
    static func write(_ ring: ByteRing, slot: Int, position: Int, random: inout SplitMix64) -> Int {
        let length = min(commitLength(&random, capacity: ring.slotCapacity), streamLength - position)
        let memory = ring.writableBytes(of: slot)
        // Through a typed pointer, whose subscript is inlined even in debug builds, so TSan sees
        // these accesses (the raw buffer's subscript runs uninstrumented in the standard library).
        let bytes = memory.baseAddress!.bindMemory(to: UInt8.self, capacity: memory.count)
        for offset in 0..<length { bytes[offset] = streamByte(position + offset) }
        // Bytes past the commit must never be read: make them wrong.
        for offset in length..<memory.count { bytes[offset] = ~streamByte(position + offset) }
        return length
    }

    /// Reads the whole stream with variable-sized consumes (and sometimes `withReadableBytes`),
    /// checking every byte. Stops early only if the producer has finished and nothing more comes.
    static func consumeStream(_ ring: ByteRing, _ outcome: Outcome, seed: UInt64) {
        var random = SplitMix64(seed: seed)
        var position = 0
        var mismatches = 0
        var firstMismatch = -1
        func check(_ view: UnsafeRawBufferPointer, count: Int) {
            guard count > 0 else { return }
            let bytes = view.baseAddress!.assumingMemoryBound(to: UInt8.self)  // bound by `write`
            for offset in 0..<count where bytes[offset] != streamByte(position + offset) {
                if firstMismatch < 0 { firstMismatch = position + offset }
                mismatches += 1
            }
        }
        while position < streamLength {
            let step = 1 + random.next(below: 3 * ring.slotCapacity / 2)
            if random.next(below: 4) == 0 {
                let taken: Int? = ring.withReadableBytes { span in
                    let count = min(step, span.byteCount)
                    span.withUnsafeBytes { check($0, count: count) }
                    return (count, count)
                }
                if let taken {
                    position += taken
                    outcome.freed.ring()
                    continue
                }
            } else if let view = ring.peek() {
                let count = min(step, view.count)
                check(view, count: count)
                ring.consume(count)
                position += count
                outcome.freed.ring()
                continue
            }
            // Nothing readable: wait for the producer, unless it has given up. Looking may have
            // released empty slots (peek skips them), which the producer may be waiting for.
            outcome.freed.ring()
            if outcome.producerDone.load(ordering: .acquiring), ring.peek() == nil { break }
            outcome.committed.wait { ring.readableSlots > 0 || outcome.producerDone.load(ordering: .acquiring) }
        }
        outcome.consumed.store(position, ordering: .relaxed)
        outcome.mismatches.store(mismatches, ordering: .relaxed)
        outcome.firstMismatch.store(firstMismatch, ordering: .relaxed)
        outcome.consumerDone.store(true, ordering: .releasing)
        outcome.freed.ring()
    }

    /// Checks what the threads reported and that the ring ended empty.
    static func expectWholeStream(_ ring: ByteRing, _ outcome: Outcome, sourceLocation: SourceLocation = #_sourceLocation) {
        let produced = outcome.produced.load(ordering: .acquiring)
        let consumed = outcome.consumed.load(ordering: .acquiring)
        #expect(produced == streamLength, sourceLocation: sourceLocation)
        #expect(consumed == streamLength, sourceLocation: sourceLocation)
        #expect(
            outcome.mismatches.load(ordering: .acquiring) == 0,
            "first wrong byte at \(outcome.firstMismatch.load(ordering: .acquiring))",
            sourceLocation: sourceLocation
        )
        #expect(outcome.emptyCommits.load(ordering: .acquiring) > 0, "the generator made no empty commits", sourceLocation: sourceLocation)
        #expect(ring.peek() == nil, sourceLocation: sourceLocation)
        #expect(ring.readableSlots == 0, sourceLocation: sourceLocation)
        #expect(ring.reservedSlots == 0, sourceLocation: sourceLocation)
        #expect(ring.freeSlots == ring.slotCount, sourceLocation: sourceLocation)
    }

    @Test("in-order commits", arguments: [(4, 61), (1, 13), (3, 64)])
    func inOrder(slotCount: Int, slotCapacity: Int) {
        let ring = ByteRing(slotCount: slotCount, slotCapacity: slotCapacity)
        let outcome = Outcome()
        Self.runOnTwoThreads(outcome) {
            var random = SplitMix64(seed: 0x5EED_0001)
            var position = 0
            var emptyCommits = 0
            while position < Self.streamLength {
                guard let slot = ring.reserve() else {
                    if outcome.consumerDone.load(ordering: .acquiring) { break }
                    outcome.freed.wait { ring.freeSlots > 0 || outcome.consumerDone.load(ordering: .acquiring) }
                    continue
                }
                let length = Self.write(ring, slot: slot, position: position, random: &random)
                ring.commit(slot, length: length)
                outcome.committed.ring()
                position += length
                if length == 0 { emptyCommits += 1 }
            }
            outcome.produced.store(position, ordering: .relaxed)
            outcome.emptyCommits.store(emptyCommits, ordering: .relaxed)
            outcome.producerDone.store(true, ordering: .releasing)
            outcome.committed.ring()
        } consumer: {
            Self.consumeStream(ring, outcome, seed: 0x5EED_0002)
        }
        Self.expectWholeStream(ring, outcome)
    }

    /// Like USB transfers in flight: the producer holds up to every slot reserved at once and
    /// commits them in a random order; the stream runs through them in reservation order.
    @Test("out-of-order commits", arguments: [(4, 61), (2, 17), (5, 32)])
    func outOfOrder(slotCount: Int, slotCapacity: Int) {
        let ring = ByteRing(slotCount: slotCount, slotCapacity: slotCapacity)
        let outcome = Outcome()
        Self.runOnTwoThreads(outcome) {
            var random = SplitMix64(seed: 0x5EED_0003)
            var position = 0
            var emptyCommits = 0
            var outOfOrder = 0
            var mostReserved = 0
            var pending: [(slot: Int, length: Int)] = []  // reserved and filled, oldest first
            pending.reserveCapacity(slotCount)
            while position < Self.streamLength || !pending.isEmpty {
                let wantsToCommit = !pending.isEmpty && (position == Self.streamLength || random.next(below: 3) == 0)
                if !wantsToCommit, position < Self.streamLength, let slot = ring.reserve() {
                    let length = Self.write(ring, slot: slot, position: position, random: &random)
                    pending.append((slot, length))
                    mostReserved = max(mostReserved, pending.count)
                    position += length
                    continue
                }
                guard !pending.isEmpty else {
                    if outcome.consumerDone.load(ordering: .acquiring) { break }
                    outcome.freed.wait { ring.freeSlots > 0 || outcome.consumerDone.load(ordering: .acquiring) }
                    continue
                }
                let chosen = random.next(below: pending.count)
                let (slot, length) = pending.remove(at: chosen)
                if chosen > 0 { outOfOrder += 1 }
                ring.commit(slot, length: length)
                outcome.committed.ring()
                if length == 0 { emptyCommits += 1 }
            }
            outcome.produced.store(position, ordering: .relaxed)
            outcome.emptyCommits.store(emptyCommits, ordering: .relaxed)
            outcome.outOfOrderCommits.store(outOfOrder, ordering: .relaxed)
            outcome.mostReserved.store(mostReserved, ordering: .relaxed)
            outcome.producerDone.store(true, ordering: .releasing)
            outcome.committed.ring()
        } consumer: {
            Self.consumeStream(ring, outcome, seed: 0x5EED_0004)
        }
        Self.expectWholeStream(ring, outcome)
        #expect(outcome.mostReserved.load(ordering: .acquiring) == slotCount, "the producer never had every slot reserved")
        if slotCount > 1 {
            #expect(outcome.outOfOrderCommits.load(ordering: .acquiring) > 1000, "the producer hardly committed out of order")
        }
    }
}
