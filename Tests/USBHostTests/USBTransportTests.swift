import CLibUSB
import Dispatch
import IAPTransport
import Synchronization
import Testing
import TestThreads
@testable import USBHost
import USBDescriptors
import USBTransport

/// What a transport handed to its owner.
final class EventLog: @unchecked Sendable {
    struct Entry { var bytes: [UInt8]; var borrowedFrom: UInt? }
    private let lock = Mutex<([Entry], [TransportError?])>(([], []))
    let closedSignal = DispatchSemaphore(value: 0)

    var handler: @Sendable (TransportEvent) -> Void {
        { [self] event in
            switch event {
            case let .received(bytes): lock.withLock { $0.0.append(Entry(bytes: bytes, borrowedFrom: nil)) }
            case let .borrowed(bytes):
                let start = bytes.withSpan { span in span.withUnsafeBytes { $0.baseAddress.map { UInt(bitPattern: $0) } } }
                lock.withLock { $0.0.append(Entry(bytes: bytes.copied(), borrowedFrom: start)) }
            case let .lent(lease):
                let start = lease.lease.withUnsafeBytes { $0.baseAddress.map { UInt(bitPattern: $0) } }
                lock.withLock { $0.0.append(Entry(bytes: lease.copied(), borrowedFrom: start)) }
            case let .closed(error):
                lock.withLock { $0.1.append(error) }
                closedSignal.signal()
            }
        }
    }
    var entries: [Entry] { lock.withLock { $0.0 } }
    var bytes: [UInt8] { entries.flatMap(\.bytes) }
    var closes: [TransportError?] { lock.withLock { $0.1 } }

    /// Waits for the close (an event, with a generous limit so a bug fails instead of hanging).
    func waitForClose() -> Bool {
        expectMayBlock("EventLog.waitForClose")
        return closedSignal.wait(timeout: .now() + 10) == .success
    }
}

/// A context over the fake backend with the DJI device open and its transport activated.
struct Harness {
    let queue = DispatchQueue(label: "test.usb")
    let fake: FakeBackend
    let context: USBContext
    let transport: USBIAPTransport
    let events = EventLog()

    /// - Parameter activate: activates the transport with ``events`` as its handler.
    init(options: USBContextOptions = USBContextOptions(), activate: Bool = true, configure: (FakeBackend) -> Void = { _ in }) throws {
        fake = FakeBackend(queue: queue)
        configure(fake)
        context = USBContext(backend: fake, queue: queue, function: .iAP2, options: options)
        transport = try Harness.open(context)
        guard activate else { return }
        let (transport, events, queue) = (self.transport, self.events, self.queue)
        queue.sync { transport.activate(queue: queue, handler: events.handler) }
        queue.sync {} // activation hops once
    }

    static func open(_ context: USBContext) throws -> USBIAPTransport {
        expectMayBlock("Harness.open")
        let result = Mutex<Result<USBAccessoryTransport, USBHostError>?>(nil)
        let done = DispatchSemaphore(value: 0)
        context.queue.sync {
            let device = try! context.devices()[0]
            context.open(device) { outcome in
                result.withLock { $0 = outcome }
                done.signal()
            }
        }
        guard done.wait(timeout: .now() + 10) == .success else { throw USBHostError(.io, "open did not finish") }
        return USBIAPTransport(try result.withLock { $0! }.get())
    }

    /// Runs `body` on the event queue (where libusb would call back).
    func onQueue<T>(_ body: () throws -> T) rethrows -> T { try queue.sync(execute: body) }

    /// Lets hops to the setup queue and back finish.
    func settle() {
        queue.sync {}
        context.setupQueue.sync {}
        queue.sync {}
    }
}

/// The tests block on the fake libusb's queues and wait for its events: each on a thread of
/// its own (`.ownThread`).
@Suite(.ownThread) struct USBOpenTests {
    func openError(_ configure: (FakeBackend) -> Void, options: USBContextOptions = USBContextOptions()) -> USBHostError? {
        let queue = DispatchQueue(label: "test.usb.open")
        let fake = FakeBackend(queue: queue)
        configure(fake)
        let context = USBContext(backend: fake, queue: queue, function: .iAP2, options: options)
        do {
            _ = try Harness.open(context)
            return nil
        } catch let error as USBHostError {
            #expect(fake.state.withLock { $0.openHandles } == 0, "a failed open must close the device")
            return error
        } catch {
            return nil
        }
    }

