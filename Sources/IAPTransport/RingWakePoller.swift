internal import Dispatch
internal import Glibc
internal import SystemCalls
internal import Synchronization

/// One thread for the process that waits in `poll(2)` on the wake-up socket of every active
/// ``SharedRingChannel`` and runs a woken channel's wake-up on the channel's queue with `sync`.
///
/// Why not a Dispatch read source per socket: a source's event is two thread hand-offs
/// (Dispatch's event thread wakes, then wakes a worker for the queue), a re-arm (`epoll_ctl`)
/// and the reads. Here a wake byte wakes this thread, and when the channel's queue is idle
/// `sync` runs the wake-up on this thread at once: one hand-off. When the queue is busy, this
/// thread waits for its turn, as an `async` block would. Nothing run on a channel's queue ever
/// waits for this thread (adding and removing take a lock and write to a pipe), so the `sync`
/// cannot deadlock.
///
/// The poller owns an activated channel's descriptor from then on: a channel that ends asks for
/// it to be closed, and it is closed here between two polls, so a descriptor number is never
/// reused while a `poll` still watches it.
///
/// **Busy-polling while the traffic goes back and forth.** A wake byte that finds this thread
/// asleep costs the time to wake it (10–25 µs on the project's virtual machines); two of them a
/// round trip are all of iapd's extra latency. So when a wake-up came soon after the previous
/// one was served (within twice the window: a request and its answer), the poller, having served
/// it, looks again without sleeping (`poll` with no timeout) for up to the window, 50 µs, before
/// it sleeps. Traffic that pauses longer than that (a sensor every 10 ms, an idle session) never
/// makes it spin; a stream that keeps a ring busy sends no wake bytes at all. What it costs: up
/// to the window of one core after each wake-up of a back-and-forth exchange. Linux's own
/// `net.core.busy_poll` suggests the same 50 µs. `ACCESSORYHOST_BUSY_POLL_US` sets the window for
/// the process (0 turns it off).
final class RingWakePoller: Sendable {
    static let shared = RingWakePoller()

    /// How long the poller looks again without sleeping after serving a wake-up.
    static var spinWindow: Duration { BusyPolling.window }

    private struct Member: Sendable {
        let descriptor: Int32
        let queue: DispatchQueue
        weak var channel: SharedRingChannel?
    }

    private struct State: ~Copyable {
        var members: [Member] = []
        /// Descriptors of channels that ended, closed by the poller's thread before its next poll.
        var closing: [Int32] = []
        /// Counts the changes to `members`, so the poller rebuilds its list only after one.
        var generation = 0
        var started = false
    }

    private let state = Mutex(State())
    private let wakeReader: Int32
    private let wakeWriter: Int32

    private init() {
        if let (reader, writer) = makeWakePipe() {
            (wakeReader, wakeWriter) = (reader, writer)
        } else {
            (wakeReader, wakeWriter) = (-1, -1)
        }
    }

    /// Whether the poller can run (its wake-up pipe exists); a channel falls back to a Dispatch
    /// read source when it cannot.
    var isAvailable: Bool { wakeWriter >= 0 }

    /// Starts watching `descriptor` for `channel`, whose wake-up runs on `queue`.
    func add(_ channel: SharedRingChannel, descriptor: Int32, queue: DispatchQueue) {
        let start = state.withLock { state -> Bool in
            state.members.append(Member(descriptor: descriptor, queue: queue, channel: channel))
            state.generation &+= 1
            defer { state.started = true }
            return !state.started
        }
        if start {
            DispatchQueue(label: "SharedRingChannel wake-ups").async { [self] in run() }
        } else {
            wake()
        }
    }

    /// Stops watching `descriptor` and closes it (on the poller's thread, before it polls again).
    func remove(descriptor: Int32) {
        state.withLock { state in
            state.members.removeAll { $0.descriptor == descriptor }
            state.closing.append(descriptor)
            state.generation &+= 1
        }
        wake()
    }

