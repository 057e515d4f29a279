/// The firmware-update protocol the simulator speaks on sessions of a `firmware-update` protocol.
///
/// Hosts implement their side from this description; the simulator implements the accessory side.
///
/// ## Framing
///
/// Messages travel on the EA session's byte stream, one after another, each:
///
/// ```
/// type    u8
/// length  u32, big-endian: the number of body bytes that follow (0 … 1048576)
/// body    `length` bytes
/// ```
///
/// The stream has no other boundaries: a message may be split across any number of reads and
/// writes, and one read or write may hold several messages. All integers are big-endian.
///
/// ## Messages
///
/// | type | name  | direction      | body |
/// |------|-------|----------------|------|
/// | 0x01 | BEGIN | host→accessory | image size u32, image CRC-32 u32, new version (UTF-8, 1…255 bytes, the rest of the body) |
/// | 0x81 | READY | accessory→host | max chunk size u32 (the simulator says 16384) |
/// | 0x02 | CHUNK | host→accessory | offset u32, then 1 … max chunk size data bytes |
/// | 0x82 | ACK   | accessory→host | next expected offset u32 (sent after every CHUNK) |
/// | 0x03 | END   | host→accessory | empty |
/// | 0x83 | DONE  | accessory→host | status u8, CRC-32 u32 the accessory computed over the data it took |
/// | 0x8F | ERROR | accessory→host | error code u8, then a UTF-8 message for a person |
///
/// CRC-32 is IEEE 802.3 (zlib's: reflected polynomial 0xEDB88320, initial and final XOR
/// 0xFFFFFFFF; "123456789" → 0xCBF43926), over the image bytes in order.
///
/// ## Exchange
///
/// 1. The host sends BEGIN. The accessory answers READY with the largest CHUNK data it takes.
///    A BEGIN while a transfer is in progress abandons that transfer and starts a new one.
/// 2. The host sends CHUNKs with consecutive offsets starting at 0, each with at most max chunk
///    size data bytes. It may send several without waiting; the accessory answers each with ACK
///    carrying the offset it expects next (the bytes it has taken so far). A CHUNK whose offset
///    is not the expected one is not taken (its ACK repeats the expected offset) and marks the
///    transfer out of order; a CHUNK reaching past the image size is not taken and marks a size
///    mismatch.
/// 3. The host sends END. The accessory answers DONE with a status, the first that applies:
///    - 3 chunk out of order: some CHUNK had an unexpected offset;
///    - 2 size mismatch: the data taken is not exactly the image size from BEGIN;
///    - 1 CRC mismatch: the CRC-32 of the data differs from the one in BEGIN;
///    - 0 ok: the image is complete and intact.
///
///    After DONE with a non-zero status the accessory waits for a new BEGIN. After DONE 0 it
///    ignores everything further and reboots `rebootDelayMs` later (the profile's value, default
///    200 ms): it disappears from the bus and comes back declaring the new version.
///
/// ## Errors
///
/// Messages that cannot be followed are answered with ERROR, and the transfer in progress, if
/// any, is abandoned (the host starts again with BEGIN):
///
/// | code | meaning | afterwards |
/// |------|---------|------------|
/// | 0x10 | unknown message type (including the accessory→host types) | the body is skipped |
/// | 0x11 | length over 1048576 | the stream cannot be followed any more: every further byte is ignored until the host closes the session and opens a new one |
/// | 0x12 | message out of sequence: CHUNK or END before BEGIN | the body is skipped |
/// | 0x13 | malformed body: BEGIN shorter than 9 or longer than 263 bytes or with a version that is not UTF-8, CHUNK without data or with more than max chunk size, END not empty | the body is skipped |
public enum FirmwareUpdateProtocol {
    /// The message types (the first byte of each message).
    public enum MessageType: UInt8, Hashable, Sendable {
        /// Host→accessory: start a transfer (image size u32, CRC-32 u32, version UTF-8).
        case begin = 0x01
        /// Host→accessory: image data (offset u32, data).
        case chunk = 0x02
        /// Host→accessory: the image is complete (empty body).
        case end = 0x03
        /// Accessory→host: BEGIN accepted (max chunk size u32).
        case ready = 0x81
        /// Accessory→host: a CHUNK was processed (next expected offset u32).
        case ack = 0x82
        /// Accessory→host: the verdict on the image (status u8, computed CRC-32 u32).
        case done = 0x83
        /// Accessory→host: a message could not be followed (error code u8, UTF-8 message).
        case error = 0x8F
    }

