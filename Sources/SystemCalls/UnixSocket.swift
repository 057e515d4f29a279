internal import Glibc

/// The credentials of the process at the other end of a Unix socket, as the kernel recorded
/// them when it connected (`SO_PEERCRED`): they cannot be forged by the peer.
package struct PeerCredentials: Sendable, Hashable {
    /// The peer's process id.
    package var pid: Int32
    /// The peer's effective user id.
    package var uid: UInt32
    /// The peer's effective group id.
    package var gid: UInt32

    /// Credentials as given.
    package init(pid: Int32, uid: UInt32, gid: UInt32) {
        self.pid = pid
        self.uid = uid
        self.gid = gid
    }
}

/// Unix stream sockets: listening, connecting, socket pairs, and descriptors passed with
/// `SCM_RIGHTS` (the way BlueZ hands a profile its connection). Every descriptor made here is
/// close-on-exec; accepted, paired and connected ones are non-blocking. Sends never raise
/// `SIGPIPE` (`MSG_NOSIGNAL`): a peer that went away is the error `EPIPE`.
///
/// The one place of the project where `sockaddr_un` and control messages are laid out by hand.
package enum UnixSocket {
    /// The longest path a Unix socket address holds (`sun_path` less its terminating zero).
    package static let maximumPathLength = MemoryLayout.size(ofValue: sockaddr_un().sun_path) - 1

    /// The most descriptors one received message may carry; any beyond are closed.
    package static let maximumPassedDescriptors = 4

    /// A non-blocking socket bound to `path` and listening. An existing socket file at `path`
    /// is replaced only when no one listens on it (a daemon that crashed left it): with someone
    /// listening, fails with `EADDRINUSE`.
    package static func listen(path: String, backlog: Int32 = 128) -> Result<Int32, SystemError> {
        guard path.utf8.count <= maximumPathLength else { return .failure(SystemError(ENAMETOOLONG)) }
        if case .success(let probe) = connect(path: path) {
            _ = Glibc.close(probe)
            return .failure(SystemError(EADDRINUSE))
        }
        _ = unlink(path)
        let made = SystemCall.retrying { socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0) }
        guard case .success(let descriptor) = made else { return made }
        let bound = withAddress(path) { address, length in Glibc.bind(descriptor, address, length) }
        if bound != 0 || Glibc.listen(descriptor, backlog) != 0 {
            let error = SystemError.last
            _ = Glibc.close(descriptor)
            return .failure(error)
        }
        return .success(descriptor)
    }

    /// Connects to the socket at `path`; the descriptor is non-blocking once connected.
    package static func connect(path: String) -> Result<Int32, SystemError> {
        guard path.utf8.count <= maximumPathLength else { return .failure(SystemError(ENAMETOOLONG)) }
        let made = SystemCall.retrying { socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0) }
        guard case .success(let descriptor) = made else { return made }
        let connected = SystemCall.retrying { withAddress(path) { address, length in Glibc.connect(descriptor, address, length) } }
        if case .failure(let error) = connected {
            _ = Glibc.close(descriptor)
            return .failure(error)
        }
        setNonBlocking(descriptor)
        return .success(descriptor)
    }

    /// Accepts one waiting connection: the new non-blocking descriptor, or `wouldBlock` when
    /// none waits.
    package static func accept(_ listener: Int32) -> Result<Int32, SystemError> {
        // accept4 is a GNU extension Swift's Glibc module does not show: the flags are set after.
        let accepted = SystemCall.retrying { Glibc.accept(listener, nil, nil) }
        guard case .success(let descriptor) = accepted else { return accepted }
        _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC)
        setNonBlocking(descriptor)
        return .success(descriptor)
    }

    /// A connected pair of non-blocking stream sockets.
    package static func pair() -> Result<(Int32, Int32), SystemError> {
        var descriptors: [Int32] = [-1, -1]
        let made = descriptors.withUnsafeMutableBufferPointer { buffer in
            SystemCall.retrying {
                socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0, buffer.baseAddress)
            }
        }
        if case .failure(let error) = made { return .failure(error) }
        return .success((descriptors[0], descriptors[1]))
    }

    /// Puts a descriptor in non-blocking mode.
    package static func setNonBlocking(_ descriptor: Int32) {
        let flags = fcntl(descriptor, F_GETFL)
        if flags >= 0 { _ = fcntl(descriptor, F_SETFL, flags | O_NONBLOCK) }
    }

    /// One `send(2)` of `bytes` (perhaps fewer taken), without `SIGPIPE`.
    package static func send(_ descriptor: Int32, _ bytes: UnsafeRawBufferPointer) -> Result<Int, SystemError> {
        SystemCall.retrying { Glibc.send(descriptor, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL)) }
    }

    /// Sends `bytes` with `passed` attached (`SCM_RIGHTS`, in order; at most
    /// ``maximumPassedDescriptors``). The descriptors travel with the first byte: a stream socket
    /// takes all of a short message or none of it when it has room for it, and the receiver gets
    /// the descriptors with the bytes it reads first.
    package static func send(_ descriptor: Int32, _ bytes: UnsafeRawBufferPointer, passing passed: [Int32]) -> Result<Int, SystemError> {
        precondition((1...maximumPassedDescriptors).contains(passed.count), "1 to \(maximumPassedDescriptors) descriptors")
        let space = controlSpace(descriptors: passed.count)
        var control = [UInt8](repeating: 0, count: space)
        return control.withUnsafeMutableBytes { controlBytes -> Result<Int, SystemError> in
            let header = controlBytes.baseAddress!.assumingMemoryBound(to: cmsghdr.self)
            header.pointee.cmsg_len = controlLength(descriptors: passed.count)
            header.pointee.cmsg_level = SOL_SOCKET
            header.pointee.cmsg_type = Int32(SCM_RIGHTS)
            for (index, one) in passed.enumerated() {
                controlBytes.baseAddress!.advanced(by: MemoryLayout<cmsghdr>.size + index * MemoryLayout<Int32>.size).storeBytes(of: one, as: Int32.self)
            }
            var vector = iovec(iov_base: UnsafeMutableRawPointer(mutating: bytes.baseAddress), iov_len: bytes.count)
            return withUnsafeMutablePointer(to: &vector) { vectorPointer in
                var message = msghdr()
                message.msg_iov = vectorPointer
                message.msg_iovlen = 1
                message.msg_control = controlBytes.baseAddress
                message.msg_controllen = space
                return SystemCall.retrying { sendmsg(descriptor, &message, Int32(MSG_NOSIGNAL)) }
            }
        }
    }

    /// One `recvmsg(2)` into `buffer`: the count read (0: the peer closed), and the descriptors
    /// that came with those bytes appended to `descriptors` (close-on-exec; more than
    /// ``maximumPassedDescriptors`` are closed and dropped).
    package static func receive(_ descriptor: Int32, into buffer: UnsafeMutableRawBufferPointer,
                               descriptors: inout [Int32]) -> Result<Int, SystemError> {
        let space = controlSpace(descriptors: maximumPassedDescriptors)
        var control = [UInt8](repeating: 0, count: space)
        var received: [Int32] = []
        let result = control.withUnsafeMutableBytes { controlBytes -> Result<Int, SystemError> in
            var vector = iovec(iov_base: buffer.baseAddress, iov_len: buffer.count)
            return withUnsafeMutablePointer(to: &vector) { vectorPointer in
                var message = msghdr()
                message.msg_iov = vectorPointer
                message.msg_iovlen = 1
                message.msg_control = controlBytes.baseAddress
                message.msg_controllen = space
                let read = SystemCall.retrying { recvmsg(descriptor, &message, Int32(MSG_CMSG_CLOEXEC)) }
                guard case .success = read else { return read }
                // Walk the control messages the kernel wrote (at most `msg_controllen` bytes).
                var offset = 0
                let end = min(Int(message.msg_controllen), space)
                let headerSize = MemoryLayout<cmsghdr>.size
                while offset + headerSize <= end {
                    let header = controlBytes.baseAddress!.advanced(by: offset).loadUnaligned(as: cmsghdr.self)
                    let length = Int(header.cmsg_len)
                    guard length >= headerSize, offset + length <= end else { break }
                    if header.cmsg_level == SOL_SOCKET, header.cmsg_type == Int32(SCM_RIGHTS) {
                        let count = (length - headerSize) / MemoryLayout<Int32>.size
                        for index in 0..<count {
                            received.append(controlBytes.baseAddress!.advanced(by: offset + headerSize + index * 4).loadUnaligned(as: Int32.self))
                        }
                    }
                    offset += (length + 7) & ~7
                }
                return read
            }
        }
        for (index, passed) in received.enumerated() {
            if index < maximumPassedDescriptors { descriptors.append(passed) } else { _ = Glibc.close(passed) }
        }
        return result
    }

    /// Who is at the other end of a connected Unix socket.
    package static func peerCredentials(_ descriptor: Int32) -> Result<PeerCredentials, SystemError> {
        // struct ucred (pid_t pid; uid_t uid; gid_t gid), three 32-bit fields; a GNU extension
        // Swift's Glibc module does not show, so it is read as three words.
        var words: [UInt32] = [0, 0, 0]
        var length = socklen_t(12)
        let status = words.withUnsafeMutableBytes { getsockopt(descriptor, SOL_SOCKET, SO_PEERCRED, $0.baseAddress, &length) }
        guard status == 0 else { return .failure(.last) }
        return .success(PeerCredentials(pid: Int32(bitPattern: words[0]), uid: words[1], gid: words[2]))
    }

    /// Bytes written to the socket that its peer has not read yet (`SIOCOUTQ`), or nil.
    package static func unreadByPeer(_ descriptor: Int32) -> Int? {
        var count: Int32 = 0
        guard case .success = SystemCall.ioctl(descriptor, UInt(TIOCOUTQ), &count) else { return nil }
        return Int(count)
    }

    /// Sets the kernel's send and receive buffer sizes (the kernel doubles the value and caps
    /// it at its `wmem_max` / `rmem_max`).
    package static func setBufferSizes(_ descriptor: Int32, bytes: Int32) {
        var value = bytes
        _ = setsockopt(descriptor, SOL_SOCKET, SO_SNDBUF, &value, socklen_t(MemoryLayout<Int32>.size))
        _ = setsockopt(descriptor, SOL_SOCKET, SO_RCVBUF, &value, socklen_t(MemoryLayout<Int32>.size))
    }

    private static func controlLength(descriptors: Int) -> Int {
        MemoryLayout<cmsghdr>.size + descriptors * MemoryLayout<Int32>.size
    }

    private static func controlSpace(descriptors: Int) -> Int {
        (controlLength(descriptors: descriptors) + 7) & ~7
    }

    private static func withAddress<Result>(_ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) -> Result) -> Result {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (index, byte) in path.utf8.prefix(maximumPathLength).enumerated() { raw[index] = byte }
        }
        return withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
    }
}
