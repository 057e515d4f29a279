@testable import ByteRing
import Testing

@Suite("ByteRing, one thread")
struct ByteRingTests {
    /// One full reserve / commit / read / consume cycle of the slot the ring hands out next, as the
    /// warm-up before a scripted sequence. Lengths run through 0...capacity, so some cycles are
    /// empty commits that `peek()` skips.
    static func advanceOneCycle(_ ring: ByteRing, cycle: Int, sourceLocation: SourceLocation = #_sourceLocation) {
        guard let slot = ring.reserve() else {
            Issue.record("warm-up cycle \(cycle): reserve() failed on an empty ring", sourceLocation: sourceLocation)
            return
        }
        #expect(slot == cycle % ring.slotCount, "warm-up cycle \(cycle)", sourceLocation: sourceLocation)
        let bytes = pattern(cycle: cycle, length: cycle % (ring.slotCapacity + 1))
        ring.fill(slot, with: bytes)
        ring.commit(slot, length: bytes.count)
        if bytes.isEmpty {
            #expect(ring.peek() == nil, "warm-up cycle \(cycle)", sourceLocation: sourceLocation)
        } else {
            #expect(ring.peekBytes() == bytes, "warm-up cycle \(cycle)", sourceLocation: sourceLocation)
            ring.consume(bytes.count)
        }
        #expect(ring.freeSlots == ring.slotCount, "warm-up cycle \(cycle)", sourceLocation: sourceLocation)
        #expect(ring.readableSlots == 0, "warm-up cycle \(cycle)", sourceLocation: sourceLocation)
    }

