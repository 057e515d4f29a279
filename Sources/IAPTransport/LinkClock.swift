public import Dispatch
public import IAPLink
import Synchronization

/// Where everything from the ``EndpointDriver`` up reads the time and sets its timers.
///
/// In use this is ``SystemLinkClock`` (the system's monotonic clock and Dispatch timers); in tests
/// it is a ``ManualLinkClock``, which moves only when the test moves it, so a retransmission, an
/// answer timeout, a drain limit or a close's bound comes due when the test says and is asserted
/// at its exact deadline, however loaded the machine is. One clock serves any number of drivers
/// and connections; its times are ``LinkTime`` since its own origin.
public protocol LinkClock: AnyObject, Sendable {
    /// The time now.
    var now: LinkTime { get }
    /// A timer whose `handler` runs on `queue` once the clock reaches the deadline it is
    /// scheduled for (``LinkTimer/schedule(at:)``); it starts idle.
    func makeTimer(queue: DispatchQueue, handler: @escaping @Sendable () -> Void) -> any LinkTimer
    /// Runs `work` once on `queue` when `delay` has passed on this clock (at once for a delay of
    /// zero or less). Nothing cancels it: `work` checks whether it is still wanted.
    func after(_ delay: Duration, on queue: DispatchQueue, _ work: @escaping @Sendable () -> Void)
}

/// A one-shot timer of a ``LinkClock``, moved as often as needed; one object for its owner's
/// whole life, so that moving it allocates nothing of ours.
public protocol LinkTimer: AnyObject, Sendable {
    /// Sets the deadline (replacing any earlier one): the handler runs once the clock reaches
    /// it, on the timer's queue. nil leaves the timer idle.
    func schedule(at deadline: LinkTime?)
    /// Ends the timer: its handler does not run again. Call on the timer's queue, so that a run
    /// already due cannot follow.
    func cancel()
}

extension Duration {
    /// The duration as Dispatch counts it: whole nanoseconds, less than zero taken as zero.
    public var dispatchInterval: DispatchTimeInterval {
        let (seconds, attoseconds) = max(self, .zero).components
        let nanoseconds = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        guard !nanoseconds.overflow, nanoseconds.partialValue < Int64.max - 1_000_000_000 else { return .never }
        return .nanoseconds(Int(nanoseconds.partialValue + attoseconds / 1_000_000_000))
    }
}

/// The clock in use: the system's monotonic clock (`ContinuousClock`, which counts time
/// asleep too) and Dispatch timers; ``LinkClock/now`` is the time since the clock was made.
public final class SystemLinkClock: LinkClock {
    private let origin = ContinuousClock.now

    /// Creates a clock whose time starts at zero now.
    public init() {}

    /// The time since the clock was made.
    public var now: LinkTime { ContinuousClock.now - origin }

    /// A Dispatch timer source on `queue` (200 µs of leeway).
    public func makeTimer(queue: DispatchQueue, handler: @escaping @Sendable () -> Void) -> any LinkTimer {
        SystemLinkTimer(clock: self, queue: queue, handler: handler)
    }

    /// `queue.asyncAfter`, `delay` from now.
    public func after(_ delay: Duration, on queue: DispatchQueue, _ work: @escaping @Sendable () -> Void) {
        queue.asyncAfter(deadline: .now() + delay.dispatchInterval, execute: work)
    }
}

/// A ``SystemLinkClock``'s timer: a Dispatch timer source, resumed from the start and set to the
/// distant future while idle. Unchecked: a Dispatch source may be scheduled and cancelled from
/// any thread (the type just does not say so); the stored properties never change.
private final class SystemLinkTimer: LinkTimer, @unchecked Sendable {
    private let clock: SystemLinkClock
    private let source: any DispatchSourceTimer

    init(clock: SystemLinkClock, queue: DispatchQueue, handler: @escaping @Sendable () -> Void) {
        self.clock = clock
        source = DispatchSource.makeTimerSource(queue: queue)
        source.setEventHandler(handler: handler)
        source.schedule(deadline: .distantFuture)
        source.resume()
    }

    deinit { source.cancel() }

    func schedule(at deadline: LinkTime?) {
        guard let deadline else { return source.schedule(deadline: .distantFuture) }
        source.schedule(deadline: .now() + (deadline - clock.now).dispatchInterval, leeway: .microseconds(200))
    }

    func cancel() { source.cancel() }
}

/// A clock that moves only when told: for tests, which decide when each timer comes due.
///
/// ``advance(by:)`` runs the timers that come due on the way in the order of their deadlines
/// (those set for the same time in the order they were set), each on its queue, with ``now``
/// reading that timer's deadline while it runs, and waits for each before the next; timers
/// that handlers set on the way run too when they fall within the step. Between steps nothing
/// of the clock's runs, so a test can wait for the effect of one step (bytes through a pipe,
/// an event) before the next.
public final class ManualLinkClock: LinkClock {
    private struct Entry {
        var deadline: LinkTime
        /// The order it was set in: ties between equal deadlines go to the first set.
        var order: UInt64
        var queue: DispatchQueue
        /// Given `order`: what set it checks that it is still the entry wanted.
        var run: @Sendable (UInt64) -> Void
    }

    private struct State {
        var now: LinkTime = .zero
        var entries: [UInt64: Entry] = [:]
        var nextOrder: UInt64 = 0
        var observer: (@Sendable () -> Void)?
    }

