public import Dispatch
internal import Synchronization

/// Two transports joined back to back in one process: what one sends, the other receives.
///
/// Each side delivers on its own queue with one hop per batch of frames (frames sent in one
/// turn of the sender's queue arrive together), like a USB completion batch. Frames are handed
/// over as the arrays they were sent in: nothing is copied.
public final class MemoryTransport: Transport {
    public let description: String
    public var kind: TransportKind { .memory }

    private struct State {
        var queue: DispatchQueue?
        var handler: Receiver?
        /// Wakes the receiving side on its queue: a user-data source, so a batch costs no
        /// allocation (a `queue.async` per batch costs a block and a continuation).
        var wakeUp: WakeUp?
        var pending: [[UInt8]] = []
        /// An emptied batch array handed back by the last flush, for the next batch.
        var spare: [[UInt8]] = []
        var closed = false
    }
    private let state = Mutex(State())
    private let peerBox = Mutex<MemoryTransport?>(nil)
    private let native = Mutex<(any NativeTransportProvider)?>(nil)

    /// The native-transport interfaces the other side offers, if any: the in-process simulator
    /// sets them on the host side for a profile with native protocols, as a USB accessory has
    /// FF/F0/01 interfaces beside its iAP2 one.
    public var nativeTransports: (any NativeTransportProvider)? {
        get { native.withLock { $0 } }
        set { native.withLock { $0 = newValue } }
    }

    private init(description: String) {
        self.description = description
    }

    /// A connected pair: `(host side, accessory side)`.
    public static func pair(name: String = "memory") -> (MemoryTransport, MemoryTransport) {
        let a = MemoryTransport(description: "\(name) (host side)")
        let b = MemoryTransport(description: "\(name) (accessory side)")
        a.peerBox.withLock { $0 = b }
        b.peerBox.withLock { $0 = a }
        return (a, b)
    }

    public func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) {
        let wakeUp = DispatchSource.makeUserDataAddSource(queue: queue)
        wakeUp.setEventHandler { [weak self] in self?.flush() }
        let closed = state.withLock { state -> Bool in
            state.queue = queue
            state.handler = Receiver(deliver: handler)
            if !state.closed { state.wakeUp = WakeUp(source: wakeUp) }
            return state.closed
        }
        wakeUp.activate()
        if closed { wakeUp.cancel() }
        flush()
    }

    public func send(_ frame: [UInt8]) {
        peerBox.withLock { $0 }?.deliver(frame)
    }

    public func cancel() {
        let peer = peerBox.withLock { box -> MemoryTransport? in
            defer { box = nil }
            return box
        }
        close(error: nil)
        peer?.close(error: TransportError("the other side of the in-memory transport closed"))
    }

    /// Simulates the peer vanishing: this side sees the error, the peer sees nothing more.
    public func vanish() {
        _ = peerBox.withLock { box -> MemoryTransport? in
            defer { box = nil }
            return box
        }
        close(error: TransportError("the device vanished"))
    }

    private func deliver(_ frame: [UInt8]) {
        // Frames sent while a wake-up is pending join its batch (the source coalesces).
        let wakeUp = state.withLock { state -> WakeUp? in
            guard !state.closed else { return nil }
            state.pending.append(frame)
            return state.wakeUp
        }
        wakeUp?.source.add(data: 1)
    }

    private func flush() {
        // The batch is taken out and the spare array put in its place (no allocation); the
        // emptied batch becomes the spare afterwards. Values move in and out of the lock by
        // return and by constant capture: a local variable a closure changes would be boxed.
        var (frames, receiver) = state.withLock { state -> ([[UInt8]], Receiver?) in
            let batch = state.pending
            state.pending = state.spare
            state.spare = []
            return (batch, state.closed ? nil : state.handler)
        }
        if let receiver {
            // One hop per batch; each frame is handed over as the array it was sent in (no copy:
            // the receiver may keep views of it).
            for frame in frames { receiver.deliver(.received(frame)) }
        }
        receiver = nil
        frames.removeAll(keepingCapacity: true)
        let emptied = frames
        frames = []
        state.withLock { state in
            if state.spare.capacity < emptied.capacity { state.spare = emptied }
        }
    }

    private func close(error: TransportError?) {
        let (queue, receiver) = state.withLock { state -> (DispatchQueue?, Receiver?) in
            guard !state.closed else { return (nil, nil) }
            state.closed = true
            state.pending.removeAll()
            state.wakeUp?.source.cancel()
            state.wakeUp = nil
            defer { state.handler = nil }
            return (state.queue, state.handler)
        }
        guard let queue, let receiver else { return }
        queue.async { receiver.deliver(.closed(error)) }
    }
}

/// The handler a memory transport delivers to. A closure kept in a struct moves through
/// `Mutex.withLock`'s generic result as it is; a bare closure there is wrapped in a
/// reabstraction thunk, an allocation per batch.
private struct Receiver: Sendable {
    let deliver: @Sendable (TransportEvent) -> Void
}

/// A user-data source that wakes a memory transport's receiving side. Dispatch sources may be
/// signalled and cancelled from any thread; the type only lacks the annotation.
private struct WakeUp: @unchecked Sendable {
    let source: any DispatchSourceUserDataAdd
}
