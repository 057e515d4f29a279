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

/// Carries a value the compiler cannot prove `Sendable` across a hop between queues, where the
/// code guarantees that one queue at a time uses it (a completion handed to the setup queue and
/// back, a callback carried to the main queue and run there once). The one such box of the
/// package; say at each use why it is safe.
package struct UncheckedSendable<Value>: @unchecked Sendable {
    /// The value carried.
    package var value: Value
    /// Carries `value`.
    package init(_ value: Value) { self.value = value }
}
