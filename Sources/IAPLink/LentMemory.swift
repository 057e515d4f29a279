package import ByteRing

// The transport's own memory as the product API shows it: ByteRing (the slot ring and the
// transmit buffers) is no product, so its types reach users only inside these wrappers, whose
// contents the package alone can reach. A transport outside the package lends nothing: it
// delivers arrays and sends arrays, and these values pass through its code untouched.

/// Received bytes a transport lends beyond the handler call that delivers them (a USB IN slot):
/// read them in place with ``withSpan(_:)``, or take a copy with ``copied()``, on the
/// transport's queue. Holding the value keeps the slot lent; the transport takes the bytes back
/// (moving them out of the slot) from a reader that holds them too long.
public struct LentBytes: Sendable {
    /// The lease on the slot.
    package let lease: SlotLease

    /// Wraps `lease`.
    package init(_ lease: SlotLease) { self.lease = lease }

    /// The number of bytes.
    public var count: Int { lease.count }

    /// Runs `body` with the bytes in place.
    public func withSpan<Result>(_ body: (RawSpan) throws -> Result) rethrows -> Result {
        try lease.withSpan(body)
    }

    /// A copy of the bytes.
    public func copied() -> [UInt8] { lease.withUnsafeBytes { Array($0) } }
}

/// An outgoing packet laid out in memory the transport lent (usbfs device memory for USB), which
/// the transport sends as it is: see ``LinkFrame/buffer(_:)``.
public struct TransmitBuffer: Sendable {
    /// The buffer.
    package let packet: PacketBuffer

    /// Wraps `packet`.
    package init(_ packet: PacketBuffer) { self.packet = packet }

    /// The packet's length in bytes.
    public var count: Int { packet.count }

    /// Runs `body` with the packet's bytes in place.
    public func withSpan<Result>(_ body: (RawSpan) throws -> Result) rethrows -> Result {
        try packet.withSpan(body)
    }

    /// A copy of the packet's bytes.
    public func copiedBytes() -> [UInt8] { packet.copiedBytes() }
}

/// The buffers a transport lends for outgoing packets, handed to a machine by the driver
/// (``IAP2Endpoint``'s link lays packets of long payloads out in them).
public struct TransmitBuffers: Sendable {
    /// The pool.
    package let pool: PacketBufferPool

    /// Wraps `pool`.
    package init(_ pool: PacketBufferPool) { self.pool = pool }
}
