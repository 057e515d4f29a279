internal import Glibc

/// Facts about the terminal a file descriptor is connected to.
public enum Terminal {
    /// Whether `fd` refers to a terminal (`isatty(3)`); use it to decide on colours or
    /// progress lines.
    public static func isTTY(_ fd: Int32) -> Bool {
        isatty(fd) == 1
    }

    /// The width in columns of the terminal on `fd` (`ioctl(TIOCGWINSZ)`), or 80 when `fd`
    /// is not a terminal or reports no width.
    public static func columns(_ fd: Int32) -> Int {
        var size = winsize()
        let status = withUnsafeMutablePointer(to: &size) { pointer in
            ioctl(fd, UInt(TIOCGWINSZ), UnsafeMutableRawPointer(pointer))
        }
        guard status == 0, size.ws_col > 0 else { return 80 }
        return Int(size.ws_col)
    }
}

/// Unbuffered writes to standard output (file descriptor 1).
public enum StandardOutput {
    /// Writes all of `text` with `write(2)`, retrying after partial writes and `EINTR`.
    /// Returns `false` when the descriptor refuses the data (closed pipe, full disk).
    @discardableResult
    public static func write(_ text: String) -> Bool {
        FileDescriptorWriter.writeAll(text, to: 1)
    }
}

/// Unbuffered writes to standard error (file descriptor 2).
public enum StandardError {
    /// Writes all of `text` with `write(2)`, retrying after partial writes and `EINTR`.
    /// Returns `false` when the descriptor refuses the data.
    @discardableResult
    public static func write(_ text: String) -> Bool {
        FileDescriptorWriter.writeAll(text, to: 2)
    }
}

/// Writes whole strings to file descriptors.
enum FileDescriptorWriter {
    /// Writes the UTF-8 bytes of `text` to `fd`: one `write(2)` call when the descriptor takes
    /// it all at once (always so for up to `PIPE_BUF` bytes on a pipe), more after a partial
    /// write or `EINTR`. Returns `false` on any other error.
    static func writeAll(_ text: String, to fd: Int32) -> Bool {
        var text = text
        return text.withUTF8 { buffer -> Bool in
            guard var pointer = buffer.baseAddress else { return true }
            var remaining = buffer.count
            while remaining > 0 {
                let written = Glibc.write(fd, pointer, remaining)
                if written < 0 {
                    if errno == EINTR { continue }
                    return false
                }
                if written == 0 { return false }
                pointer += written
                remaining -= written
            }
            return true
        }
    }
}
