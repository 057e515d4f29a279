internal import FoundationEssentials

/// Why bytes from the other side are not a valid message.
package enum DaemonProtocolError: Error, Sendable, Hashable, CustomStringConvertible {
    /// A length prefix larger than the limit (the connection cannot be trusted further).
    case tooLong(length: Int, limit: Int)
    /// The JSON is not a message of the protocol.
    case malformed(String)

    /// The error in a sentence.
    package var description: String {
        switch self {
        case let .tooLong(length, limit): return "a message of \(length) bytes announced, more than the \(limit) allowed"
        case let .malformed(reason): return "a malformed message: \(reason)"
        }
    }
}

/// Encodes messages, and cuts a byte stream into messages: a 4-byte big-endian length, then
/// that many bytes of JSON. Holds at most one message's bytes (bounded by `limit`) plus what a
/// read brought; a length over the limit is an error before anything is buffered.
package struct MessageFramer: Sendable {
    /// The longest message accepted.
    package let limit: Int
    private var buffer: [UInt8] = []
    private var start = 0

    /// A framer accepting messages of at most `limit` bytes.
    package init(limit: Int) {
        self.limit = limit
    }

    /// Bytes received and not yet cut into a message.
    package var bufferedCount: Int { buffer.count - start }

    /// Adds received bytes.
    package mutating func append(_ bytes: some Collection<UInt8>) {
        if start > 0, start == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            start = 0
        }
        buffer.append(contentsOf: bytes)
    }

    /// The next complete message's JSON bytes, nil when it has not all arrived.
    /// - Throws: ``DaemonProtocolError/tooLong(length:limit:)``.
    package mutating func nextPayload() throws(DaemonProtocolError) -> [UInt8]? {
        guard buffer.count - start >= 4 else { return nil }
        let length = buffer[start..<start + 4].reduce(0) { $0 << 8 | Int($1) }
        guard length <= limit else { throw .tooLong(length: length, limit: limit) }
        guard buffer.count - start - 4 >= length else { return nil }
        let payload = Array(buffer[start + 4..<start + 4 + length])
        start += 4 + length
        if start > 64 * 1024, start * 2 > buffer.count {
            buffer.removeFirst(start)
            start = 0
        }
        return payload
    }

    /// The next complete message decoded as `Message`, nil when it has not all arrived.
    package mutating func next<Message: Decodable>(_ type: Message.Type) throws(DaemonProtocolError) -> Message? {
        guard let payload = try nextPayload() else { return nil }
        return try Self.decode(type, from: payload)
    }

    /// Decodes one payload.
    package static func decode<Message: Decodable>(_ type: Message.Type, from payload: [UInt8]) throws(DaemonProtocolError) -> Message {
        do {
            return try JSONDecoder().decode(type, from: Data(payload))
        } catch let error as DecodingError {
            throw .malformed(Self.describe(error))
        } catch {
            throw .malformed("\(error)")
        }
    }

    /// One message as it goes on the wire: the length, then the JSON.
    package static func encode(_ message: some Encodable) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        // Every message type of the protocol encodes (plain structs, strings, numbers).
        let json = (try? encoder.encode(message)) ?? Data("{}".utf8)
        let length = json.count
        var bytes = [UInt8(truncatingIfNeeded: length >> 24), UInt8(truncatingIfNeeded: length >> 16),
                     UInt8(truncatingIfNeeded: length >> 8), UInt8(truncatingIfNeeded: length)]
        bytes.append(contentsOf: json)
        return bytes
    }

    private static func describe(_ error: DecodingError) -> String {
        func path(_ context: DecodingError.Context) -> String {
            let keys = context.codingPath.map { $0.intValue.map(String.init) ?? $0.stringValue }
            return keys.isEmpty ? "" : " at " + keys.joined(separator: ".")
        }
        switch error {
        case let .typeMismatch(_, context), let .valueNotFound(_, context), let .dataCorrupted(context):
            return context.debugDescription + path(context)
        case let .keyNotFound(key, context):
            return "'\(key.stringValue)' is missing" + path(context)
        @unknown default:
            return "\(error)"
        }
    }
}
