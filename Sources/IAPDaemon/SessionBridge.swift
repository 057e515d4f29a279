internal import AccessoryHost
internal import ByteRing
internal import Dispatch
internal import IAPTransport

/// One session the daemon opened for a client: the accessory's ``AccessorySession`` joined to
/// the session's shared rings (``SharedRingChannel``, the daemon's end), whose memory and socket
/// the client holds the other end of.
///
/// The bridge is the session's relay (``SessionRelay``): the connection moves the bytes in the
/// same service of the link that made them movable, with one copy in the daemon each way:
/// - accessory → client: each chunk the link accepted is copied into the client's ring before
///   the link is left (the link's buffer is free again at once, and the accessory's next packet
///   is acknowledged without waiting for another turn of the queue);
/// - client → accessory: the client's ring is lent in place to the link, which copies it into
///   its packets (the link's one copy) as far as its window takes.
/// The client's wake-ups (bytes in its ring, room in the daemon's) serve the session once.
///
/// Back-pressure both ways: what the accessory cannot take stays in the client's ring, so the
/// client's writes wait for room; what the client does not read fills its ring, so the link's
/// buffer fills and the link holds the accessory off. Memory per session is the two rings. The
/// accessory's acknowledgements of the client's bytes are published in the rings' header as
/// they come, so the client's drain waits for the accessory.
///
/// Confinement: created and driven on the manager's queue.
final class SessionBridge: SessionRelay, @unchecked Sendable {
    let id: Int
    let session: AccessorySession
    private let channel: SharedRingChannel
    private let queue: DispatchQueue
    private let log: (String) -> Void
    /// Called once, on the queue, when the bridge is done (the protocol is free again), with the
    /// bridge (its byte counts are final then).
    private var onEnd: ((SessionBridge) -> Void)?
    private var clientClosed = false
    private var accessoryEnded = false
    private var closing = false
    /// Session bytes the accessory's link took from the client's ring (iapd's metrics).
    private(set) var bytesToAccessory = 0
    /// Session bytes the accessory sent that went into the client's ring (iapd's metrics).
    private(set) var bytesToClient = 0

    /// A bridge for `session` over the rings in `memory` and the wake-up `socket`. `log` is told
    /// when the client broke its ring (the session is closed then); `onEnd` when the bridge is done.
    init(id: Int, session: AccessorySession, memory: SharedRingMemory, socket: Int32, queue: DispatchQueue, log: @escaping (String) -> Void,
         onEnd: @escaping (SessionBridge) -> Void) {
        self.id = id
        self.session = session
        self.channel = SharedRingChannel(memory: memory, socket: socket, role: .daemon, description: "session \(id) '\(session.protocolString)'")
        self.queue = queue
        self.log = log
        self.onEnd = onEnd
    }

    /// Whether the client closed its end: the session is on its way out (an open of its
    /// protocol waits for it instead of being refused).
    var isReleasing: Bool { clientClosed || onEnd == nil || channel.peerHasClosed }

    /// Starts moving bytes. On the queue.
    func start() {
        channel.activate(queue: queue) { [weak self] event in
            guard let self, onEnd != nil else { return }
            switch event {
            case .readable, .writable:
                session.serveRelay()
                afterService()
            case .closed(let error?):
                // The client broke its ring: its session ends now.
                log(error.description)
                abort()
            case .closed(nil):
                clientEnded()
            }
        }
        session.relay(to: self)
    }

    /// Ends the bridge at once (the client went away): the session is closed without waiting.
    func abort() {
        guard onEnd != nil else { return }
        channel.close()
        session.close()
        finish()
    }

    // MARK: The relay (called by the connection, inside its service of the link)

    func deliver(_ bytes: RawSpan) -> Int {
        // A client that closed its end reads nothing more: its bytes are dropped.
        guard !clientClosed else { return bytes.byteCount }
        let written = channel.write(span: bytes)
        bytesToClient += written
        return written
    }

    func withOutgoing(_ body: (RawSpan) -> Int) {
        guard onEnd != nil else { return }
        while let taken = channel.withReadableBytes({ span -> (consumed: Int, result: Int) in
            let taken = body(span)
            return (taken, taken)
        }), taken > 0 {
            bytesToAccessory += taken
        }
        // The client's last bytes went to the link: the close can go on (from the queue).
        if clientClosed, !closing, channel.readableByteCount == 0 { queue.async { [weak self] in self?.afterService() } }
    }

    func acknowledged(_ count: Int) {
        channel.publishAcknowledged(count)
    }

    func ended() {
        guard onEnd != nil, !accessoryEnded else { return }
        accessoryEnded = true
        session.serveRelay() // what the accessory sent before, as far as the client's ring takes it
        afterService()
    }

    // MARK: The ends

    /// After a service: the client's end is closed once the accessory ended and every byte it
    /// sent is in the client's ring; the session is closed once the client closed and every byte
    /// it wrote was handed to the link.
    private func afterService() {
        guard onEnd != nil else { return }
        if accessoryEnded, !clientClosed, !session.hasBytesAvailable { channel.close() }
        if accessoryEnded, clientClosed { return finish() }
        if clientClosed, channel.readableByteCount == 0 { closeGracefully() }
    }

    private func clientEnded() {
        clientClosed = true
        session.serveRelay()
        afterService()
    }

    /// The client closed its end and everything it wrote was handed to the link: the session is
    /// closed once the accessory acknowledged those bytes (at most 10 s).
    private func closeGracefully() {
        guard !closing, onEnd != nil else { return }
        closing = true
        let session = self.session
        let queue = self.queue
        Task {
            do {
                try await session.close(timeout: .seconds(10))
            } catch {
                session.close()
            }
            queue.async { [weak self] in self?.finish() }
        }
    }

    private func finish() {
        guard let onEnd else { return }
        self.onEnd = nil
        channel.close()
        // Closed here too (a no-op when the graceful close did it): the connection holds the
        // bridge as the session's relay until the session is closed.
        session.close()
        onEnd(self)
    }
}
