package import Dispatch

/// Marks queues so that code can tell whether it already runs on one: the one way the package
/// asks "am I on this queue" (a manager's queue, whose task executor and handlers call the
/// synchronous API from the queue itself, where `sync` would wait for itself; a USB context's;
/// a bus connection's). The mark is the queue's identity, so every module that marks the same
/// queue marks it alike.
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