    /// The device is opened on the setup queue (the real backend reads its configuration there),
    /// and an open still in flight keeps libusb's context alive through a shutdown: it ends
    /// first, its transport dropped unused gives the device back, and only then the context exits.
    @Test func aShutdownDuringAnOpenWaitsForTheOpenToEnd() throws {
        let queue = DispatchQueue(label: "test.usb.open.shutdown")
        let fake = FakeBackend(queue: queue)
        let gate = DispatchSemaphore(value: 0)
        fake.openGate.withLock { $0 = gate }
        let context = USBContext(backend: fake, queue: queue, function: .iAP2, options: USBContextOptions())
        let opened = DispatchSemaphore(value: 0)
        queue.sync {
            let device = try! context.devices()[0]
            context.open(device) { result in
                if case .success = result { opened.signal() } // the transport is dropped here, unused
            }
            context.shutdown()
        }
        #expect(!context.waitUntilExited(timeout: .now() + .milliseconds(50)), "libusb must outlive an open in flight")
        #expect(!fake.log.contains("shutdown"))
        gate.signal()
        #expect(opened.wait(timeout: .now() + 10) == .success)
        #expect(context.waitUntilExited(timeout: .now() + 10))
        #expect(fake.log.filter { $0 != "free device memory" } == ["open", "claim 0", "release 0", "close", "shutdown"])
        #expect(fake.state.withLock { $0.openHandles } == 0)
    }

    @Test func openingReadsTheStringsAndClaimsOnlyTheIAPInterface() throws {
        let harness = try Harness()
        #expect(harness.transport.description == "usb 1-1.2 2ca3:1002 Goggles 3 (serial GG3-0042)")
        #expect(harness.transport.pipe.device.manufacturer == "DJI")
        #expect(harness.fake.log == ["open", "claim 0"])
        #expect(harness.transport.kind == .usb)
    }

    @Test("IN transfers are 64 KiB where usbfs reports scatter-gather, 16 KiB elsewhere, or what the options say",
          arguments: [(UInt32?.none, Int?.none, 16_384), (0x04 | 0x02 | 0x01, nil, 16_384), (0x3D, nil, 65_536),
                      (0x3D, 32_768, 32_768), (nil, 4_096, 4_096)] as [(UInt32?, Int?, Int)])
    func inTransferSizeFollowsTheController(capabilities: UInt32?, option: Int?, expected: Int) throws {
        var options = USBContextOptions()
        options.inTransferSize = option
        let harness = try Harness(options: options) { $0.state.withLock { $0.usbfsCapabilities = capabilities } }
        let lengths = harness.onQueue {
            harness.fake.pending.filter { $0.pointee.endpoint & 0x80 != 0 }.map { Int($0.pointee.length) }
        }
        #expect(lengths == Array(repeating: expected, count: USBContextOptions().inTransfers))
        #expect(harness.onQueue { harness.transport.pipe.statistics.inTransferSize } == expected)
    }

    @Test func permissionDeniedNamesTheUdevRule() throws {
        let error = try #require(openError { $0.state.withLock { $0.openStatus = LIBUSB_ERROR_ACCESS.rawValue } })
        #expect(error.kind == .access)
        #expect(error.message == "cannot open usb 1-1.2 2ca3:1002 (/dev/bus/usb/001/005): permission denied")
        #expect(error.advice?.contains("rules.d/70-mfi-accessory.rules") == true)
        #expect(error.advice?.contains("udevadm control --reload-rules") == true)
    }

    @Test func aBusyInterfaceNamesAnotherProcess() throws {
        let error = try #require(openError { $0.state.withLock { $0.claimStatus = LIBUSB_ERROR_BUSY.rawValue } })
        #expect(error.kind == .busy)
        #expect(error.message.hasSuffix("is in use by another process, such as usbmuxd or a second iapctl"))
        #expect(error.advice == "stop the other program (find it with: fuser -v /dev/bus/usb/001/005) and try again")
    }

