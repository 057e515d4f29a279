import Dispatch
import Glibc
import IAPTransport
import Synchronization
import Testing
import TestSupport
import TestThreads

/// How long any wait may take before the test fails (generous: CI machines have two cores).
private let timeout: DispatchTimeInterval = .seconds(30)

/// Collects what a transport's handler receives, and lets a test wait for a condition on it.
final class Recorder: Sendable {
    struct Log {
        var bytes: [UInt8] = []
        var reads = 0
        var closes: [TransportError?] = []
        var eventsAfterClose = 0
    }

    private let log = Mutex(Log())
    private let changed = DispatchSemaphore(value: 0)

    var handler: @Sendable (TransportEvent) -> Void {
        { [self] event in
            log.withLock { log in
                if !log.closes.isEmpty { log.eventsAfterClose += 1 }
                switch event {
                case .received(let bytes):
                    log.bytes.append(contentsOf: bytes)
                    log.reads += 1
                case .borrowed(let bytes):
                    log.bytes.append(contentsOf: bytes.copied())
                    log.reads += 1
                case .lent(let lease):
                    log.bytes.append(contentsOf: lease.copied())
                    log.reads += 1
                case .closed(let error):
                    log.closes.append(error)
                }
            }
            changed.signal()
        }
    }

    var snapshot: Log { log.withLock { $0 } }

    /// Waits (on events, not a clock) until `condition` holds; false after ``timeout``.
    func wait(until condition: (Log) -> Bool) -> Bool {
        expectMayBlock("Recorder.wait")
        let deadline = DispatchTime.now() + timeout
        while true {
            if log.withLock({ condition($0) }) { return true }
            if changed.wait(timeout: deadline) == .timedOut {
                return log.withLock { condition($0) }
            }
        }
    }
}

/// A transport running on its own serial queue with a recorder attached.
///
/// Every call goes through the queue, as ``Transport`` asks, and is waited for with ``timeout``
/// so that a transport that blocks fails the test instead of hanging it.
struct Endpoint {
    let transport: SerialTransport
    let queue: DispatchQueue
    let recorder = Recorder()

    init(_ transport: SerialTransport, label: String) {
        self.transport = transport
        self.queue = DispatchQueue(label: "SerialTransportTests.\(label)")
    }

    /// Runs `body` on the queue and returns its result, or `nil` when it did not finish in time.
    @discardableResult
    func run<Result: Sendable>(_ body: @escaping @Sendable (SerialTransport) -> Result) -> Result? {
        expectMayBlock("Endpoint.run")
        let transport = transport
        let result = Mutex<Result?>(nil)
        let done = DispatchSemaphore(value: 0)
        queue.async {
            let value = body(transport)
            result.withLock { $0 = value }
            done.signal()
        }
        guard done.wait(timeout: .now() + timeout) == .success else {
            Issue.record("\(transport.description): a call on its queue did not return in time")
            return nil
        }
        return result.withLock { $0 }
    }

    func activate() {
        let (queue, handler) = (queue, recorder.handler)
        run { $0.activate(queue: queue, handler: handler) }
    }

    func send(_ frames: [[UInt8]]) {
        run { transport in
            for frame in frames { transport.send(frame) }
        }
    }

    func cancel() {
        run { $0.cancel() }
    }

    /// `pendingOutputBytes` read on the queue (-1 if the queue is stuck).
    var pendingOutputBytes: Int {
        run { $0.pendingOutputBytes } ?? -1
    }

    /// Returns once every block already queued on this endpoint's queue ran.
    func drainQueue() {
        run { _ in }
    }
}

/// Byte `index` of a recognisable stream (period 251, a prime, so shifted copies differ).
func patternByte(_ index: Int, seed: Int) -> UInt8 {
    UInt8((index &* 7 &+ seed) % 251)
}

/// `count` frames of assorted lengths (1 to 1500 bytes), consecutive slices of one pattern.
private func patternFrames(count: Int, seed: Int) -> [[UInt8]] {
    var frames: [[UInt8]] = []
    var offset = 0
    for number in 0..<count {
        let length = 1 + (number &* 397) % 1500
        frames.append((offset..<(offset + length)).map { patternByte($0, seed: seed) })
        offset += length
    }
    return frames
}

