internal import AccessoryHost
internal import Dispatch
internal import IAPTransport

/// One session the daemon opened for a client: the accessory's ``AccessorySession`` joined to
/// the daemon's end of the socket pair whose other end the client holds.
///
/// Both directions move without a copy of their own:
/// - accessory → client: each chunk the link received is lent in place
///   (``AccessorySession/withNextChunk(_:)``) and sent to the socket from there;
/// - client → accessory: the socket is read into the channel's buffer, which is lent to
///   ``AccessorySession/writeAvailable(span:)`` (the link's one copy, into its packet).
///
/// Back-pressure both ways: what the accessory cannot take stays in the channel's buffer, which
/// stops reading the socket when full, so the client's writes block; what the client does not
/// read fills its socket, so the daemon stops taking the session's bytes and the link holds the
/// accessory off. Memory per session is bounded by the channel's buffer.
///
/// Confinement: created and driven on the manager's queue.
final class SessionBridge: @unchecked Sendable {
    let id: Int
    let session: AccessorySession
    private let channel: SocketByteChannel
    private let queue: DispatchQueue
    private let log: (String) -> Void
    /// Called once, on the queue, when the bridge is done (the protocol is free again).
    private var onEnd: (() -> Void)?
    private var clientClosed = false
    private var accessoryEnded = false
    private var closing = false

    init(id: Int, session: AccessorySession, descriptor: Int32, queue: DispatchQueue, log: @escaping (String) -> Void, onEnd: @escaping () -> Void) {
        self.id = id
        self.session = session
        self.channel = SocketByteChannel(descriptor: descriptor, description: "client socket of '\(session.protocolString)'")
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
            case .closed: clientEnded()
            }
        }
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
