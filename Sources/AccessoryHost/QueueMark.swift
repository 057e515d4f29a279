package import Dispatch

/// Marks a manager's queue so that code can tell whether it already runs there: a task on
/// ``AccessoryManager/taskExecutor`` (or a handler given the manager's queue) calls the
/// synchronous API from the queue itself, where `sync` would wait for itself.
package enum QueueMark {
    private static let key = DispatchSpecificKey<UInt>()

    private static func marker(of queue: DispatchQueue) -> UInt { UInt(bitPattern: ObjectIdentifier(queue).hashValue) }

    /// Marks `queue` (another queue carries another mark).
    package static func mark(_ queue: DispatchQueue) { queue.setSpecific(key: key, value: marker(of: queue)) }

    /// Whether the caller runs on `queue`.
    package static func isCurrent(_ queue: DispatchQueue) -> Bool { DispatchQueue.getSpecific(key: key) == marker(of: queue) }

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
