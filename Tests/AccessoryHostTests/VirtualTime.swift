import Dispatch
import IAPLink
import IAPTransport
import Synchronization

/// Something that says when it changed: a waiter sees every change after the count it read.
final class ChangeSignal: Sendable {
    private struct State {
        var count = 0
        var waiters: [(after: Int, continuation: CheckedContinuation<Void, Never>)] = []
    }

    private let state = Mutex(State())

    /// How many changes there were.
    var count: Int { state.withLock { $0.count } }

    /// Says there was a change: every waiter resumes.
    func fire() {
        let waiters = state.withLock { state in
            state.count += 1
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters { waiter.continuation.resume() }
    }

    /// Returns once the count is past `count`.
    func wait(after count: Int) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = state.withLock { state -> Bool in
                guard state.count <= count else { return true }
                state.waiters.append((count, continuation))
                return false
            }
            if now { continuation.resume() }
        }
    }
}

/// A transport that counts the bytes it sends and receives, so that ``QuietClock`` knows when
/// nothing is under way on the line it is one end of.
final class CountedTransport: Transport {
    let base: any Transport
    /// Bytes handed to ``send(_:)`` and bytes delivered to the handler.
    let sent = Atomic<Int>(0)
    let received = Atomic<Int>(0)
    let changes: ChangeSignal

    init(_ base: any Transport, changes: ChangeSignal) {
        self.base = base
        self.changes = changes
    }

    var description: String { base.description }
    var kind: TransportKind { base.kind }
    func capability<Value>(_ type: Value.Type) -> Value? { base.capability(type) }

    func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) {
        base.activate(queue: queue) { [weak self] event in
            let count: Int
            switch event {
            case let .received(bytes): count = bytes.count
            case let .borrowed(bytes): count = bytes.count
            case let .lent(lease): count = lease.count
            case .closed: count = 0
            }
            handler(event)
            guard let self else { return }
            self.received.wrappingAdd(count, ordering: .relaxed)
            self.changes.fire()
        }
    }

    func send(_ frame: [UInt8]) {
        sent.wrappingAdd(frame.count, ordering: .relaxed)
        base.send(frame)
        changes.fire()
    }

    func cancel() { base.cancel() }
}

/// Runs a ``ManualLinkClock`` as discrete-event time: whenever the lines it watches are quiet (no
/// byte sent that has not arrived, no event in the last round through the queues), the clock
/// moves to its next deadline and runs what is due there; then it waits for quiet again.
///
/// A retransmission, a timeout or a drain limit therefore comes due after everything before it
/// has happened, however slow the machine is: a test's outcome does not depend on load, and a
/// test that waits 30 s of link time takes milliseconds. While a line has bytes under way that
/// will not arrive (a reader stopped), ``holdsForBytesInFlight`` false lets time go on.
final class QuietClock: Sendable {
    let clock: ManualLinkClock
    private let queues: [DispatchQueue]
    private let lines: [(CountedTransport, CountedTransport)]
    let changes: ChangeSignal
    private let stopped = Atomic<Bool>(false)
    private let holds = Atomic<Bool>(true)
    private let runner = Mutex<Task<Void, Never>?>(nil)

    /// Watches `lines` (both ends of each, counted with `changes`) and `queues` (every queue the
    /// host and the accessory run on).
    init(clock: ManualLinkClock, changes: ChangeSignal, queues: [DispatchQueue], lines: [(CountedTransport, CountedTransport)]) {
        self.clock = clock
        self.changes = changes
        self.queues = queues
        self.lines = lines
        clock.observeDeadlines { changes.fire() }
    }

    /// Whether bytes sent and not yet arrived keep the clock where it is (true by default).
    var holdsForBytesInFlight: Bool {
        get { holds.load(ordering: .relaxed) }
        set {
            holds.store(newValue, ordering: .relaxed)
            changes.fire()
        }
    }

    /// Starts moving the clock.
    func start() {
        let task = Task.detached { [self] in await run() }
        runner.withLock { $0 = task }
    }

    /// Stops moving the clock (what is under way finishes).
    func stop() {
        stopped.store(true, ordering: .relaxed)
        changes.fire()
    }

    private var bytesInFlight: Int {
        lines.reduce(0) { total, line in
            total + line.0.sent.load(ordering: .relaxed) - line.1.received.load(ordering: .relaxed)
                + line.1.sent.load(ordering: .relaxed) - line.0.received.load(ordering: .relaxed)
        }
    }

    private func run() async {
        while !stopped.load(ordering: .relaxed) {
            let seen = changes.count
            // One round through every queue: what was queued before it has run.
            for queue in queues {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    queue.async { continuation.resume() }
                }
            }
            let quiet = changes.count == seen && (bytesInFlight == 0 || !holdsForBytesInFlight)
            if quiet, clock.nextDeadline != nil {
                await clock.advanceToNextDeadline()
                changes.fire()
            } else if quiet || changes.count == seen {
                // Nothing due, or bytes on their way: wait for the next change (a byte, a timer set).
                await changes.wait(after: seen)
            }
        }
    }
}
