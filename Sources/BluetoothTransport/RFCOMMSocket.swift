internal import Dispatch
internal import Glibc
package import IAPTransport
internal import SystemCalls

/// RFCOMM sockets opened directly (`AF_BLUETOOTH`, `BTPROTO_RFCOMM`), without BlueZ's profile
/// machinery: what the simulated accessory uses to reach a host's iAP2 channel. (On one
/// machine the host's registration already holds the iAP2 UUID in bluetoothd, which takes each
/// UUID once, so the accessory side cannot register it too.)
///
/// The one place of the project where `sockaddr_rc` is laid out by hand: a 2-byte family, the
/// address in `bdaddr_t` order (least significant byte first), the channel, one byte of padding.
package enum RFCOMMSocket {
    /// The socket family (`AF_BLUETOOTH`).
    static let family: Int32 = 31
    /// The RFCOMM protocol number (`BTPROTO_RFCOMM`).
    static let rfcomm: Int32 = 3

    /// Connects to `address` on `channel` (1–30), from the local adapter `local` when given, on
    /// a Dispatch queue of its own (connecting pages the device: seconds when it is away).
    /// Returns the connected socket (blocking mode off) and the local adapter's address.
    ///
    /// - Throws: ``BlueZError``: no Bluetooth in the kernel, permission, refused (no such
    ///   channel), not answering.
    package static func connect(to address: BluetoothAddress, channel: UInt8, from local: BluetoothAddress? = nil) async throws(BlueZError)
        -> (descriptor: Int32, local: BluetoothAddress) {
        let result = await withCheckedContinuation { (continuation: CheckedContinuation<Result<(Int32, BluetoothAddress), BlueZError>, Never>) in
            DispatchQueue(label: "RFCOMMSocket.connect").async {
                continuation.resume(returning: connectBlocking(to: address, channel: channel, from: local))
            }
        }
        let (descriptor, localAddress) = try result.get()
        return (descriptor, localAddress)
    }

    private static func connectBlocking(to address: BluetoothAddress, channel: UInt8, from local: BluetoothAddress?)
        -> Result<(Int32, BluetoothAddress), BlueZError> {
        let descriptor = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), rfcomm)
        guard descriptor >= 0 else {
            let code = errno
            if code == EAFNOSUPPORT || code == EPROTONOSUPPORT {
                return .failure(BlueZError(.noAdapter, "this kernel has no Bluetooth RFCOMM sockets",
                                               advice: "load the modules: modprobe bluetooth rfcomm (and a controller's driver)"))
            }
            return .failure(systemError(code, "cannot make an RFCOMM socket", address: address))
        }
        if let local {
            let bound = socketAddress(local, channel: 0)
            guard withSocketAddress(bound, { bind(descriptor, $0, $1) }) == 0 else {
                let code = errno
                _ = close(descriptor)
                return .failure(BlueZError(.noAdapter, "no local adapter has the address \(local): \(SystemError(code).text)",
                                               advice: "bluetoothctl list shows the adapters' addresses"))
            }
        }
        let remote = socketAddress(address, channel: channel)
        guard withSocketAddress(remote, { Glibc.connect(descriptor, $0, $1) }) == 0 else {
            let code = errno
            _ = close(descriptor)
            return .failure(systemError(code, "cannot connect to \(address) channel \(channel)", address: address))
        }
        var mine = [UInt8](repeating: 0, count: 10)
        var length = socklen_t(mine.count)
        _ = mine.withUnsafeMutableBytes { raw in getsockname(descriptor, raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), &length) }
        let localAddress = BluetoothAddress(bytes: Array(mine[2..<8].reversed())) ?? BluetoothAddress(bytes: [0, 0, 0, 0, 0, 0])!
        let flags = fcntl(descriptor, F_GETFL)
        _ = fcntl(descriptor, F_SETFL, flags | O_NONBLOCK)
        return .success((descriptor, localAddress))
    }

    /// A listening RFCOMM socket on the local adapter `local`, channel `channel` (1–30), in
    /// blocking mode and without an SDP record: for a raw RFCOMM peer beside the iAP2 service
    /// (`iapbench bluetooth`'s baseline echo), never for the iAP2 service itself, which BlueZ
    /// serves (``BluetoothProfile``).
    ///
    /// - Throws: ``BlueZError``: no Bluetooth in the kernel, no adapter with that address,
    ///   the channel taken, permission.
    package static func listen(on local: BluetoothAddress, channel: UInt8) throws(BlueZError) -> Int32 {
        let descriptor = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), rfcomm)
        guard descriptor >= 0 else {
            let code = errno
            if code == EAFNOSUPPORT || code == EPROTONOSUPPORT {
                throw BlueZError(.noAdapter, "this kernel has no Bluetooth RFCOMM sockets",
                                     advice: "load the modules: modprobe bluetooth rfcomm (and a controller's driver)")
            }
            throw systemError(code, "cannot make an RFCOMM socket", address: local)
        }
        guard withSocketAddress(socketAddress(local, channel: channel), { bind(descriptor, $0, $1) }) == 0 else {
            let code = errno
            _ = close(descriptor)
            if code == EADDRINUSE {
                throw BlueZError(.failed, "RFCOMM channel \(channel) of \(local) is taken", advice: "choose another channel (1-30)")
            }
            throw BlueZError(.noAdapter, "cannot listen on \(local) channel \(channel): \(SystemError(code).text)",
                                 advice: "bluetoothctl list shows the adapters' addresses")
        }
        guard Glibc.listen(descriptor, 1) == 0 else {
            let code = errno
            _ = close(descriptor)
            throw systemError(code, "cannot listen on \(local) channel \(channel)", address: local)
        }
        return descriptor
    }

    /// Waits for one connection on `listener` (from ``listen(on:channel:)``) and returns it, in
    /// blocking mode, with the peer's address. Blocks: call it on a thread of its own.
    ///
    /// - Throws: ``BlueZError`` when the wait fails (the listener closed).
    package static func accept(_ listener: Int32) throws(BlueZError) -> (descriptor: Int32, peer: BluetoothAddress) {
        var peer = [UInt8](repeating: 0, count: 10)
        var length = socklen_t(peer.count)
        let descriptor = peer.withUnsafeMutableBytes { raw in
            Glibc.accept(listener, raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), &length)
        }
        if descriptor >= 0 { _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC) }
        guard descriptor >= 0 else {
            throw BlueZError(.failed, "accepting an RFCOMM connection failed: \(SystemError.last.text)",
                                 advice: "dmesg shows what the kernel reports")
        }
        return (descriptor, BluetoothAddress(bytes: Array(peer[2..<8].reversed())) ?? BluetoothAddress(bytes: [0, 0, 0, 0, 0, 0])!)
    }

    private static func withSocketAddress(_ bytes: [UInt8], _ body: (UnsafePointer<sockaddr>, socklen_t) -> Int32) -> Int32 {
        bytes.withUnsafeBytes { raw in body(raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t(raw.count)) }
    }

    /// A `sockaddr_rc` as bytes.
    static func socketAddress(_ address: BluetoothAddress, channel: UInt8) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: 10)
        bytes[0] = UInt8(truncatingIfNeeded: family)
        bytes[1] = UInt8(truncatingIfNeeded: family >> 8)
        bytes.replaceSubrange(2..<8, with: address.bytes.reversed())
        bytes[8] = channel
        return bytes
    }

    private static func systemError(_ code: Int32, _ what: String, address: BluetoothAddress) -> BlueZError {
        let text = SystemError(code).text
        switch code {
        case EACCES, EPERM:
            return BlueZError(.permission, "\(what): \(text)", advice: "run as root, or give the program CAP_NET_RAW")
        case ECONNREFUSED:
            return BlueZError(.notAdvertised, "\(what): \(text)",
                                  advice: "nothing listens on that channel; sdptool browse \(address) (or bluetoothctl info) shows the iAP2 record's channel")
        case EHOSTDOWN, EHOSTUNREACH, ETIMEDOUT:
            return BlueZError(.unreachable, "\(what): \(text)", advice: "check that the host is on, in range and its adapter powered (bluetoothctl power on)")
        case ENETDOWN, ENODEV:
            return BlueZError(.adapterOff, "\(what): \(text)", advice: "power the adapter on: bluetoothctl power on")
        case 52 /* EBADE: the link's authentication failed */:
            return BlueZError(.pairingRefused, "\(what): \(text)", advice: "pair the two: bluetoothctl pair \(address)")
        default:
            return BlueZError(.failed, "\(what): \(text)", advice: "dmesg and journalctl -u bluetooth show what the kernel and bluetoothd report")
        }
    }
}