    private let state = Mutex(State())

    /// Creates a clock standing at zero.
    public init() {}

    /// The time now: where the last ``advance(by:)`` left it, or a due timer's deadline while its
    /// handler runs.
    public var now: LinkTime { state.withLock { $0.now } }

    /// The earliest deadline set (a timer's or an ``after(_:on:_:)``'s), nil when none is.
    public var nextDeadline: LinkTime? { state.withLock { $0.entries.values.map(\.deadline).min() } }

    /// Runs `body` each time a deadline is set (on the thread that set it, after setting it):
    /// what moves the clock can wait for work to come due instead of looking again and again.
    /// Replaces the observer set before.
    public func observeDeadlines(_ body: @escaping @Sendable () -> Void) {
        state.withLock { $0.observer = body }
    }

    /// A timer that runs when ``advance(by:)`` passes its deadline.
    public func makeTimer(queue: DispatchQueue, handler: @escaping @Sendable () -> Void) -> any LinkTimer {
        ManualLinkTimer(clock: self, queue: queue, handler: handler)
    }

    /// Runs `work` when ``advance(by:)`` reaches `delay` from now.
    public func after(_ delay: Duration, on queue: DispatchQueue, _ work: @escaping @Sendable () -> Void) {
        let observer = state.withLock { state in
            _ = Self.insert(&state, deadline: state.now + max(delay, .zero), queue: queue) { _ in work() }
            return state.observer
        }
        observer?()
    }

    /// Moves the clock by `duration`, running every timer that comes due on the way (see the
    /// type's summary), and returns once the last has run and the clock reads its new time.
    public func advance(by duration: Duration) async {
        let target = now + max(duration, .zero)
        while let entry = takeDue(by: target) {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                entry.queue.async {
                    entry.run(entry.order)
                    continuation.resume()
                }
            }
        }
        state.withLock { $0.now = max($0.now, target) }
    }

    /// Moves the clock to the next deadline set, running what is due there (as ``advance(by:)``);
    /// returns the new time, nil (the clock unmoved) when nothing is set.
    @discardableResult
    public func advanceToNextDeadline() async -> LinkTime? {
        guard let next = nextDeadline else { return nil }
        await advance(by: next - now)
        return next
    }

    /// Removes and returns the first entry due by `target`, with the clock moved to its deadline.
    private func takeDue(by target: LinkTime) -> Entry? {
        state.withLock { state in
            guard let (key, entry) = state.entries.filter({ $0.value.deadline <= target })
                .min(by: { ($0.value.deadline, $0.value.order) < ($1.value.deadline, $1.value.order) })
            else { return nil }
            state.entries[key] = nil
            state.now = max(state.now, entry.deadline)
            return entry
        }
    }

    private static func insert(_ state: inout State, deadline: LinkTime, queue: DispatchQueue,
                               run: @escaping @Sendable (UInt64) -> Void) -> UInt64 {
        let order = state.nextOrder
        state.nextOrder += 1
        state.entries[order] = Entry(deadline: deadline, order: order, queue: queue, run: run)
        return order
    }

    /// Replaces entry `key` (if any) with one at `deadline` (none when nil); returns the new key.
    fileprivate func set(_ key: UInt64?, deadline: LinkTime?, queue: DispatchQueue,
                         run: @escaping @Sendable (UInt64) -> Void) -> UInt64? {
        let (key, observer) = state.withLock { state -> (UInt64?, (@Sendable () -> Void)?) in
            if let key { state.entries[key] = nil }
            guard let deadline else { return (nil, nil) }
            return (Self.insert(&state, deadline: deadline, queue: queue, run: run), state.observer)
        }
        observer?()
        return key
    }
}

/// A ``ManualLinkClock``'s timer: one entry in the clock at a time, which a run checks is still
/// the one set (a run the clock took before a reschedule or a cancel does nothing).
private final class ManualLinkTimer: LinkTimer {
    private struct State {
        var key: UInt64?
        var cancelled = false
    }

    private let clock: ManualLinkClock
    private let queue: DispatchQueue
    private let handler: @Sendable () -> Void
    private let state = Mutex(State())

    init(clock: ManualLinkClock, queue: DispatchQueue, handler: @escaping @Sendable () -> Void) {
        self.clock = clock
        self.queue = queue
        self.handler = handler
    }

    deinit {
        let key = state.withLock { $0.key }
        _ = clock.set(key, deadline: nil, queue: queue) { _ in }
    }

    func schedule(at deadline: LinkTime?) {
        state.withLock { state in
            guard !state.cancelled else { return }
            state.key = clock.set(state.key, deadline: deadline, queue: queue) { [weak self] key in self?.fire(key) }
        }
    }

    func cancel() {
        state.withLock { state in
            state.cancelled = true
            _ = clock.set(state.key, deadline: nil, queue: queue) { _ in }
            state.key = nil
        }
    }

    /// The clock ran entry `key` (and dropped it): the handler runs if that is still the entry
    /// set, and the timer is idle until set again.
    private func fire(_ key: UInt64) {
        let wanted = state.withLock { state -> Bool in
            guard !state.cancelled, state.key == key else { return false }
            state.key = nil
            return true
        }
        if wanted { handler() }
    }
}
