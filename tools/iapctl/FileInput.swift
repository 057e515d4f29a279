import Glibc

/// Reading a whole file or standard input without Foundation.
enum FileInput {
    struct ReadError: Error, CustomStringConvertible {
        var errno: Int32
        var description: String { String(cString: strerror(errno)) }
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

    deinit { if fd != 0 { close(fd) } }
}