/// Where two byte streams first differ, in words (`nil` when equal); keeps failure output short.
func difference(_ actual: [UInt8], _ expected: [UInt8]) -> String? {
    guard actual != expected else { return nil }
    let index = zip(actual.indices, zip(actual, expected)).first { $0.1.0 != $0.1.1 }?.0 ?? min(actual.count, expected.count)
    return "got \(actual.count) bytes, expected \(expected.count); first difference at byte \(index)"
}

/// A pty with a transport on each side: the master wrapped, the slave opened by path.
func makePair(keepSlaveOpen: Bool = true) throws -> (PseudoTerminal, master: Endpoint, slave: Endpoint) {
    let pty = try PseudoTerminal(keepSlaveOpen: keepSlaveOpen)
    let slave = Endpoint(try SerialTransport(spec: SerialPortSpec(parsing: pty.slavePath)), label: "slave")
    let master = Endpoint(try pty.makeMasterTransport(), label: "master")
    return (pty, master, slave)
}

/// Cancels `first` and then `second`, and expects each to deliver `.closed` in time.
func cancelBoth(_ first: Endpoint, _ second: Endpoint, sourceLocation: SourceLocation = #_sourceLocation) {
    first.cancel()
    second.cancel()
    #expect(first.recorder.wait { !$0.closes.isEmpty }, sourceLocation: sourceLocation)
    #expect(second.recorder.wait { !$0.closes.isEmpty }, sourceLocation: sourceLocation)
}

/// The tests wait for transports on their queues, and for bytes through the pty: each on a thread
/// of its own (`.ownThread`), not one of the cooperative pool's.
@Suite(.serialized, .ownThread)
struct SerialTransportTests {
    @Test func bytesFlowBothWaysInOrder() throws {
        let (pty, master, slave) = try makePair()
        #expect(slave.transport.description == "serial \(pty.slavePath) @ 115200")
        #expect(slave.transport.kind == .serial)
        #expect(master.transport.kind == .serial)
        master.activate()
        slave.activate()

        let toSlave = patternFrames(count: 300, seed: 1)
        let expectedAtSlave = Array(toSlave.joined())
        master.send(toSlave)
        #expect(slave.recorder.wait { $0.bytes.count >= expectedAtSlave.count })
        let atSlave = slave.recorder.snapshot
        #expect(difference(atSlave.bytes, expectedAtSlave) == nil)
        #expect(atSlave.reads > 1, "a few hundred KiB should take more than one read")

        let toMaster = patternFrames(count: 300, seed: 2)
        let expectedAtMaster = Array(toMaster.joined())
        slave.send(toMaster)
        #expect(master.recorder.wait { $0.bytes.count >= expectedAtMaster.count })
        let atMaster = master.recorder.snapshot
        #expect(difference(atMaster.bytes, expectedAtMaster) == nil)
        #expect(atMaster.reads > 1)

        cancelBoth(master, slave)
    }

    @Test func fourMebibytesQueueWithoutBlockingAndAllArrive() throws {
        let (_, writer, reader) = try makePair()
        writer.activate()

        let frameSize = 4096
        let total = 4 * 1024 * 1024
        let frames = (0..<(total / frameSize)).map { number in
            bytes(frameSize, from: number * frameSize) { patternByte($0, seed: 3) }
        }
        // The reader is not reading yet: the kernel takes a little, the transport queues the rest.
        writer.send(frames)
        let queued = writer.pendingOutputBytes
        #expect(queued > total / 2, "the pty holds far less than 4 MiB, so most of it must be pending")
        #expect(queued <= total)

        reader.activate()
        #expect(reader.recorder.wait { $0.bytes.count >= total })
        let received = reader.recorder.snapshot
        #expect(received.bytes.count == total)
        #expect(difference(received.bytes, Array(frames.joined())) == nil)
        #expect(writer.pendingOutputBytes == 0)
        #expect(writer.recorder.snapshot.closes.isEmpty)

        cancelBoth(writer, reader)
    }

