import Dispatch
import Glibc
import IAPTransport
import Testing
import TestSupport
import TestThreads

/// The tests wait for the channel's events on semaphores: each on a thread of its own.
@Suite("SocketByteChannel", .ownThread)
struct SocketByteChannelTests {
    /// A guard against hangs, never a way to synchronise.
    static let guardTimeout: DispatchTimeInterval = .seconds(20)

    /// Through iapd over Bluetooth, a client's transfer was ended by its stall watchdog in a slow
    /// guest: iapd's channel read the client's socket again only once its 1 MiB had drained to
    /// the last byte, and at 50 kB/s a session's bytes then went untaken for 20 s.
    @Test("a full ring reads again once a sixteenth is free, not once it is empty; every byte comes in order across the wrap")
    func readsAgainOnceRoomIsFree() throws {
        var ends: [Int32] = [-1, -1]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &ends) == 0)
        let capacity = 64 * 1_024
        let channel = SocketByteChannel(descriptor: ends[0], description: "test", bufferCapacity: capacity)
        #expect(channel.resumeRoom == 4_096)
        let queue = DispatchQueue(label: "channel")
        let readable = DispatchSemaphore(value: 0)
        queue.sync { channel.activate(queue: queue) { event in if case .readable = event { readable.signal() } } }

        // The peer writes eight rings' worth, blocking while the channel holds it off.
        let total = capacity * 8
        let pattern = bytes(total) { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 11) }
        let peer = ends[1]
        let written = DispatchSemaphore(value: 0)
        DispatchQueue(label: "peer").async {
            var offset = 0
            while offset < total {
                let count = pattern[offset...].withUnsafeBytes { write(peer, $0.baseAddress, $0.count) }
                guard count > 0 else { break }
                offset += count
            }
            _ = close(peer)
            written.signal()
        }

        /// Waits for readable events until `condition` holds on the queue; false after a wait
        /// with no event at all.
        func waitUntil(_ condition: @escaping () -> Bool) -> Bool {
            while !queue.sync(execute: condition) {
                guard readable.wait(timeout: .now() + Self.guardTimeout) == .success else { return false }
            }
            return true
        }

        // 1. The ring fills and the channel stops reading.
        #expect(waitUntil { channel.readableByteCount == capacity })
        // 2. Half is taken: the channel reads again before the ring is empty.
        var received: [UInt8] = []
        queue.sync {
            _ = channel.withReadableBytes { span -> (consumed: Int, result: Void) in
                span.withUnsafeBytes { received.append(contentsOf: $0.prefix(capacity / 2)) }
                return (capacity / 2, ())
            }
        }
        #expect(waitUntil { channel.readableByteCount > capacity / 2 }, "the channel did not read again with half its ring free")
        // 3. The rest, taken in pieces of every size: the lent bytes cross the ring's wrap.
        var generator = SplitMix64(seed: 22)
        while received.count < total {
            let took = queue.sync {
                channel.withReadableBytes { span -> (consumed: Int, result: Int) in
                    let count = min(span.byteCount, 1 + generator.next(below: 9_000))
                    span.withUnsafeBytes { received.append(contentsOf: $0.prefix(count)) }
                    return (count, count)
                }
            }
            if took == nil {
                guard readable.wait(timeout: .now() + Self.guardTimeout) == .success else { break }
            }
        }
        #expect(written.wait(timeout: .now() + Self.guardTimeout) == .success)
        #expect(received.count == total)
        #expect(received == pattern, "the bytes came out of order or changed")
        queue.sync { channel.close() }
    }
}
