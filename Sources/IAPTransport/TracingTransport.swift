public import Dispatch
public import IAPLink

/// Wraps a transport and shows every byte in both directions to an observer, unchanged: how
/// `--trace` sees the wire.
public final class TracingTransport: Transport {
    /// Which way bytes went.
    public enum Direction: String, Sendable {
        /// From the host to the accessory.
        case out
        /// From the accessory to the host.
        case `in`
    }

    /// The transport underneath, which does the work: every call is passed on to it, and its
    /// capabilities are this transport's.
    public let base: any Transport
    private let observer: @Sendable (Direction, [UInt8]) -> Void

    /// Wraps `base`, showing `observer` every byte that passes, in order, without changing them.
    ///
    /// - Parameters:
    ///   - base: the transport to watch.
    ///   - observer: called on the transport's queue with each frame sent and each chunk
    ///     received; keep it short, the wire waits for it.
    public init(_ base: any Transport, observer: @escaping @Sendable (Direction, [UInt8]) -> Void) {
        self.base = base
        self.observer = observer
    }

    public var description: String { base.description }
    public var kind: TransportKind { base.kind }
    /// The base transport's native-transport interfaces.
    public var nativeTransports: (any NativeTransportProvider)? { base.nativeTransports }
    /// The base transport's capabilities.
    public func capability<Value>(_ type: Value.Type) -> Value? { base.capability(type) }

    public func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) {
        let observer = self.observer
        base.activate(queue: queue) { event in
            switch event {
            case let .received(bytes): observer(.in, bytes)
            case let .borrowed(bytes): observer(.in, bytes.copied())
            case let .lent(bytes): observer(.in, bytes.copied())
            case .closed: break
            }
            handler(event)
        }
    }

    public func send(_ frame: [UInt8]) {
        observer(.out, frame)
        base.send(frame)
    }

    /// Shows the frame to the observer and hands it to the base to send ahead.
    public func sendAhead(_ frame: [UInt8]) {
        observer(.out, frame)
        base.sendAhead(frame)
    }

    /// Shows the frame to the observer (a copy when it is in a transmit buffer) and hands it to
    /// the base as it is.
    public func send(frame: LinkFrame) {
        observer(.out, frame.copiedBytes())
        base.send(frame: frame)
    }

    public func cancel() { base.cancel() }
}