    @Test("every wrap-around position", arguments: [(1, 8), (2, 1), (3, 5), (4, 16), (5, 3)])
    func everyWrapPosition(slotCount: Int, slotCapacity: Int) {
        for start in 0..<(slotCount * 2) {
            let ring = ByteRing(slotCount: slotCount, slotCapacity: slotCapacity)
            var cycle = 0
            for _ in 0..<start {
                Self.advanceOneCycle(ring, cycle: cycle)
                cycle += 1
            }
            let at = "start \(start) of \(slotCount)×\(slotCapacity)"

            // Fill every slot; the lengths differ so a slot read with another's length shows.
            var written: [[UInt8]] = []
            for n in 0..<slotCount {
                #expect(ring.freeSlots == slotCount - n, "\(at)")
                guard let slot = ring.reserve() else {
                    Issue.record("\(at): reserve() failed with \(n) of \(slotCount) slots in use")
                    return
                }
                #expect(slot == (start + n) % slotCount, "\(at)")
                let bytes = pattern(cycle: cycle, length: slotCapacity - n % slotCapacity)
                cycle += 1
                ring.fill(slot, with: bytes)
                #expect(ring.reservedSlots == 1, "\(at)")
                ring.commit(slot, length: bytes.count)
                #expect(ring.reservedSlots == 0, "\(at)")
                #expect(ring.readableSlots == n + 1, "\(at)")
                written.append(bytes)
            }
            #expect(ring.reserve() == nil, "\(at): a full ring handed out a slot")
            #expect(ring.freeSlots == 0, "\(at)")

            // Read every slot back: part of it, the rest, then the slot is free again.
            for (n, bytes) in written.enumerated() {
                #expect(ring.frontSlot == (start + n) % slotCount, "\(at)")
                #expect(ring.peekBytes() == bytes, "\(at), slot \(n)")
                let part = bytes.count / 2
                if part > 0 {
                    ring.consume(part)
                    #expect(ring.peekBytes() == Array(bytes[part...]), "\(at), slot \(n) after consume(\(part))")
                    #expect(ring.freeSlots == n, "\(at): a partly read slot was freed")
                    if n == 0 { #expect(ring.reserve() == nil, "\(at): a partly read slot was handed out") }
                }
                if n == slotCount - 1 {
                    ring.releaseFront()
                } else {
                    ring.consume(bytes.count - part)
                }
                #expect(ring.freeSlots == n + 1, "\(at)")
                #expect(ring.readableSlots == slotCount - n - 1, "\(at)")
            }
            #expect(ring.peek() == nil, "\(at)")
            #expect(ring.frontSlot == nil, "\(at)")

            // Once more round the whole ring, from where the script left it: no stale bytes.
            var again: [[UInt8]] = []
            for n in 0..<slotCount {
                let bytes = pattern(cycle: cycle, length: slotCapacity)
                cycle += 1
                #expect(ring.push(bytes) == (start + n) % slotCount, "\(at), second round")
                again.append(bytes)
            }
            #expect(ring.reserve() == nil, "\(at), second round")
            for bytes in again {
                #expect(ring.peekBytes() == bytes, "\(at), second round")
                ring.consume(bytes.count)
            }
            #expect(ring.peek() == nil, "\(at), second round")
            #expect(ring.freeSlots == slotCount, "\(at), second round")
        }
    }

    @Test func outOfOrderCommitsArePublishedInReservationOrder() throws {
        let ring = ByteRing(slotCount: 4, slotCapacity: 8)
        let first = try #require(ring.reserve())
        let second = try #require(ring.reserve())
        let third = try #require(ring.reserve())
        #expect([first, second, third] == [0, 1, 2])
        #expect(ring.reservedSlots == 3)
        for (slot, byte) in [(first, UInt8(0xA1)), (second, 0xB2), (third, 0xC3)] {
            ring.fill(slot, with: [UInt8](repeating: byte, count: 8))
        }

        ring.commit(third, length: 3)
        #expect(ring.peek() == nil, "the 3rd slot was visible before the 1st was committed")
        #expect(ring.frontSlot == nil)
        #expect(ring.readableSlots == 0)
        #expect(ring.reservedSlots == 3)

        ring.commit(first, length: 1)
        #expect(ring.readableSlots == 1)
        #expect(ring.frontSlot == first)
        #expect(ring.peekBytes() == [0xA1])
        ring.consume(1)
        #expect(ring.peek() == nil, "a slot after the uncommitted 2nd was visible")
        #expect(ring.readableSlots == 0)
        #expect(ring.freeSlots == 2)

        ring.commit(second, length: 2)
        #expect(ring.reservedSlots == 0)
        #expect(ring.readableSlots == 2)
        #expect(ring.peekBytes() == [0xB2, 0xB2])
        ring.consume(2)
        #expect(ring.peekBytes() == [0xC3, 0xC3, 0xC3])
        ring.consume(3)
        #expect(ring.peek() == nil)
        #expect(ring.freeSlots == 4)
    }

    /// Every commit order of every batch size, from several wrap positions: after each commit the
    /// consumer sees exactly the committed prefix of the reservations, in order.
    @Test("any commit order is read in reservation order", arguments: [1, 2, 3, 4])
    func everyCommitOrder(batch: Int) {
        let slotCount = 4
        for order in permutations(of: Array(0..<batch)) {
            for start in 0..<slotCount {
                let ring = ByteRing(slotCount: slotCount, slotCapacity: 6)
                for cycle in 0..<start { Self.advanceOneCycle(ring, cycle: cycle) }
                let at = "order \(order) from \(start)"
                let slots = (0..<batch).compactMap { _ in ring.reserve() }
                #expect(slots == (0..<batch).map { (start + $0) % slotCount }, "\(at)")
                guard slots.count == batch else { continue }
                let contents = (0..<batch).map { pattern(cycle: 100 + start * 10 + $0, length: 1 + $0) }
                for (slot, bytes) in zip(slots, contents) { ring.fill(slot, with: bytes) }

                var committed = Set<Int>()
                var read = 0
                for n in order {
                    ring.commit(slots[n], length: contents[n].count)
                    committed.insert(n)
                    var visible = 0
                    while committed.contains(visible) { visible += 1 }
                    #expect(ring.readableSlots == visible - read, "\(at) after committing #\(n)")
                    #expect(ring.reservedSlots == batch - visible, "\(at) after committing #\(n)")
                    while read < visible {
                        #expect(ring.peekBytes() == contents[read], "\(at), reservation #\(read)")
                        ring.consume(contents[read].count)
                        read += 1
                    }
                    #expect(ring.peek() == nil, "\(at) after committing #\(n)")
                }
                #expect(read == batch, "\(at)")
                #expect(ring.freeSlots == slotCount, "\(at)")
            }
        }
    }

    @Test func emptyCommitsAreSkippedAndFreed() throws {
        let ring = ByteRing(slotCount: 3, slotCapacity: 8)
        let empty1 = try #require(ring.reserve())
        let full = try #require(ring.reserve())
        let empty2 = try #require(ring.reserve())
        ring.fill(full, with: [1, 2, 3, 4])
        ring.fill(empty1, with: [9, 9, 9])  // written but committed as empty: must not show
        ring.commit(empty1, length: 0)
        ring.commit(full, length: 4)
        ring.commit(empty2, length: 0)
        #expect(ring.freeSlots == 0)
        #expect(ring.readableSlots == 3)

        #expect(ring.peekBytes() == [1, 2, 3, 4])
        #expect(ring.freeSlots == 1, "the skipped empty slot was not freed")
        #expect(ring.reserve() == empty1, "the skipped empty slot is not the next free one")
        ring.consume(4)
        #expect(ring.freeSlots == 1)
        #expect(ring.peek() == nil)
        #expect(ring.freeSlots == 2, "the trailing empty slot was not freed")
        #expect(ring.readableSlots == 0)

        // withReadableBytes skips empty slots too, and does not call its body for them.
        ring.commit(empty1, length: 0)
        var called = false
        let result: Int? = ring.withReadableBytes { _ in
            called = true
            return (0, 1)
        }
        #expect(result == nil)
        #expect(!called)
        #expect(ring.freeSlots == 3)
    }

    @Test func onlyEmptyCommits() {
        let ring = ByteRing(slotCount: 2, slotCapacity: 4)
        for round in 0..<5 {
            #expect(ring.push([]) != nil, "round \(round)")
            #expect(ring.push([]) != nil, "round \(round)")
            #expect(ring.reserve() == nil, "round \(round)")
            #expect(ring.peek() == nil, "round \(round)")
            #expect(ring.freeSlots == 2, "round \(round)")
        }
        #expect(ring.push([7]) != nil)
        #expect(ring.peekBytes() == [7])
    }

    @Test func consumeOfZeroOnAnEmptySlotReleasesIt() {
        let ring = ByteRing(slotCount: 2, slotCapacity: 4)
        ring.push([])
        ring.push([5, 6])
        #expect(ring.readableSlots == 2)
        ring.consume(0)
        #expect(ring.readableSlots == 1)
        #expect(ring.freeSlots == 1)
        ring.consume(0)  // nothing consumed of a non-empty slot: it stays
        #expect(ring.peekBytes() == [5, 6])
    }

    @Test func withReadableBytesConsumesWhatTheBodySays() {
        let ring = ByteRing(slotCount: 2, slotCapacity: 8)
        #expect(ring.withReadableBytes { _ in (0, "called") } == nil)
        ring.push([10, 11, 12, 13, 14])
        ring.push([20, 21])
        let first = ring.withReadableBytes { span in
            (2, span.withUnsafeBytes { Array($0) })
        }
        #expect(first == [10, 11, 12, 13, 14])
        let nothing = ring.withReadableBytes { span in (0, span.byteCount) }
        #expect(nothing == 3)
        let rest = ring.withReadableBytes { span in
            (span.byteCount, span.withUnsafeBytes { Array($0) })
        }
        #expect(rest == [12, 13, 14])
        #expect(ring.freeSlots == 1)
        let second = ring.withReadableBytes { span in
            (span.byteCount, span.withUnsafeBytes { Array($0) })
        }
        #expect(second == [20, 21])
        #expect(ring.peek() == nil)
        #expect(ring.freeSlots == 2)
    }

    /// The whole-slot consumer of USB OUT: `frontSlot`, `length(of:)`, `committedBytes(of:)`,
    /// `releaseFront()`.
    @Test func wholeSlotConsumer() throws {
        let ring = ByteRing(slotCount: 3, slotCapacity: 8)
        #expect(ring.frontSlot == nil)
        for round in 0..<4 {  // from several wrap positions
            let at = "round \(round)"
            let contents = [pattern(cycle: round, length: 8), pattern(cycle: round + 50, length: 5), []]
            let slots = contents.compactMap { ring.push($0) }
            #expect(slots.count == 3, "\(at)")
            #expect(ring.reserve() == nil, "\(at)")

            for (n, bytes) in contents.enumerated() {
                let front = try #require(ring.frontSlot, "\(at)")
                #expect(front == slots[n], "\(at)")
                #expect(ring.length(of: front) == bytes.count, "\(at)")
                #expect(Array(ring.committedBytes(of: front)) == bytes, "\(at)")
                if n == 0 {
                    // Reading part of a slot does not move its whole view, and releasing the
                    // slot whole resets the read position for the next one.
                    ring.consume(3)
                    #expect(ring.peekBytes() == Array(bytes[3...]), "\(at)")
                    #expect(Array(ring.committedBytes(of: front)) == bytes, "\(at)")
                    #expect(ring.length(of: front) == bytes.count, "\(at)")
                    #expect(ring.frontSlot == front, "\(at)")
                }
                #expect(ring.freeSlots == n, "\(at)")
                ring.releaseFront()
                #expect(ring.freeSlots == n + 1, "\(at)")
                #expect(ring.readableSlots == 2 - n, "\(at)")
                if n == 0 {
                    #expect(ring.peekBytes() == contents[1], "\(at): the read position was not reset")
                }
            }
            #expect(ring.frontSlot == nil, "\(at)")
            #expect(ring.peek() == nil, "\(at)")
        }
    }

    @Test func frontSlotWaitsForEarlierReservations() throws {
        let ring = ByteRing(slotCount: 2, slotCapacity: 4)
        let first = try #require(ring.reserve())
        let second = try #require(ring.reserve())
        ring.fill(second, with: [1, 2])
        ring.commit(second, length: 2)
        #expect(ring.frontSlot == nil)
        ring.commit(first, length: 4)
        #expect(ring.frontSlot == first)
        ring.releaseFront()
        #expect(ring.frontSlot == second)
        #expect(Array(ring.committedBytes(of: second)) == [1, 2])
        ring.releaseFront()
        #expect(ring.frontSlot == nil)
        #expect(ring.freeSlots == 2)
    }

    @Test func slotsAreDistinctAndAligned() {
        for alignment in [1, 16, 64] {
            let ring = ByteRing(slotCount: 5, slotCapacity: 13, alignment: alignment)
            let starts = (0..<5).map { Int(bitPattern: ring.writableBytes(of: $0).baseAddress) }
            #expect(ring.externalSlotCount == 0)
            #expect((0..<5).allSatisfy { !ring.isExternal($0) })
            #expect(starts.allSatisfy { $0 % alignment == 0 }, "alignment \(alignment)")
            #expect((0..<5).allSatisfy { ring.writableBytes(of: $0).count == 13 })
            let sorted = starts.sorted()
            #expect(zip(sorted, sorted.dropFirst()).allSatisfy { $1 - $0 >= 13 }, "slots overlap at alignment \(alignment)")
        }
    }

    @Test func releasedMemoryReservesNothing() {
        let ring = ByteRing(slotCount: 2, slotCapacity: 4)
        ring.push([1])
        ring.releaseMemory()
        ring.releaseMemory()  // idempotent
        #expect(ring.reserve() == nil)
    }
}

/// All orderings of `items` (n! of them; the tests use n ≤ 4).
func permutations<Element>(of items: [Element]) -> [[Element]] {
    guard items.count > 1 else { return [items] }
    var result: [[Element]] = []
    for (index, item) in items.enumerated() {
        var rest = items
        rest.remove(at: index)
        for tail in permutations(of: rest) { result.append([item] + tail) }
    }
    return result
}
