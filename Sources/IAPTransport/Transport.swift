public import Dispatch
public import IAPLink

/// What kind of wire a ``Transport`` is.
public enum TransportKind: String, Sendable, Hashable, Codable {
    /// Two endpoints in one process (tests, the in-process simulator).
    case memory
    /// A serial line: a UART, a USB-serial adapter, or a pseudo-terminal.
    case serial
    /// The iAP2 bulk interface of a USB accessory.
    case usb
    /// This machine as a USB gadget (the simulator behind FunctionFS).
    case gadget
    /// An RFCOMM channel over Bluetooth Classic (BlueZ).
    case bluetooth
}

/// Something that happened on a ``Transport``.
public enum TransportEvent: Sendable {
    /// Bytes arrived (any amount; frames may be split or coalesced).
    case received([UInt8])
    /// Bytes arrived in the transport's own buffer (a USB transfer's ring slot): read them
    /// during the handler call, without copying; they are gone when it returns.
    case borrowed(BorrowedBytes)
    /// Bytes arrived in the transport's own buffer, lent beyond the handler call (a USB IN
    /// slot): keep the value as long as the bytes are needed and read it on the transport's
    /// queue; the buffer goes back after the last reference went (or the transport moves the
    /// bytes out of it, for a reader that holds it too long).
    case lent(LentBytes)
    /// The transport closed: `nil` when asked to, otherwise why (the device vanished, a read
    /// failed…). No event follows.
    case closed(TransportError?)
}

/// A view of bytes a transport owns (a USB ring slot), valid only during the handler call that
/// delivers it, on the transport's queue. Read it in place with ``withSpan(_:)`` or take a copy
/// with ``copied()``; never keep it.
public struct BorrowedBytes: @unchecked Sendable {
    // Sendability: the view is handed to one handler call on one queue and not kept; the
    // transport does not touch the bytes until that call returns.
    private let bytes: UnsafeRawBufferPointer

    /// Wraps `bytes`, which must stay valid and unchanged until the handler returns.
    public init(_ bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

    /// The number of bytes.
    public var count: Int { bytes.count }

    /// Runs `body` with the bytes in place.
    public func withSpan<Result>(_ body: (RawSpan) throws -> Result) rethrows -> Result {
        try body(RawSpan(_unsafeBytes: bytes))
    }

    /// A copy of the bytes.
    public func copied() -> [UInt8] { Array(bytes) }
}

/// Why a transport failed, with what a person can do about it.
///
/// Decide on ``kind`` (and ``errno``), never on the message: the message is for people and may
/// change.
public struct TransportError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What a caller can decide on without reading the message.
    public enum Kind: String, Sendable, Hashable {
        /// The wire went away: an adapter unplugged, a pseudo-terminal's other end closed, a USB
        /// device disconnected.
        case hungUp
        /// The device or file does not exist.
        case notFound
        /// Not allowed (file permissions, a missing group, root needed).
        case permission
        /// Someone else holds it (another program, another transport, another session).
        case busy
        /// The device cannot do what was asked (a baud rate, a descriptor that is not a tty).
        case unsupported
        /// The peer did not answer within the time allowed.
        case timedOut
        /// The peer stopped taking data: more waited to be written than the transport keeps.
        case stalled
        /// Anything else: see the message.
        case failed
    }

    /// What failed, e.g. "cannot open /dev/ttyUSB0".
    public var message: String
    /// What kind of failure it is.
    public var kind: Kind
    /// The errno, when the failure came from a system call.
    public var errno: Int32?
    /// What to do next, e.g. "add your user to the dialout group".
    public var advice: String?

    /// An error saying `message`; `kind` defaults to ``Kind/failed``.
    public init(_ message: String, kind: Kind = .failed, errno: Int32? = nil, advice: String? = nil) {
        self.message = message
        self.kind = kind
        self.errno = errno
        self.advice = advice
    }

    /// The message, then the advice after a semicolon.
    public var description: String {
        advice.map { "\(message); \($0)" } ?? message
    }
}

/// A byte pipe to one peer: what the link layer runs over.
///
/// Every method is called on the queue given to ``activate(queue:handler:)``, and the handler
/// is called on that queue too, so a transport needs no locking of its own. ``send(_:)`` takes
/// one frame (one link packet or the detect): the host's USB transport sends each in its own
/// OUT transfer; byte streams (serial) just write the bytes. What arrives is always treated as a
/// byte stream, whatever the wire: a USB device may split a frame over several IN transfers
/// (the gadget does, to end a transfer with a short packet) or pack several into one, and the
/// frame scanner above finds the frames in any chunking.
public protocol Transport: AnyObject, Sendable {
    /// What a person reads in `iapctl list`, e.g. `serial /dev/ttyUSB0 @ 115200`.
    var description: String { get }
    /// The kind of wire.
    var kind: TransportKind { get }
    /// Starts delivering events to `handler` on `queue`.
    func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void)
    /// Sends one frame. Must not block: a transport that cannot write at once queues the bytes
    /// (the link's window bounds how many there can be).
    func send(_ frame: [UInt8])
    /// Sends one frame as the link holds it: an array, or a transmit buffer this transport lent
    /// (a ``TransmitBuffer`` from the pool it offers), to send from where it lies and to hold
    /// until it is sent. The default sends the
    /// array, or a copy of the buffer's bytes; a wrapper forwards the frame to its base as it is.
    func send(frame: LinkFrame)
    /// Sends one small frame (a bare acknowledgement) ahead of frames already waiting in this
    /// transport, after the one it is writing: on a byte stream (serial, RFCOMM) an ACK must not
    /// wait behind a window of data, or the peer retransmits what arrived long ago. The default
    /// sends it in order, as ``send(_:)``: USB sends each frame in a transfer of its own, and
    /// the memory transport queues nothing.
    func sendAhead(_ frame: [UInt8])
    /// Closes the transport; the handler receives `.closed(nil)` unless it already got a close.
    func cancel()
    /// The accessory's native-transport interfaces reachable through this transport (USB, or
    /// the in-process simulator's), if any. A wrapper forwards its base's. Nil by default.
    var nativeTransports: (any NativeTransportProvider)? { get }
    /// A value of the type asked for that this transport can give, when it has one: what a
    /// layer above wants to know of a particular kind of wire without knowing the transport's
    /// class (the package's USB transport gives its pipe counters and its device this way, to
    /// AccessoryHostUSB and the core). Nil by default; a wrapper forwards its base's.
    func capability<Value>(_ type: Value.Type) -> Value?
}

extension Transport {
    public func send(frame: LinkFrame) {
        switch frame {
        case let .bytes(bytes): send(bytes)
        case let .buffer(buffer): send(buffer.copiedBytes())
        }
    }
    public func sendAhead(_ frame: [UInt8]) { send(frame) }
    public var nativeTransports: (any NativeTransportProvider)? { nil }
    public func capability<Value>(_ type: Value.Type) -> Value? { nil }
}
