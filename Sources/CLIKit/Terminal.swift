internal import AccessoryLogging
internal import Glibc

/// Facts about the terminal a file descriptor is connected to.
package enum Terminal {
    /// Whether `fd` refers to a terminal (`isatty(3)`); use it to decide on colours or
    /// progress lines.
    package static func isTTY(_ fd: Int32) -> Bool {
        isatty(fd) == 1
    }

    /// The width in columns of the terminal on `fd` (`ioctl(TIOCGWINSZ)`), or 80 when `fd`
    /// is not a terminal or reports no width.
    package static func columns(_ fd: Int32) -> Int {
        var size = winsize()
        let status = withUnsafeMutablePointer(to: &size) { pointer in
            ioctl(fd, UInt(TIOCGWINSZ), UnsafeMutableRawPointer(pointer))
        }
        guard status == 0, size.ws_col > 0 else { return 80 }
        return Int(size.ws_col)
    }
}

/// Unbuffered writes to standard output (file descriptor 1).
package enum StandardOutput {
    /// Writes all of `text` with `write(2)`, retrying after partial writes and `EINTR`.
    /// Returns `false` when the descriptor refuses the data (closed pipe, full disk).
    @discardableResult
    package static func write(_ text: String) -> Bool {
        FileDescriptorWriter.writeAll(text, to: 1)
    }
}

/// Unbuffered writes to standard error (file descriptor 2).
package enum StandardError {
    /// Writes all of `text` with `write(2)`, retrying after partial writes and `EINTR`.
    /// Returns `false` when the descriptor refuses the data.
    @discardableResult
    package static func write(_ text: String) -> Bool {
        FileDescriptorWriter.writeAll(text, to: 2)
    }
}
