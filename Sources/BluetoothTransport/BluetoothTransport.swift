package import Dispatch
package import IAPTransport
internal import Glibc

/// iAP2 over one RFCOMM connection: the socket BlueZ handed over in `NewConnection` (or one
/// connected out by ``RFCOMMSocket``), as a ``Transport`` of kind ``TransportKind/bluetooth``.
///
/// RFCOMM is a reliable byte stream, so the link runs on it as on a serial line: each link
/// packet written as it is, what arrives scanned for frames in any chunking. The socket is
/// driven like every serial line of the process (`SerialTransport`: the one poller thread says
/// when to read, reads and writes happen on the activation queue, output beyond what the
/// kernel takes is queued and bounded). Errors say what to do in Bluetooth's terms.
///
/// ``capability(_:)`` gives its ``BluetoothPeer``.
package final class BluetoothTransport: Transport {
    /// What a person reads, e.g. `bluetooth 00:1A:7D:DA:71:13 (hci0)`.
    package let description: String
    /// Always ``TransportKind/bluetooth``.
    package var kind: TransportKind { .bluetooth }
    /// Who is at the other end.
    package let peer: BluetoothPeer
    private let base: SerialTransport
    private let closed: @Sendable () -> Void

    /// A transport over `descriptor` (a connected RFCOMM socket, or any connected stream socket
    /// in tests), which it now owns; `closed` runs once when the transport has closed.
    ///
    /// - Throws: ``TransportError`` when the descriptor cannot be used (it is then closed).
    package init(descriptor: Int32, peer: BluetoothPeer, closed: @escaping @Sendable () -> Void = {}) throws(TransportError) {
        let description = "bluetooth \(peer.address)" + (peer.adapter.isEmpty ? "" : " (\(peer.adapter))")
        do {
            base = try SerialTransport(fileDescriptor: descriptor, description: description, ownsDescriptor: true)
        } catch {
            _ = Glibc.close(descriptor)
            throw error
        }
        self.description = description
        self.peer = peer
        self.closed = closed
    }

    /// Starts delivering events to `handler` on `queue` (serial); a close carries Bluetooth advice.
    package func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) {
        let closed = self.closed
        let address = peer.address
        base.activate(queue: queue) { event in
            guard case let .closed(error) = event else { return handler(event) }
            closed()
            handler(.closed(error.map { Self.explained($0, address: address) }))
        }
    }

    /// Writes `frame` now as far as the socket takes it and queues the rest; never blocks.
    package func send(_ frame: [UInt8]) { base.send(frame) }

    /// Writes `frame` (a bare ACK) ahead of the data waiting for the socket, once the frame being
    /// written is whole.
    package func sendAhead(_ frame: [UInt8]) { base.sendAhead(frame) }

    /// Closes the connection (the RFCOMM channel goes down); the handler receives `.closed(nil)`.
    package func cancel() { base.cancel() }

    /// Its ``BluetoothPeer``, and what its socket's transport gives (its output progress).
    package func capability<Value>(_ type: Value.Type) -> Value? {
        type == BluetoothPeer.self ? peer as? Value : base.capability(type)
    }

    /// `error` with advice for a Bluetooth link instead of a serial line's.
    static func explained(_ error: TransportError, address: BluetoothAddress) -> TransportError {
        var explained = error
        // The link going down under an open RFCOMM channel (the peer's controller switched
        // off, out of range: the supervision timeout) reads as ECONNRESET, EHOSTDOWN or
        // ETIMEDOUT, not as end of file: to a person that is the connection ending too.
        let linkLost = error.errno.map { [ECONNRESET, EHOSTDOWN, EHOSTUNREACH, ETIMEDOUT, ENOTCONN].contains($0) } ?? false
        switch error.kind {
        case _ where linkLost && error.kind != .stalled:
            explained.kind = .hungUp
            explained.message = "the Bluetooth connection to \(address) was lost (\(error.message))"
            explained.advice = "the accessory was switched off, went out of range or its adapter went away; it connects again by itself, "
                + "or run iapctl --bluetooth-connect \(address)"
        case .hungUp:
            explained.message = "the Bluetooth connection to \(address) ended"
            explained.advice = "the accessory disconnected, went out of range or was switched off; it connects again by itself, "
                + "or run iapctl --bluetooth-connect \(address)"
        case .stalled:
            explained.advice = "the accessory stopped reading; switch it off and on, then connect again"
        default:
            explained.advice = "connect again (iapctl --bluetooth-connect \(address)); journalctl -u bluetooth shows what bluetoothd reports"
        }
        return explained
    }
}
