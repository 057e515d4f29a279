internal import Dispatch
internal import Synchronization

/// Runs async work from synchronous code (a command's body) and waits for its result.
///
/// The work runs as a `Task` on the cooperative pool while the calling thread waits, so call it
/// only from a thread that is not part of that pool (a tool's main thread, a Dispatch queue).
package func blockingAwait<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) throws -> T {
    let result = Mutex<Result<T, any Error>?>(nil)
    let done = DispatchSemaphore(value: 0)
    Task {
        do {
            let value = try await body()
            result.withLock { $0 = .success(value) }
        } catch {
            result.withLock { $0 = .failure(error) }
        }
        done.signal()
    }
    done.wait()
    guard let outcome = result.withLock({ $0 }) else { throw ExitCode.software }
    return try outcome.get()
}
