import Glibc
import SystemCalls

/// Reading a whole file or standard input without Foundation.
enum FileInput {
    struct ReadError: Error, CustomStringConvertible {
        var errno: Int32
        var description: String { SystemError(errno).text }
    }

    /// Every byte of the file at `path`, or of standard input for "-".
    static func readAll(path: String) throws(ReadError) -> [UInt8] {
        let fd: Int32 = path == "-" ? 0 : open(path, O_RDONLY | O_CLOEXEC)
        if fd < 0 { throw ReadError(errno: errno) }
        defer { if fd != 0 { close(fd) } }
        var result: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count == 0 { return result }
            if count < 0 {
                if errno == EINTR { continue }
                throw ReadError(errno: errno)
            }
            result.append(contentsOf: buffer[0..<count])
        }
    }
}

/// A file or standard input read in pieces, for input that need not fit in memory.
struct ChunkedInput: ~Copyable {
    private let fd: Int32

    /// Opens the file at `path`, or standard input for "-".
    init(path: String) throws(FileInput.ReadError) {
        fd = path == "-" ? 0 : open(path, O_RDONLY | O_CLOEXEC)
        if fd < 0 { throw FileInput.ReadError(errno: errno) }
    }

    /// Reads what is there, up to `buffer.count` bytes, into the start of `buffer`; 0 at the
    /// end. From a pipe or a terminal it returns as soon as some bytes came.
    func read(into buffer: inout [UInt8]) throws(FileInput.ReadError) -> Int {
        while true {
            let count = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if count >= 0 { return count }
            if errno == EINTR { continue }
            throw FileInput.ReadError(errno: errno)
        }
    }

    /// The size of a regular file; nil for a pipe, a terminal or a device (no end known).
    var regularFileSize: Int? {
        var status = stat()
        guard fstat(fd, &status) == 0, status.st_mode & S_IFMT == S_IFREG else { return nil }
        return Int(status.st_size)
    }

    /// Reads until `buffer` is full or the input ends; 0 only at the end.
    func readFully(into buffer: inout [UInt8]) throws(FileInput.ReadError) -> Int {
        var filled = 0
        while filled < buffer.count {
            let count = buffer.withUnsafeMutableBytes { raw in Glibc.read(fd, raw.baseAddress! + filled, raw.count - filled) }
            if count < 0 {
                if errno == EINTR { continue }
                throw FileInput.ReadError(errno: errno)
            }
            if count == 0 { break }
            filled += count
        }
        return filled
    }

    deinit { if fd != 0 { close(fd) } }
}
