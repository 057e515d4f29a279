import ByteRing
import CLibUSB
import Dispatch
import IAPTransport
import Synchronization
import Testing
import TestThreads
@testable import USBHost
import USBDescriptors
import USBTransport

/// A reader that keeps the leases it is lent while `keeping` is set, as a session whose
/// application has not read yet does.
final class LeaseKeeper: Sendable {
    struct Kept { var lease: SlotLease; var bytes: [UInt8]; var address: UInt? }
    private let state = Mutex<(keeping: Bool, kept: [Kept], closes: Int)>((true, [], 0))

    var handler: @Sendable (TransportEvent) -> Void {
        { [self] event in
            state.withLock { state in
                switch event {
                case let .lent(lease):
                    let (bytes, address) = lease.lease.withUnsafeBytes { (Array($0), $0.baseAddress.map { UInt(bitPattern: $0) }) }
                    if state.keeping { state.kept.append(Kept(lease: lease.lease, bytes: bytes, address: address)) }
                case .received, .borrowed: Issue.record("the pipe was asked to lend its slots")
                case .closed: state.closes += 1
                }
            }
        }
    }
    var keeping: Bool {
        get { state.withLock { $0.keeping } }
        set { state.withLock { $0.keeping = newValue } }
    }
    var kept: [Kept] { state.withLock { $0.kept } }
    var closes: Int { state.withLock { $0.closes } }
    /// Lets go of the kept leases (the application read them).
    func release() { state.withLock { $0.kept.removeAll() } }
}

/// The tests block on the fake libusb's queues and wait for its events: each on a thread of
/// its own (`.ownThread`).
@Suite("IN slots lent to the reader", .ownThread)
struct LentSlotTests {
    struct Rig {
        let harness: Harness
        let keeper = LeaseKeeper()
        var pipe: USBAccessoryTransport { harness.transport.pipe }
        var pendingIn: Int { harness.fake.pendingTransfers(in: true).count }

        init() throws {
            // The harness's own handler is replaced: a second activation would be ignored, so
            // open a fresh transport with the keeper as its reader.
            harness = try Harness(activate: false)
            let (transport, keeper, queue) = (harness.transport, keeper, harness.queue)
            queue.sync { transport.activate(queue: queue, handler: keeper.handler) }
            queue.sync {}
        }
    }

    @Test("a kept lease keeps its bytes in the transfer's own slot, and the slot goes back to the kernel once the reader lets go")
    func aKeptLeaseHoldsItsSlot() throws {
        let rig = try Rig()
        try rig.harness.onQueue {
            #expect(rig.pendingIn == 4)
            let buffer = try #require(rig.harness.fake.completeIn([0xFF, 0x5A, 0x00, 0x09]))
            do {
                let kept = try #require(rig.keeper.kept.last)
                #expect(kept.address == UInt(bitPattern: buffer), "the reader holds the kernel's slot: no copy")
                #expect(kept.bytes == [0xFF, 0x5A, 0x00, 0x09])
            }
            #expect(rig.pendingIn == 3, "a lent slot is not resubmitted")
            #expect(rig.pipe.statistics.inSlotsLent == 1)

            rig.keeper.keeping = false
            rig.keeper.release()
            rig.harness.fake.completeIn([1, 2, 3])
            #expect(rig.pendingIn == 4, "released leases give their slots back at the next completion")
            #expect(rig.pipe.statistics.inSlotsEvacuated == 0)
        }
    }

