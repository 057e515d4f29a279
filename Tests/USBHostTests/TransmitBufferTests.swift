import ByteRing
import CLibUSB
import Dispatch
import IAPLink
import IAPTransport
import Testing
import TestThreads
@testable import USBHost
import USBDescriptors
import USBTransport

/// The tests block on the fake libusb's queues and wait for its events: each on a thread of
/// its own (`.ownThread`).
@Suite("OUT frames sent from transmit buffers in device memory", .ownThread)
struct TransmitBufferTests {
    /// A buffer from the pipe's pool holding `bytes`.
    static func filled(_ pool: PacketBufferPool, _ bytes: [UInt8]) throws -> PacketBuffer {
        let buffer = try #require(pool.take())
        bytes.withUnsafeBytes { buffer.append(RawSpan(_unsafeBytes: $0)) }
        return buffer
    }

    @Test("a frame laid out in a transmit buffer is submitted from where it lies, and held until its transfer ends")
    func sentInPlace() throws {
        let harness = try Harness()
        try harness.onQueue {
            let pool = try #require(harness.transport.pipe.transmitBuffers)
            #expect(pool.bufferCount == BulkPipe.initialTransmitBuffers)
            #expect(pool.limit == USBContextOptions().transmitBuffers)
            #expect(harness.transport.capability(PacketBufferPool.self) === pool, "the link finds the pool through the transport")
            let buffer = try Self.filled(pool, Array(0..<100))
            let address = buffer.withSpan { $0.withUnsafeBytes { $0.baseAddress } }
            harness.transport.send(frame: .buffer(TransmitBuffer(buffer)))
            #expect(buffer.pendingTransmissions == 1)
            let transfer = try #require(harness.fake.pendingTransfers(in: false).first)
            #expect(UnsafeRawPointer(transfer.pointee.buffer) == address, "the transfer reads the buffer itself: no copy")
            #expect(harness.fake.isDeviceMemory(UnsafeRawPointer(transfer.pointee.buffer!)))
            #expect(pool.buffersInUse == 1)

            let sent = try #require(harness.fake.completeOut())
            #expect(sent.bytes == Array(0..<100))
            #expect(buffer.pendingTransmissions == 0, "the transport is done with it")
            let statistics = harness.transport.pipe.statistics
            #expect(statistics.bytesSentInPlace == 100)
            #expect(statistics.bytesCopiedOut == 0)
            #expect(statistics.transmitBuffers == pool.bufferCount)
        }
    }

    @Test("array frames are still copied into a slot, and counted as copied")
    func arraysAreCopied() throws {
        let harness = try Harness()
        harness.onQueue {
            harness.transport.send(frame: .bytes([1, 2, 3]))
            #expect(harness.fake.completeOut()?.bytes == [1, 2, 3])
            #expect(harness.transport.pipe.statistics.bytesCopiedOut == 3)
            #expect(harness.transport.pipe.statistics.bytesSentInPlace == 0)
        }
    }

    @Test("buffer and array frames go out in the order they were sent, through waiting when every transfer is busy")
    func orderKeptThroughWaiting() throws {
        let harness = try Harness()
        try harness.onQueue {
            let pool = try #require(harness.transport.pipe.transmitBuffers)
            for index in 0..<USBContextOptions().outTransfers { harness.transport.send([UInt8(index)]) }
            let waitingBuffer = try Self.filled(pool, [0xAA, 0xBB])
            harness.transport.send(frame: .buffer(TransmitBuffer(waitingBuffer)))
            harness.transport.send([0xCC])
            #expect(waitingBuffer.pendingTransmissions == 1, "waiting counts as pending: the link must not rewrite it")
            var sent: [[UInt8]] = []
            while let out = harness.fake.completeOut() { sent.append(out.bytes) }
            #expect(sent == (0..<USBContextOptions().outTransfers).map { [UInt8($0)] } + [[0xAA, 0xBB], [0xCC]])
            #expect(waitingBuffer.pendingTransmissions == 0)
        }
    }

    @Test("a buffer that waited for a slot is let go when its transfer ends, even while frames behind it still wait")
    func waitedBufferIsLetGo() throws {
        let harness = try Harness()
        try harness.onQueue {
            let pool = try #require(harness.transport.pipe.transmitBuffers)
            let transfers = USBContextOptions().outTransfers
            for index in 0..<transfers { harness.transport.send([UInt8(index)]) }
            harness.transport.send(frame: .buffer(TransmitBuffer(try Self.filled(pool, [0xAA]))))
            for index in 0...transfers { harness.transport.send([UInt8(0x80 + index)]) } // one more than the slots
            #expect(pool.buffersInUse == 1)
            // The first completion submits the buffer; the next ones finish it and submit the
            // frames behind it, which keep the waiting line alive.
            for _ in 0...transfers { harness.fake.completeOut() }
            #expect(harness.transport.pipe.statistics.bytesSentInPlace == 1)
            #expect(harness.fake.pendingTransfers(in: false).count == transfers)
            #expect(pool.buffersInUse == 0, "nothing holds the buffer once it is sent: the pool may hand it out again")
        }
    }

    @Test("at close, waiting buffers are given back and held ones keep their bytes after the device memory is freed")
    func closeGivesEverythingBack() throws {
        let harness = try Harness()
        let (held, waiting) = try harness.onQueue { () throws -> (PacketBuffer, PacketBuffer) in
            let pool = try #require(harness.transport.pipe.transmitBuffers)
            for _ in 0..<USBContextOptions().outTransfers { harness.transport.send([0]) }
            let held = try Self.filled(pool, [9, 8, 7]) // the link still holds it: not acknowledged
            let waiting = try Self.filled(pool, [6, 5])
            harness.transport.send(frame: .buffer(TransmitBuffer(waiting)))
            return (held, waiting)
        }
        harness.transport.cancel()
        #expect(harness.events.waitForClose())
        harness.onQueue {
            #expect(waiting.pendingTransmissions == 0, "a frame dropped at close is not pending for ever")
            #expect(!held.isExternal, "moved to the heap before the device memory went")
            #expect(held.copiedBytes() == [9, 8, 7])
            harness.fake.state.withLock { #expect($0.deviceMemoryLive == 0) }
        }
    }

    @Test("without device memory there are no transmit buffers: frames go through the slots")
    func noDeviceMemoryNoBuffers() throws {
        let harness = try Harness { $0.state.withLock { $0.deviceMemory = false } }
        harness.onQueue {
            #expect(harness.transport.pipe.transmitBuffers == nil)
            #expect(harness.transport.capability(PacketBufferPool.self) == nil)
        }
    }

    @Test("with the option at 0 there are none either")
    func optionOff() throws {
        var options = USBContextOptions()
        options.transmitBuffers = 0
        let harness = try Harness(options: options)
        harness.onQueue { #expect(harness.transport.pipe.transmitBuffers == nil) }
    }
}
