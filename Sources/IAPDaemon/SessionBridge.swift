internal import AccessoryHost
internal import ByteRing
internal import Dispatch
internal import IAPTransport

/// One session the daemon opened for a client: the accessory's ``AccessorySession`` joined to
/// the session's shared rings (``SharedRingChannel``, the daemon's end), whose memory and socket
/// the client holds the other end of.
///
/// Both directions move with one copy in the daemon:
/// - accessory → client: each chunk the link received is lent in place
///   (``AccessorySession/withNextChunk(_:)``) and copied into the client's ring;
/// - client → accessory: the client's ring is lent in place to
///   ``AccessorySession/writeAvailable(span:)`` (the link's one copy, into its packet).
///
/// Back-pressure both ways: what the accessory cannot take stays in the client's ring, so the
/// client's writes wait for room; what the client does not read fills its ring, so the daemon
/// stops taking the session's bytes and the link holds the accessory off. Memory per session is
/// the two rings. The accessory's acknowledgements of the client's bytes are published in the
/// rings' header as they come, so the client's drain waits for the accessory.
///
/// Confinement: created and driven on the manager's queue.
final class SessionBridge: @unchecked Sendable {
    let id: Int
    let session: AccessorySession
    private let channel: SharedRingChannel
    private let queue: DispatchQueue
    private let log: (String) -> Void
    /// Called once, on the queue, when the bridge is done (the protocol is free again).
    private var onEnd: (() -> Void)?
    private var clientClosed = false
    private var accessoryEnded = false
    private var closing = false

    init(id: Int, session: AccessorySession, memory: SharedRingMemory, socket: Int32, queue: DispatchQueue, log: @escaping (String) -> Void,
         onEnd: @escaping () -> Void) {
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
            guard let self else { return }
            switch event {
            case .readable: toAccessory()
            case .writable: toClient()
            case .closed(let error?):
                // The client broke its ring: its session ends now.
                log(error.description)
                abort()
            case .closed(nil): clientEnded()
            }
        }
        let channel = self.channel
        session.observeAcknowledgements { channel.publishAcknowledged($0) }
        session.setEventHandler(queue: queue) { [weak self] event in
            guard let self else { return }
            switch event {
            case .hasBytesAvailable: toClient()
            case .hasSpaceAvailable: toAccessory()
            case .endEncountered, .errorOccurred: accessoryStopped()
            case .openCompleted: break
            }
        }
    }

    /// Ends the bridge at once (the client went away): the session is closed without waiting.
    func abort() {
        guard onEnd != nil else { return }
        channel.close()
        session.close()
        finish()
    }

    private func toClient() {
        guard onEnd != nil else { return }
        while let sent = session.withNextChunk({ span -> (consumed: Int, result: Int) in
            let sent = channel.write(span: span)
            return (sent, sent)
        }), sent > 0 {}
        if accessoryEnded, !session.hasBytesAvailable { channel.close() }
    }

    private func toAccessory() {
        guard onEnd != nil, !accessoryEnded else { return }
        while let taken = channel.withReadableBytes({ span -> (consumed: Int, result: Int) in
            let taken = (try? session.writeAvailable(span: span)) ?? 0
            return (taken, taken)
        }), taken > 0 {}
        if clientClosed, channel.readableByteCount == 0 { closeGracefully() }
    }

    private func clientEnded() {
        clientClosed = true
        if accessoryEnded {
            return finish()
        }
        if channel.readableByteCount == 0 { closeGracefully() } else { toAccessory() }
    }

    private func accessoryStopped() {
        guard !accessoryEnded else { return }
        accessoryEnded = true
        toClient()
        if clientClosed { finish() }
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
        onEnd()
    }
}
