internal import Dispatch
internal import Glibc
internal import IAPTransport
internal import Synchronization
internal import SystemCalls

// The threads of the gadget code (this transport, GadgetFS, the endpoint byte channel): started
// named, woken from blocking calls with a signal, and joined.

/// Installs a handler that does nothing for ``GadgetTransport/interruptSignal``, without
/// `SA_RESTART`, so that a thread the signal is sent to returns from a blocking call with
/// `EINTR`. A handler someone else installed stays.
private let interruptHandlerInstalled: Bool = {
    var current = sigaction()
    guard sigaction(SIGURG, nil, &current) == 0 else { return false }
    // sa_handler shares its storage with sa_sigaction. 0 is SIG_DFL and 1 is SIG_IGN: nobody
    // else uses the signal. Anything else is someone's handler, which is left alone.
    let existing = unsafeBitCast(current.__sigaction_handler.sa_handler, to: UInt.self)
    guard existing <= 1 else { return true }
    var action = sigaction()
    action.__sigaction_handler.sa_handler = { _ in }
    sigemptyset(&action.sa_mask)
    action.sa_flags = 0
    return sigaction(SIGURG, &action, nil) == 0
}()

/// Wakes `thread` from a blocking call with the interrupt signal, repeating in case the signal
/// came just before the call, and joins it.
func interruptAndJoin(_ thread: WorkerThread) {
    repeat {
        pthread_kill(thread.handle, SIGURG)
    } while thread.finished.wait(timeout: .now() + .milliseconds(20)) == .timedOut
    pthread_join(thread.handle, nil)
}

/// A thread of the transport: its handle, and a semaphore signalled when its body returned.
final class WorkerThread: Sendable {
    let name: String
    let handle: pthread_t
    let finished: DispatchSemaphore

    init(name: String, handle: pthread_t, finished: DispatchSemaphore) {
        self.name = name
        self.handle = handle
        self.finished = finished
    }
}

/// The body of a new thread, handed through `pthread_create`'s context pointer.
private final class ThreadStart: Sendable {
    let name: String
    let body: @Sendable () -> Void
    let started = DispatchSemaphore(value: 0)
    let finished: DispatchSemaphore

    init(name: String, body: @escaping @Sendable () -> Void, finished: DispatchSemaphore) {
        self.name = name
        self.body = body
        self.finished = finished
    }
}

/// Names the calling thread (what `ps -L` and /proc show; 15 bytes at most) by writing its
/// `comm` file: `pthread_setname_np` is a GNU extension Swift does not see.
private func nameCurrentThread(_ name: String) {
    guard case .success(let descriptor) = SystemCall.open("/proc/thread-self/comm", O_WRONLY | O_CLOEXEC) else { return }
    let bytes = Array(name.utf8.prefix(15))
    _ = bytes.withUnsafeBytes { SystemCall.write(descriptor, $0) }
    _ = close(descriptor)
}

/// Starts a joinable thread with ``GadgetTransport/interruptSignal`` unblocked, and returns once
/// it runs and carries its name; fails when the system has no more threads to give.
func spawnThread(name: String, body: @escaping @Sendable () -> Void) -> Result<WorkerThread, TransportError> {
    _ = interruptHandlerInstalled
    let finished = DispatchSemaphore(value: 0)
    let start = ThreadStart(name: name, body: body, finished: finished)
    let context = Unmanaged.passRetained(start).toOpaque()
    var handle = pthread_t()
    let result = pthread_create(&handle, nil, { context in
        let start = Unmanaged<ThreadStart>.fromOpaque(context!).takeRetainedValue()
        nameCurrentThread(start.name)
        var signals = sigset_t()
        sigemptyset(&signals)
        sigaddset(&signals, SIGURG)
        pthread_sigmask(SIG_UNBLOCK, &signals, nil)
        start.started.signal()
        start.body()
        start.finished.signal()
        return nil
    }, context)
    guard result == 0 else {
        Unmanaged<ThreadStart>.fromOpaque(context).release()
        return .failure(TransportError(
            "cannot start the \(name) thread: \(SystemError(result).description)", errno: result,
            advice: "the system is out of threads or memory; close something and try again"))
    }
    start.started.wait()
    return .success(WorkerThread(name: name, handle: handle, finished: finished))
}
