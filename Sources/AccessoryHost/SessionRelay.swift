/// What a relay of a session's bytes to another process (iapd's bridge to a client's shared
/// rings) gives the connection, so that the connection moves the bytes in the same service of the
/// link that made them movable: a packet the link accepted is handed on before the link is
/// left, room the accessory's acknowledgements made is filled from the relay at once, with no
/// event queued and no second call into the link per direction.
///
/// Every method is called on the connection's queue. ``deliver(_:)``, ``withOutgoing(_:)`` and
/// ``acknowledged(_:)`` are called from inside the connection's service of the link: they may
/// not call the session (or another) back; anything more goes on the queue. ``ended()`` is
/// posted to the queue, outside any service: it may call the session.
package protocol SessionRelay: AnyObject, Sendable {
    /// Takes what it can of bytes the accessory sent (in place, valid only during the call);
    /// returns how many it took (0: it is full; the link then holds the accessory off).
    func deliver(_ bytes: RawSpan) -> Int
    /// Lends the bytes waiting to go to the accessory to `body`, in order, as long as `body`
    /// takes all it is lent (it returns how many it took).
    func withOutgoing(_ body: (RawSpan) -> Int)
    /// The accessory acknowledged `count` of the bytes written so far (counts only grow).
    func acknowledged(_ count: Int)
    /// The session's stream ended (the accessory closed it or went away): bytes it sent before
    /// may still wait to be delivered.
    func ended()
}