    @Test(arguments: [false, true])
    func closingTheSlaveSideClosesTheMasterWithAnErrorOnce(keepSlaveOpen: Bool) throws {
        let (pty, master, slave) = try makePair(keepSlaveOpen: keepSlaveOpen)
        if keepSlaveOpen { pty.closeSlave() }
        master.activate()
        slave.activate()
        slave.send([[1, 2, 3]])
        #expect(master.recorder.wait { $0.bytes == [1, 2, 3] })

        slave.cancel()
        #expect(slave.recorder.wait { !$0.closes.isEmpty })
        #expect(master.recorder.wait { !$0.closes.isEmpty })
        // Anything the transport still had queued would have run by now.
        master.send([[4, 5, 6]])
        master.cancel()
        master.drainQueue()

        let log = master.recorder.snapshot
        #expect(log.closes.count == 1)
        #expect(log.eventsAfterClose == 0)
        let error = try #require(log.closes.first.flatMap { $0 })
        #expect(error.errno == EIO)
        #expect(error.kind == .hungUp)
        #expect(error.advice?.contains("reconnect") == true)
        #expect(slave.recorder.snapshot.closes.count == 1)
    }

    /// 300 pseudo-terminals with a transport on each side, all active at once: one poller
    /// thread watches them all (a watcher per port used to park a Dispatch worker each, and the
    /// pool ran out near 255 ports).
    @Test func threeHundredPortsAtOnceAllCarryTheirBytes() throws {
        var pairs: [(PseudoTerminal, master: Endpoint, slave: Endpoint)] = []
        for _ in 0..<300 { pairs.append(try makePair(keepSlaveOpen: false)) }
        for (_, master, slave) in pairs {
            master.activate()
            slave.activate()
        }
        for (index, pair) in pairs.enumerated() {
            pair.slave.send([[UInt8(index & 0xFF), UInt8(index >> 8), 0x7E]])
        }
        for (index, pair) in pairs.enumerated() {
            #expect(pair.master.recorder.wait { $0.bytes.count >= 3 }, "port \(index) got nothing")
            #expect(pair.master.recorder.snapshot.bytes == [UInt8(index & 0xFF), UInt8(index >> 8), 0x7E])
        }
        for (_, master, slave) in pairs {
            slave.cancel()
            master.cancel()
        }
        for (_, master, slave) in pairs {
            #expect(master.recorder.wait { !$0.closes.isEmpty })
            #expect(slave.recorder.wait { !$0.closes.isEmpty })
        }
    }

    @Test func aPeerThatStopsReadingClosesTheTransportAtTheOutputBoundInsteadOfGrowing() throws {
        let (_, writer, reader) = try makePair()
        writer.activate()
        _ = reader // never activated: nothing reads the other side
        let frame = [UInt8](repeating: 0x5A, count: 64 * 1024)
        let frames = SerialTransport.outputLimit / frame.count + 64
        writer.send(Array(repeating: frame, count: frames))
        #expect(writer.recorder.wait { !$0.closes.isEmpty })
        #expect(writer.pendingOutputBytes <= SerialTransport.outputLimit)
        let error = try #require(writer.recorder.snapshot.closes.first.flatMap { $0 })
        #expect(error.kind == .stalled)
        #expect(error.advice != nil)
        writer.cancel()
        reader.cancel()
    }

    @Test("output sent before activation is bounded: past the limit the transport closes, and activation says why")
    func outputBeforeActivationIsBounded() throws {
        let (_, writer, reader) = try makePair()
        let frame = [UInt8](repeating: 0x5A, count: 64 * 1024)
        let fitting = SerialTransport.outputLimit / frame.count
        writer.send(Array(repeating: frame, count: fitting))
        #expect(writer.pendingOutputBytes == fitting * frame.count)
        writer.send([[0x01]]) // one byte past the bound
        #expect(writer.pendingOutputBytes == 0, "the queued output is dropped with the close")
        writer.activate()
        #expect(writer.recorder.wait { !$0.closes.isEmpty })
        let error = try #require(writer.recorder.snapshot.closes.first.flatMap { $0 })
        #expect(error.kind == .stalled)
        #expect(error.description.contains("before it was activated"))
        #expect(error.advice?.contains("activate the transport") == true)
        reader.cancel()
    }

    @Test("a transport that stops reading leaves the bytes to the kernel, and reads them all once it resumes")
    func readingStopsAndResumes() throws {
        let (_, master, slave) = try makePair()
        master.activate()
        slave.activate()
        master.run { $0.setReading(false) }
        let frames = patternFrames(count: 1_000, seed: 3)
        let total = frames.reduce(0) { $0 + $1.count }
        slave.send(frames)
        // 750 KB: more than the kernel buffers, so the slave's own queue holds the rest.
        #expect(slave.pendingOutputBytes > 0)
        #expect(master.recorder.snapshot.bytes.isEmpty)
        master.run { $0.setReading(true) }
        #expect(master.recorder.wait { $0.bytes.count >= total })
        #expect(master.recorder.snapshot.bytes == frames.flatMap { $0 })
        slave.cancel()
        master.cancel()
    }

