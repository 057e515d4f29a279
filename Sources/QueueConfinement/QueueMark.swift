package import Dispatch

/// Marks queues so that code can tell whether it already runs on one: the one way the package
/// asks "am I on this queue" (a manager's queue, whose task executor and handlers call the
/// synchronous API from the queue itself, where `sync` would wait for itself; a USB context's;
/// a bus connection's). The mark is a token object set on the queue itself the first time any
/// module marks it, and kept: on Linux a `DispatchQueue` is a wrapper that `.main` and `global()`
/// make anew on each read, and a freed wrapper's address may come back, so neither can stand
/// for the queue.
package enum QueueMark {
    /// What marks one queue: compared by identity.
    private final class Token: Sendable {}

    private static let key = DispatchSpecificKey<Token>()

    /// Marks `queue`, once: a queue marked already keeps its token.
    package static func mark(_ queue: DispatchQueue) {
        if queue.getSpecific(key: key) == nil { queue.setSpecific(key: key, value: Token()) }
    }

    /// Whether the caller runs on `queue` (false for a queue never marked).
    package static func isCurrent(_ queue: DispatchQueue) -> Bool {
        guard let token = queue.getSpecific(key: key) else { return false }
        return DispatchQueue.getSpecific(key: key) === token
    }

    /// Runs `body` on `queue` from any thread: inline when already on it, otherwise with `sync`,
    /// which runs it on the calling thread once the queue is free (the queue taken like a lock:
    /// no other thread is woken). Work on a manager's queue never blocks (no thread waits in
    /// libusb or for I/O there), so the wait is short.
    package static func run<Result>(on queue: DispatchQueue, _ body: () throws -> Result) rethrows -> Result {
        if isCurrent(queue) { return try body() }
        return try queue.sync(execute: body)
    }

    /// Runs `body` on `queue`: inline when already on it, otherwise later with `async`.
    package static func runOrAsync(on queue: DispatchQueue, _ body: @escaping @Sendable () -> Void) {
        if isCurrent(queue) { return body() }
        queue.async(execute: body)
    }
}

/// A value that belongs to one queue, carried across a hop to it: a completion handed to the
/// setup queue and back, a libusb snapshot taken on the event thread and used on the context's
/// queue, a callback run on the main queue. The compiler cannot prove such a value `Sendable`;
/// the code's promise is that only `queue` reads it, and in debug builds every read checks that
/// promise (as swift-nio's `NIOLoopBound` checks its event loop), so a read from elsewhere stops
/// the test that made it instead of racing. Release builds read it unchecked.
///
/// The one box of the package for values carried between queues: say at each use which queue
/// the value belongs to. State shared by several queues takes a lock (`Mutex`), not a box.
///
/// `queue` is a serial queue of the package's own, not a global (root) queue, which cannot be
/// marked, and a box is read on that queue itself: the check does not follow target queues.
package struct QueueBound<Value>: @unchecked Sendable {
    // Sendability: `carried` is read only through `value`, which checks (in debug builds) that it
    // runs on `queue`; so one queue at a time uses it, whatever thread made the box.
    private let carried: Value
    private let queue: DispatchQueue

    /// Carries `value`, to be read on `queue` only (which is marked for the check).
    package init(_ value: Value, on queue: DispatchQueue) {
        QueueMark.mark(queue)
        self.carried = value
        self.queue = queue
    }

    /// The value; only on the queue it belongs to (checked in debug builds).
    package var value: Value {
        assert(QueueMark.isCurrent(queue), "a QueueBound value read off its queue (\(queue.label))")
        return carried
    }
}
