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