    @Test("a hang-up while reading is stopped is reported once reading resumes")
    func hangUpWhileNotReading() throws {
        let (_, master, slave) = try makePair(keepSlaveOpen: false)
        slave.activate()
        master.activate()
        master.run { $0.setReading(false) }
        slave.cancel()
        #expect(slave.recorder.wait { !$0.closes.isEmpty })
        master.drainQueue()
        #expect(master.recorder.snapshot.closes.isEmpty)
        master.run { $0.setReading(true) }
        #expect(master.recorder.wait { !$0.closes.isEmpty })
        #expect(master.recorder.snapshot.closes.first??.kind == .hungUp)
    }

    @Test func aHangUpWithOutputStillQueuedClosesOnceAndDropsTheOutput() throws {
        let (_, writer, reader) = try makePair(keepSlaveOpen: false)
        writer.activate()
        // The reader never reads, so most of this stays queued in the writer.
        writer.send((0..<256).map { _ in [UInt8](repeating: 0xA5, count: 4096) })
        #expect(writer.pendingOutputBytes > 0)

        reader.cancel()
        #expect(writer.recorder.wait { !$0.closes.isEmpty })
        writer.send([[1]])
        writer.cancel()
        writer.drainQueue()
        let log = writer.recorder.snapshot
        #expect(log.closes.count == 1)
        #expect(log.eventsAfterClose == 0)
        #expect(log.closes.first.flatMap { $0 }?.kind == .hungUp)
        #expect(writer.pendingOutputBytes == 0)
    }

    @Test func closingTheMasterSideClosesTheSlaveWithAnErrorOnce() throws {
        let (_, master, slave) = try makePair()
        master.activate()
        slave.activate()
        master.cancel()
        #expect(master.recorder.wait { !$0.closes.isEmpty })
        #expect(slave.recorder.wait { !$0.closes.isEmpty })
        slave.cancel()
        slave.drainQueue()

        let log = slave.recorder.snapshot
        #expect(log.closes.count == 1)
        #expect(log.eventsAfterClose == 0)
        let error = try #require(log.closes.first.flatMap { $0 })
        #expect(error.kind == .hungUp)
        #expect(master.recorder.snapshot.closes.count == 1)
        #expect(master.recorder.snapshot.closes.first.flatMap { $0 } == nil)
    }

    @Test func cancelDeliversClosedNilOnceAndNothingAfter() throws {
        let (_, master, slave) = try makePair()
        master.activate()
        slave.activate()
        master.send([[9, 8, 7]])
        #expect(slave.recorder.wait { $0.bytes == [9, 8, 7] })

        slave.cancel()
        #expect(slave.recorder.wait { !$0.closes.isEmpty })
        // None of this may reach the closed transport's handler.
        master.send([[1, 2, 3]])
        slave.send([[4, 5, 6]])
        slave.cancel()
        slave.activate()
        slave.drainQueue()
        master.drainQueue()
        slave.drainQueue()

        let log = slave.recorder.snapshot
        #expect(log.closes.count == 1)
        #expect(log.closes.first.map { $0 == nil } == true)
        #expect(log.eventsAfterClose == 0)
        #expect(log.bytes == [9, 8, 7])
        #expect(slave.pendingOutputBytes == 0)
        master.cancel()
    }

    @Test func cancelBeforeActivateStillDeliversOneClose() throws {
        let (_, master, _) = try makePair()
        master.send([[1, 2, 3]])
        #expect(master.transport.pendingOutputBytes == 3)
        master.cancel()
        #expect(master.transport.pendingOutputBytes == 0)
        master.activate()
        #expect(master.recorder.wait { !$0.closes.isEmpty })
        master.drainQueue()
        let log = master.recorder.snapshot
        #expect(log.closes.count == 1)
        #expect(log.closes.first.map { $0 == nil } == true)
    }

    @Test func outputSentBeforeActivationGoesOutOnActivation() throws {
        let (_, master, slave) = try makePair()
        slave.activate()
        master.send([[1, 2], [3]])
        #expect(master.transport.pendingOutputBytes == 3)
        master.activate()
        #expect(slave.recorder.wait { $0.bytes == [1, 2, 3] })
        #expect(master.pendingOutputBytes == 0)
        master.cancel()
        slave.cancel()
    }

