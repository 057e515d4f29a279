internal import SystemCalls

/// Writes whole strings to file descriptors.
public enum FileDescriptorWriter {
    /// Writes the UTF-8 bytes of `text` to `fd`: one `write(2)` call when the descriptor takes
    /// it all at once (always so for up to `PIPE_BUF` bytes on a pipe), more after a partial
    /// write or `EINTR`. Returns `false` on any other error.
    public static func writeAll(_ text: String, to fd: Int32) -> Bool {
        var text = text
        return text.withUTF8 { buffer in
            (try? SystemCall.writeAll(fd, UnsafeRawBufferPointer(buffer)).get()) != nil
        }
    }
}
