import Dispatch
import IAPLink
import IAPTransport
import Synchronization
import Testing

/// What ran, in order, and when by the clock.
private final class Runs: Sendable {
    let entries = Mutex<[(String, LinkTime)]>([])
    func note(_ name: String, _ time: LinkTime) { entries.withLock { $0.append((name, time)) } }
    var names: [String] { entries.withLock { $0.map(\.0) } }
    var times: [LinkTime] { entries.withLock { $0.map(\.1) } }
}

/// A machine that wants to be woken at the times it is given, and notes when it was.
private struct WakingMachine: DrivenMachine {
    var wakeTimes: [LinkTime]
    var woken: [LinkTime] = []

    mutating func start(now: LinkTime) {}
    mutating func receive(_ bytes: [UInt8], now: LinkTime) {}
    mutating func advance(to now: LinkTime) {
        while let first = wakeTimes.first, first <= now {
            wakeTimes.removeFirst()
            woken.append(now)
        }
    }
    var nextDeadline: LinkTime? { wakeTimes.first }
    mutating func takeOutput() -> [[UInt8]] { [] }
}

/// Runs `body` on `queue` without blocking the calling task's thread.
private func on<Result: Sendable>(_ queue: DispatchQueue, _ body: @escaping @Sendable () -> Result) async -> Result {
    await withCheckedContinuation { continuation in queue.async { continuation.resume(returning: body()) } }
}

@Suite("Link clocks: the system's, and the manual one tests run the stack on")
struct LinkClockTests {
    @Test("a manual clock runs what comes due in deadline order, each at its own deadline, ties in the order set")
    func manualOrder() async {
        let clock = ManualLinkClock()
        let queue = DispatchQueue(label: "test.clock")
        let runs = Runs()
        clock.after(.milliseconds(30), on: queue) { runs.note("c", clock.now) }
        clock.after(.milliseconds(10), on: queue) { runs.note("a", clock.now) }
        clock.after(.milliseconds(30), on: queue) { runs.note("d", clock.now) }
        let timer = clock.makeTimer(queue: queue) { runs.note("b", clock.now) }
        timer.schedule(at: .milliseconds(20))
        #expect(clock.nextDeadline == .milliseconds(10))
        await clock.advance(by: .milliseconds(5))
        #expect(runs.names.isEmpty)
        #expect(clock.now == .milliseconds(5))
        await clock.advance(by: .milliseconds(95))
        #expect(runs.names == ["a", "b", "c", "d"])
        #expect(runs.times == [.milliseconds(10), .milliseconds(20), .milliseconds(30), .milliseconds(30)])
        #expect(clock.now == .milliseconds(100))
        #expect(clock.nextDeadline == nil)
    }

    @Test("a timer moved runs at its new deadline only; an idle or cancelled one never runs; one set by a handler within the step runs too")
    func manualTimers() async {
        let clock = ManualLinkClock()
        let queue = DispatchQueue(label: "test.clock")
        let runs = Runs()
        let moved = clock.makeTimer(queue: queue) { runs.note("moved", clock.now) }
        moved.schedule(at: .milliseconds(10))
        moved.schedule(at: .milliseconds(40))
        let idled = clock.makeTimer(queue: queue) { runs.note("idled", clock.now) }
        idled.schedule(at: .milliseconds(15))
        idled.schedule(at: nil)
        let cancelled = clock.makeTimer(queue: queue) { runs.note("cancelled", clock.now) }
        cancelled.schedule(at: .milliseconds(20))
        await on(queue) { cancelled.cancel() }
        cancelled.schedule(at: .milliseconds(25))
        let chained = Mutex<(any LinkTimer)?>(nil)
        let first = clock.makeTimer(queue: queue) {
            runs.note("first", clock.now)
            chained.withLock { $0?.schedule(at: clock.now + .milliseconds(5)) }
        }
        chained.withLock { $0 = clock.makeTimer(queue: queue) { runs.note("chained", clock.now) } }
        first.schedule(at: .milliseconds(30))
        await clock.advance(by: .milliseconds(50))
        #expect(runs.names == ["first", "chained", "moved"])
        #expect(runs.times == [.milliseconds(30), .milliseconds(35), .milliseconds(40)])
        // Past its deadline a timer is idle until set again.
        await clock.advance(by: .seconds(1))
        #expect(runs.names.count == 3)
        moved.schedule(at: clock.now)
        await clock.advance(by: .zero)
        #expect(runs.names.last == "moved")
    }

    @Test("an endpoint driver on a manual clock wakes its machine exactly at each deadline, and not before")
    func driverOnManualClock() async throws {
        let clock = ManualLinkClock()
        let queue = DispatchQueue(label: "test.driver")
        let (near, far) = MemoryTransport.pair(name: "clock test")
        defer { withExtendedLifetime(far) {} }
        await clock.advance(by: .seconds(7)) // the driver's time starts at zero whatever the clock reads
        let driver = EndpointDriver(machine: WakingMachine(wakeTimes: [.milliseconds(100), .milliseconds(250), .seconds(3)]),
                                    transport: near, queue: queue, clock: clock)
        await on(queue) { driver.start(update: { _, _ in }, closed: { _ in }) }
        await clock.advance(by: .milliseconds(99))
        #expect(await on(queue) { driver.perform { machine, _ in machine.woken } }.isEmpty)
        await clock.advance(by: .milliseconds(1))
        #expect(await on(queue) { driver.perform { machine, _ in machine.woken } } == [.milliseconds(100)])
        await clock.advance(by: .seconds(10))
        #expect(await on(queue) { driver.perform { machine, now in (machine.woken, now) } } == ([.milliseconds(100), .milliseconds(250), .seconds(3)], .milliseconds(10_100)))
        await on(queue) { driver.stop() }
        #expect(clock.nextDeadline == nil || clock.nextDeadline! > clock.now)
    }

    @Test("the system clock's timer and after(_:on:_:) run on their queue once their time has passed")
    func systemClock() async {
        let clock = SystemLinkClock()
        let queue = DispatchQueue(label: "test.system-clock")
        let start = clock.now
        let ran: LinkTime = await withCheckedContinuation { continuation in
            clock.after(.milliseconds(20), on: queue) {
                dispatchPrecondition(condition: .onQueue(queue))
                continuation.resume(returning: clock.now)
            }
        }
        #expect(ran - start >= .milliseconds(20))
        let timer = Mutex<(any LinkTimer)?>(nil)
        let fired: LinkTime = await withCheckedContinuation { continuation in
            let made = clock.makeTimer(queue: queue) { continuation.resume(returning: clock.now) }
            timer.withLock { $0 = made }
            made.schedule(at: clock.now + .milliseconds(20))
        }
        #expect(fired - ran >= .milliseconds(20))
        await on(queue) { timer.withLock { $0?.cancel() } }
    }

    @Test("durations become Dispatch intervals in whole nanoseconds; less than zero is zero, too long is never")
    func dispatchIntervals() {
        #expect(Duration.milliseconds(1_500).dispatchInterval == .nanoseconds(1_500_000_000))
        #expect(Duration.nanoseconds(-5).dispatchInterval == .nanoseconds(0))
        #expect(Duration.seconds(Int64.max / 2).dispatchInterval == .never)
    }
}
