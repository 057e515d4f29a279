import AccessoryHost
import Dispatch
import IAPTransport
import Synchronization
import Testing

/// Returns once what `queue` had to do before this call has run, without blocking the task's
/// thread (a cooperative one).
private func passed(_ queue: DispatchQueue) async {
    await withCheckedContinuation { continuation in queue.async { continuation.resume() } }
}

/// ``AccessoryManager/Opening``: how a source's accessory in the making keeps the manager
/// unsettled, and how it ends.
@Suite("a source's openings and the manager's settling", .timeLimit(.minutes(1)))
struct OpeningTests {
    @Test("an opening dropped without an end wakes a pending settle wait (its timeout never comes)")
    func droppedOpeningWakesTheWait() async throws {
        let clock = ManualLinkClock()
        var configuration = AccessoryManager.Configuration()
        configuration.clock = clock
        let manager = AccessoryManager(configuration: configuration)
        defer { manager.stop() }
        var opening: AccessoryManager.Opening? = manager.beginOpening()
        #expect(opening != nil)
        // The wait's timeout is set once it watches: only then is the opening dropped, so the
        // drop (not the wait's first look) must end it.
        let timeoutSet = AsyncStream<Void>.makeStream()
        clock.observeDeadlines { timeoutSet.continuation.yield() }
        async let settled = manager.waitUntilSettled(timeout: .seconds(3_600))
        for await _ in timeoutSet.stream { break }
        await passed(manager.queue) // the wait's first look (unsettled) is over
        opening = nil
        await passed(manager.queue) // the wake-up the drop sent has run
        await clock.advance(by: .seconds(3_600)) // a wait still pending now times out: false
        #expect(await settled, "the drop ended the wait, not its timeout")
    }

    @Test("an opening that fails after the manager stopped publishes nothing")
    func failureAfterStopIsQuiet() async {
        let manager = AccessoryManager()
        let heard = Mutex<[AccessoryEvent]>([])
        let handlers = DispatchQueue(label: "handlers")
        let subscription = manager.onEvent(queue: handlers) { event in heard.withLock { $0.append(event) } }
        defer { subscription.cancel() }
        let before = manager.beginOpening()
        before.fail(location: "usb 1-1", reason: "no reply to the detect")
        await passed(manager.queue) // published before the stop
        let after = manager.beginOpening()
        manager.stop()
        after.fail(location: "usb 1-2", reason: "the context was shut down")
        await passed(manager.queue)
        await passed(handlers)
        let failures = heard.withLock { events in
            events.compactMap { event -> String? in
                if case .failed(let location, _) = event { return location }
                return nil
            }
        }
        #expect(failures == ["usb 1-1"], "only the failure before the stop is news")
    }
}
