internal import Glibc

/// Writes whole strings to file descriptors.
public enum FileDescriptorWriter {
    /// Writes the UTF-8 bytes of `text` to `fd`: one `write(2)` call when the descriptor takes
    /// it all at once (always so for up to `PIPE_BUF` bytes on a pipe), more after a partial
    /// write or `EINTR`. Returns `false` on any other error.
    public static func writeAll(_ text: String, to fd: Int32) -> Bool {
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
