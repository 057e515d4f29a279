internal import IAPWire

/// The EA sessions of an endpoint, in an array searched by id (there are few). A session is
/// read in place through ``reading(_:_:)`` and changed in place through ``modifying(_:_:)``:
/// neither copies it (its name and queues), so a received packet or a counter read costs no
/// retain of them, and no allocation (a dictionary's in-place access allocates for a value this
/// large).
struct SessionTable: Sendable {
    private(set) var entries: [Upper.Session] = []

    /// Where the session `id` lies in `entries`, looked up in place.
    private func index(of id: UInt16) -> Int? {
        let span = entries.span
        for index in span.indices where span[index].id == id { return index }
        return nil
    }

    /// Runs `body` on the session `id` where it lies, without copying it; nil when there is none.
    func reading<Result>(_ id: UInt16, _ body: (Upper.Session) throws -> Result) rethrows -> Result? {
        let span = entries.span
        for index in span.indices where span[index].id == id { return try body(span[index]) }
        return nil
    }

    func contains(_ id: UInt16) -> Bool { index(of: id) != nil }

    /// The ids, in order.
    var ids: [UInt16] { entries.map(\.id).sorted() }

    mutating func insert(_ session: Upper.Session) {
        remove(session.id)
        entries.append(session)
    }

    mutating func remove(_ id: UInt16) { entries.removeAll { $0.id == id } }

    /// Runs `body` on the session `id` in place, to change it; nil when there is none.
    mutating func modifying<Result>(_ id: UInt16, _ body: (inout Upper.Session) throws -> Result) rethrows -> Result? {
        guard let index = index(of: id) else { return nil }
        return try body(&entries[index])
    }
}

/// Bytes written to one session and not yet handed to the link, already laid out as link packets:
/// each element is storage from the link (a transmit buffer the transport lent, or an array from
/// ``LinkPacket/framedBuffer(payloadCapacity:)``) holding the header's headroom, the EA session
/// id and up to one packet's worth of application bytes. The application's bytes are copied
/// once, into this storage; the link finishes each packet where it lies and the transport sends
/// a transmit buffer as it is.
struct OutboundQueue: Sendable {
    /// A packet being laid out, and the sum of its payload so far (EA header and application
    /// bytes, modulo 256): each byte is summed as it is copied in, so the link writes the
    /// checksum without reading the payload again.
    struct LaidOut: Sendable {
        var frame: LinkFrame
        var payloadSum: UInt8
    }

    private var packets = FIFO<LaidOut>()
    /// Application bytes queued (EA headers and headroom not counted).
    private(set) var byteCount = 0
    /// The smallest buffer made for a short write, so a run of small writes shares packets.
    static let minimumBuffer = 1_024
    /// Writes at least this long get a buffer of a whole packet.
    static let largeWrite = 4_096

    /// Copies up to `limit - byteCount` bytes of `bytes` into packets of at most `chunk`
    /// application bytes each; returns how many were taken.
    mutating func append(_ bytes: RawSpan, sessionID: UInt16, chunk: Int, limit: Int, buffers link: inout IAP2Link) -> Int {
        let total = min(max(0, limit - byteCount), bytes.byteCount)
        guard chunk > 0, total > 0 else { return 0 }
        let headroom = LinkPacketHeader.size + EASessionData.headerSize
        var taken = 0
        while taken < total {
            // Fill the newest packet up to its capacity (one byte stays free for the checksum),
            // so it never grows by reallocation; otherwise start a new one.
            let filled = packets.withLast { packet -> Int in
                let room = min(headroom + chunk, packet.frame.capacity - 1) - packet.frame.count
                guard room > 0 else { return 0 }
                let count = min(room, total - taken)
                packet.payloadSum &+= packet.frame.appendSummed(bytes.extracting(taken..<(taken + count)))
                return count
            } ?? 0
            if filled > 0 {
                taken += filled
                continue
            }
            // A write of a few KiB or more gets a whole packet's room (later writes fill it);
            // a short one a small buffer.
            let remaining = total - taken
            let capacity = EASessionData.headerSize
                + (remaining >= Self.largeWrite ? chunk : min(chunk, max(remaining, Self.minimumBuffer)))
            var packet = link.packetStorage(payloadCapacity: capacity)
            let header = (UInt8(sessionID >> 8), UInt8(sessionID & 0xFF))
            packet.append(header.0)
            packet.append(header.1)
            packets.append(LaidOut(frame: packet, payloadSum: header.0 &+ header.1))
        }
        byteCount += taken
        return taken
    }

    /// Takes the oldest packet, the number of application bytes it carries and the sum of its
    /// payload.
    mutating func popPacket() -> (packet: LinkFrame, dataBytes: Int, payloadSum: UInt8)? {
        guard let laid = packets.popFirst() else { return nil }
        let data = laid.frame.count - LinkPacketHeader.size - EASessionData.headerSize
        byteCount -= data
        return (laid.frame, data, laid.payloadSum)
    }

    mutating func removeAll() {
        packets.removeAll()
        byteCount = 0
    }
}

extension Upper {
    /// One EA session: its protocol, its state and the bytes queued each way.
    struct Session: Sendable {
        var id: UInt16
        var protocolName: String
        var protocolID: UInt8
        var state: EASessionState
        var inbound = ChunkQueue()
        var outbound = OutboundQueue()
        var wasFull = false
        /// Bytes of this session the peer's link acknowledged.
        var acknowledged = 0
    }
}
