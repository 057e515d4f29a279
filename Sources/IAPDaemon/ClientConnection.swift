internal import AccessoryHost
internal import Dispatch
internal import Glibc
internal import IAPDaemonProtocol
internal import IAPTransport
internal import SystemCalls

/// One connected client: its control socket, what it asked for, its sessions.
final class Client: @unchecked Sendable {
    // Confinement: the manager's queue.
    let id: Int
    let holder: SessionHolder
    private let descriptor: Int32
    private unowned let core: Core
    private var watch: DescriptorWatch?
    /// Queued output: bytes, and the descriptor that goes with their first byte.
    private var output: [(bytes: [UInt8], descriptors: [Int32])] = []
    private var outputOffset = 0
    private var queuedBytes = 0
    private var framer = MessageFramer(limit: DaemonProtocol.maximumRequestLength)
    private var scratch = [UInt8](repeating: 0, count: 16 * 1024)
    var welcomed = false
    /// The protocol version the client said in its hello.
    var version = 0
    var dropped = false
    var opening = 0
    /// Opens waiting for a protocol this client (or its closing session) still holds.
    var waitingOpens = 0
    var bridges: [Int: SessionBridge] = [:]

    init(id: Int, descriptor: Int32, holder: SessionHolder, core: Core) {
        self.id = id
        self.descriptor = descriptor
        self.holder = holder
        self.core = core
    }

    func start() {
        watch = DescriptorWatch(descriptor: descriptor, queue: core.queue,
                                readable: { [weak self] in self?.receive() }, writable: { [weak self] in self?.flush() })
    }

    /// Tells a client it is not served, then closes its socket.
    func refuse(_ failure: DaemonFailure) {
        let bytes = MessageFramer.encode(DaemonMessage(id: nil, reply: .failure(failure)))
        _ = bytes.withUnsafeBytes { UnixSocket.send(descriptor, $0) }
        _ = close(descriptor)
    }

    private func receive() {
        while !dropped {
            let result = scratch.withUnsafeMutableBytes { SystemCall.read(descriptor, into: $0) }
            switch result {
            case .success(0):
                return drop(reason: nil)
            case .success(let count):
                framer.append(scratch.prefix(count))
                do {
                    while !dropped, let message = try framer.next(ClientMessage.self) { handle(message) }
                } catch {
                    return refuseRequest(id: nil, "\(error)")
                }
            case .failure(let error) where error.kind == .wouldBlock:
                return
            case .failure(let error):
                return drop(reason: "\(error)")
            }
        }
    }

    private func handle(_ message: ClientMessage) {
        if let invalid = message.request.invalidity { return refuseRequest(id: message.id, invalid) }
        switch message.request {
        case let .hello(version, _):
            guard (DaemonProtocol.oldestVersion...DaemonProtocol.version).contains(version) else {
                reply(message.id, .failure(DaemonFailure(.version, DaemonProtocol.versionMismatch(daemon: DaemonProtocol.oldestVersion...DaemonProtocol.version, client: version))))
                return drop(reason: "protocol version \(version)")
            }
            self.version = version
            welcomed = true
            reply(message.id, .welcome(version: DaemonProtocol.version, daemon: core.options.name, accessories: core.records))
        case .list:
            guard welcomed else { return refuseRequest(id: message.id, "list before hello") }
            reply(message.id, .accessories(core.records))
        case let .open(accessory, protocolString):
            guard welcomed else { return refuseRequest(id: message.id, "open before hello") }
            core.open(self, request: message.id, accessoryID: accessory, protocolString: protocolString)
        case .ping:
            reply(message.id, .pong)
        case .stats:
            guard welcomed else { return refuseRequest(id: message.id, "stats before hello") }
            reply(message.id, .statistics(core.statistics()))
        }
    }

    /// A request that breaks the protocol: the client is told why and dropped.
    private func refuseRequest(id: UInt32?, _ reason: String) {
        core.book.failure(.badRequest)
        core.logger.notice("dropping client \(self.id) (\(holder)): \(reason)")
        reply(id, .failure(DaemonFailure(.badRequest, "iapd dropped this client: \(reason)")))
        flush()
        drop(reason: reason)
    }

    func reply(_ id: UInt32?, _ reply: DaemonReply, passing descriptors: [Int32] = []) {
        let bytes = MessageFramer.encode(DaemonMessage(id: id, reply: reply))
        guard !dropped else {
            for descriptor in descriptors { _ = close(descriptor) }
            return
        }
        output.append((bytes, descriptors))
        queuedBytes += bytes.count
        flush()
        // A client that sends requests (stats, list, ping) and never reads the answers must not
        // grow the daemon's memory: past the bound, with more than this one reply waiting (one
        // large welcome or list alone may exceed it), it is dropped as a slow client.
        if !dropped, queuedBytes > core.options.maximumQueuedOutput, output.count > 1 {
            core.book.failure(.slowClient)
            core.logger.notice("dropping client \(self.id) (\(holder)): it left \(queuedBytes) bytes of replies unread")
            drop(reason: "too slow")
        }
    }

    func send(_ bytes: [UInt8]) {
        guard !dropped else { return }
        output.append((bytes, []))
        queuedBytes += bytes.count
        guard queuedBytes <= core.options.maximumQueuedOutput else {
            core.book.failure(.slowClient)
            core.logger.notice("dropping client \(id) (\(holder)): it left \(queuedBytes) bytes of events unread")
            return drop(reason: "too slow")
        }
        flush()
    }

    private func flush() {
        while !dropped, let first = output.first {
            let result = first.bytes.withUnsafeBytes { raw -> Result<Int, SystemError> in
                let rest = UnsafeRawBufferPointer(rebasing: raw[outputOffset...])
                if outputOffset == 0, !first.descriptors.isEmpty { return UnixSocket.send(descriptor, rest, passing: first.descriptors) }
                return UnixSocket.send(descriptor, rest)
            }
            switch result {
            case .success(let count):
                if outputOffset == 0, count > 0, !first.descriptors.isEmpty {
                    for passed in first.descriptors { _ = close(passed) } // they went with the first byte
                    output[0].descriptors = []
                }
                outputOffset += count
                queuedBytes -= count
                if outputOffset == first.bytes.count {
                    output.removeFirst()
                    outputOffset = 0
                }
            case .failure(let error) where error.kind == .wouldBlock:
                watch?.watchWritable()
                return
            case .failure(let error):
                return drop(reason: "\(error)")
            }
        }
        watch?.stopWatchingWritable()
    }

    /// Closes the client's socket and ends its sessions at once.
    func drop(reason: String?) {
        guard !dropped else { return }
        dropped = true
        for pending in output { for passed in pending.descriptors { _ = close(passed) } }
        output.removeAll()
        if let watch { watch.cancel() } else { _ = close(descriptor) }
        watch = nil
        for bridge in Array(bridges.values) { bridge.abort() }
        bridges.removeAll()
        core.removed(self)
        core.logger.debug("client \(id): \(holder) went away\(reason.map { " (\($0))" } ?? "")")
    }
}