    @Test func aKernelDriverIsDetachedOrNamed() throws {
        let queue = DispatchQueue(label: "test.usb.detach")
        let fake = FakeBackend(queue: queue)
        fake.state.withLock { $0.kernelDriver = "usbfs-hog" }
        let context = USBContext(backend: fake, queue: queue, function: .iAP2, options: USBContextOptions())
        _ = try Harness.open(context)
        queue.sync {} // the queue lets go of the open's closures, and with them the transport
        #expect(Array(fake.log.prefix(3)) == ["open", "detach 0", "claim 0"])
        // An opened transport dropped unused gives everything back.
        #expect(Array(fake.log.suffix(2)) == ["release 0", "close"])
        #expect(fake.state.withLock { $0.openHandles == 0 && $0.deviceMemoryLive == 0 && $0.transfersLive == 0 })

        var keep = USBContextOptions()
        keep.detachKernelDriver = false
        let error = try #require(openError({ $0.state.withLock { $0.kernelDriver = "usbfs-hog" } }, options: keep))
        #expect(error.kind == .busy)
        #expect(error.message == "interface 0 of usb 1-1.2 2ca3:1002 Goggles 3 (serial GG3-0042) is held by the kernel driver usbfs-hog")
        #expect(error.advice?.contains("echo 1-1.2:1.0 | sudo tee /sys/bus/usb/drivers/usbfs-hog/unbind") == true)
    }

    @Test func theConfigurationIsSelectedOffTheEventQueueWhenNeeded() throws {
        let queue = DispatchQueue(label: "test.usb.config")
        let fake = FakeBackend(queue: queue)
        fake.state.withLock { $0.devices[0].activeConfiguration = nil }
        _ = try Harness.open(USBContext(backend: fake, queue: queue, function: .iAP2, options: USBContextOptions()))
        // (The fake asserts that SET_CONFIGURATION is not called on the event queue.)
        #expect(Array(fake.log.prefix(3)) == ["open", "set configuration 1", "claim 0"])

        let error = try #require(openError {
            $0.state.withLock { $0.devices[0].activeConfiguration = 2; $0.setConfigurationStatus = LIBUSB_ERROR_BUSY.rawValue }
        })
        #expect(error.kind == .busy)
        #expect(error.message.hasPrefix("cannot select configuration 1 of usb 1-1.2"))
    }

    @Test func aDeviceWithoutAnIAPInterfaceIsNotOpened() throws {
        let queue = DispatchQueue(label: "test.usb.other")
        let fake = FakeBackend(queue: queue)
        fake.state.withLock { $0.devices[0].configurations = [USBConfigurationDescriptor(value: 1, interfaces: [])] }
        let context = USBContext(backend: fake, queue: queue, function: .iAP2, options: USBContextOptions())
        let error = try #require(openError { $0.state.withLock { $0.devices[0].configurations = [USBConfigurationDescriptor(value: 1, interfaces: [])] } })
        #expect(error.kind == .notAnAccessory)
        #expect(queue.sync { try? context.devices() }?.first?.function == nil)
    }
}

/// The tests block on the fake libusb's queues and wait for its events: each on a thread of
/// its own (`.ownThread`).
@Suite(.ownThread) struct USBPipeTests {
    @Test func inTransfersStayQueuedAndBytesArriveInPlace() throws {
        let harness = try Harness()
        harness.onQueue {
            #expect(harness.fake.pendingTransfers(in: true).count == 4)
            let buffer = harness.fake.completeIn([0xFF, 0x5A, 0x00])
            #expect(harness.fake.pendingTransfers(in: true).count == 4, "the slot is resubmitted once read")
            let entry = harness.events.entries.last
            #expect(entry?.bytes == [0xFF, 0x5A, 0x00])
            #expect(entry?.borrowedFrom == buffer.map { UInt(bitPattern: $0) }, "the reader sees the transfer's own buffer: no copy")
            #expect(harness.fake.isDeviceMemory(UnsafeRawPointer(buffer!)))
        }
        #expect(harness.transport.pipe.statistics.deviceMemorySlots == 12)
        #expect(harness.transport.pipe.statistics.heapSlots == 0)
    }

