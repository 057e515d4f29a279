import Dispatch
import Testing
import TestThreads

/// The trait that keeps blocking and long-running tests off Swift's cooperative pool.
@Suite("The .ownThread trait")
struct OwnThreadTests {
    @Test("a synchronous test given the trait runs on its own thread", .ownThread)
    func synchronousTest() {
        #expect(isOnOwnTestThread)
    }

    @Test("an async test given the trait resumes on its own thread after each await", .ownThread)
    func asyncTest() async {
        #expect(isOnOwnTestThread)
        let value = await withCheckedContinuation { continuation in
            DispatchQueue(label: "test.elsewhere").async { continuation.resume(returning: 7) }
        }
        #expect(value == 7)
        #expect(isOnOwnTestThread)
    }

    @Test("without the trait a test runs on the cooperative pool")
    func withoutTheTrait() {
        #expect(!isOnOwnTestThread)
    }
}
