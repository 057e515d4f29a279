import Dispatch
public import Testing

/// Runs each test case it is given to on a thread of its own instead of Swift's cooperative pool:
/// for tests that block their thread (semaphore and condition waits, `queue.sync` on a queue that
/// may be busy, blocking reads, joins) or run for seconds of CPU.
///
/// Swift Testing runs every test function, synchronous ones included, as a task on the
/// cooperative pool, which has one thread per core and never adds one for a thread that blocks.
/// On a two-core machine two such tests at once leave no thread for anything else: the awaits
/// of every other test, and the timers of the time limits, wait until one of them returns. Under
/// load that is minutes (issue 16). With this trait the test's jobs run on a serial Dispatch queue
/// of its own, whose thread the kernel shares out like any other; its awaits still work (they
/// resume on that queue), so a test may mix both. A blocking wait must then not wait for a child
/// task of the same test (`async let`, a task group): that child runs on the same queue.
public struct OwnThreadTrait: TestTrait, SuiteTrait, TestScoping {
    public var isRecursive: Bool { true }

    public func provideScope(for test: Test, testCase: Test.Case?,
                             performing function: @Sendable () async throws -> Void) async throws {
        // A suite's own scope holds no test code: each of its test cases gets its own thread.
        guard testCase != nil else { return try await function() }
        let executor = OwnThreadExecutor(label: "test \(test.name)")
        try await withTaskExecutorPreference(executor) { try await function() }
    }
}

extension Trait where Self == OwnThreadTrait {
    /// Runs each test case on a thread of its own, off Swift's cooperative pool: see
    /// ``OwnThreadTrait``.
    public static var ownThread: Self { OwnThreadTrait() }
}

/// A task executor that runs its jobs on a serial Dispatch queue of its own (a queue made with a
/// label gets a thread of Dispatch's overcommitting pool, not one of the cooperative pool).
final class OwnThreadExecutor: TaskExecutor, @unchecked Sendable {
    // Sendability: immutable.
    let queue: DispatchQueue

    init(label: String) {
        queue = DispatchQueue(label: label)
        queue.setSpecific(key: ownThreadKey, value: true)
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        queue.async { job.runSynchronously(on: executor) }
    }
}

private let ownThreadKey = DispatchSpecificKey<Bool>()

/// Whether the caller runs on the thread of a test given ``OwnThreadTrait`` (so it may block).
public var isOnOwnTestThread: Bool { DispatchQueue.getSpecific(key: ownThreadKey) ?? false }

/// Records an issue unless the caller runs on a thread of its own (``OwnThreadTrait``): helpers
/// that block call it first, so that a test using them without the trait fails at once instead
/// of starving the cooperative pool on a loaded machine.
public func expectMayBlock(_ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
    if !isOnOwnTestThread {
        Issue.record("\(what) blocks its thread: give the test or its suite the .ownThread trait", sourceLocation: sourceLocation)
    }
}