    @Test func withoutDeviceMemoryTheSlotsComeFromTheHeap() throws {
        let harness = try Harness { $0.state.withLock { $0.deviceMemory = false } }
        harness.onQueue {
            let buffer = harness.fake.completeIn([1, 2, 3])
            #expect(!harness.fake.isDeviceMemory(UnsafeRawPointer(buffer!)))
            #expect(harness.events.entries.last?.borrowedFrom == buffer.map { UInt(bitPattern: $0) })
        }
        #expect(harness.transport.pipe.statistics.heapSlots == 12)
    }

    @Test func shortReadsZeroLengthPacketsAndOverflowsInOrder() throws {
        let harness = try Harness()
        harness.onQueue {
            var expected: [UInt8] = []
            for round in 0..<40 {
                let chunk = (0..<(round * 37 % 700)).map { UInt8(truncatingIfNeeded: $0 &+ round) }
                harness.fake.completeIn(chunk)
                expected += chunk
            }
            harness.fake.completeIn([9, 9], status: LIBUSB_TRANSFER_OVERFLOW)
            expected += [9, 9]
            #expect(harness.events.bytes == expected)
            #expect(harness.fake.pendingTransfers(in: true).count == 4)
        }
        let stats = harness.transport.pipe.statistics
        #expect(stats.zeroLengthIn == 1) // round 0
        #expect(stats.overflows == 1)
        #expect(stats.inTransfers == 40)
    }

    @Test func aStalledInEndpointIsClearedOnceAndResumes() throws {
        let harness = try Harness()
        harness.onQueue {
            for _ in 0..<4 { harness.fake.completeIn([], status: LIBUSB_TRANSFER_STALL) }
            #expect(harness.fake.pendingTransfers(in: true).isEmpty, "nothing is resubmitted before the halt is cleared")
        }
        harness.settle()
        #expect(harness.fake.log.filter { $0.hasPrefix("clear halt") } == ["clear halt 0x81"])
        harness.onQueue {
            #expect(harness.fake.pendingTransfers(in: true).count == 4)
            harness.fake.completeIn([7])
        }
        #expect(harness.events.bytes == [7])
        #expect(harness.transport.pipe.statistics.stalls == 1)
        #expect(harness.events.closes.isEmpty)
    }

    @Test func aStallThatCannotBeClearedEndsTheTransport() throws {
        let harness = try Harness { $0.state.withLock { $0.clearHaltStatuses = [LIBUSB_ERROR_IO.rawValue] } }
        harness.onQueue { for _ in 0..<4 { harness.fake.completeIn([], status: LIBUSB_TRANSFER_STALL) } }
        harness.settle()
        #expect(harness.events.waitForClose())
        #expect(harness.events.closes.first??.message.hasPrefix("cannot clear the stall on endpoint 0x81") == true)
    }

    @Test func outSendsOnePacketPerTransferWithAZeroLengthPacketOnMultiplesOfThePacketSize() throws {
        let harness = try Harness()
        harness.onQueue {
            harness.transport.send([UInt8](repeating: 1, count: 100))
            harness.transport.send([UInt8](repeating: 2, count: 1_024))
            let first = harness.fake.completeOut()
            let second = harness.fake.completeOut()
            #expect(first?.bytes.count == 100 && first?.flags == 0)
            #expect(second?.bytes == [UInt8](repeating: 2, count: 1_024))
            #expect(second?.flags == UInt8(LIBUSB_TRANSFER_ADD_ZERO_PACKET.rawValue))
        }
        #expect(harness.transport.pipe.statistics.zeroLengthOut == 1)
        #expect(harness.transport.pipe.statistics.outTransfers == 2)
    }

