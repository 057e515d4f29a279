internal import IAPWire

/// One frame for the transport to send, as the link holds it: an array, or a ``TransmitBuffer``
/// the transport lent (memory it can submit as it is: usbfs device memory for USB). A link
/// packet in a buffer was laid out there by the writer and finished there by the link; the
/// transport sends it without copying it and the link keeps it until the peer acknowledges it.
public enum LinkFrame: Sendable {
    /// A frame in an array (control frames, and every frame of a transport that lends no buffers).
    case bytes([UInt8])
    /// A frame in a buffer from the transport's ``TransmitBuffers``.
    case buffer(TransmitBuffer)

    /// The frame's length in bytes.
    public var count: Int {
        switch self {
        case let .bytes(bytes): bytes.count
        case let .buffer(buffer): buffer.count
        }
    }

    /// Runs `body` with the frame's bytes in place.
    public func withSpan<Result>(_ body: (RawSpan) throws -> Result) rethrows -> Result {
        switch self {
        case let .bytes(bytes): try body(bytes.span.bytes)
        case let .buffer(buffer): try buffer.withSpan(body)
        }
    }

    /// Whether the frame is a bare acknowledgement (an iAP2 ACK or EAK of the link, no SYN, no
    /// session data): what a byte-stream transport may send ahead of data already waiting
    /// (``IAP2Link`` sends these from arrays).
    public var isBareAcknowledgement: Bool {
        guard case let .bytes(bytes) = self else { return false }
        return LinkFrame.isBareAcknowledgement(bytes)
    }

    /// Whether `bytes` is an iAP2 link packet with ACK (and perhaps EAK) and nothing else: start
    /// of packet, a header whose length is the bytes', control ACK or ACK|EAK, link session 0.
    public static func isBareAcknowledgement(_ bytes: [UInt8]) -> Bool {
        guard bytes.count >= LinkPacketHeader.size, bytes[0] == 0xFF, bytes[1] == 0x5A,
              Int(bytes[2]) << 8 | Int(bytes[3]) == bytes.count, bytes[7] == 0 else { return false }
        let control = LinkControl(rawValue: bytes[4])
        return control == .ack || control == [.ack, .eak]
    }

    /// Whether `bytes` is an iAP2 data packet (ACK set, a link session other than 0, no SYN, RST
    /// or SLP): what a bare acknowledgement may overtake in a byte-stream transport's queue.
    /// Anything else (a SYN, the detect, an iAP1 frame) keeps its place before later frames.
    public static func isDataPacket(_ bytes: [UInt8]) -> Bool {
        guard bytes.count > LinkPacketHeader.size, bytes[0] == 0xFF, bytes[1] == 0x5A,
              Int(bytes[2]) << 8 | Int(bytes[3]) == bytes.count, bytes[7] != 0 else { return false }
        return LinkControl(rawValue: bytes[4]) == .ack
    }

    /// The frame as an array: the array itself, or a copy of the buffer's bytes.
    public func copiedBytes() -> [UInt8] {
        switch self {
        case let .bytes(bytes): bytes
        case let .buffer(buffer): buffer.copiedBytes()
        }
    }
}

// Laying a packet out: the frame as storage the writer appends to before the link finishes it.
// A frame from ``IAP2Link/packetStorage(payloadCapacity:)`` (a framed array, or a buffer from
// the transport's pool) holds ``LinkPacketHeader/size`` bytes of headroom before the payload and
// room for the checksum after it.
extension LinkFrame {
    /// The most bytes this frame holds without growing.
    var capacity: Int {
        switch self {
        case let .bytes(bytes): bytes.capacity
        case let .buffer(buffer): buffer.packet.capacity
        }
    }

    /// Appends `bytes` (the caller checked they fit in ``capacity``) and returns their sum
    /// modulo 256: copied and summed in one pass (``Checksum/append(_:to:)``), so the payload's
    /// checksum needs no second reading.
    mutating func appendSummed(_ bytes: RawSpan) -> UInt8 {
        switch self {
        case .bytes(var array):
            self = .bytes([]) // the array stays uniquely referenced while it grows
            var sum: UInt8 = 0
            array.append(addingCapacity: bytes.byteCount) { output in sum = Checksum.append(bytes, to: &output) }
            self = .bytes(array)
            return sum
        case let .buffer(buffer):
            return buffer.packet.append(upTo: bytes.byteCount) { output in Checksum.append(bytes, to: &output) }
        }
    }

    /// Appends one byte.
    mutating func append(_ byte: UInt8) {
        switch self {
        case .bytes(var array):
            self = .bytes([])
            array.append(byte)
            self = .bytes(array)
        case let .buffer(buffer):
            buffer.packet.append(byte)
        }
    }
}
