@testable import AccessoryGadget
import AccessorySimulator
import Dispatch
import Glibc
import IAPTransport
import IAPWire
import Synchronization
import Testing
import TestSupport
import TestThreads

// GadgetTransport's data path over socket pairs standing in for the FunctionFS files: ep1 (IN),
// ep2 (OUT) and, where a test needs it, ep0 (fed with 12-byte event records). SOCK_SEQPACKET
// keeps write boundaries, so the IN side shows each write() the transport made.
/// The tests block: on events of the transport's threads, in recv() on the socket peers, in
/// cancel() (which joins the threads). Each runs on a thread of its own (`.ownThread`).
@Suite("GadgetTransport over socket pairs", .serialized, .ownThread)
struct GadgetTransportTests {
    /// A guard against hangs, never a way to synchronise.
    static let guardTimeout: DispatchTimeInterval = .seconds(20)

    @Test("a frame whose length is a multiple of the packet size is written as all but the last byte, then the last byte")
    func shortPacketSplit() throws {
        let (inside, peer) = try socketPair(SOCK_SEQPACKET)
        let (outInside, outPeer) = try socketPair(SOCK_STREAM)
        defer { closeAll(peer, outPeer) }
        let transport = try GadgetTransport(ep0: nil, inEndpoint: inside, outEndpoint: outInside, maxPacket: 512)
        let log = EventLog()
        transport.activate(queue: DispatchQueue(label: "test"), handler: log.handle)
        let frames = [testFrame(1024, seed: 1), testFrame(1000, seed: 2), testFrame(512, seed: 3), testFrame(1, seed: 4)]
        for frame in frames { transport.send(frame) }
        var writes: [[UInt8]] = []
        for _ in 0..<6 { writes.append(try receiveRecord(peer)) }
        #expect(writes.map(\.count) == [1023, 1, 1000, 511, 1, 1])
        #expect(writes.flatMap { $0 } == frames.flatMap { $0 })
        transport.cancel()
        let statistics = transport.statistics
        #expect(statistics.framesSent == 4)
        #expect(statistics.shortPacketSplits == 2)
        #expect(statistics.bytesSent == 1024 + 1000 + 512 + 1)
    }

    @Test("many frames arrive whole and in order")
    func ordering() throws {
        let (inside, peer) = try socketPair(SOCK_STREAM)
        let (outInside, outPeer) = try socketPair(SOCK_STREAM)
        defer { closeAll(peer, outPeer) }
        let transport = try GadgetTransport(ep0: nil, inEndpoint: inside, outEndpoint: outInside, maxPacket: 64)
        transport.activate(queue: DispatchQueue(label: "test"), handler: EventLog().handle)
        // 600 frames, about 900 KiB: more than the socket holds, so the writer blocks on the way.
        let frames = (0..<600).map { index in testFrame(1 + (index * 977) % 3072, seed: UInt64(index)) }
        for frame in frames { transport.send(frame) }
        let expected = frames.flatMap { $0 }
        let received = try readExactly(peer, expected.count)
        #expect(received == expected)
        transport.cancel()
        #expect(transport.statistics.framesSent == frames.count)
        #expect(transport.statistics.shortPacketSplits == frames.filter { $0.count % 64 == 0 }.count)
    }

    @Test("bytes read from the OUT endpoint are delivered in order on the activation queue")
    func reads() throws {
        let (inside, peer) = try socketPair(SOCK_STREAM)
        let (outInside, outPeer) = try socketPair(SOCK_STREAM)
        defer { closeAll(peer, outPeer) }
        let transport = try GadgetTransport(ep0: nil, inEndpoint: inside, outEndpoint: outInside, maxPacket: 512)
        let queue = DispatchQueue(label: "test")
        let log = EventLog(queue: queue)
        transport.activate(queue: queue, handler: log.handle)
        var expected: [UInt8] = []
        for index in 0..<80 {
            let chunk = testFrame(1 + (index * 4099) % 40_000, seed: UInt64(index + 100))
            try writeAll(outPeer, chunk)
            expected += chunk
        }
        #expect(log.wait { $0.bytes.count >= expected.count })
        #expect(log.snapshot.bytes == expected)
        #expect(log.snapshot.wrongQueue == 0)
        transport.cancel()
        #expect(transport.statistics.bytesReceived == expected.count)
    }