    private func wake() {
        var byte: UInt8 = 1
        // A full pipe already holds a wake-up, so a failed write loses nothing.
        _ = write(wakeWriter, &byte, 1)
    }

    private func run() {
        var drain = [UInt8](repeating: 0, count: 256)
        var watched: [pollfd] = []
        var polled: [Member] = []
        var batch: [SharedRingChannel] = []
        var generation = -1
        var dropped = false
        let window = Self.spinWindow
        /// When the last wake-up was served, and whether the traffic goes back and forth.
        var servedAt: ContinuousClock.Instant?
        var spinning = false
        while true {
            // The list is rebuilt only after a change: a wake-up allocates nothing.
            let change = state.withLock { state -> (closing: [Int32], members: [Member])? in
                guard state.generation != generation || dropped else { return nil }
                // A channel gone without ending (dropped while active) leaves its descriptor
                // here. Each weak reference is read once: a channel freed between two reads
                // would otherwise be dropped from the list without its descriptor closed.
                var closing = state.closing
                var alive: [Member] = []
                alive.reserveCapacity(state.members.count)
                for member in state.members {
                    if member.channel == nil { closing.append(member.descriptor) } else { alive.append(member) }
                }
                state.members = alive
                state.closing.removeAll()
                generation = state.generation
                return (closing, state.members)
            }
            if let change {
                for descriptor in change.closing { _ = Glibc.close(descriptor) }
                polled = change.members
                watched.removeAll(keepingCapacity: true)
                watched.append(pollfd(fd: wakeReader, events: Int16(POLLIN), revents: 0))
                for member in polled { watched.append(pollfd(fd: member.descriptor, events: Int16(POLLIN), revents: 0)) }
                dropped = false
            }
            var found = false
            if spinning, let servedAt {
                // Back and forth: look again without sleeping, up to the window.
                let until = servedAt + window
                repeat {
                    if case let .success(count) = SystemCall.poll(&watched, timeout: 0), count > 0 { found = true }
                } while !found && ContinuousClock.now < until
            }
            if !found, case .failure = SystemCall.poll(&watched) {
                // Not EINTR (retried inside): out of memory for the poll table. Try again soon
                // rather than spin.
                usleep(1_000)
                continue
            }
            if window > .zero, let servedAt {
                spinning = ContinuousClock.now - servedAt <= window * 2
            }
            if watched[0].revents != 0 {
                while drain.withUnsafeMutableBytes({ read(wakeReader, $0.baseAddress, $0.count) }) > 0 {}
            }
            // The ready channels, queue by queue: one `sync` for every ready channel of a queue.
            while let first = polled.indices.first(where: { watched[$0 + 1].revents != 0 }) {
                let queue = polled[first].queue
                batch.removeAll(keepingCapacity: true)
                for index in first..<polled.count where watched[index + 1].revents != 0 && polled[index].queue === queue {
                    watched[index + 1].revents = 0
                    if let channel = polled[index].channel { batch.append(channel) } else { dropped = true }
                }
                if !batch.isEmpty {
                    queue.sync {
                        for channel in batch { channel.woken() }
                    }
                    batch.removeAll(keepingCapacity: true) // a channel dropped meanwhile is not kept alive here
                    servedAt = ContinuousClock.now
                }
            }
        }
    }
}

/// How long a side that waits for an answer looks for it without sleeping, for the process: the
/// ring poller after a wake-up it served, a session's read off the manager's queue. 50 µs, or
/// `ACCESSORYHOST_BUSY_POLL_US` (0 turns it off; at most 10 ms).
package enum BusyPolling {
    /// The window, read once from the environment.
    package static let window: Duration = {
        guard let text = getenv("ACCESSORYHOST_BUSY_POLL_US"), let micros = Int(String(cString: text)), micros >= 0 else {
            return .microseconds(50)
        }
        return .microseconds(min(micros, 10_000))
    }()
}
