internal import Dispatch

/// A task executor that runs jobs on a serial `DispatchQueue`: ``AccessoryManager/taskExecutor``.
///
/// A task that prefers it (`withTaskExecutorPreference(manager.taskExecutor) { … }`) runs its code
/// between awaits on the manager's queue, so a session call it awaits resumes without waking
/// another thread: what a request/response loop wants for the lowest latency. While such code
/// runs, no accessory's protocol work runs: keep what it does between awaits short, and never
/// block in it.
final class QueueTaskExecutor: TaskExecutor, @unchecked Sendable {
    // Sendability: immutable.
    let queue: DispatchQueue

    init(queue: DispatchQueue) {
        self.queue = queue
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        queue.async { job.runSynchronously(on: executor) }
    }
}