    @Test func theMasterCanBeHandedOutOnlyOnce() throws {
        let pty = try PseudoTerminal()
        let first = try pty.makeMasterTransport()
        let error = #expect(throws: TransportError.self) { _ = try pty.makeMasterTransport() }
        #expect(error?.kind == .busy)
        #expect(first.description.contains(pty.slavePath))
        first.cancel()
    }

    @Test func wrappedNonTerminalDescriptorsWorkAndReportTheirPeerClosing() throws {
        // A socket pair: two connected descriptors that are not terminals (termios is skipped).
        var ends: [Int32] = [-1, -1]
        let made = ends.withUnsafeMutableBufferPointer { socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, $0.baseAddress) }
        try #require(made == 0)
        let near = Endpoint(try SerialTransport(fileDescriptor: ends[0], description: "socket near"), label: "near")
        let far = Endpoint(try SerialTransport(fileDescriptor: ends[1], description: "socket far"), label: "far")
        #expect(near.transport.description == "socket near")
        #expect(fcntl(ends[0], F_GETFL) & O_NONBLOCK != 0)
        #expect(fcntl(ends[1], F_GETFL) & O_NONBLOCK != 0)
        near.activate()
        far.activate()

        far.send([[0xFF, 0x5A], [0x00, 0x01]])
        #expect(near.recorder.wait { $0.bytes == [0xFF, 0x5A, 0x00, 0x01] })
        near.send([[7, 7]])
        #expect(far.recorder.wait { $0.bytes == [7, 7] })

