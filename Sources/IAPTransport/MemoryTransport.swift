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
        var handler: (@Sendable (TransportEvent) -> Void)?
        var pending: [[UInt8]] = []
        /// An emptied batch array handed back by the last flush, for the next batch.
        var spare: [[UInt8]] = []
        var closed = false
        var flushScheduled = false
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
        state.withLock {
            $0.queue = queue
            $0.handler = handler
        }
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
        let schedule = state.withLock { state -> Bool in
            guard !state.closed else { return false }
            state.pending.append(frame)
            guard !state.flushScheduled, state.queue != nil else { return false }
            state.flushScheduled = true
            return true
        }
        if schedule { state.withLock { $0.queue }?.async { self.flush() } }
    }

    private func flush() {
        // The batch is swapped out for the spare array (no allocation), and the emptied batch
        // becomes the spare again afterwards.
        var frames: [[UInt8]] = []
        let handler = state.withLock { state -> (@Sendable (TransportEvent) -> Void)? in
            state.flushScheduled = false
            swap(&frames, &state.pending)
            swap(&state.pending, &state.spare)
            return state.closed ? nil : state.handler
        }
        if let handler {
            // One hop per batch; each frame is handed over as the array it was sent in (no copy:
            // the receiver may keep views of it).
            for frame in frames { handler(.received(frame)) }
        }
        frames.removeAll(keepingCapacity: true)
        state.withLock { state in
            if state.spare.capacity < frames.capacity { swap(&state.spare, &frames) }
        }
    }

    private func close(error: TransportError?) {
        let (queue, handler) = state.withLock { state -> (DispatchQueue?, (@Sendable (TransportEvent) -> Void)?) in
            guard !state.closed else { return (nil, nil) }
            state.closed = true
            state.pending.removeAll()
            defer { state.handler = nil }
            return (state.queue, state.handler)
        }
        guard let queue, let handler else { return }
        queue.async { handler(.closed(error)) }
    }
}
