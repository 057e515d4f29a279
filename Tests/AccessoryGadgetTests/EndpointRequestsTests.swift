@testable import AccessoryGadget
import Foundation
import Glibc
import Testing

// EndpointRequests over a regular file: the kernel's AIO runs requests on a regular file (opened
// without O_DIRECT) to completion inside io_submit, so the queue's bookkeeping (order, slots,
// split writes, errors) is exercised without a USB controller. FunctionFS itself is the rig's.
@Suite("Requests queued on an endpoint file with the kernel's AIO")
struct EndpointRequestsTests {
    /// A temporary file holding `contents`, opened with `flags`; removed when the test ends.
    private static func file(_ contents: [UInt8], flags: Int32) throws -> (descriptor: Int32, path: String) {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("requests-\(getpid())-\(UInt32.random(in: 0...UInt32.max))").path
        #expect(FileManager.default.createFile(atPath: path, contents: Data(contents)))
        let descriptor = open(path, flags | O_CLOEXEC)
        try #require(descriptor >= 0, "cannot open \(path): errno \(errno)")
        return (descriptor, path)
    }

    private static func completions(_ requests: EndpointRequests) throws -> [String] {
        var seen: [String] = []
        while requests.inFlight > 0 {
            try #require(requests.collect(wait: true) == nil)
            requests.takeCompleted { completion in
                switch completion {
                case let .moved(bytes, writes): seen.append("\(Array(bytes)) in \(writes)")
                case let .failed(code, _): seen.append("errno \(code)")
                }
            }
        }
        return seen
    }

    @Test("reads are handed out in order, each with the bytes it read, and their slots come back")
    func readsInOrder() throws {
        let (descriptor, path) = try Self.file([1, 2, 3, 4, 5], flags: O_RDONLY)
        defer { close(descriptor); unlink(path) }
        let requests = try #require(EndpointRequests(descriptor: descriptor, writes: false, depth: 3, slotSize: 4))
        for _ in 0..<3 { #expect(requests.queueRead() == nil) }
        #expect(!requests.hasRoom)
        #expect(requests.queueRead() == EAGAIN)
        // Every read starts at the file's start (the offset is always 0) and fills its slot of 4.
        #expect(try Self.completions(requests) == Array(repeating: "[1, 2, 3, 4] in 1", count: 3))
        #expect(requests.hasRoom && requests.inFlight == 0)
        #expect(requests.queueRead() == nil)
        #expect(try Self.completions(requests) == ["[1, 2, 3, 4] in 1"])
    }

    @Test("a write is copied into its slot; one that must end with a short packet goes as two writes")
    func writesAndSplits() throws {
        let (descriptor, path) = try Self.file([], flags: O_WRONLY)
        defer { close(descriptor); unlink(path) }
        let requests = try #require(EndpointRequests(descriptor: descriptor, writes: true, depth: 2, slotSize: 8))
        var frame: [UInt8] = [9, 8, 7, 6]
        #expect(frame.withUnsafeBytes { requests.queueWrite($0, splitBeforeLast: true) } == nil)
        frame[0] = 0 // the slot holds its own copy
        #expect(frame.withUnsafeBytes { requests.queueWrite($0, splitBeforeLast: false) } == nil)
        #expect(try Self.completions(requests) == ["[9, 8, 7, 6] in 2", "[0, 8, 7, 6] in 1"])
        // Both pieces of the split write and the last write went to offset 0: the last one won.
        #expect(try Array(Data(contentsOf: URL(fileURLWithPath: path))) == [0, 8, 7, 6])
    }

    @Test("a request the kernel refuses leaves its slot free and says why")
    func refused() throws {
        let (descriptor, path) = try Self.file([1], flags: O_RDONLY)
        defer { close(descriptor); unlink(path) }
        let writer = try #require(EndpointRequests(descriptor: descriptor, writes: true, depth: 1, slotSize: 4))
        let bytes: [UInt8] = [1, 2]
        #expect(bytes.withUnsafeBytes { writer.queueWrite($0, splitBeforeLast: false) } == EBADF)
        #expect(writer.hasRoom && writer.inFlight == 0)
        let reader = try #require(EndpointRequests(descriptor: -1, writes: false, depth: 1, slotSize: 4))
        #expect(reader.queueRead() == EBADF)
        #expect(reader.collect(wait: true) == nil) // nothing queued: nothing to wait for
    }
}