    @Test("cancel wakes a reader blocked in read() and a writer blocked in write(), joins them and closes the files")
    func cancelWhileBlocked() throws {
        let (inside, peer) = try socketPair(SOCK_STREAM)
        let (outInside, outPeer) = try socketPair(SOCK_STREAM)
        let (ep0Inside, ep0Peer) = try socketPair(SOCK_SEQPACKET)
        defer { closeAll(peer, outPeer, ep0Peer) }
        let transport = try GadgetTransport(ep0: ep0Inside, inEndpoint: inside, outEndpoint: outInside, maxPacket: 512)
        let enabled = ConnectionLog()
        transport.onConnectionChange(enabled.record)
        let queue = DispatchQueue(label: "test")
        let log = EventLog()
        transport.activate(queue: queue, handler: log.handle)
        try sendEvents(ep0Peer, .bind, .enable)
        #expect(enabled.wait(for: .bound))
        #expect(enabled.wait(for: .enabled))
        // Nobody reads the IN side: 1 MiB fills the socket and the writer blocks in write().
        for index in 0..<64 { transport.send(testFrame(16 * 1024, seed: UInt64(index))) }
        #expect(transport.runningThreads == 3)
        #expect(threadCount(transport) == 3)

        let cancelled = DispatchSemaphore(value: 0)
        DispatchQueue(label: "test.cancel").async {
            transport.cancel()
            cancelled.signal()
        }
        #expect(cancelled.wait(timeout: .now() + Self.guardTimeout) == .success)
        #expect(transport.runningThreads == 0)
        #expect(threadsGone(transport.threadNamePrefix))
        // Every end the transport owned is closed: each peer reads to its end.
        #expect(try drainToEnd(peer) > 0)
        #expect(try drainToEnd(outPeer) == 0)
        #expect(try drainToEnd(ep0Peer) == 0)
        #expect(log.wait { $0.closes.count == 1 })
        #expect(log.snapshot.closes == [nil])
        // Nothing after the close, and cancelling again changes nothing.
        transport.cancel()
        transport.send([1, 2, 3])
        #expect(log.flushed(on: queue).closes.count == 1)
        #expect(log.snapshot.eventsAfterClose == 0)
    }

    @Test("the connection follows ep0's events; frames sent while not enabled are dropped")
    func connectionFollowsEndpointZero() throws {
        let (inside, peer) = try socketPair(SOCK_SEQPACKET)
        let (outInside, outPeer) = try socketPair(SOCK_STREAM)
        let (ep0Inside, ep0Peer) = try socketPair(SOCK_SEQPACKET)
        defer { closeAll(peer, outPeer, ep0Peer) }
        let transport = try GadgetTransport(ep0: ep0Inside, inEndpoint: inside, outEndpoint: outInside, maxPacket: 512)
        let changes = ConnectionLog()
        transport.onConnectionChange(changes.record)
        transport.activate(queue: DispatchQueue(label: "test"), handler: EventLog().handle)
        #expect(transport.connection == .unbound)
        transport.send(Array("dropped while unbound".utf8))

        // A host-to-device control request with 4 data bytes: the transport reads them (which is
        // how FunctionFS acknowledges it), then sees BIND.
        let setup = USBSetupRequest(requestType: 0x41, request: 0x40, value: 500, index: 0, length: 4)
        try writeRecord(ep0Peer, FunctionFSEvent(kind: .setup, setup: setup).bytes)
        try writeRecord(ep0Peer, [1, 2, 3, 4])
        try sendEvents(ep0Peer, .bind)
        #expect(changes.wait(for: .bound))
        #expect(transport.statistics.setupRequests == 1)
        try sendEvents(ep0Peer, .enable)
        #expect(changes.wait(for: .enabled))
        transport.send(Array("first".utf8))
        #expect(try receiveRecord(peer) == Array("first".utf8))

        try sendEvents(ep0Peer, .suspend)
        #expect(changes.wait(for: .suspended))
        try sendEvents(ep0Peer, .resume)
        #expect(changes.wait(for: .enabled))

        try sendEvents(ep0Peer, .disable)
        #expect(changes.wait(for: .bound))
        transport.send(Array("dropped while disabled".utf8))
        try sendEvents(ep0Peer, .enable)
        #expect(changes.wait(for: .enabled))
        transport.send(Array("second".utf8))
        #expect(try receiveRecord(peer) == Array("second".utf8))

        try sendEvents(ep0Peer, .unbind)
        #expect(changes.wait(for: .unbound))
        #expect(changes.all == [.bound, .enabled, .suspended, .enabled, .bound, .enabled, .unbound])
        transport.cancel()
        let statistics = transport.statistics
        #expect(statistics.framesDropped == 2)
        #expect(statistics.framesSent == 2)
        #expect(statistics.events == 8)
    }

