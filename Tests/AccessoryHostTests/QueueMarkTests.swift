import Dispatch
import QueueConfinement
import Testing

/// Runs `body` on `queue` and returns its result, without blocking the test's thread.
private func on<Result: Sendable>(_ queue: DispatchQueue, _ body: @escaping @Sendable () -> Result) async -> Result {
    await withCheckedContinuation { continuation in queue.async { continuation.resume(returning: body()) } }
}

@Suite("QueueMark: whether code runs on a given queue")
struct QueueMarkTests {
    @Test("the mark is seen on its queue only; marking again keeps it; an unmarked queue is never current")
    func marks() async {
        let queue = DispatchQueue(label: "test.mark")
        let other = DispatchQueue(label: "test.other")
        let unmarked = DispatchQueue(label: "test.unmarked")
        QueueMark.mark(queue)
        QueueMark.mark(other)
        QueueMark.mark(queue) // a second module marking the same queue
        #expect(!QueueMark.isCurrent(queue))
        #expect(await on(queue) { QueueMark.isCurrent(queue) })
        #expect(await on(queue) { !QueueMark.isCurrent(other) })
        #expect(await on(other) { !QueueMark.isCurrent(queue) })
        #expect(await on(unmarked) { !QueueMark.isCurrent(unmarked) })
    }

    @Test("run and runOrAsync on the queue itself run inline (no sync on the queue, which would wait for itself)")
    func inline() async {
        let queue = DispatchQueue(label: "test.inline")
        QueueMark.mark(queue)
        let nested = await on(queue) { QueueMark.run(on: queue) { QueueMark.run(on: queue) { QueueMark.isCurrent(queue) } } }
        #expect(nested)
        let order = await on(queue) { () -> [Int] in
            nonisolated(unsafe) var steps: [Int] = []
            QueueMark.runOrAsync(on: queue) { steps.append(1) }
            steps.append(2)
            return steps
        }
        #expect(order == [1, 2])
    }

    @Test("a QueueBound value made on one thread is read on the queue it belongs to, which it marks; so is one bound to the main queue")
    func bound() async {
        let queue = DispatchQueue(label: "test.bound")
        final class Unsendable { var count = 7 }
        let box = QueueBound(Unsendable(), on: queue) // made here, off its queue
        #expect(await on(queue) { QueueMark.isCurrent(queue) }) // the box marked it
        #expect(await on(queue) { box.value.count } == 7)
        let onMain = QueueBound(Unsendable(), on: .main)
        #expect(await on(.main) { onMain.value.count } == 7)
    }
}
