internal import IAPWire

// A control message spread over several link packets (the Clicks keyboard's certificate,
// PROTOCOL.md §7.7), joined as the stream is read: what `iapctl decode` shows part by part.

extension FrameInspector {
    /// The longest control message joined from parts (its header's length field is 16 bits).
    static let maxJoinedControlMessage = 65_535

    /// A control-session payload whose message runs on past its packet: the first part of a
    /// message spread over several (kept; true), or not (false).
    mutating func startControlMessage(_ payload: RawSpan, sequence: UInt8, streamOffset: Int, details: inout [String],
                                              fields: inout [(String, JSONValue)]) -> Bool {
        guard payload.byteCount >= ControlMessage.headerSize, let declared = try? ControlMessage.declaredLength(in: payload),
              declared > payload.byteCount, declared <= Self.maxJoinedControlMessage else { return false }
        let bytes = copy(payload)
        partialControl = PartialControl(parts: [(sequence, bytes)], declared: declared, offset: streamOffset)
        let id = MessageID(UInt16(bytes[4]) << 8 | UInt16(bytes[5]))
        details.append("\(id) (0x\(hex16(id.rawValue))), part 1: \(bytes.count) of the \(declared) bytes its header declares; the rest in the next packets")
        fields.append(("part", .object([("message", .int(Int(id.rawValue))), ("index", .int(1)), ("received", .int(bytes.count)),
                                        ("declared", .int(declared))])))
        return true
    }

    /// The next part of a control message spread over several packets: nil when none is
    /// coming, or this payload is whole messages of its own; .some(nil) for a part that does
    /// not complete it (or one sent again); .some(message) for the last part. Parts are
    /// joined in the order of their sequence numbers, so one sent again after an EAK goes back
    /// in its place.
    mutating func continueControlMessage(_ payload: RawSpan, sequence: UInt8, details: inout [String],
                                                 fields: inout [(String, JSONValue)]) -> ControlMessage?? {
        guard var partial = partialControl else { return nil }
        // A payload that is whole messages of its own is not a part (the other side's message,
        // or a new one after a header that lied).
        if payload.byteCount >= 2, payload.byte(at: 0) == 0x40, payload.byte(at: 1) == 0x40,
           (try? ControlMessage.decode(prefixOf: payload)) != nil {
            return nil
        }
        let id = partial.messageID
        if partial.parts.contains(where: { $0.sequence == sequence }) {
            details.append("\(id) (0x\(hex16(id.rawValue))): a part sent again (sequence number \(sequence), already taken)")
            return .some(nil)
        }
        let taken = min(payload.byteCount, partial.declared - partial.received)
        partial.parts.append((sequence, copy(payload.extracting(0..<taken))))
        partialControl = partial
        fields.append(("part", .object([("message", .int(Int(id.rawValue))), ("index", .int(partial.parts.count)),
                                        ("received", .int(partial.received)), ("declared", .int(partial.declared))])))
        guard partial.received >= partial.declared else {
            details.append("\(id) (0x\(hex16(id.rawValue))), part \(partial.parts.count): \(partial.received) of \(partial.declared) bytes")
            return .some(nil)
        }
        details.append("\(id) (0x\(hex16(id.rawValue))), part \(partial.parts.count), the last: joined from \(partial.parts.count) packets")
        do {
            return .some(try ControlMessage.decode(partial.joined))
        } catch {
            details.append("the joined message: \(error)")
            partialControl = nil
            return .some(nil)
        }
    }
}

/// A control message spread over several link packets, while its parts come.
struct PartialControl: Sendable {
    /// Each part's sequence number and bytes, in the order they came.
    var parts: [(sequence: UInt8, bytes: [UInt8])]
    /// The length its header declares.
    var declared: Int
    /// Where its first part starts in the stream.
    var offset: Int

    /// Its id, from the first part's header.
    var messageID: MessageID { MessageID(UInt16(parts[0].bytes[4]) << 8 | UInt16(parts[0].bytes[5])) }
    /// Bytes received (each part once).
    var received: Int { parts.reduce(0) { $0 + $1.bytes.count } }
    /// The parts joined in the order of their sequence numbers from the first's.
    var joined: [UInt8] {
        let first = parts[0].sequence
        return Array(parts.sorted { ($0.sequence &- first) < ($1.sequence &- first) }.flatMap(\.bytes).prefix(declared))
    }
}