    /// The status of DONE.
    public enum Status: UInt8, Hashable, Sendable {
        /// The image is complete and its CRC-32 matches.
        case ok = 0
        /// The CRC-32 of the data differs from the one in BEGIN.
        case crcMismatch = 1
        /// The data is not exactly the image size from BEGIN.
        case sizeMismatch = 2
        /// A CHUNK arrived with an offset other than the expected one.
        case chunkOutOfOrder = 3
    }

    /// The error code of ERROR.
    public enum ErrorCode: UInt8, Hashable, Sendable {
        /// The message type is not one the host sends.
        case unknownType = 0x10
        /// The length is over ``FirmwareUpdateProtocol/maxMessageLength``; the stream is lost.
        case tooLong = 0x11
        /// CHUNK or END before BEGIN.
        case outOfSequence = 0x12
        /// The body does not have the shape of its type.
        case malformed = 0x13
    }

    /// Bytes before each body: type u8 and length u32.
    public static let headerSize = 5
    /// The longest body any message may have.
    public static let maxMessageLength = 1 << 20
    /// The largest CHUNK data the simulator takes (announced in READY).
    public static let maxChunkSize = 16_384
    /// The longest version string in BEGIN, in UTF-8 bytes.
    public static let maxVersionLength = 255
}

/// The accessory side of ``FirmwareUpdateProtocol`` for one session, as a pure parser: bytes in,
/// response bytes and events out. The buffer never holds more than one CHUNK.
struct FirmwareUpdateReceiver: Sendable {
    typealias P = FirmwareUpdateProtocol

    enum Event: Hashable, Sendable {
        case began(version: String, imageSize: Int)
        case finished(status: P.Status, computedCRC: UInt32, version: String)
        case error(code: P.ErrorCode, message: String)
    }

    private struct Transfer: Sendable {
        var size: Int
        var expectedCRC: UInt32
        var version: String
        var nextOffset = 0
        var crc = CRC32()
        var outOfOrder = false
        var overrun = false
    }

    private enum Phase: Sendable {
        case idle
        case receiving(Transfer)
        /// DONE 0 sent: about to reboot, nothing more is read.
        case finished
        /// A length over the limit: the framing is lost until the session is reopened.
        case lost
    }

    private var phase = Phase.idle
    private var header: [UInt8] = []
    private var body: [UInt8] = []
    private var messageType: P.MessageType?
    private var bodyLength = 0
    private var skipRemaining = 0

    /// Whether further bytes are ignored (after DONE 0, or when the framing is lost).
    var isIgnoringInput: Bool {
        switch phase {
        case .finished, .lost: return true
        case .idle, .receiving: return false
        }
    }

    /// Bytes held for a message not complete yet.
    var bufferedBytes: Int { header.count + body.count }

    /// Consumes received bytes; appends responses to `responses` and reports what happened.
    mutating func consume(_ bytes: [UInt8], responses: inout [UInt8], events: inout [Event]) {
        var index = 0
        while index < bytes.count, !isIgnoringInput {
            if skipRemaining > 0 {
                let count = min(skipRemaining, bytes.count - index)
                skipRemaining -= count
                index += count
                continue
            }
            if messageType == nil {
                let count = min(P.headerSize - header.count, bytes.count - index)
                header.append(contentsOf: bytes[index..<(index + count)])
                index += count
                if header.count == P.headerSize { startMessage(responses: &responses, events: &events) }
                continue
            }
            let count = min(bodyLength - body.count, bytes.count - index)
            body.append(contentsOf: bytes[index..<(index + count)])
            index += count
            if body.count == bodyLength { finishMessage(responses: &responses, events: &events) }
        }
    }

    /// Validates a complete header; buffers the body only for a message that will be used.
    private mutating func startMessage(responses: inout [UInt8], events: inout [Event]) {
        let rawType = header[0]
        let length = Int(readUInt32(header, at: 1))
        header.removeAll(keepingCapacity: true)
        guard length <= P.maxMessageLength else {
            fail(.tooLong, "message length \(length) is over the \(P.maxMessageLength)-byte limit, so the stream cannot be followed; close the session and open a new one",
                 responses: &responses, events: &events)
            phase = .lost
            return
        }
        guard let type = P.MessageType(rawValue: rawType), [.begin, .chunk, .end].contains(type) else {
            fail(.unknownType, "unknown message type 0x\(String(rawType, radix: 16)); a host sends BEGIN 0x01, CHUNK 0x02 or END 0x03",
                 responses: &responses, events: &events)
            skipRemaining = length
            return
        }
        let allowed: ClosedRange<Int>
        switch type {
        case .begin: allowed = 9...(8 + P.maxVersionLength)
        case .chunk: allowed = 5...(4 + P.maxChunkSize)
        default: allowed = 0...0
        }
        guard allowed.contains(length) else {
            fail(.malformed, "\(type.name) with a \(length)-byte body; its body is \(allowed.lowerBound)…\(allowed.upperBound) bytes",
                 responses: &responses, events: &events)
            skipRemaining = length
            return
        }
        if type != .begin, case .idle = phase {
            fail(.outOfSequence, "\(type.name) before BEGIN; send BEGIN first", responses: &responses, events: &events)
            skipRemaining = length
            return
        }
        messageType = type
        bodyLength = length
        body.removeAll(keepingCapacity: true)
        if length == 0 { finishMessage(responses: &responses, events: &events) }
    }

