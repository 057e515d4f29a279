import CLibUSB
import Dispatch
import IAPTransport
import Synchronization
import Testing
import TestThreads
@testable import USBHost
import USBDescriptors
import USBTransport

/// The USB transport's `DeviceReset` capability on the fake libusb: what is in flight is
/// cancelled, the reset runs on the setup queue only once libusb gave every transfer back, and
/// the pipe carries data again afterwards.
@Suite(.ownThread) struct DeviceResetTests {
    /// Resets through the capability and waits for its outcome.
    func reset(_ harness: Harness) throws -> TransportError? {
        expectMayBlock("DeviceResetTests.reset")
        let capability = try #require(harness.transport.capability(DeviceReset.self), "a USB transport can reset its device")
        let outcome = Mutex<TransportError??>(nil)
        let done = DispatchSemaphore(value: 0)
        capability.reset { error in
            dispatchPrecondition(condition: .onQueue(harness.queue))
            outcome.withLock { $0 = .some(error) }
            done.signal()
        }
        #expect(done.wait(timeout: .now() + 10) == .success, "the reset finished")
        return try #require(outcome.withLock { $0 })
    }

    @Test func aResetCancelsWhatIsInFlightThenResetsAndTheDataFlowsAgain() throws {
        let harness = try Harness()
        harness.onQueue { harness.transport.send([1, 2, 3]) }
        #expect(try reset(harness) == nil)
        let log = harness.fake.log
        let resetAt = try #require(log.firstIndex(of: "reset device"))
        #expect(log[..<resetAt].filter { $0 == "cancel 0x81" }.count == 4, "every IN transfer cancelled before the reset: \(log)")
        #expect(log[..<resetAt].contains("cancel 0x1"), "the OUT transfer cancelled before the reset: \(log)")
        harness.onQueue {
            #expect(harness.fake.pendingTransfers(in: true).count == 4, "the IN transfers are queued again")
            harness.fake.completeIn([0xFF, 0x55])
            harness.transport.send([4, 5])
            #expect(harness.fake.completeOut()?.bytes == [4, 5], "frames go out again")
        }
        #expect(harness.events.bytes == [0xFF, 0x55])
        #expect(harness.transport.pipe.statistics.deviceResets == 1)
        #expect(harness.events.closes.isEmpty, "the transport stays open")
    }

    @Test func aFailedResetClosesTheTransportAsDisconnected() throws {
        let harness = try Harness()
        harness.fake.state.withLock { $0.resetStatus = LIBUSB_ERROR_NOT_FOUND.rawValue }
        let error = try #require(try reset(harness))
        #expect(error.kind == .hungUp)
        #expect(error.description.contains("unplug and replug"))
        #expect(harness.events.waitForClose())
        #expect(harness.transport.pipe.statistics.deviceResets == 0)
    }

    @Test func aResetOfAClosedTransportIsRefused() throws {
        let harness = try Harness()
        harness.transport.cancel()
        #expect(harness.events.waitForClose())
        let error = try #require(try reset(harness))
        #expect(error.description.contains("is closed"))
        #expect(!harness.fake.log.contains("reset device"))
    }
}