    @Test("a simulator over a gadget starts over with a detect each time a host configures the function, not on resume")
    func simulatorStartsOverForEachHost() throws {
        let (inside, peer) = try socketPair(SOCK_SEQPACKET)
        let (outInside, outPeer) = try socketPair(SOCK_STREAM)
        let (ep0Inside, ep0Peer) = try socketPair(SOCK_SEQPACKET)
        defer { closeAll(peer, outPeer, ep0Peer) }
        let transport = try GadgetTransport(ep0: ep0Inside, inEndpoint: inside, outEndpoint: outInside, maxPacket: 512)
        let profile = try #require(SimulatorProfile.builtIn(named: "multi-sensor"))
        let runner = try SimulatorRunner(profile: profile, attachment: .transport(transport))
        runner.start()
        defer { runner.stop() }
        runner.queue.sync {} // launched: the runner's connection handler comes before the log's
        let changes = ConnectionLog()
        transport.onConnectionChange(changes.record)

        // The runner's handler hops to its queue before the log records the change, so a sync
        // on that queue after the log saw it means the runner has handled it too.
        func settle(_ connection: GadgetConnection) -> Int {
            #expect(changes.wait(for: connection))
            runner.queue.sync {}
            return runner.hostConnectionRestarts
        }
        try sendEvents(ep0Peer, .bind)
        #expect(settle(.bound) == 0)
        try sendEvents(ep0Peer, .enable)
        #expect(settle(.enabled) == 1, "the first host")
        // The detect sent at launch went nowhere (not enabled); the first write is the new one.
        #expect(try receiveRecord(peer) == IAP2Detect.bytes)
        try sendEvents(ep0Peer, .suspend)
        #expect(settle(.suspended) == 1)
        try sendEvents(ep0Peer, .resume)
        #expect(settle(.enabled) == 1, "a resume is the same host")
        try sendEvents(ep0Peer, .disable)
        #expect(settle(.bound) == 1)
        try sendEvents(ep0Peer, .enable)
        #expect(settle(.enabled) == 2, "a bus reset: the host starts over")
        try sendEvents(ep0Peer, .unbind)
        #expect(settle(.unbound) == 2)
        try sendEvents(ep0Peer, .bind)
        #expect(settle(.bound) == 2)
        try sendEvents(ep0Peer, .enable)
        #expect(settle(.enabled) == 3, "the UDC bound again")
    }

    @Test("after an endpoint error the reader waits for the next ENABLE instead of retrying")
    func readerWaitsForEnable() throws {
        let (inside, peer) = try socketPair(SOCK_STREAM)
        let (outInside, outPeer) = try socketPair(SOCK_STREAM)
        let (ep0Inside, ep0Peer) = try socketPair(SOCK_SEQPACKET)
        defer { closeAll(peer, outPeer, ep0Peer) }
        // A non-blocking OUT side with nothing in it fails with EAGAIN, as FunctionFS does while
        // the function is down. The fallback retry is far beyond the guard, so only ENABLE wakes it.
        try setNonBlocking(outInside)
        let transport = try GadgetTransport(ep0: ep0Inside, inEndpoint: inside, outEndpoint: outInside, maxPacket: 512,
                                            retryInterval: .seconds(3600))
        let errors = DispatchSemaphore(value: 0)
        transport.onEndpointError { errors.signal() }
        let changes = ConnectionLog()
        transport.onConnectionChange(changes.record)
        let queue = DispatchQueue(label: "test")
        let log = EventLog(queue: queue)
        transport.activate(queue: queue, handler: log.handle)
        try sendEvents(ep0Peer, .enable)
        #expect(errors.wait(timeout: .now() + Self.guardTimeout) == .success)
        try writeAll(outPeer, Array("hello".utf8))
        try sendEvents(ep0Peer, .disable, .enable)
        #expect(log.wait { $0.bytes.count >= 5 })
        #expect(log.snapshot.bytes == Array("hello".utf8))
        transport.cancel()
        // One failure before the data, at most one after it: no spinning.
        #expect(transport.statistics.endpointErrors <= 3)
        #expect(log.flushed(on: queue).closes == [nil])
    }

