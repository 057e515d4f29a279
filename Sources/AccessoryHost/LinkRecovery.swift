internal import AccessoryLogging
internal import Dispatch
internal import IAPLink
internal import IAPTransport

/// When to reset a device whose accessory never brings its iAP2 link up (PROTOCOL.md §7.2: an
/// accessory whose handshake failed ignores new detects and SYNs until it is unplugged or
/// reset). No I/O and no clock: times come in, a decision goes out.
///
/// The link has ``bound`` to come up (``LinkState/connected``) from the start of the
/// connection, and again from each new negotiation (the accessory's SYN: a detect that came late
/// is not held against it). Missing the bound is a stuck episode: the first one asks for one
/// device reset, after which the link has the bound again; missing it after the reset gives up.
/// A reset is asked for at most once per connection, so a device that sticks again is never
/// reset in a loop.
struct StuckLinkPolicy: Sendable {
    /// What to do at a deadline.
    enum Decision: Equatable, Sendable {
        /// Nothing (yet).
        case wait
        /// Reset the device once; the reason is for the log and the event.
        case reset(reason: String)
        /// Stop trying; the reason says what failed and what to do.
        case giveUp(reason: String)
    }

    /// How long the link may take to come up.
    let bound: Duration
    /// When the link must be up by; nil once it is (or while a reset runs, or after giving up).
    private(set) var deadline: LinkTime?
    /// Whether the reset was used.
    private(set) var didReset = false
    /// When the device reset finished, to say how long recovery took.
    private(set) var resetFinishedAt: LinkTime?
    private var done = false

    /// A policy whose first bound runs from `start`.
    init(bound: Duration, start: LinkTime) {
        self.bound = bound
        deadline = start + bound
    }

    /// The link's state changed at `now`.
    mutating func linkStateChanged(_ state: LinkState, now: LinkTime) {
        guard !done else { return }
        switch state {
        case .connected:
            done = true
            deadline = nil
        case .negotiating:
            if deadline != nil { deadline = now + bound }
        case .detecting, .sleeping, .failed:
            break
        }
    }

    /// Whether the link came up (the policy has nothing more to do).
    var linkCameUp: Bool { done && deadline == nil && !gaveUp }
    private(set) var gaveUp = false

    /// The decision at `now` (call at ``deadline``).
    mutating func decide(now: LinkTime) -> Decision {
        guard !done, let deadline, deadline <= now else { return .wait }
        let seconds = bound.formatted
        if !didReset {
            didReset = true
            self.deadline = nil
            return .reset(reason: "the accessory's iAP2 link did not come up within \(seconds) (no SYN, or no answer to the host's SYN|ACK); resetting the USB device once and starting again")
        }
        done = true
        gaveUp = true
        self.deadline = nil
        return .giveUp(reason: "the accessory's iAP2 link did not come up within \(seconds), even after a USB reset; unplug the accessory and plug it in again")
    }

    /// The reset finished at `now` (successfully): the link has the bound again.
    mutating func resetFinished(now: LinkTime) {
        guard !done else { return }
        resetFinishedAt = now
        deadline = now + bound
    }
}

extension Duration {
    /// "2 s", "1.5 s", "250 ms".
    fileprivate var formatted: String {
        let milliseconds = Int(components.seconds) * 1_000 + Int(components.attoseconds / 1_000_000_000_000_000)
        if milliseconds % 1_000 == 0 { return "\(milliseconds / 1_000) s" }
        if milliseconds > 1_000 { return "\(Double(milliseconds) / 1_000) s" }
        return "\(milliseconds) ms"
    }
}

/// Runs a ``StuckLinkPolicy`` for one connection whose transport can reset its device
/// (`DeviceReset`, a USB transport's capability): a timer on the connection's queue, the reset,
/// what is logged and announced. The connection feeds it its start and its link's state
/// changes; nothing else of the connection changes.
///
/// Confinement: every stored `var` is touched on `queue` only.
final class StuckLinkRecovery: @unchecked Sendable {
    /// How long an accessory's link may take to come up before the device is reset: 2 s (a
    /// healthy accessory answers within milliseconds; the FLIR ONE leaves the bus after 4.69 s
    /// without an answer, PROTOCOL.md §7.1).
    static let defaultBound: Duration = .seconds(2)

    private let queue: DispatchQueue
    private let reset: DeviceReset
    private let logger: Logger
    private let clock: any LinkClock
    /// Says a reset is under way (an event people see: `iapctl watch`).
    private let announce: (String) -> Void
    /// Ends the connection with the reason.
    private let giveUp: (String) -> Void
    private var policy: StuckLinkPolicy?
    private var timer: (any LinkTimer)?
    private var stopped = false

    /// A recovery for `transport`, or nil when it cannot reset its device.
    init?(transport: any Transport, queue: DispatchQueue, logger: Logger, clock: any LinkClock,
          announce: @escaping (String) -> Void, giveUp: @escaping (String) -> Void) {
        guard let reset = transport.capability(DeviceReset.self) else { return nil }
        self.reset = reset
        self.queue = queue
        self.logger = logger
        self.clock = clock
        self.announce = announce
        self.giveUp = giveUp
    }

    /// The connection started (its link waits for the accessory). On the queue.
    func start() {
        policy = StuckLinkPolicy(bound: Self.defaultBound, start: clock.now)
        schedule()
    }

    /// An event of the connection's endpoint. On the queue.
    func observe(_ event: EndpointEvent) {
        switch event {
        case .protocolSwitched(.iap1), .identified:
            // An iAP1 accessory has no iAP2 link to bring up; an identified one is working.
            return stop()
        default:
            break
        }
        guard case let .link(.stateChanged(state)) = event, var policy = self.policy else { return }
        policy.linkStateChanged(state, now: clock.now)
        if policy.linkCameUp, policy.didReset, let since = policy.resetFinishedAt {
            logger.info("the link came up \((clock.now - since).formatted) after the USB reset")
        }
        self.policy = policy
        schedule()
    }

    /// The connection ended. On the queue.
    func stop() {
        stopped = true
        policy = nil
        timer?.cancel()
        timer = nil
    }

    private func schedule() {
        guard !stopped else { return }
        let timer = self.timer ?? clock.makeTimer(queue: queue) { [weak self] in self?.fire() }
        self.timer = timer
        timer.schedule(at: policy?.deadline)
    }

    private func fire() {
        guard !stopped, var policy else { return }
        let decision = policy.decide(now: clock.now)
        self.policy = policy
        switch decision {
        case .wait:
            schedule()
        case let .reset(reason):
            logger.warning("\(reason)")
            announce(reason)
            reset.reset { [weak self] error in
                guard let self else { return }
                self.queue.async { self.resetDone(error) }
            }
        case let .giveUp(reason):
            logger.error("\(reason)")
            stop()
            giveUp(reason)
        }
    }

    private func resetDone(_ error: TransportError?) {
        guard !stopped, var policy else { return }
        if let error {
            // The transport closes as well (the device went or came back as another): the
            // connection ends through it; nothing more to do here.
            logger.warning("the USB reset failed: \(error)")
            stop()
            return
        }
        logger.info("the USB device was reset; waiting for the accessory's link")
        policy.resetFinished(now: clock.now)
        self.policy = policy
        schedule()
    }
}