    @Test func aFrameSentRightAfterActivationOrBeforeItGoesOut() throws {
        let queue = DispatchQueue(label: "test.usb.early")
        let fake = FakeBackend(queue: queue)
        let context = USBContext(backend: fake, queue: queue, function: .iAP2, options: USBContextOptions())
        let transport = try Harness.open(context)
        let events = EventLog()
        queue.sync {
            transport.send([1]) // before activation: kept until then
            transport.activate(queue: queue, handler: events.handler)
            transport.send([2]) // what EndpointDriver does: the detect right after activating
            #expect(fake.completeOut()?.bytes == [1])
            #expect(fake.completeOut()?.bytes == [2])
            #expect(fake.pendingTransfers(in: true).count == 4)
        }
    }

    @Test func withoutKernelSupportTheZeroLengthPacketIsATransferOfItsOwn() throws {
        let harness = try Harness { $0.state.withLock { $0.zeroPacketFlagSupported = false } }
        harness.onQueue {
            harness.transport.send([UInt8](repeating: 3, count: 512))
            harness.transport.send([4])
            let sent = (0..<3).compactMap { _ in harness.fake.completeOut() }
            #expect(sent.map(\.bytes.count) == [512, 0, 1])
            #expect(sent.allSatisfy { $0.flags == 0 })
        }
    }

    @Test func framesBeyondTheSlotsWaitAndGoOutInOrder() throws {
        let harness = try Harness()
        harness.onQueue {
            for index in 0..<20 { harness.transport.send([UInt8(index), 0xAA]) }
            #expect(harness.fake.pendingTransfers(in: false).count == 8)
            var order: [UInt8] = []
            while let out = harness.fake.completeOut() { order.append(out.bytes[0]) }
            #expect(order == Array(0..<20))
        }
        #expect(harness.transport.pipe.statistics.queuedFrames == 12)
    }

    @Test func outTimeoutsBackOffAndRecover() throws {
        let harness = try Harness()
        harness.onQueue {
            harness.transport.send([1])
            #expect(harness.fake.completeOut(status: LIBUSB_TRANSFER_TIMED_OUT)?.timeout == 2_000)
            harness.transport.send([2])
            #expect(harness.fake.completeOut(status: LIBUSB_TRANSFER_TIMED_OUT)?.timeout == 4_000)
            harness.transport.send([3])
            #expect(harness.fake.completeOut()?.timeout == 8_000)
            harness.transport.send([4])
            #expect(harness.fake.completeOut()?.timeout == 2_000)
        }
        #expect(harness.transport.pipe.statistics.timeouts == 2)
        #expect(harness.events.closes.isEmpty)
    }

