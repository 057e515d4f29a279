package import Glibc

/// A failed system call's `errno`, with its name and text.
///
/// Compare errors by ``code`` (or the ``kind`` shortcuts); the text is for people.
package struct SystemError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The `errno` value.
    package let code: Int32

    /// Wraps an `errno` value.
    package init(_ code: Int32) { self.code = code }

    /// The error of the last failed system call on this thread.
    package static var last: SystemError { SystemError(errno) }

    /// The errno's symbolic name, e.g. `ENOENT`, or `errno 123` for one not in the table.
    package var name: String {
        SystemError.names[code] ?? "errno \(code)"
    }

    /// `strerror(3)`'s text, e.g. "No such file or directory".
    package var text: String {
        strerror(code).map { String(cString: $0) } ?? "error \(code)"
    }

    /// The text with the name, e.g. "No such file or directory (ENOENT)".
    package var description: String { "\(text) (\(name))" }

    /// What the error means to a caller that only needs to decide what to do next.
    package var kind: Kind {
        switch code {
        case EINTR: .interrupted
        case EAGAIN, EWOULDBLOCK: .wouldBlock
        case EACCES, EPERM, EROFS: .permission
        case ENOENT: .notFound
        case EBUSY: .busy
        case ENODEV, ENXIO, ESHUTDOWN: .noDevice
        case EIO: .inputOutput
        default: .other
        }
    }

    /// Coarse classes of ``SystemError`` that callers decide on.
    package enum Kind: Sendable, Hashable {
        /// `EINTR`: a signal interrupted the call (returned only when the caller asked to stop retrying).
        case interrupted
        /// `EAGAIN` / `EWOULDBLOCK`: a non-blocking descriptor has nothing now.
        case wouldBlock
        /// `EACCES`, `EPERM`, `EROFS`: not allowed.
        case permission
        /// `ENOENT`: no such file.
        case notFound
        /// `EBUSY`: something else holds it.
        case busy
        /// `ENODEV`, `ENXIO`, `ESHUTDOWN`: the device is gone or not there.
        case noDevice
        /// `EIO`: an input/output error (a pty master whose slave closed, a device error).
        case inputOutput
        /// Anything else; look at ``SystemError/code``.
        case other
    }

    private static let names: [Int32: String] = [
        EPERM: "EPERM", ENOENT: "ENOENT", EINTR: "EINTR", EIO: "EIO", ENXIO: "ENXIO", EBADF: "EBADF",
        EAGAIN: "EAGAIN", ENOMEM: "ENOMEM", EACCES: "EACCES", EFAULT: "EFAULT", EBUSY: "EBUSY", EEXIST: "EEXIST",
        ENODEV: "ENODEV", ENOTDIR: "ENOTDIR", EISDIR: "EISDIR", EINVAL: "EINVAL", ENFILE: "ENFILE", EMFILE: "EMFILE",
        ENOTTY: "ENOTTY", ENOSPC: "ENOSPC", EROFS: "EROFS", EPIPE: "EPIPE", EBADMSG: "EBADMSG", EBADFD: "EBADFD",
        ESHUTDOWN: "ESHUTDOWN", ECONNRESET: "ECONNRESET", ECONNREFUSED: "ECONNREFUSED", EOVERFLOW: "EOVERFLOW",
        EIDRM: "EIDRM", ETIMEDOUT: "ETIMEDOUT", EADDRINUSE: "EADDRINUSE", ENOTCONN: "ENOTCONN", ELOOP: "ELOOP",
    ]
}

/// System calls that retry `EINTR` and return typed errors: the one place the serial, pty and
/// gadget code goes through for `read`, `write`, `poll` and `open`.
///
/// Each takes `retry`, asked after every `EINTR`: `true` (the default) calls again; `false`
/// returns ``SystemError/Kind/interrupted``, for a thread that is woken by a signal to stop.
package enum SystemCall {
    /// Calls `body` until it returns a non-negative value or fails with something other than
    /// `EINTR` (or with `EINTR` once `retry()` says no).
    @inline(__always)
    package static func retrying<Value: SignedInteger>(
        retry: () -> Bool = { true }, _ body: () -> Value
    ) -> Result<Value, SystemError> {
        while true {
            let value = body()
            if value >= 0 { return .success(value) }
            let code = errno
            if code == EINTR, retry() { continue }
            return .failure(SystemError(code))
        }
    }

    /// `read(2)` into `buffer`: the count read (0 at the end of the file), or the error.
    package static func read(_ descriptor: Int32, into buffer: UnsafeMutableRawBufferPointer,
                            retry: () -> Bool = { true }) -> Result<Int, SystemError> {
        retrying(retry: retry) { Glibc.read(descriptor, buffer.baseAddress, buffer.count) }
    }

    /// One `write(2)` of `bytes`: the count written (perhaps fewer), or the error.
    package static func write(_ descriptor: Int32, _ bytes: UnsafeRawBufferPointer,
                             retry: () -> Bool = { true }) -> Result<Int, SystemError> {
        retrying(retry: retry) { Glibc.write(descriptor, bytes.baseAddress, bytes.count) }
    }

    /// Writes all of `bytes`, calling `write(2)` again after partial writes. A write that takes
    /// nothing fails with `EIO`. On a non-blocking descriptor it may fail with
    /// ``SystemError/Kind/wouldBlock`` part way: use ``write(_:_:retry:)`` there.
    package static func writeAll(_ descriptor: Int32, _ bytes: UnsafeRawBufferPointer,
                                retry: () -> Bool = { true }) -> Result<Void, SystemError> {
        var offset = 0
        while offset < bytes.count {
            switch write(descriptor, UnsafeRawBufferPointer(rebasing: bytes[offset...]), retry: retry) {
            case .success(0): return .failure(SystemError(EIO))
            case .success(let count): offset += count
            case .failure(let error): return .failure(error)
            }
        }
        return .success(())
    }

    /// `poll(2)` over `descriptors` for up to `timeout` milliseconds (-1: no limit): the number
    /// of descriptors with events, or the error. An interrupted wait is retried whole.
    package static func poll(_ descriptors: inout [pollfd], timeout: Int32 = -1,
                            retry: () -> Bool = { true }) -> Result<Int32, SystemError> {
        retrying(retry: retry) {
            descriptors.withUnsafeMutableBufferPointer { Glibc.poll($0.baseAddress, nfds_t($0.count), timeout) }
        }
    }

    /// `open(2)`: the new descriptor, or the error.
    package static func open(_ path: String, _ flags: Int32, mode: mode_t = 0) -> Result<Int32, SystemError> {
        retrying { Glibc.open(path, flags, mode) }
    }

    /// `ioctl(2)` with a pointer argument: its result, or the error.
    package static func ioctl(_ descriptor: Int32, _ request: UInt, _ argument: UnsafeMutableRawPointer) -> Result<Int32, SystemError> {
        retrying { Glibc.ioctl(descriptor, request, argument) }
    }
}
