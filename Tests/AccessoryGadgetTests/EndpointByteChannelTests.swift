@testable import AccessoryGadget
import AccessorySimulator
import Dispatch
import Glibc
import IAPTransport
import Synchronization
import Testing
import TestSupport
import TestThreads

/// The GadgetFS native channel over pipes in place of the endpoint files: one pipe carries what
/// the "host" sends (read by the channel's OUT thread), the other what the channel writes.
/// The tests block in read() on the pipes: each on a thread of its own (`.ownThread`); their
/// awaits resume there too.
@Suite("EndpointByteChannel over pipes", .timeLimit(.minutes(1)), .ownThread)
struct EndpointByteChannelTests {
    final class Wire: Sendable {
        let channel: EndpointByteChannel
        let hostWrites: Int32 // write end of the pipe the channel reads
        let hostReads: Int32 // read end of the pipe the channel writes
        let events = AsyncStream<ByteChannelEvent>.makeStream()
        let queue = DispatchQueue(label: "test.endpoint-channel")

        init(capacity: Int = 1 << 20) throws {
            var toChannel: [Int32] = [0, 0], fromChannel: [Int32] = [0, 0]
            guard pipe(&toChannel) == 0, pipe(&fromChannel) == 0 else { throw TransportError("pipe") }
            channel = try EndpointByteChannel(inEndpoint: fromChannel[1], outEndpoint: toChannel[0], maxPacket: 512,
                                              capacity: capacity, description: "test channel")
            hostWrites = toChannel[1]
            hostReads = fromChannel[0]
            let continuation = events.continuation
            channel.activate(queue: queue) { continuation.yield($0) }
        }

        func send(_ bytes: [UInt8]) {
            var offset = 0
            while offset < bytes.count {
                let written = bytes.withUnsafeBytes { write(hostWrites, $0.baseAddress! + offset, bytes.count - offset) }
                precondition(written > 0)
                offset += written
            }
        }

        func receive(_ count: Int) -> [UInt8] {
            expectMayBlock("Wire.receive")
            var bytes: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 65_536)
            while bytes.count < count {
                let got = read(hostReads, &buffer, min(buffer.count, count - bytes.count))
                precondition(got > 0)
                bytes += buffer.prefix(got)
            }
            return bytes
        }

        /// Everything readable now, consumed in place on the channel's queue.
        func drain() -> [UInt8] {
            queue.sync {
                var bytes: [UInt8] = []
                while let chunk = channel.withReadableBytes({ span in (span.byteCount, span.withUnsafeBytes { Array($0) }) }) { bytes += chunk }
                return bytes
            }
        }

        deinit {
            channel.close()
            _ = close(hostWrites)
            _ = close(hostReads)
        }
    }

    static func pattern(_ count: Int, seed: Int) -> [UInt8] { bytes(count) { UInt8(truncatingIfNeeded: $0 &* 13 &+ seed) } }

    @Test("what the host sends becomes readable in order; what is written reaches the host in order")
    func bothDirections() async throws {
        let wire = try Wire()
        let inbound = Self.pattern(300_000, seed: 1)
        DispatchQueue(label: "test.sender").async { wire.send(inbound) }
        var received: [UInt8] = []
        var events = wire.events.stream.makeAsyncIterator()
        while received.count < inbound.count {
            guard let event = await events.next() else { break }
            if event == .readable { received += wire.drain() }
            received += wire.drain()
        }
        #expect(received == inbound)
        let outbound = Self.pattern(200_000, seed: 2)
        var offered = 0
        while offered < outbound.count {
            let taken = wire.queue.sync { wire.channel.write(outbound[offered...]) }
            offered += taken
            if taken == 0 { _ = await events.next() } // .writable
        }
        // 512 is the packet size: a chunk of a multiple of it is written in two pieces, which the
        // stream does not see.
        #expect(wire.receive(outbound.count) == outbound)
        // The count moves after each write returns; `.writable` follows once nothing is unsent.
        while wire.queue.sync(execute: { wire.channel.bytesDelivered }) < outbound.count {
            guard await events.next() != nil else { break }
        }
        #expect(wire.queue.sync { wire.channel.bytesDelivered } == outbound.count)
    }

    @Test("a reader that stops reading stops the channel reading: it holds its capacity and one read")
    func backPressure() async throws {
        let wire = try Wire(capacity: 8_192)
        let flood = Self.pattern(1 << 20, seed: 3)
        let sent = Atomic<Int>(0)
        let writer = DispatchQueue(label: "test.flood")
        // The pipe holds 64 KiB; the channel stops reading past its capacity, so this blocks.
        writer.async {
            for start in stride(from: 0, to: flood.count, by: 4_096) {
                wire.send(Array(flood[start..<(start + 4_096)]))
                sent.add(4_096, ordering: .relaxed)
            }
        }
        var events = wire.events.stream.makeAsyncIterator()
        _ = await events.next() // .readable: the channel has read something
        // Bounded, however long the flood goes on: capacity plus one 64 KiB read.
        let held = wire.queue.sync { wire.channel.readableByteCount }
        #expect(held <= 8_192 + EndpointByteChannel.readSize)
        var received = wire.drain()
        var largest = held
        while received.count < flood.count {
            _ = await events.next()
            largest = max(largest, wire.queue.sync { wire.channel.readableByteCount })
            received += wire.drain()
        }
        #expect(received == flood)
        #expect(largest <= 8_192 + EndpointByteChannel.readSize, "never more held than the capacity and one read")
    }

    @Test("close wakes the threads blocked in read and write, joins them and says closed once")
    func closeJoinsBlockedThreads() async throws {
        let wire = try Wire(capacity: 1 << 20)
        // The writer blocks once the pipe is full (nobody reads the host side).
        let big = Self.pattern(512 * 1_024, seed: 4)
        _ = wire.queue.sync { wire.channel.write(big[...]) }
        wire.channel.close()
        var events = wire.events.stream.makeAsyncIterator()
        var closes = 0
        while let event = await events.next() {
            if case .closed(nil) = event { closes += 1; break }
        }
        #expect(closes == 1)
        #expect(wire.queue.sync { wire.channel.write([1, 2, 3][...]) } == 0)
    }
}