    private mutating func finishMessage(responses: inout [UInt8], events: inout [Event]) {
        guard let type = messageType else { return }
        messageType = nil
        defer { body.removeAll(keepingCapacity: true) }
        switch type {
        case .begin:
            guard let version = String(validating: body[8...], as: UTF8.self) else {
                fail(.malformed, "the version in BEGIN is not valid UTF-8", responses: &responses, events: &events)
                return
            }
            let size = Int(readUInt32(body, at: 0))
            phase = .receiving(Transfer(size: size, expectedCRC: readUInt32(body, at: 4), version: version))
            append(.ready, value: UInt32(P.maxChunkSize), to: &responses)
            events.append(.began(version: version, imageSize: size))
        case .chunk:
            guard case var .receiving(transfer) = phase else { return }
            let offset = Int(readUInt32(body, at: 0))
            let dataCount = body.count - 4
            if offset != transfer.nextOffset {
                transfer.outOfOrder = true
            } else if transfer.nextOffset + dataCount > transfer.size {
                transfer.overrun = true
            } else {
                transfer.crc.update(body[4...])
                transfer.nextOffset += dataCount
            }
            phase = .receiving(transfer)
            append(.ack, value: UInt32(truncatingIfNeeded: transfer.nextOffset), to: &responses)
        case .end:
            guard case let .receiving(transfer) = phase else { return }
            let status: P.Status
            if transfer.outOfOrder {
                status = .chunkOutOfOrder
            } else if transfer.overrun || transfer.nextOffset != transfer.size {
                status = .sizeMismatch
            } else if transfer.crc.value != transfer.expectedCRC {
                status = .crcMismatch
            } else {
                status = .ok
            }
            responses.append(P.MessageType.done.rawValue)
            appendUInt32(5, to: &responses)
            responses.append(status.rawValue)
            appendUInt32(transfer.crc.value, to: &responses)
            phase = status == .ok ? .finished : .idle
            events.append(.finished(status: status, computedCRC: transfer.crc.value, version: transfer.version))
        default:
            break
        }
    }

    /// Answers ERROR and abandons the transfer in progress.
    private mutating func fail(_ code: P.ErrorCode, _ message: String, responses: inout [UInt8], events: inout [Event]) {
        let text = Array(message.utf8)
        responses.append(P.MessageType.error.rawValue)
        appendUInt32(UInt32(1 + text.count), to: &responses)
        responses.append(code.rawValue)
        responses.append(contentsOf: text)
        phase = .idle
        events.append(.error(code: code, message: message))
    }

    private func append(_ type: P.MessageType, value: UInt32, to responses: inout [UInt8]) {
        responses.append(type.rawValue)
        appendUInt32(4, to: &responses)
        appendUInt32(value, to: &responses)
    }
}

extension FirmwareUpdateProtocol.MessageType {
    /// The message's name in the protocol description.
    var name: String {
        switch self {
        case .begin: return "BEGIN"
        case .chunk: return "CHUNK"
        case .end: return "END"
        case .ready: return "READY"
        case .ack: return "ACK"
        case .done: return "DONE"
        case .error: return "ERROR"
        }
    }
}

/// A big-endian u32 at `offset` (the caller checked there are four bytes).
func readUInt32(_ bytes: [UInt8], at offset: Int) -> UInt32 {
    UInt32(bytes[offset]) << 24 | UInt32(bytes[offset + 1]) << 16 | UInt32(bytes[offset + 2]) << 8 | UInt32(bytes[offset + 3])
}

func appendUInt32(_ value: UInt32, to bytes: inout [UInt8]) {
    bytes.append(UInt8(truncatingIfNeeded: value >> 24))
    bytes.append(UInt8(truncatingIfNeeded: value >> 16))
    bytes.append(UInt8(truncatingIfNeeded: value >> 8))
    bytes.append(UInt8(truncatingIfNeeded: value))
}
