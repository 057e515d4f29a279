internal import Foundation

/// A value behind a lock, for state that holds references Swift cannot prove Sendable (run
/// loops, timers, delegates, Foundation streams): `Mutex` would insist on sending them.
final class Locked<Value>: @unchecked Sendable {
    // Confinement: `value` is touched only inside `withLock`, under `lock`.
    private let lock = NSLock()
    private var value: Value

    init(_ value: Value) { self.value = value }

    /// Runs `body` with the value, under the lock.
    func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}
