import Glibc
import SystemCalls
import Testing

@Suite("System calls: EINTR retried, errors typed")
struct SystemCallTests {
    @Test("a call interrupted by EINTR is made again until it succeeds")
    func retriesInterrupted() {
        var calls = 0
        let result = SystemCall.retrying { () -> Int in
            calls += 1
            if calls < 3 {
                errno = EINTR
                return -1
            }
            return 7
        }
        #expect(calls == 3)
        #expect(result == .success(7))
    }

    @Test("retry: false returns EINTR as .interrupted at once")
    func stopsWhenAsked() {
        var calls = 0
        let result = SystemCall.retrying(retry: { false }) { () -> Int in
            calls += 1
            errno = EINTR
            return -1
        }
        #expect(calls == 1)
        guard case .failure(let error) = result else { Issue.record("expected a failure"); return }
        #expect(error.kind == .interrupted)
        #expect(error.name == "EINTR")
    }

    @Test("other errors come back typed, with name and text")
    func typedErrors() {
        let result = SystemCall.open("/nonexistent-\(getpid())/file", O_RDONLY)
        guard case .failure(let error) = result else { Issue.record("expected a failure"); return }
        #expect(error.code == ENOENT)
        #expect(error.kind == .notFound)
        #expect(error.description.hasSuffix("(ENOENT)"))
        #expect(SystemError(EAGAIN).kind == .wouldBlock)
        #expect(SystemError(EACCES).kind == .permission)
        #expect(SystemError(4_000).name == "errno 4000")
    }

    @Test("read, write and writeAll over a pipe; a read of a non-blocking empty pipe would block")
    func pipeRoundTrip() throws {
        var ends: [Int32] = [0, 0]
        try #require(pipe(&ends) == 0)
        for end in ends { _ = fcntl(end, F_SETFL, O_NONBLOCK) }
        defer { close(ends[0]); close(ends[1]) }
        let bytes: [UInt8] = Array(0..<200)
        let written = bytes.withUnsafeBytes { SystemCall.writeAll(ends[1], $0) }
        #expect((try? written.get()) != nil)
        var buffer = [UInt8](repeating: 0, count: 256)
        let read = buffer.withUnsafeMutableBytes { SystemCall.read(ends[0], into: $0) }
        #expect(read == .success(200))
        #expect(Array(buffer[..<200]) == bytes)
        let again = buffer.withUnsafeMutableBytes { SystemCall.read(ends[0], into: $0) }
        guard case .failure(let error) = again else { Issue.record("expected EAGAIN"); return }
        #expect(error.kind == .wouldBlock)
        var watched = [pollfd(fd: ends[0], events: Int16(POLLIN), revents: 0)]
        #expect(SystemCall.poll(&watched, timeout: 0) == .success(0))
    }
}