        far.cancel()
        #expect(far.recorder.wait { !$0.closes.isEmpty })
        #expect(near.recorder.wait { !$0.closes.isEmpty })
        near.drainQueue()
        let log = near.recorder.snapshot
        #expect(log.closes.count == 1)
        #expect(log.eventsAfterClose == 0)
        #expect(log.closes.first.flatMap { $0 }?.kind == .hungUp)
        #expect(far.recorder.snapshot.closes.count == 1)
    }

    @Test func wrappingADescriptorThatIsNotOpenThrows() {
        let error = #expect(throws: TransportError.self) {
            _ = try SerialTransport(fileDescriptor: 4000, description: "nothing")
        }
        #expect(error?.errno == EBADF)
        #expect(error?.message.contains("4000") == true)
    }

    @Test func aMissingDeviceSaysToPlugTheAdapterIn() {
        let error = #expect(throws: TransportError.self) {
            _ = try SerialTransport(spec: SerialPortSpec(parsing: "/dev/does-not-exist"))
        }
        #expect(error?.errno == ENOENT)
        #expect(error?.kind == .notFound)
        #expect(error?.message.contains("/dev/does-not-exist") == true)
        #expect(error?.advice?.contains("is the adapter plugged in?") == true)
        #expect(error?.advice?.contains("ls /dev/ttyUSB* /dev/ttyACM*") == true)
    }

    @Test func aRegularFileIsNotATerminal() throws {
        var template = Array("/tmp/serial-transport-test-XXXXXX".utf8CString)
        let descriptor = template.withUnsafeMutableBufferPointer { buffer in
            buffer.baseAddress.map { mkstemp($0) } ?? -1
        }
        try #require(descriptor >= 0)
        _ = close(descriptor)
        let path = String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        defer { _ = unlink(path) }

        let error = #expect(throws: TransportError.self) {
            _ = try SerialTransport(spec: SerialPortSpec(parsing: path))
        }
        #expect(error?.errno == ENOTTY)
        #expect(error?.kind == .unsupported)
        #expect(error?.message.contains(path) == true)
        #expect(error?.advice?.contains("/dev/ttyUSB0") == true)
        // The file is this test's own, so a descriptor left open on it is the failed open's.
        // The kernel names it by its resolved path; the test's own open shows the name is seen.
        let resolved = try #require(realpath(path, nil))
        let name = String(cString: resolved)
        free(resolved)
        let own = open(path, O_RDONLY | O_CLOEXEC)
        #expect(openDescriptorIdentities().contains(name))
        _ = close(own)
        for _ in 0..<10 { _ = try? SerialTransport(spec: SerialPortSpec(parsing: path)) }
        #expect(!openDescriptorIdentities().contains(name), "the failed open must not leak its descriptor")
    }

    @Test(arguments: [
        ("/dev/ttyS0", "/dev/ttyS0", 115_200),
        ("/dev/ttyS0:9600", "/dev/ttyS0", 9_600),
        ("/dev/ttyUSB0:3000000", "/dev/ttyUSB0", 3_000_000),
        ("/dev/ttyACM0:921600", "/dev/ttyACM0", 921_600),
        ("/dev/serial/by-path/pci-0000:00:14.0-usb-0:1:1.0-port0",
         "/dev/serial/by-path/pci-0000:00:14.0-usb-0:1:1.0-port0", 115_200),
        ("/dev/serial/by-path/pci-0000:00:14.0-usb-0:1:1.0-port0:57600",
         "/dev/serial/by-path/pci-0000:00:14.0-usb-0:1:1.0-port0", 57_600),
    ])
    func goodSpecsParse(text: String, path: String, baudRate: Int) throws {
        let spec = try SerialPortSpec(parsing: text)
        #expect(spec.path == path)
        #expect(spec.baudRate == baudRate)
        #expect(try SerialPortSpec(parsing: spec.description) == spec)
    }

    @Test(arguments: [
        ("/dev/ttyS0:1234", "unsupported baud rate 1234"),
        (":115200", "missing serial device path"),
        ("/dev/ttyS0:", "missing baud rate"),
        ("/dev/ttyS0:fast", "not a number"),
        ("", "missing serial device path"),
    ])
    func badSpecsAreRejected(text: String, expectedMessage: String) {
        let error = #expect(throws: TransportError.self) { _ = try SerialPortSpec(parsing: text) }
        #expect(error?.message.contains(expectedMessage) == true, "\(String(describing: error))")
        #expect(error?.advice?.isEmpty == false)
    }

    @Test func anUnsupportedRateListsEverySupportedRate() throws {
        let error = #expect(throws: TransportError.self) { _ = try SerialPortSpec(parsing: "/dev/ttyS0:1234") }
        let advice = try #require(error?.advice)
        #expect(advice.contains(
            "9600, 19200, 38400, 57600, 115200, 230400, 460800, 921600, 1000000, 1500000, 2000000, 3000000"
        ))
    }

    @Test func noDescriptorLeaksOverAHundredPseudoTerminals() throws {
        // One round first, so that anything created once per process (Dispatch's epoll and
        // event descriptors) already exists when counting starts.
        try openAndCancelOnePair()
        // Other suites open and close descriptors in parallel, and a pseudo-terminal's names are
        // used again as soon as it closes, so this counts: over five rounds of 20 pairs, where a
        // leak adds at least 20 in every round, and another suite holding descriptors for a while
        // shows in some rounds only. The smallest growth decides.
        var growth: [Int] = []
        for _ in 0..<5 {
            let before = openDescriptorCount()
            for _ in 0..<20 { try openAndCancelOnePair() }
            growth.append(openDescriptorCount() - before)
        }
        #expect(growth.min()! < 10, "descriptors gained per round of 20: \(growth)")
    }

    private func openAndCancelOnePair() throws {
        let (_, master, slave) = try makePair()
        master.activate()
        slave.activate()
        // `.closed` is delivered after the descriptor is closed.
        cancelBoth(master, slave)
    }
}

/// A transport over a stream socket (an RFCOMM channel, a socket pair): a peer that went away is
/// a hang-up, never a SIGPIPE that would kill the process.
@Suite("SerialTransport over a socket")
struct SocketTransportTests {
    @Test("writing after the peer closed ends the transport as hung up, without SIGPIPE")
    func noSIGPIPE() async throws {
        var ends: [Int32] = [-1, -1]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &ends) == 0)
        let transport = try SerialTransport(fileDescriptor: ends[0], description: "socket")
        close(ends[1])
        let queue = DispatchQueue(label: "socket transport")
        let reason = await withCheckedContinuation { (continuation: CheckedContinuation<TransportError?, Never>) in
            let done = Mutex(false)
            transport.activate(queue: queue) { event in
                if case let .closed(error) = event, !done.withLock({ let was = $0; $0 = true; return was }) { continuation.resume(returning: error) }
            }
            // Written before the poller noticed the hang-up: send(2) gets EPIPE.
            queue.async { for _ in 0..<4 { transport.send([UInt8](repeating: 0x5A, count: 4096)) } }
        }
        #expect(reason?.kind == .hungUp)
    }
}
