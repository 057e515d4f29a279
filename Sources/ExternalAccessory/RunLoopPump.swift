internal import Foundation


/// Posts a stream's events to the run loops it is scheduled on, from any thread.
///
/// Foundation on Linux has no run-loop source a library can signal from another thread, but a
/// timer added from any thread wakes its run loop: ``poke()`` adds a one-shot timer (at most one
/// waits at a time) whose firing calls ``fire`` on the run loop's thread, which works out what
/// happened. While scheduled, a timer that never fires keeps the run loop running, as a
/// stream scheduled on iOS does.
final class RunLoopPump: @unchecked Sendable {
    // Confinement: `state` behind its lock; `fire` set once, before the stream is handed out.
    private struct Scheduled {
        let runLoop: RunLoop
        let mode: RunLoop.Mode
        let keepAlive: Timer
    }
    private struct State {
        var scheduled: [Scheduled] = []
        var pending = false
    }

    private let state = Locked(State())
    /// Runs on the run loop's thread when poked.
    var fire: () -> Void = {}

    /// Posts the events to `runLoop` in `mode` from now on.
    func schedule(in runLoop: RunLoop, forMode mode: RunLoop.Mode) {
        let keepAlive = Timer(fire: .distantFuture, interval: 0, repeats: false) { _ in }
        let added = state.withLock { state -> Bool in
            guard !state.scheduled.contains(where: { $0.runLoop === runLoop && $0.mode == mode }) else { return false }
            state.scheduled.append(Scheduled(runLoop: runLoop, mode: mode, keepAlive: keepAlive))
            return true
        }
        guard added else { return }
        runLoop.add(keepAlive, forMode: mode)
        poke()
    }

    /// Stops posting to `runLoop` in `mode`.
    func remove(from runLoop: RunLoop, forMode mode: RunLoop.Mode) {
        let removed = state.withLock { state -> [Scheduled] in
            let removed = state.scheduled.filter { $0.runLoop === runLoop && $0.mode == mode }
            state.scheduled.removeAll { $0.runLoop === runLoop && $0.mode == mode }
            return removed
        }
        for entry in removed { entry.keepAlive.invalidate() }
    }

    /// Stops posting anywhere (the stream closed or went away).
    func removeAll() {
        let removed = state.withLock { state -> [Scheduled] in
            defer { state.scheduled.removeAll() }
            return state.scheduled
        }
        for entry in removed { entry.keepAlive.invalidate() }
    }

    /// Something may have happened: has ``fire`` run soon on the first run loop scheduled.
    func poke() {
        let target = state.withLock { state -> (RunLoop, RunLoop.Mode)? in
            guard !state.pending, let first = state.scheduled.first else { return nil }
            state.pending = true
            return (first.runLoop, first.mode)
        }
        guard let (runLoop, mode) = target else { return }
        let timer = Timer(timeInterval: 0, repeats: false) { [weak self] _ in
            guard let self else { return }
            self.state.withLock { $0.pending = false }
            self.fire()
        }
        runLoop.add(timer, forMode: mode)
    }
}
