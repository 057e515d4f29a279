internal import Dispatch
internal import IAPTransport
internal import Synchronization

/// A repeating Dispatch timer that is started at most once and stopped at most once, from any
/// thread: what iapd's keepers (``SerialPortKeeper``, ``BluetoothKeeper``) try again with.
///
/// Dispatch's sources are safe to resume and cancel from any thread; the state says which was
/// done, so that a source never resumed is resumed before it goes (Dispatch's rule).
final class RepeatingTimer: Sendable {
    private nonisolated(unsafe) let source: any DispatchSourceTimer
    private let state = Mutex<(started: Bool, stopped: Bool)>((false, false))

    /// A timer that fires on `queue` once started.
    init(queue: DispatchQueue) {
        source = DispatchSource.makeTimerSource(queue: queue)
    }

    deinit {
        if !state.withLock({ $0.started }) { source.resume() }
        source.cancel()
    }

    /// Runs `handler` now and then every `interval` (at least 1 ms); false, and nothing done,
    /// when the timer was started or stopped before.
    @discardableResult
    func start(every interval: Duration, _ handler: @escaping @Sendable () -> Void) -> Bool {
        let first = state.withLock { state -> Bool in
            guard !state.started, !state.stopped else { return false }
            state.started = true
            return true
        }
        guard first else { return false }
        source.schedule(deadline: .now(), repeating: max(interval, .milliseconds(1)).dispatchInterval, leeway: .milliseconds(100))
        source.setEventHandler(handler: handler)
        source.resume()
        return true
    }

    /// Stops firing for good (a later ``start(every:_:)`` does nothing).
    func stop() {
        state.withLock { $0.stopped = true }
        source.cancel()
    }
}