    @Test("a reader that holds more than half the slots gets the oldest bytes moved out of their slot, so the pipe never stops")
    func aLaggingReaderCannotStallThePipe() throws {
        let rig = try Rig()
        try rig.harness.onQueue {
            var buffers: [UnsafeMutableRawPointer] = []
            for round in 0..<10 {
                buffers.append(try #require(rig.harness.fake.completeIn([UInt8](repeating: UInt8(round), count: 100 + round))))
                #expect(rig.pendingIn >= 2, "at least half the IN transfers stay queued")
            }
            let kept = rig.keeper.kept
            #expect(kept.count == 10)
            for (round, entry) in kept.enumerated() {
                // Every lease still reads what arrived, moved or not.
                #expect(entry.lease.withUnsafeBytes { Array($0) } == [UInt8](repeating: UInt8(round), count: 100 + round))
            }
            #expect(kept.prefix(8).allSatisfy { $0.lease.isEvacuated }, "the oldest were moved out")
            #expect(kept.suffix(2).allSatisfy { !$0.lease.isEvacuated }, "the newest stay in their slots")
            #expect(rig.pipe.statistics.inSlotsEvacuated == 8)
            #expect(rig.pipe.statistics.bytesEvacuated == (0..<8).reduce(0) { $0 + 100 + $1 })
            // The slots moved out of were reused: the kernel wrote later bytes over them.
            #expect(Set(buffers).count < buffers.count)
        }
    }

    @Test("leases still held when the pipe closes keep their bytes; the device memory is given back")
    func leasesOutliveTheClose() throws {
        let rig = try Rig()
        let lease = try rig.harness.onQueue { () throws -> SlotLease in
            rig.harness.fake.completeIn([9, 8, 7, 6])
            return try #require(rig.keeper.kept.last?.lease)
        }
        rig.harness.transport.cancel()
        rig.harness.settle()
        rig.harness.settle()
        #expect(rig.keeper.closes == 1)
        rig.harness.onQueue {
            #expect(lease.isEvacuated)
            #expect(lease.withUnsafeBytes { Array($0) } == [9, 8, 7, 6])
            #expect(rig.harness.fake.log.contains("free device memory"))
            #expect(rig.pipe.statistics.inSlotsEvacuated == 1)
            #expect(rig.pipe.statistics.bytesEvacuated == 4)
        }
    }

    @Test("empty and cancelled completions between kept leases are skipped, and every slot comes back in order once the reader lets go")
    func emptyCompletionsAmongKeptLeases() throws {
        let rig = try Rig()
        rig.harness.onQueue {
            rig.harness.fake.completeIn([1, 1])
            rig.harness.fake.completeIn([]) // a zero-length packet: nothing to lend
            #expect(rig.keeper.kept.map(\.bytes) == [[1, 1]], "only the slot with bytes is lent")
            #expect(rig.pendingIn == 2, "the empty slot waits behind the kept one: slots go back in order")
            rig.keeper.keeping = false
            rig.keeper.release()
            rig.harness.fake.completeIn([], status: LIBUSB_TRANSFER_CANCELLED)
            #expect(rig.pendingIn == 4, "the released lease lets all three slots go back")
            #expect(rig.pipe.statistics.inSlotsLent == 1)
            #expect(rig.pipe.statistics.inSlotsEvacuated == 0)
        }
    }
}

/// The tests block on the fake libusb's queues and wait for its events: each on a thread of
/// its own (`.ownThread`).
@Suite("IN slots borrowed for the call only", .ownThread)
struct BorrowedSlotTests {
    @Test("without lending, the handler borrows the slot for its call and the slot is resubmitted at once")
    func borrowedSlotsGoBackAtOnce() throws {
        let harness = try Harness(activate: false)
        let seen = Mutex<[(bytes: [UInt8], lent: Bool)]>([])
        let pipe = harness.transport.pipe
        harness.queue.sync {
            pipe.activate(queue: harness.queue) { event in
                switch event {
                case let .borrowed(bytes): seen.withLock { $0.append((bytes.withUnsafeBytes { Array($0) }, false)) }
                case let .lent(lease): seen.withLock { $0.append((lease.withUnsafeBytes { Array($0) }, true)) }
                case .received, .closed: break
                }
            }
        }
        harness.queue.sync {}
        harness.onQueue {
            harness.fake.completeIn([4, 5, 6])
            harness.fake.completeIn([7])
            #expect(harness.fake.pendingTransfers(in: true).count == 4, "borrowed slots are resubmitted after the call")
        }
        let events = seen.withLock { $0 }
        #expect(events.map(\.bytes) == [[4, 5, 6], [7]])
        #expect(events.allSatisfy { !$0.lent }, "lending is opt-in")
        #expect(harness.onQueue { pipe.statistics.inSlotsLent } == 0)
    }
}