    @Test func aStalledOutEndpointIsClearedAndTheWaitingFramesFollow() throws {
        let harness = try Harness()
        harness.onQueue {
            harness.transport.send([1])
            harness.fake.completeOut(status: LIBUSB_TRANSFER_STALL)
            harness.transport.send([2]) // waits while the halt is cleared
            #expect(harness.fake.pendingTransfers(in: false).isEmpty)
        }
        harness.settle()
        harness.onQueue { #expect(harness.fake.completeOut()?.bytes == [2]) }
        #expect(harness.fake.log.contains("clear halt 0x1"))
    }

    @Test func errorsInARowEndTheTransportAfterBackingOff() throws {
        var options = USBContextOptions()
        options.maxConsecutiveErrors = 3
        let harness = try Harness(options: options)
        // Every transfer in flight fails at once (as when the accessory leaves the bus): one error
        // in a row, not four; the round after the back-off fails again, and so on.
        for round in 1...3 {
            harness.onQueue {
                #expect(harness.fake.pendingTransfers(in: true).count == 4, "round \(round) resubmitted every IN transfer")
                for _ in 0..<4 { harness.fake.completeIn([], status: LIBUSB_TRANSFER_ERROR) }
            }
            guard round < 3 else { break }
            try #require(harness.onQueue { harness.transport.pipe.lifecycle.isRunning }, "\(round) round(s) of errors are not yet 3 in a row")
            // Wait for the retry's submits (events), not for a time.
            while harness.onQueue({ harness.fake.pendingTransfers(in: true).count }) < 4 {
                try #require(harness.fake.submitted.wait(timeout: .now() + 30) == .success, "the round is retried")
            }
        }
        #expect(harness.events.waitForClose())
        #expect(harness.transport.pipe.statistics.errors == 12)
        #expect(harness.events.closes.first??.message == "usb 1-1.2 2ca3:1002 Goggles 3 (serial GG3-0042): 3 transfer errors in a row")
    }

    @Test func aFailedSubmitIsRetriedAfterABackOff() throws {
        let harness = try Harness()
        harness.onQueue {
            harness.fake.state.withLock { $0.submitStatuses = [LIBUSB_ERROR_IO.rawValue] }
            harness.fake.completeIn([5]) // its resubmission fails
            #expect(harness.fake.pendingTransfers(in: true).count == 3)
        }
        // Wait for the retry's submit (an event), not for a time.
        while harness.onQueue({ harness.fake.pendingTransfers(in: true).count }) < 4 {
            #expect(harness.fake.submitted.wait(timeout: .now() + 5) == .success)
        }
        #expect(harness.events.bytes == [5])
    }
}

/// The tests block on the fake libusb's queues and wait for its events: each on a thread of
/// its own (`.ownThread`).
@Suite(.ownThread) struct USBTeardownTests {
    @Test func cancelWithTransfersInFlightWaitsForEveryOneThenReleasesInOrder() throws {
        let harness = try Harness()
        harness.onQueue { harness.transport.send([1, 2, 3]) }
        harness.transport.cancel()
        #expect(harness.events.waitForClose())
        #expect(harness.events.closes.count == 1 && harness.events.closes[0] == nil)
        let log = harness.fake.log
        let tail = Array(log.drop { !$0.hasPrefix("cancel") })
        #expect(tail.prefix(5).allSatisfy { $0.hasPrefix("cancel") })
        // 4 IN slots, 8 OUT slots and the transmit buffers, all before the interface and the handle go.
        let freed = USBContextOptions().inTransfers + USBContextOptions().outTransfers + BulkPipe.initialTransmitBuffers
        #expect(Array(tail.dropFirst(5)) == Array(repeating: "free device memory", count: freed) + ["release 0", "close"])
        harness.fake.state.withLock { state in
            #expect(state.openHandles == 0)
            #expect(state.deviceMemoryLive == 0)
            #expect(state.transfersLive == 0)
        }
        #expect(harness.onQueue { harness.fake.pending.isEmpty })
    }

    @Test func aVanishedDeviceEndsTheTransportWithTheReasonAndNothingLeaks() throws {
        let harness = try Harness()
        harness.onQueue {
            harness.transport.send([1])
            harness.fake.unplug(FakeDevice())
        }
        #expect(harness.events.waitForClose())
        #expect(harness.events.closes.first??.message
            == "usb 1-1.2 2ca3:1002 Goggles 3 (serial GG3-0042) left the bus (unplugged, or the accessory disconnected itself)")
        harness.fake.state.withLock { state in
            #expect(state.openHandles == 0 && state.deviceMemoryLive == 0 && state.transfersLive == 0)
        }
        // Sends after the end are dropped, not submitted.
        let before = harness.fake.state.withLock { $0.submits }
        harness.onQueue { harness.transport.send([2]) }
        #expect(harness.fake.state.withLock { $0.submits } == before)
    }

    @Test func cancelAfterTheDeviceVanishedStillTearsDownCleanly() throws {
        let harness = try Harness()
        harness.onQueue { harness.fake.state.withLock { $0.vanished = true } } // cancels now answer NO_DEVICE
        harness.transport.cancel()
        #expect(harness.events.waitForClose())
        harness.fake.state.withLock { state in
            #expect(state.openHandles == 0 && state.deviceMemoryLive == 0 && state.transfersLive == 0)
        }
    }

    @Test func transfersTheKernelNeverGivesBackAreLeakedNotFreed() throws {
        var options = USBContextOptions()
        options.teardownTimeoutMilliseconds = 50
        let harness = try Harness(options: options) { $0.state.withLock { $0.completeCancelled = false } }
        harness.transport.cancel()
        #expect(harness.events.waitForClose())
        #expect(harness.transport.pipe.statistics.abandonedTransfers == 4)
        harness.fake.state.withLock { state in
            #expect(state.openHandles == 1, "the handle stays open while libusb owns transfers")
            #expect(state.transfersLive == 12)
        }
    }

