import ByteRing
import Testing

@Suite("Packet buffers and their pool")
struct PacketBufferTests {
    static func fill(_ buffer: PacketBuffer, _ bytes: [UInt8]) {
        bytes.withUnsafeBytes { buffer.append(RawSpan(_unsafeBytes: $0)) }
    }

    @Test("a buffer lays bytes out after headroom and rewrites them in place")
    func layOutAndRewrite() {
        let buffer = PacketBuffer(capacity: 16)
        buffer.appendZeros(3)
        Self.fill(buffer, [1, 2, 3])
        buffer.append(9)
        #expect(buffer.count == 7)
        #expect(buffer.freeCapacity == 9)
        buffer.withMutableSpan { span in span.storeBytes(of: 0xAB, toByteOffset: 0, as: UInt8.self) }
        #expect(buffer.copiedBytes() == [0xAB, 0, 0, 1, 2, 3, 9])
        buffer.removeAll()
        #expect(buffer.count == 0 && buffer.capacity == 16)
    }

    @Test("the pool hands out only buffers nobody holds, and each comes back empty once let go")
    func heldBuffersAreNotHandedOutAgain() throws {
        let pool = PacketBufferPool(count: 2, capacity: 32, allocator: nil)
        var first = pool.take()
        Self.fill(try #require(first), [1, 2])
        let second = try #require(pool.take())
        #expect(first !== second)
        #expect(pool.take() == nil, "both are held")
        #expect(pool.exhausted == 1)
        #expect(pool.buffersInUse == 2)
        first = nil
        let again = try #require(pool.take())
        #expect(again.count == 0, "emptied when handed out again")
        #expect(pool.taken == 3)
        _ = second
    }

    @Test("the pool's memory is the allocator's; a declined buffer is left out")
    func allocatorMemory() throws {
        let allocator = RecordingAllocator { $0 < 3 }
        let pool = PacketBufferPool(count: 5, capacity: 64, allocator: allocator)
        #expect(pool.bufferCount == 3, "the allocator declined the fourth: the pool stops there")
        let buffer = try #require(pool.take())
        #expect(buffer.isExternal)
        let address = buffer.withSpan { $0.withUnsafeBytes { $0.baseAddress } }
        #expect(allocator.snapshot.served.contains { UnsafeRawPointer($0) == address })
    }

    @Test("the pool grows while every buffer is held, up to its limit, and no further once the allocator declines")
    func growsOnDemand() throws {
        let allocator = RecordingAllocator { $0 < 4 }
        let pool = PacketBufferPool(initial: 1, limit: 6, capacity: 64, allocator: allocator)
        #expect(pool.bufferCount == 1)
        var held: [PacketBuffer] = []
        for _ in 0..<4 { held.append(try #require(pool.take())) }
        #expect(pool.bufferCount == 4, "grown one at a time, only when none was free")
        #expect(pool.take() == nil, "the allocator declined the fifth")
        #expect(allocator.snapshot.allocateCalls.count == 5)
        #expect(pool.take() == nil)
        #expect(allocator.snapshot.allocateCalls.count == 5, "not asked again after it declined")
        held.removeFirst()
        #expect(pool.take() != nil, "a buffer let go is handed out again")

        let heap = PacketBufferPool(initial: 0, limit: 2, capacity: 8, allocator: nil)
        let first = try #require(heap.take())
        let second = try #require(heap.take())
        #expect(heap.take() == nil, "the limit")
        #expect(first !== second && heap.bufferCount == 2)
    }

    @Test("releasing the memory moves held buffers to the heap first, so their holders keep their bytes")
    func releaseEvacuatesHeldBuffers() throws {
        let allocator = RecordingAllocator { _ in true }
        let pool = PacketBufferPool(count: 3, capacity: 64, allocator: allocator)
        let held = try #require(pool.take())
        Self.fill(held, [7, 7, 7, 7])
        pool.releaseMemory()
        #expect(allocator.snapshot.live.isEmpty, "every buffer's memory went back")
        #expect(allocator.snapshot.strayDeallocations == 0)
        #expect(!held.isExternal)
        #expect(held.copiedBytes() == [7, 7, 7, 7])
        #expect(pool.bytesEvacuated == 4)
        #expect(pool.take() == nil, "nothing handed out after the release")
        pool.releaseMemory() // idempotent
        #expect(allocator.snapshot.deallocateCalls.count == 3)
    }
}
