internal import IAPTransport
internal import Glibc
internal import Synchronization

/// A session's read, seen from a task off the manager's queue: whether a read would find bytes
/// now, and whether the reads go back and forth with writes.
///
/// A read that must wait is resumed by the manager's queue onto the task's executor; on
/// Swift's cooperative pool that wakes a sleeping thread, 10–25 µs on the project's virtual
/// machines and most of a short round trip. So a read off the manager's queue, when the last
/// reads were answered within twice the window (a request and its answer), first looks at this
/// flag for up to the window (50 µs; `ACCESSORYHOST_BUSY_POLL_US` sets it for the process, 0
/// turns it off) before it waits: the answer usually comes within that time and the read takes
/// it without a hand-off. The flag is stored by the queue after every service of the session,
/// so the look takes no lock and never holds up the queue. A read that had to wait long, or
/// found nothing within the window, does not look the next time; a reader on the manager's
/// queue (its task executor) never looks, since it would hold up the very queue that answers.
final class ReadWait: Sendable {
    /// How long a read looks before it waits (shared with the ring poller's busy-polling).
    static let window: Duration = BusyPolling.window

    private let readable = Atomic<Bool>(false)
    /// Whether the last read was answered within twice the window.
    private let backAndForth = Atomic<Bool>(false)

    /// On the queue, after every service of the session.
    func setReadable(_ value: Bool) {
        readable.store(value, ordering: .releasing)
    }

    /// Looks for up to the window whether bytes came (off the queue). True when they did or the
    /// look was not worth it; the read then goes on as usual.
    func lookBeforeWaiting() -> ContinuousClock.Instant? {
        let window = Self.window
        guard window > .zero else { return nil }
        let start = ContinuousClock.now
        guard backAndForth.load(ordering: .relaxed), !readable.load(ordering: .acquiring) else { return start }
        let until = start + window
        while ContinuousClock.now < until {
            if readable.load(ordering: .acquiring) { return start }
            // A thread that would answer may be waiting for this core.
            sched_yield()
        }
        return start
    }

    /// After the read: how long it took from `start`, which decides whether the next one looks.
    func readEnded(since start: ContinuousClock.Instant?) {
        guard let start else { return }
        backAndForth.store(ContinuousClock.now - start <= Self.window * 2, ordering: .relaxed)
    }
}