    @Test func theContextShutsLibusbDownOnlyAfterItsTransportsFinished() throws {
        let harness = try Harness()
        harness.onQueue {
            harness.transport.cancel()
            harness.context.shutdown()
            #expect(!harness.fake.log.contains("shutdown"))
        }
        #expect(harness.events.waitForClose())
        harness.onQueue { #expect(harness.fake.log.last == "shutdown") }
    }
}

/// The tests block on the fake libusb's queues and wait for its events: each on a thread of
/// its own (`.ownThread`).
@Suite(.ownThread) struct USBMonitorTests {
    @Test func hotplugReportsPresentDevicesThenArrivalsAndDepartures() throws {
        let queue = DispatchQueue(label: "test.usb.hotplug")
        let fake = FakeBackend(queue: queue)
        let context = USBContext(backend: fake, queue: queue, function: .iAP2, options: USBContextOptions())
        let seen = Mutex<[String]>([])
        try queue.sync {
            try context.startMonitoring { event in
                switch event {
                case let .arrived(device): seen.withLock { $0.append("+\(device.location) \(device.function != nil)") }
                case let .left(device): seen.withLock { $0.append("-\(device.location)") }
                }
            }
            var other = FakeDevice()
            other.address = 9
            other.portPath = [3]
            other.configurations = [USBConfigurationDescriptor(value: 1, interfaces: [])]
            fake.plug(other)
            fake.unplug(other)
        }
        queue.sync {} // hotplug news is handled after the libusb call that reported it
        #expect(context.usesHotplug)
        #expect(seen.withLock { $0 } == ["+1-1.2 true", "+1-3 false", "-1-3"])
    }

    /// libusb may report a device that appeared during registration twice (once from the
    /// enumeration, once from the hotplug queue): the second report must not open it again.
    @Test func aRepeatedArrivalIsReportedOnce() throws {
        let queue = DispatchQueue(label: "test.usb.hotplug.repeat")
        let fake = FakeBackend(queue: queue)
        let context = USBContext(backend: fake, queue: queue, function: .iAP2, options: USBContextOptions())
        let seen = Mutex<[String]>([])
        try queue.sync {
            try context.startMonitoring { event in
                switch event {
                case let .arrived(device): seen.withLock { $0.append("+\(device.address)") }
                case let .left(device): seen.withLock { $0.append("-\(device.address)") }
                }
            }
            fake.repeatArrival(FakeDevice()) // the present device, reported again
            fake.unplug(FakeDevice())
            fake.plug(FakeDevice()) // back at the same address after it left: a new arrival
        }
        queue.sync {}
        #expect(seen.withLock { $0 } == ["+5", "-5", "+5"])
    }

    @Test func withoutHotplugTheListIsPolled() throws {
        let queue = DispatchQueue(label: "test.usb.poll")
        let fake = FakeBackend(queue: queue)
        fake.state.withLock { $0.hotplugSupported = false }
        var options = USBContextOptions()
        options.pollInterval = .seconds(3_600) // the test polls by hand
        let context = USBContext(backend: fake, queue: queue, function: .iAP2, options: options)
        let seen = Mutex<[String]>([])
        try queue.sync {
            try context.startMonitoring { event in
                switch event {
                case let .arrived(device): seen.withLock { $0.append("+\(device.address)") }
                case let .left(device): seen.withLock { $0.append("-\(device.address)") }
                }
            }
            var second = FakeDevice()
            second.address = 6
            fake.state.withLock { $0.devices.append(second) }
            context.poll()
            context.poll() // nothing changed
            _ = fake.state.withLock { $0.devices.removeFirst() }
            context.poll()
        }
        #expect(!context.usesHotplug)
        #expect(seen.withLock { $0 } == ["+5", "+6", "-5"])
        queue.sync { context.shutdown() }
    }
}
