import Dispatch
import IAPTransport
import Synchronization
import Testing
import TestThreads

/// Events of one side of a channel, waited on without sleeping.
final class ChannelProbe: Sendable {
    private let events = Mutex<[ByteChannelEvent]>([])
    private let signal = DispatchSemaphore(value: 0)
    let queue = DispatchQueue(label: "test.channel-probe")

    func attach(_ channel: any ByteChannel) {
        channel.activate(queue: queue) { [self] event in
            events.withLock { $0.append(event) }
            signal.signal()
        }
    }

    /// Waits for an event matching `predicate` (one already seen counts) and removes it.
    func wait(for predicate: (ByteChannelEvent) -> Bool) -> Bool {
        expectMayBlock("ChannelProbe.wait")
        let deadline = DispatchTime.now() + 10
        while true {
            let found = events.withLock { seen -> Bool in
                guard let index = seen.firstIndex(where: predicate) else { return false }
                seen.remove(at: index)
                return true
            }
            if found { return true }
            if signal.wait(timeout: deadline) == .timedOut { return false }
        }
    }

    func sync<T>(_ body: () -> T) -> T { queue.sync(execute: body) }
}

/// The tests block waiting for channel events: each on a thread of its own (`.ownThread`).
@Suite("MemoryByteChannel: the in-process native transport", .ownThread)
struct ByteChannelTests {
    @Test("a write takes what fits, the rest waits for the reader; nothing is lost or reordered")
    func backPressureBothWays() {
        let (host, accessory) = MemoryByteChannel.pair(capacity: 1_000)
        let hostProbe = ChannelProbe(), accessoryProbe = ChannelProbe()
        hostProbe.attach(host)
        accessoryProbe.attach(accessory)
        let payload = (0..<2_500).map { UInt8(truncatingIfNeeded: $0 &* 13) }
        var written = hostProbe.sync { host.write(payload[...]) }
        #expect(written == 1_000) // the peer's buffer is full
        #expect(hostProbe.sync { host.write(payload[written...]) } == 0)
        #expect(!hostProbe.sync { host.isWritable })
        #expect(hostProbe.sync { host.bytesDelivered } == 1_000)
        #expect(accessoryProbe.wait { $0 == .readable })

        var received: [UInt8] = []
        while received.count < payload.count {
            // Consume part of what is readable, in place: room appears and the writer hears it.
            let took = accessoryProbe.sync {
                accessory.withReadableBytes { span -> (consumed: Int, result: Int) in
                    let count = min(300, span.byteCount)
                    span.withUnsafeBytes { received.append(contentsOf: $0.prefix(count)) }
                    return (count, count)
                } ?? 0
            }
            if took == 0 {
                #expect(accessoryProbe.wait { $0 == .readable })
                continue
            }
            if written < payload.count, hostProbe.wait(for: { $0 == .writable }) {
                written += hostProbe.sync { host.write(payload[written...]) }
            }
        }
        #expect(received == payload)
        #expect(accessoryProbe.sync { accessory.readableByteCount } == 0)
    }

    @Test("closing ends the stream on both sides; what was received stays readable")
    func closeKeepsReceivedBytes() {
        let (host, accessory) = MemoryByteChannel.pair(capacity: 100)
        let hostProbe = ChannelProbe(), accessoryProbe = ChannelProbe()
        hostProbe.attach(host)
        accessoryProbe.attach(accessory)
        #expect(accessoryProbe.sync { accessory.write([1, 2, 3][...]) } == 3)
        accessoryProbe.sync { accessory.close() }
        #expect(accessoryProbe.wait { $0 == .closed(nil) })
        #expect(hostProbe.wait { $0 == .closed(nil) })
        #expect(hostProbe.sync { host.write([9][...]) } == 0)
        #expect(!hostProbe.sync { host.isWritable })
        let bytes = hostProbe.sync { host.withReadableBytes { span in (span.byteCount, span.withUnsafeBytes { Array($0) }) } }
        #expect(bytes == [1, 2, 3])
        #expect(hostProbe.sync { host.readableByteCount } == 0)
    }

    @Test("a channel activated after bytes and the close arrived hears both")
    func lateActivation() {
        let (host, accessory) = MemoryByteChannel.pair(capacity: 100)
        #expect(host.write([7, 8][...]) == 2)
        host.close()
        let probe = ChannelProbe()
        probe.attach(accessory)
        #expect(probe.wait { $0 == .readable })
        #expect(probe.wait { $0 == .closed(nil) })
        #expect(probe.sync { accessory.readableByteCount } == 2)
    }
}
