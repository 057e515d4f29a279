import Dispatch
import Glibc
import IAPTransport
import Synchronization
import SystemCalls

/// A ``ByteChannel`` over a pair of USB gadget endpoint files (GadgetFS): the device side of a
/// native-transport session. What the host writes to the OUT endpoint is read by a thread and
/// becomes readable; what is written goes out on the IN endpoint from another thread.
///
/// Flow control both ways: the reader thread stops reading while ``capacity`` bytes wait to be
/// consumed (the host's OUT transfers then wait: NAK), and ``write(_:)`` takes at most
/// ``capacity`` bytes not yet sent. Each IN write ends with a short packet (a write whose length
/// is a multiple of the packet size is split, as ``GadgetTransport/send(_:)`` does), so the
/// host's IN transfers complete. A zero-length OUT packet reads as 0 bytes and is skipped.
///
/// ``close()`` wakes both threads with ``GadgetTransport/interruptSignal``, joins them and
/// closes the files (which disables the endpoints). An endpoint error ends the channel with
/// that error.
final class EndpointByteChannel: ByteChannel, Sendable {
    let description: String
    /// Most bytes held for the reader, and most bytes accepted and not yet sent.
    let capacity: Int
    private let inEndpoint: Int32
    private let outEndpoint: Int32
    private let maxPacket: Int
    private let readerRoom = DispatchSemaphore(value: 0)
    private let writerWork = DispatchSemaphore(value: 0)
    private let state = Mutex(State())

    struct State {
        var queue: DispatchQueue?
        var handler: (@Sendable (ByteChannelEvent) -> Void)?
        var inbound: [[UInt8]] = []
        var head = 0
        var readable = 0
        var readerWaits = false
        var outbound: [[UInt8]] = []
        var unsent = 0
        var delivered = 0
        var wantsWritable = false
        var closing = false
        var closeDelivered = false
        var threads: [WorkerThread] = []
    }

    /// Reads this much at a time: a multiple of every bulk packet size.
    static let readSize = 65_536
    /// The largest piece written at once.
    static let maxWrite = 65_535
    private let shutdownDone = DispatchSemaphore(value: 0)

    /// Takes ownership of the two endpoint files (configured and enabled) and starts the threads.
    init(inEndpoint: Int32, outEndpoint: Int32, maxPacket: Int, capacity: Int = 1 << 20, description: String) throws(TransportError) {
        self.inEndpoint = inEndpoint
        self.outEndpoint = outEndpoint
        self.maxPacket = max(2, maxPacket)
        self.capacity = capacity
        self.description = description
        for name in ["native-out", "native-in"] {
            let reads = name == "native-out"
            switch spawnThread(name: name, body: { [self] in if reads { readLoop() } else { writeLoop() } }) {
            case let .success(thread): state.withLock { $0.threads.append(thread) }
            case let .failure(error):
                close()
                throw error
            }
        }
    }

    func activate(queue: DispatchQueue, handler: @escaping @Sendable (ByteChannelEvent) -> Void) {
        let (readable, closed) = state.withLock { state -> (Bool, Bool) in
            state.queue = queue
            state.handler = handler
            return (state.readable > 0, state.closing && !state.closeDelivered)
        }
        if readable { queue.async { handler(.readable) } }
        if closed { deliverClose(nil) }
    }

    func withReadableBytes<Result>(_ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        // The chunk is taken out of the lock for the call: only this queue consumes.
        guard let (chunk, head) = state.withLock({ state -> ([UInt8], Int)? in
            state.inbound.first.map { ($0, state.head) }
        }) else { return nil }
        let (consumed, result) = try body(chunk.span.bytes.extracting(head..<chunk.count))
        let taken = max(0, min(consumed, chunk.count - head))
        let wake = state.withLock { state -> Bool in
            state.head += taken
            state.readable -= taken
            if state.head == chunk.count {
                state.inbound.removeFirst()
                state.head = 0
            }
            guard state.readerWaits, state.readable < capacity else { return false }
            state.readerWaits = false
            return true
        }
        if wake { readerRoom.signal() }
        return result
    }

    var readableByteCount: Int { state.withLock { $0.readable } }

    func write(_ bytes: ArraySlice<UInt8>) -> Int {
        let taken = state.withLock { state -> Int in
            guard !state.closing else { return 0 }
            let taken = min(bytes.count, max(0, capacity - state.unsent))
            // Pieces of at most 65535 bytes: each is one kernel allocation and one transfer, and a
            // full piece ends with a short packet.
            var start = bytes.startIndex
            while start < bytes.startIndex + taken {
                let end = min(bytes.startIndex + taken, start + Self.maxWrite)
                state.outbound.append(Array(bytes[start..<end]))
                start = end
            }
            state.unsent += taken
            if taken < bytes.count { state.wantsWritable = true }
            return taken
        }
        if taken > 0 { writerWork.signal() }
        return taken
    }

    var isWritable: Bool { state.withLock { !$0.closing && $0.unsent < capacity } }
    var unsentByteCount: Int { state.withLock { $0.unsent } }
    var bytesDelivered: Int { state.withLock { $0.delivered } }

