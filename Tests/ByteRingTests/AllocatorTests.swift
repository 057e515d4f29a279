import ByteRing
import Testing

@Suite("ByteRing slot allocator")
struct AllocatorTests {
    /// Writes a different pattern into every slot, round after round, and reads it all back.
    static func exercise(_ ring: ByteRing, rounds: Int, sourceLocation: SourceLocation = #_sourceLocation) {
        var cycle = 0
        for round in 0..<rounds {
            var written: [[UInt8]] = []
            for _ in 0..<ring.slotCount {
                let bytes = pattern(cycle: cycle, length: ring.slotCapacity - cycle % 3)
                cycle += 1
                #expect(ring.push(bytes) != nil, "round \(round)", sourceLocation: sourceLocation)
                written.append(bytes)
            }
            for bytes in written {
                #expect(ring.peekBytes() == bytes, "round \(round)", sourceLocation: sourceLocation)
                ring.consume(bytes.count)
            }
        }
    }

    @Test func servedAndDeclinedSlots() throws {
        let served: Set<Int> = [0, 2, 3]
        let allocator = RecordingAllocator { served.contains($0) }
        let ring = ByteRing(slotCount: 5, slotCapacity: 24, allocator: allocator)

        let afterInit = allocator.snapshot
        #expect(afterInit.allocateCalls == [24, 24, 24, 24, 24], "asked once per slot for its capacity")
        #expect(afterInit.served.count == 3)
        #expect(afterInit.deallocateCalls.isEmpty)
        #expect(ring.externalSlotCount == 3)
        #expect((0..<5).filter { ring.isExternal($0) } == [0, 2, 3])

        // External slots are the allocator's memory; heap slots are not, and are aligned.
        let servedAddresses = Set(afterInit.served)
        for slot in 0..<5 {
            let memory = ring.writableBytes(of: slot)
            let base = try #require(memory.baseAddress)
            #expect(memory.count == 24)
            #expect(servedAddresses.contains(base) == ring.isExternal(slot), "slot \(slot)")
            if !ring.isExternal(slot) { #expect(Int(bitPattern: base) % 64 == 0, "slot \(slot)") }
        }
        #expect(Set((0..<5).map { ring.writableBytes(of: $0).baseAddress }).count == 5, "two slots share memory")

        Self.exercise(ring, rounds: 3)

        ring.releaseMemory()
        #expect(ring.reserve() == nil, "a ring whose memory is gone handed out a slot")
        let afterRelease = allocator.snapshot
        #expect(afterRelease.deallocateCalls.count == 3)
        #expect(afterRelease.deallocateCalls.allSatisfy { $0.byteCount == 24 })
        #expect(Set(afterRelease.deallocateCalls.map(\.pointer)) == servedAddresses)
        #expect(afterRelease.live.isEmpty)
        #expect(afterRelease.strayDeallocations == 0)

        ring.releaseMemory()
        #expect(allocator.snapshot.deallocateCalls.count == 3, "a second releaseMemory() deallocated again")
        _ = consume ring
        #expect(allocator.snapshot.deallocateCalls.count == 3, "deinit deallocated again after releaseMemory()")
    }

    @Test func deinitAloneDeallocates() {
        let allocator = RecordingAllocator { $0 % 2 == 1 }
        func useAndDrop() {
            let ring = ByteRing(slotCount: 4, slotCapacity: 10, allocator: allocator)
            #expect(ring.externalSlotCount == 2)
            Self.exercise(ring, rounds: 2)
            #expect(allocator.snapshot.deallocateCalls.isEmpty)
        }
        useAndDrop()
        let state = allocator.snapshot
        #expect(state.deallocateCalls.count == 2)
        #expect(state.deallocateCalls.allSatisfy { $0.byteCount == 10 })
        #expect(Set(state.deallocateCalls.map(\.pointer)) == Set(state.served))
        #expect(state.live.isEmpty)
        #expect(state.strayDeallocations == 0)
    }

    @Test func everySlotServed() {
        let allocator = RecordingAllocator { _ in true }
        do {
            let ring = ByteRing(slotCount: 3, slotCapacity: 7, allocator: allocator)
            #expect(ring.externalSlotCount == 3)
            #expect((0..<3).allSatisfy { ring.isExternal($0) })
            Self.exercise(ring, rounds: 4)
        }
        let state = allocator.snapshot
        #expect(state.deallocateCalls.count == 3)
        #expect(state.live.isEmpty)
        #expect(state.strayDeallocations == 0)
    }

    @Test func everySlotDeclined() {
        let allocator = RecordingAllocator { _ in false }
        do {
            let ring = ByteRing(slotCount: 3, slotCapacity: 7, allocator: allocator)
            #expect(ring.externalSlotCount == 0)
            #expect((0..<3).allSatisfy { !ring.isExternal($0) })
            Self.exercise(ring, rounds: 4)
            ring.releaseMemory()
            #expect(ring.reserve() == nil)
        }
        let state = allocator.snapshot
        #expect(state.allocateCalls.count == 3)
        #expect(state.deallocateCalls.isEmpty)
    }
}