    @Test("stallIn() reads the IN endpoint once, after the frames sent before it")
    func stallIn() throws {
        let (inside, peer) = try socketPair(SOCK_SEQPACKET)
        let (outInside, outPeer) = try socketPair(SOCK_STREAM)
        defer { closeAll(peer, outPeer) }
        let transport = try GadgetTransport(ep0: nil, inEndpoint: inside, outEndpoint: outInside, maxPacket: 512)
        transport.activate(queue: DispatchQueue(label: "test"), handler: EventLog().handle)
        transport.send(Array("before".utf8))
        transport.stallIn()
        transport.send(Array("after".utf8))
        #expect(try receiveRecord(peer) == Array("before".utf8))
        // The writer now sits in read() on the IN side (with FunctionFS that read sets the
        // halt and returns at once); "after" cannot have been written yet.
        var probe = [UInt8](repeating: 0, count: 16)
        let early = probe.withUnsafeMutableBytes { recv(peer, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
        #expect(early < 0)
        try writeRecord(peer, [0x55])
        #expect(try receiveRecord(peer) == Array("after".utf8))
        transport.cancel()
        #expect(transport.statistics.inHaltRequests == 1)
        #expect(transport.statistics.inHalts == 0) // a socket is not FunctionFS: no EBADMSG
    }

    @Test("an OUT side that ends closes the transport with an error when there is no ep0")
    func unrecoverableError() throws {
        let (inside, peer) = try socketPair(SOCK_STREAM)
        let (outInside, outPeer) = try socketPair(SOCK_STREAM)
        defer { closeAll(peer) }
        let transport = try GadgetTransport(ep0: nil, inEndpoint: inside, outEndpoint: outInside, maxPacket: 512)
        let queue = DispatchQueue(label: "test")
        let log = EventLog()
        transport.activate(queue: queue, handler: log.handle)
        _ = close(outPeer)
        #expect(log.wait { $0.closes.count == 1 })
        let close = try #require(log.snapshot.closes.first)
        #expect(close != nil)
        transport.cancel()
        #expect(transport.runningThreads == 0)
        #expect(try drainToEnd(peer) == 0)
        #expect(log.flushed(on: queue).closes.count == 1)
    }

    @Test("releasing a transport without cancel() ends its threads and closes its files, silently")
    func releaseWithoutCancel() throws {
        let (inside, peer) = try socketPair(SOCK_STREAM)
        let (outInside, outPeer) = try socketPair(SOCK_STREAM)
        let (ep0Inside, ep0Peer) = try socketPair(SOCK_SEQPACKET)
        defer { closeAll(peer, outPeer, ep0Peer) }
        let queue = DispatchQueue(label: "test")
        let log = EventLog()
        var prefix = ""
        do {
            let transport = try GadgetTransport(ep0: ep0Inside, inEndpoint: inside, outEndpoint: outInside, maxPacket: 512)
            transport.activate(queue: queue, handler: log.handle)
            prefix = transport.threadNamePrefix
            #expect(threadCount(prefix) == 3)
        }
        #expect(threadsGone(prefix))
        #expect(try drainToEnd(peer) == 0)
        #expect(try drainToEnd(outPeer) == 0)
        #expect(try drainToEnd(ep0Peer) == 0)
        #expect(log.flushed(on: queue).closes.isEmpty)
    }

    @Test("no descriptor outlives its transport over many open-cancel cycles")
    func noDescriptorLeak() throws {
        // By identity, not by count: other suites open and close descriptors in parallel.
        var held: Set<String> = []
        for cycle in 0..<64 {
            let (inside, peer) = try socketPair(SOCK_STREAM)
            let (outInside, outPeer) = try socketPair(SOCK_STREAM)
            let (ep0Inside, ep0Peer) = try socketPair(SOCK_SEQPACKET)
            let transport = try GadgetTransport(ep0: ep0Inside, inEndpoint: inside, outEndpoint: outInside, maxPacket: 512)
            let identities = transport.fileDescriptors.compactMap(descriptorIdentity)
            #expect(identities.count == 5, "three endpoints and the wake pipe's two ends: \(identities)")
            held.formUnion(identities)
            transport.activate(queue: DispatchQueue(label: "test"), handler: EventLog().handle)
            transport.send(testFrame(100, seed: UInt64(cycle)))
            transport.cancel()
            #expect(transport.runningThreads == 0)
            #expect(threadsGone(transport.threadNamePrefix))
            closeAll(peer, outPeer, ep0Peer)
        }
        // Four names a cycle: a pipe's two ends share one.
        #expect(held.count == 64 * 4)
        let open = openDescriptorIdentities()
        #expect(!open.isEmpty)
        let leaked = held.intersection(open).sorted()
        #expect(leaked.isEmpty, "still open after cancel()")
    }
}

// USBGadget needs root, configfs and the gadget modules; without them (as here) its error
// paths still run: a configfs root that is a plain directory refuses the attribute writes, and
// every directory made before the failure must be gone again.
@Suite("USBGadget without gadget support")
struct USBGadgetErrorTests {
    @Test("a failure part way undoes what was built and names the path, with advice")
    func undoesAfterAFailure() throws {
        let root = try temporaryDirectory()
        defer { _ = rmdir(root) }
        var configuration = USBGadgetConfiguration(manufacturer: "Acme", product: "Probe", serialNumber: "P-1")
        configuration.configfsRoot = root
        configuration.mountDirectory = root + "/mount"
        #expect(configuration.usbID == "1209:0001")
        do {
            _ = try USBGadget(configuration: configuration)
            Issue.record("a plain directory is not configfs, yet the gadget was built")
        } catch {
            #expect(error.path == root + "/iapsim/idVendor")
            #expect(error.errno == ENOENT)
            #expect(error.advice?.contains("modprobe libcomposite") == true)
            #expect(error.description.contains(root + "/iapsim/idVendor"))
        }
        #expect(directoryEntries(root).isEmpty, "the gadget directory was removed again")
    }

    @Test("no configfs: the error says what to load")
    func noConfigfs() throws {
        let root = try temporaryDirectory()
        defer { _ = rmdir(root) }
        var configuration = USBGadgetConfiguration(manufacturer: "Acme", product: "Probe", serialNumber: "P-1")
        configuration.configfsRoot = root + "/usb_gadget"
        #expect(throws: USBGadgetError.self) { try USBGadget(configuration: configuration) }
        do { _ = try USBGadget(configuration: configuration) } catch {
            #expect(error.category == .missingSupport)
            #expect(error.path == root + "/usb_gadget/iapsim")
        }
    }

    @Test("a gadget of the same name is in the way")
    func nameTaken() throws {
        let root = try temporaryDirectory()
        defer { _ = rmdir(root) }
        #expect(mkdir(root + "/iapsim", 0o755) == 0)
        defer { _ = rmdir(root + "/iapsim") }
        var configuration = USBGadgetConfiguration(manufacturer: "Acme", product: "Probe", serialNumber: "P-1")
        configuration.configfsRoot = root
        do {
            _ = try USBGadget(configuration: configuration)
            Issue.record("built over an existing gadget")
        } catch {
            #expect(error.category == .busy)
            #expect(error.errno == EEXIST)
        }
        #expect(directoryEntries(root) == ["iapsim"], "the existing directory is left alone")
    }

    @Test("strings that cannot be USB strings are refused before anything is made")
    func badStrings() throws {
        let root = try temporaryDirectory()
        defer { _ = rmdir(root) }
        var configuration = USBGadgetConfiguration(manufacturer: "Acme", product: "two\nlines", serialNumber: "P-1")
        configuration.configfsRoot = root
        #expect(throws: USBGadgetError.self) { try USBGadget(configuration: configuration) }
        #expect(directoryEntries(root).isEmpty)
    }
}

private func temporaryDirectory() throws -> String {
    let base = getenv("TMPDIR").map { String(cString: $0) } ?? "/tmp"
    var template = Array((base + "/gadget-test-XXXXXX").utf8CString)
    guard template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) != nil else {
        throw SystemCallFailure(call: "mkdtemp", code: errno)
    }
    return String(decoding: template.dropLast().map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

// MARK: - Helpers

private struct SystemCallFailure: Error, CustomStringConvertible {
    var call: String
    var code: Int32
    var description: String { "\(call) failed: errno \(code)" }
}

private func socketPair(_ type: __socket_type) throws -> (Int32, Int32) {
    var ends: [Int32] = [-1, -1]
    let result = ends.withUnsafeMutableBufferPointer { socketpair(AF_UNIX, Int32(type.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, $0.baseAddress) }
    guard result == 0 else { throw SystemCallFailure(call: "socketpair", code: errno) }
    // A receive timeout on every end: a broken transport fails the test instead of hanging it.
    var timeout = timeval(tv_sec: 20, tv_usec: 0)
    for end in ends {
        _ = setsockopt(end, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }
    return (ends[0], ends[1])
}

private func setNonBlocking(_ descriptor: Int32) throws {
    let flags = fcntl(descriptor, F_GETFL)
    guard flags >= 0, fcntl(descriptor, F_SETFL, flags | O_NONBLOCK) == 0 else {
        throw SystemCallFailure(call: "fcntl", code: errno)
    }
}

private func closeAll(_ descriptors: Int32...) {
    for descriptor in descriptors { _ = close(descriptor) }
}

private func testFrame(_ count: Int, seed: UInt64) -> [UInt8] {
    var state = seed &* 0x9E37_79B9_7F4A_7C15 | 1
    return bytes(count) { _ in
        state ^= state << 13
        state ^= state >> 7
        state ^= state << 17
        return UInt8(truncatingIfNeeded: state)
    }
}

/// One record of a SOCK_SEQPACKET socket: exactly what one write() of the transport put there.
private func receiveRecord(_ descriptor: Int32) throws -> [UInt8] {
    var buffer = [UInt8](repeating: 0, count: 256 * 1024)
    while true {
        let count = buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
        if count >= 0 { return Array(buffer[..<count]) }
        if errno == EINTR { continue }
        throw SystemCallFailure(call: "recv", code: errno)
    }
}

private func readExactly(_ descriptor: Int32, _ total: Int) throws -> [UInt8] {
    var result: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 64 * 1024)
    while result.count < total {
        let count = buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, min($0.count, total - result.count), 0) }
        if count > 0 {
            result += buffer[..<count]
        } else if count == 0 {
            break
        } else if errno != EINTR {
            throw SystemCallFailure(call: "recv", code: errno)
        }
    }
    return result
}

/// Reads until the other end is closed; returns how many bytes were still queued. Fails (by the
/// receive timeout) if the other end stays open.
private func drainToEnd(_ descriptor: Int32) throws -> Int {
    var total = 0
    var buffer = [UInt8](repeating: 0, count: 64 * 1024)
    while true {
        let count = buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
        if count > 0 { total += count; continue }
        if count == 0 { return total }
        if errno == EINTR { continue }
        throw SystemCallFailure(call: "recv", code: errno)
    }
}

private func writeAll(_ descriptor: Int32, _ bytes: [UInt8]) throws {
    var offset = 0
    while offset < bytes.count {
        let count = bytes.withUnsafeBytes { send(descriptor, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
        if count > 0 { offset += count; continue }
        if count < 0, errno == EINTR { continue }
        throw SystemCallFailure(call: "send", code: errno)
    }
}

private func writeRecord(_ descriptor: Int32, _ bytes: [UInt8]) throws {
    let count = bytes.withUnsafeBytes { send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    guard count == bytes.count else { throw SystemCallFailure(call: "send", code: errno) }
}

private func sendEvents(_ ep0Peer: Int32, _ kinds: FunctionFSEvent.Kind...) throws {
    for kind in kinds { try writeRecord(ep0Peer, FunctionFSEvent(kind: kind).bytes) }
}

/// Entries of a /proc directory.
private func directoryEntries(_ path: String) -> [String] {
    guard let directory = opendir(path) else { return [] }
    defer { closedir(directory) }
    var names: [String] = []
    while let entry = readdir(directory) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        if name != "." && name != ".." { names.append(name) }
    }
    return names
}

/// Threads of this process named for `transport` (`gadget<n>-ep0`, `-in`, `-out`).
private func threadCount(_ transport: GadgetTransport) -> Int {
    threadCount(transport.threadNamePrefix)
}

/// Whether no thread named `prefix-…` is left. A thread that `pthread_join` has returned for can
/// still be listed in /proc for a moment (join returns when the thread clears its tid, before the
/// kernel finishes its exit), so the list is read again, yielding in between, a bounded number of
/// times: a thread that really lives on stays listed through all of them.
private func threadsGone(_ prefix: String) -> Bool {
    for _ in 0..<10_000 {
        if threadCount(prefix) == 0 { return true }
        sched_yield()
    }
    return false
}

private func threadCount(_ prefix: String) -> Int {
    directoryEntries("/proc/self/task").filter { task in
        let descriptor = open("/proc/self/task/\(task)/comm", O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return false }
        defer { _ = close(descriptor) }
        var buffer = [UInt8](repeating: 0, count: 32)
        let count = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
        return count > 0 && String(decoding: buffer[..<count], as: UTF8.self).hasPrefix(prefix + "-")
    }.count
}

/// Everything a transport delivered, with a semaphore to wait on.
private final class EventLog: Sendable {
    struct Snapshot: Sendable {
        var bytes: [UInt8] = []
        var closes: [TransportError?] = []
        var eventsAfterClose = 0
        var wrongQueue = 0
    }

    private let state = Mutex(Snapshot())
    private let changed = DispatchSemaphore(value: 0)
    private let queue: DispatchQueue?
    private let queueKey = DispatchSpecificKey<Bool>()

    init(queue: DispatchQueue? = nil) {
        self.queue = queue
        queue?.setSpecific(key: queueKey, value: true)
    }

    var handle: @Sendable (TransportEvent) -> Void {
        { [self] event in record(event) }
    }

    private func record(_ event: TransportEvent) {
        let onQueue = queue == nil || DispatchQueue.getSpecific(key: queueKey) == true
        state.withLock { state in
            if !onQueue { state.wrongQueue += 1 }
            if !state.closes.isEmpty { state.eventsAfterClose += 1 }
            switch event {
            case let .received(bytes): state.bytes += bytes
            case let .borrowed(bytes): state.bytes += bytes.copied()
            case let .lent(lease): state.bytes += lease.copied()
            case let .closed(error): state.closes.append(error)
            }
        }
        changed.signal()
    }

    var snapshot: Snapshot { state.withLock { $0 } }

    /// Waits until `condition` holds (false after the guard timeout).
    func wait(_ condition: (Snapshot) -> Bool) -> Bool {
        expectMayBlock("EventLog.wait")
        let deadline = DispatchTime.now() + GadgetTransportTests.guardTimeout
        while true {
            if condition(snapshot) { return true }
            if changed.wait(timeout: deadline) == .timedOut { return condition(snapshot) }
        }
    }

    /// The snapshot after everything already queued on `queue` ran (pass the activation queue).
    func flushed(on queue: DispatchQueue) -> Snapshot {
        queue.sync {}
        return snapshot
    }
}

/// Connection changes a transport reported.
private final class ConnectionLog: Sendable {
    private let state = Mutex<[GadgetConnection]>([])
    private let changed = DispatchSemaphore(value: 0)
    /// How many of the changes `wait(for:)` has consumed.
    private let consumed = Mutex(0)

    var record: @Sendable (GadgetConnection) -> Void {
        { [self] connection in
            state.withLock { $0.append(connection) }
            changed.signal()
        }
    }

    var all: [GadgetConnection] { state.withLock { $0 } }

    /// Waits for the next change not yet waited for to be `connection`.
    func wait(for connection: GadgetConnection) -> Bool {
        expectMayBlock("ConnectionLog.wait")
        let deadline = DispatchTime.now() + GadgetTransportTests.guardTimeout
        while true {
            let next = consumed.withLock { index -> GadgetConnection? in
                let changes = state.withLock { $0 }
                guard index < changes.count else { return nil }
                index += 1
                return changes[index - 1]
            }
            if let next { return next == connection }
            if changed.wait(timeout: deadline) == .timedOut { return false }
        }
    }
}
