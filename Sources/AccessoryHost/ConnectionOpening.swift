internal import Dispatch
internal import IAPLink
internal import IAPTransport
internal import Synchronization

// Opening sessions on a connection: on the link, on a native transport, or through iapd.

extension Connection {
    // MARK: Calls from sessions and accessories (hop to the queue first)

    func openSession(accessory: Accessory, protocolString: String) async throws -> AccessorySession {
        try await withCheckedThrowingContinuation { continuation in
            openSession(accessory: accessory, protocolString: protocolString) { continuation.resume(with: $0) }
        }
    }

    /// Opens a session and calls `complete` on the queue with it or the reason it did not open.
    /// From any thread (it hops to the queue).
    func openSession(accessory: Accessory, protocolString: String, complete: @escaping OpenCompletion) {
        queue.async {
            guard self.downReason == nil, self.accessory === accessory else {
                return complete(.failure(.disconnected(self.downReason ?? "the accessory reconnected")))
            }
            if let remote = self.remote {
                return self.openRemote(remote, accessory: accessory, protocolString: protocolString, complete: complete)
            }
            if let declared = accessory.identity.protocols.first(where: { $0.name == protocolString }),
               declared.nativeTransportComponentIdentifier != nil {
                return self.openNative(accessory: accessory, protocolString: protocolString, complete: complete)
            }
            self.driver.perform { machine, now in
                do {
                    let id = try machine.openSession(protocolName: protocolString, now: now)
                    self.pendingOpens[id] = (protocolString, complete)
                } catch EndpointError.protocolInUse(let name) {
                    complete(.failure(.protocolInUse(name)))
                } catch EndpointError.unsupportedProtocol(let name) {
                    complete(.failure(.unsupportedProtocol(name, available: accessory.protocolStrings)))
                } catch {
                    complete(.failure(.disconnected("\(error)")))
                }
            }
        }
    }

    /// Opens a protocol the accessory binds to a native transport: its channel (for USB, the
    /// FF/F0/01 interface in alternate setting 1), no StartExternalAccessoryProtocolSession.
    private func openNative(accessory: Accessory, protocolString: String, complete: @escaping OpenCompletion) {
        let inUse = pendingNativeOpens.contains(protocolString)
            || sessions.values.contains { $0.stream.isNative && $0.protocolString == protocolString }
        guard !inUse else { return complete(.failure(.protocolInUse(protocolString))) }
        guard let provider = transport.nativeTransports else {
            return complete(.failure(.sessionRefused(
                "the accessory carries '\(protocolString)' on a native USB interface of its own, and \(transport.description) has none; connect the accessory by USB to open it")))
        }
        pendingNativeOpens.insert(protocolString)
        logger.debug("opening '\(protocolString)' on its native transport")
        provider.openNativeChannel(for: protocolString, queue: queue) { [self] result in
            channelOpened(result.mapError { .sessionRefused($0.description) }, accessory: accessory, protocolString: protocolString,
                          complete: complete)
        }
    }

    /// A channel for an opening session came (native transport or iapd's socket), or why not:
    /// the session is handed out over it unless the accessory went away meanwhile. On the queue.
    private func channelOpened(_ result: Result<any ByteChannel, AccessoryError>, accessory: Accessory, protocolString: String,
                               complete: @escaping OpenCompletion) {
        pendingNativeOpens.remove(protocolString)
        switch result {
        case let .failure(error):
            complete(.failure(error))
        case let .success(channel):
            guard downReason == nil, self.accessory === accessory else {
                channel.close()
                return complete(.failure(.disconnected(downReason ?? "the accessory reconnected")))
            }
            let session = add(NativeSessionStream(channel: channel), protocolString: protocolString, accessory: accessory)
            let key = session.key
            channel.activate(queue: queue) { [weak self] event in self?.nativeEvent(key, event) }
            logger.info("session '\(protocolString)' open on \(channel.description)")
            complete(.success(session))
        }
    }

    /// Opens a session on an accessory the daemon owns: the daemon checks and opens it, and
    /// hands over a socket carrying its bytes, served like a native channel.
    private func openRemote(_ remote: RemoteAccessory, accessory: Accessory, protocolString: String, complete: @escaping OpenCompletion) {
        let inUse = pendingNativeOpens.contains(protocolString) || sessions.values.contains { $0.protocolString == protocolString }
        guard !inUse else { return complete(.failure(.protocolInUse(protocolString))) }
        pendingNativeOpens.insert(protocolString)
        remote.open(protocolString) { [self] result in
            channelOpened(result, accessory: accessory, protocolString: protocolString, complete: complete)
        }
    }

    private func nativeEvent(_ key: Int, _ event: ByteChannelEvent) {
        if case let .closed(error) = event {
            // The stream ended under the session: the accessory closed it, or it went away.
            end(key, error: error.map { AccessoryError.disconnected($0.description) })
        }
        withSession(key) { _, _ in }
    }
}
