internal import IAPLink
internal import IAPTransport

/// Where one session's bytes travel, behind the one interface `Connection` serves its readers,
/// writers and events through: multiplexed on the iAP2 (or iAP1) link under an EA session id, or
/// raw on a native-transport channel of its own (PROTOCOL.md §4.3).
///
/// Every call runs on the connection's queue with the endpoint lent by the driver (a native
/// stream does not use it): the link's session state lives in the endpoint.
protocol SessionStream {
    /// Whether the bytes travel on a native transport.
    var isNative: Bool { get }
    /// The EA session id on the link, for a link session.
    var linkSessionID: UInt16? { get }
    /// Bytes readable now.
    func readable(_ machine: inout IAPEndpoint) -> Int
    /// Takes up to `maxBytes` readable bytes (the one copy of the way in).
    func read(_ machine: inout IAPEndpoint, maxBytes: Int) -> [UInt8]
    /// Lends the next readable bytes in place; `body` says how many it consumed.
    func borrow<Result>(_ machine: inout IAPEndpoint, _ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result?
    /// Takes what fits of `bytes` now; returns how many.
    func write(_ machine: inout IAPEndpoint, _ bytes: ArraySlice<UInt8>, now: LinkTime) -> Int
    /// Takes what fits of `bytes` (lent, not kept) now; returns how many.
    func write(_ machine: inout IAPEndpoint, span bytes: RawSpan, now: LinkTime) -> Int
    /// Bytes written and not yet handed to the wire.
    func unsent(_ machine: inout IAPEndpoint) -> Int
    /// Whether a write would take bytes now.
    func hasSpace(_ machine: inout IAPEndpoint) -> Bool
    /// Bytes the accessory is known to have received.
    func acknowledged(_ machine: inout IAPEndpoint) -> Int
    /// The owner closed the session (`linkUp`: the link can still carry the close).
    func close(_ machine: inout IAPEndpoint, now: LinkTime, linkUp: Bool)
    /// The accessory went away under the session.
    func abandon()
}

/// A session multiplexed on the link under an EA session id (iAP2) or data session id (iAP1).
struct LinkSessionStream: SessionStream {
    let id: UInt16
    var isNative: Bool { false }
    var linkSessionID: UInt16? { id }

    func readable(_ machine: inout IAPEndpoint) -> Int { machine.bytesAvailable(id) }
    func read(_ machine: inout IAPEndpoint, maxBytes: Int) -> [UInt8] { machine.read(id, maxBytes: maxBytes) }
    func borrow<Result>(_ machine: inout IAPEndpoint, _ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        try machine.borrow(id, body)
    }
    func write(_ machine: inout IAPEndpoint, _ bytes: ArraySlice<UInt8>, now: LinkTime) -> Int {
        (try? machine.write(id, span: bytes.span.bytes, now: now)) ?? 0
    }
    func write(_ machine: inout IAPEndpoint, span bytes: RawSpan, now: LinkTime) -> Int {
        (try? machine.write(id, span: bytes, now: now)) ?? 0
    }
    func unsent(_ machine: inout IAPEndpoint) -> Int { machine.bytesPending(id) }
    func hasSpace(_ machine: inout IAPEndpoint) -> Bool { machine.spaceAvailable(id) > 0 }
    /// The endpoint keeps the count of a closed session until the owner closes it too.
    func acknowledged(_ machine: inout IAPEndpoint) -> Int { machine.bytesAcknowledged(id) }
    func close(_ machine: inout IAPEndpoint, now: LinkTime, linkUp: Bool) {
        if linkUp { machine.closeSession(id, now: now) }
    }
    func abandon() {}
}

/// A session on a native-transport channel: raw bytes, its own flow control.
struct NativeSessionStream: SessionStream {
    let channel: any ByteChannel
    var isNative: Bool { true }
    var linkSessionID: UInt16? { nil }

    func readable(_ machine: inout IAPEndpoint) -> Int { channel.readableByteCount }

    func read(_ machine: inout IAPEndpoint, maxBytes: Int) -> [UInt8] {
        var bytes: [UInt8] = []
        while bytes.count < maxBytes {
            let room = maxBytes - bytes.count
            let took: Int? = channel.withReadableBytes { span in
                let count = min(room, span.byteCount)
                span.extracting(0..<count).withUnsafeBytes { bytes.append(contentsOf: $0) }
                return (count, count)
            }
            guard let took, took > 0 else { break }
        }
        return bytes
    }

    func borrow<Result>(_ machine: inout IAPEndpoint, _ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        try channel.withReadableBytes(body)
    }
    func write(_ machine: inout IAPEndpoint, _ bytes: ArraySlice<UInt8>, now: LinkTime) -> Int { channel.write(bytes) }
    func write(_ machine: inout IAPEndpoint, span bytes: RawSpan, now: LinkTime) -> Int { channel.write(span: bytes) }
    func unsent(_ machine: inout IAPEndpoint) -> Int { channel.unsentByteCount }
    func hasSpace(_ machine: inout IAPEndpoint) -> Bool { channel.isWritable }
    func acknowledged(_ machine: inout IAPEndpoint) -> Int { channel.bytesDelivered }
    func close(_ machine: inout IAPEndpoint, now: LinkTime, linkUp: Bool) { channel.close() }
    func abandon() { channel.close() }
}
