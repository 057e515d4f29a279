package import AccessorySimulator
package import Dispatch
package import IAPTransport
internal import Synchronization

/// A gadget's wire that plays an accessory whose iAP2 state machine sticks after a failed
/// handshake, as the Teslong TD300 does (PROTOCOL.md §7.2): it ignores new detects and SYNs
/// until it is unplugged or reset.
///
/// On the first host connection the accessory behind it sends its detect and its SYN; then the
/// wire sticks: nothing more reaches the accessory (the host's SYN|ACK is lost) and nothing
/// more of the accessory's reaches the host. Only when the gadget sees the host go (FunctionFS
/// DISABLE: a USB reset, an unplug, the controller unbound) does it come unstuck, and the
/// ``SimulatorRunner`` starts the accessory over at the next configuration, as after any
/// re-plug. It sticks on the first `stuckConnections` host connections (1 by default; see ``init(_:stuckConnections:)``).
package final class StickingWire: HostReconnectingWire, Sendable {
    private let inner: any HostReconnectingWire
    private struct State {
        var remaining: Int
        var stuck = false
        /// The accessory's SYN went out on this host connection.
        var synSent = false
        var changeHandler: (@Sendable (HostConnectionState) -> Void)?
        var stuckSince: ContinuousClock.Instant?
        var episodes: [Duration] = []
        var onStuck: (@Sendable () -> Void)?
        var onUnstuck: (@Sendable () -> Void)?
    }
    private let state: Mutex<State>

    /// Wraps `inner` (a gadget's transport); it sticks on its first `stuckConnections` host
    /// connections.
    package init(_ inner: any HostReconnectingWire, stuckConnections: Int = 1) {
        self.inner = inner
        state = Mutex(State(remaining: stuckConnections))
        inner.onHostConnectionChange { [weak self] connection in self?.hostConnectionChanged(connection) }
    }

    /// The inner wire's description, marked.
    package var description: String { "\(inner.description) (sticks after its handshake)" }
    /// The inner wire's kind.
    package var kind: TransportKind { inner.kind }
    /// The inner wire's host connection.
    package var hostConnection: HostConnectionState { inner.hostConnection }
    /// Whether the wire is stuck now.
    package var isStuck: Bool { state.withLock { $0.stuck } }

    /// Calls `stuck` (any thread) each time the wire sticks, and `unstuck` when it comes unstuck.
    package func onStickingChange(stuck: @escaping @Sendable () -> Void, unstuck: @escaping @Sendable () -> Void) {
        state.withLock {
            $0.onStuck = stuck
            $0.onUnstuck = unstuck
        }
    }

    /// Calls `handler` with every change of the host connection (after the wire has taken it into
    /// account), on the inner wire's thread.
    package func onHostConnectionChange(_ handler: @escaping @Sendable (HostConnectionState) -> Void) {
        state.withLock { $0.changeHandler = handler }
    }

    /// Starts the inner wire; while stuck, what the host sends is dropped.
    package func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) {
        inner.activate(queue: queue) { [weak self] event in
            if case .closed = event { return handler(event) }
            if self?.isStuck == true { return }
            handler(event)
        }
    }

    /// Sends `frame` unless stuck; the accessory's first SYN on a host connection that is to
    /// stick goes out, and the wire sticks right after it.
    package func send(_ frame: [UInt8]) {
        let (forward, stuckNow) = state.withLock { state -> (Bool, (@Sendable () -> Void)?) in
            if state.stuck { return (false, nil) }
            guard state.remaining > 0, !state.synSent, Self.isSYN(frame) else { return (true, nil) }
            state.synSent = true
            state.stuck = true
            state.stuckSince = .now
            return (true, state.onStuck)
        }
        if forward { inner.send(frame) }
        stuckNow?()
    }

    /// Cancels the inner wire.
    package func cancel() { inner.cancel() }

    /// How long each stuck episode lasted, from the SYN to the host's reset (or unplug).
    package var stuckEpisodes: [Duration] { state.withLock { $0.episodes } }

    /// An iAP2 link packet (FF 5A) with the SYN bit.
    static func isSYN(_ frame: [UInt8]) -> Bool {
        frame.count >= 5 && frame[0] == 0xFF && frame[1] == 0x5A && frame[4] & 0x80 != 0
    }

    private func hostConnectionChanged(_ connection: HostConnectionState) {
        let (handler, unstuck) = state.withLock { state -> ((@Sendable (HostConnectionState) -> Void)?, (@Sendable () -> Void)?) in
            var unstuck: (@Sendable () -> Void)?
            if connection == .absent, state.synSent {
                // The host reset the device (or it was unplugged): a real TD300 comes unstuck.
                if state.stuck, let since = state.stuckSince { state.episodes.append(.now - since) }
                state.stuck = false
                state.synSent = false
                state.remaining -= 1
                unstuck = state.onUnstuck
            }
            return (state.changeHandler, unstuck)
        }
        unstuck?()
        handler?(connection)
    }
}
