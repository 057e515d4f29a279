/// A transport's way to reset the device under it without unplugging it (on USB a port reset):
/// what a host tries, once, when an accessory's link is stuck and would otherwise stay stuck
/// until someone re-plugs it. Offered through ``Transport/capability(_:)``; the layers above
/// learn nothing of the bus.
public struct DeviceReset: Sendable {
    private let body: @Sendable (@escaping @Sendable (TransportError?) -> Void) -> Void

    /// A reset that runs `body`; `body` calls its argument once, with nil when the device is
    /// back and the transport carries data again, or with why not.
    public init(_ body: @escaping @Sendable (@escaping @Sendable (TransportError?) -> Void) -> Void) {
        self.body = body
    }

    /// Resets the device; `completion` (on the transport's queue) gets nil once the transport
    /// carries data again, or the failure (the transport may then close).
    public func reset(completion: @escaping @Sendable (TransportError?) -> Void) { body(completion) }
}