    func close() { shutDown(error: nil) }

    /// Stops the threads, closes the files and delivers the close (once).
    private func shutDown(error: TransportError?) {
        let (threads, mine) = state.withLock { state -> ([WorkerThread]?, Bool) in
            let me = pthread_self()
            let mine = state.threads.contains { pthread_equal($0.handle, me) != 0 }
            guard !state.closing else { return (nil, mine) }
            state.closing = true
            return (state.threads, mine)
        }
        guard let threads else {
            // Another close is under way: wait until its files are closed (an endpoint file can be
            // opened again only once closed), unless this is one of the threads it joins.
            if !mine {
                shutdownDone.wait()
                shutdownDone.signal()
            }
            return
        }
        readerRoom.signal()
        writerWork.signal()
        let me = pthread_self()
        for thread in threads {
            if pthread_equal(thread.handle, me) != 0 {
                pthread_detach(thread.handle) // an endpoint error on this very thread: it ends on return
            } else {
                interruptAndJoin(thread)
            }
        }
        _ = Glibc.close(inEndpoint)
        _ = Glibc.close(outEndpoint)
        state.withLock { $0.threads = [] }
        shutdownDone.signal()
        deliverClose(error)
    }

    private func deliverClose(_ error: TransportError?) {
        let target = state.withLock { state -> (DispatchQueue, @Sendable (ByteChannelEvent) -> Void)? in
            guard let queue = state.queue, let handler = state.handler, !state.closeDelivered else { return nil }
            state.closeDelivered = true
            return (queue, handler)
        }
        if let (queue, handler) = target { queue.async { handler(.closed(error)) } }
    }

    private func notify(_ event: ByteChannelEvent) {
        let target = state.withLock { state -> (DispatchQueue, @Sendable (ByteChannelEvent) -> Void)? in
            guard !state.closing, let queue = state.queue, let handler = state.handler else { return nil }
            return (queue, handler)
        }
        if let (queue, handler) = target { queue.async { handler(event) } }
    }

    private var closing: Bool { state.withLock { $0.closing } }

    private func failed(_ what: String, _ code: Int32) {
        guard !closing else { return }
        let error = TransportError("\(what) of \(description) failed: \(SystemError(code).description)", errno: code,
                                   advice: "the host went away or reset the device")
        // Not joined from here: the thread that failed returns right after. On a queue of its own,
        // not the global one: the shutdown joins threads, and on Linux the global queue shares
        // its threads with Swift's tasks (as many as cores; a blocked one is made up for only
        // after about a second).
        DispatchQueue(label: "EndpointByteChannel shutdown").async { [self] in shutDown(error: error) }
    }

    private func readLoop() {
        while !closing {
            let full = state.withLock { state -> Bool in
                guard state.readable >= capacity else { return false }
                state.readerWaits = true
                return true
            }
            if full {
                readerRoom.wait()
                continue
            }
            var result: Result<Int, SystemError> = .success(0)
            let bytes = [UInt8](unsafeUninitializedCapacity: Self.readSize) { buffer, initialized in
                result = SystemCall.read(outEndpoint, into: UnsafeMutableRawBufferPointer(buffer), retry: { !closing })
                initialized = (try? result.get()) ?? 0
            }
            let count = (try? result.get()) ?? -1
            if count > 0 {
                let wasEmpty = state.withLock { state -> Bool in
                    let wasEmpty = state.readable == 0
                    // A short read is copied out (through a buffer pointer: `Array(bytes)` would share
                    // the 64 KiB storage), so that what is held stays near what is counted.
                    state.inbound.append(count < 4_096 ? bytes.withUnsafeBufferPointer { Array($0) } : bytes)
                    state.readable += count
                    return wasEmpty
                }
                if wasEmpty { notify(.readable) }
                continue
            }
            if count == 0 { continue } // a zero-length packet
            guard case .failure(let error) = result, error.kind != .interrupted else { continue }
            failed("reading the OUT endpoint", error.code)
            return
        }
    }

    private func writeLoop() {
        while true {
            guard let chunk = state.withLock({ state -> [UInt8]? in
                state.closing || state.outbound.isEmpty ? nil : state.outbound.removeFirst()
            }) else {
                if closing { return }
                writerWork.wait()
                continue
            }
            // The short-packet rule: never end a write on a full packet.
            let pieces = chunk.count % maxPacket == 0 ? [0..<(chunk.count - 1), (chunk.count - 1)..<chunk.count] : [0..<chunk.count]
            for piece in pieces {
                let result = chunk.withUnsafeBytes {
                    SystemCall.writeAll(inEndpoint, UnsafeRawBufferPointer(rebasing: $0[piece]), retry: { !closing })
                }
                if case .failure(let error) = result {
                    if error.kind != .interrupted { failed("writing the IN endpoint", error.code) }
                    return
                }
            }
            let wakeWriter = state.withLock { state -> Bool in
                state.delivered += chunk.count
                state.unsent -= chunk.count
                guard state.wantsWritable || state.unsent == 0 else { return false }
                state.wantsWritable = false
                return true
            }
            if wakeWriter { notify(.writable) }
        }
    }
}
