internal import Glibc
internal import Synchronization
internal import SystemCalls

/// A pseudo-terminal pair: a serial line inside this machine, for running the host against a
/// simulated accessory without hardware.
///
/// The accessory side holds the master (``makeMasterTransport()``); the host opens
/// ``slavePath`` like any serial port, e.g. `SerialTransport(spec: SerialPortSpec(parsing: pty.slavePath))`.
/// `iapctl simulate --pty` will create one and print ``slavePath`` for the host to open.
///
/// The slave side is put in raw mode here. By default this object also keeps a slave
/// descriptor open while it lives: without one, the master reads `EIO` (a hang-up) until a peer
/// opens the slave, and again each time the last peer closes it. ``closeSlave()`` lets go of
/// it, so that the master sees the host close.
///
/// Linux semantics observed: after the last slave descriptor closes, the master reads what
/// was still buffered, then `EIO`; after the master closes, the slave reads 0 and writes fail
/// with `EIO`. A ``SerialTransport`` reports either as `.closed(error)`.
public final class PseudoTerminal: Sendable {
    /// The master side's descriptor (non-blocking, close-on-exec). This object owns it until
    /// ``makeMasterTransport()`` hands it to a transport, which then closes it.
    public let masterDescriptor: Int32
    /// Where the slave side is, e.g. `/dev/pts/3`: what the host opens.
    public let slavePath: String

    private struct Descriptors {
        /// Whether the master descriptor is still this object's to close.
        var ownsMaster = true
        /// The slave descriptor this object holds, or -1.
        var slave: Int32
    }
    private let descriptors: Mutex<Descriptors>

    /// Opens a new pseudo-terminal pair and puts its slave side in raw mode.
    ///
    /// `openpty(3)` does `posix_openpt(O_RDWR | O_NOCTTY)`, `grantpt`, `unlockpt` and opens the
    /// slave (Swift's Glibc module does not export the `posix_openpt` family itself).
    ///
    /// - Parameter keepSlaveOpen: keep a slave descriptor open until ``closeSlave()`` or this
    ///   object goes away (the default), so that the master does not read a hang-up before the
    ///   host opens ``slavePath``. Pass `false` when the peer opens the slave before the master
    ///   transport is activated and its close should reach the master.
    /// - Throws: ``TransportError`` when the system has no pseudo-terminals to give.
    public init(keepSlaveOpen: Bool = true) throws(TransportError) {
        var master: Int32 = -1
        var slave: Int32 = -1
        guard openpty(&master, &slave, nil, nil, nil) == 0 else {
            let code = errno
            throw TransportError(
                "cannot create a pseudo-terminal: \(SystemError(code).description)",
                errno: code,
                advice: code == EMFILE || code == ENFILE || code == ENOSPC
                    ? "too many open files or pseudo-terminals; close some (or raise ulimit -n / kernel.pty.max) and try again"
                    : "check that /dev/ptmx exists and devpts is mounted on /dev/pts"
            )
        }
        do throws(TransportError) {
            try Self.prepareMaster(master)
            try Self.makeRaw(slave)
            slavePath = try Self.path(ofSlave: slave)
        } catch {
            _ = close(slave)
            _ = close(master)
            throw error
        }
        if !keepSlaveOpen {
            _ = close(slave)
            slave = -1
        } else {
            _ = fcntl(slave, F_SETFD, FD_CLOEXEC)
        }
        masterDescriptor = master
        descriptors = Mutex(Descriptors(slave: slave))
    }

    deinit {
        descriptors.withLock { descriptors in
            if descriptors.slave >= 0 { _ = close(descriptors.slave) }
            if descriptors.ownsMaster { _ = close(masterDescriptor) }
        }
    }

    /// A transport on the master side; from now on it owns ``masterDescriptor`` and closes it
    /// when it closes, which hangs up the slave side.
    ///
    /// - Throws: ``TransportError`` when called a second time: one descriptor can feed only one
    ///   transport.
    public func makeMasterTransport() throws(TransportError) -> SerialTransport {
        try descriptors.withLock { descriptors throws(TransportError) -> SerialTransport in
            guard descriptors.ownsMaster else {
                throw TransportError(
                    "the master side of \(slavePath) already belongs to a transport",
                    kind: .busy,
                    advice: "keep the first transport, or create a new PseudoTerminal"
                )
            }
            let transport = try SerialTransport(
                fileDescriptor: masterDescriptor,
                description: "pseudo-terminal master for \(slavePath)",
                ownsDescriptor: true
            )
            descriptors.ownsMaster = false
            return transport
        }
    }

    /// Closes the slave descriptor this object kept open (see ``init(keepSlaveOpen:)``), so
    /// that the master reads a hang-up once the host closes its own. Does nothing the second time.
    public func closeSlave() {
        descriptors.withLock { descriptors in
            guard descriptors.slave >= 0 else { return }
            _ = close(descriptors.slave)
            descriptors.slave = -1
        }
    }

    private static func prepareMaster(_ master: Int32) throws(TransportError) {
        let flags = fcntl(master, F_GETFL)
        guard flags >= 0,
              fcntl(master, F_SETFL, flags | O_NONBLOCK) == 0,
              fcntl(master, F_SETFD, FD_CLOEXEC) == 0
        else {
            let code = errno
            throw TransportError(
                "cannot configure the pseudo-terminal master: \(SystemError(code).description)",
                errno: code,
                advice: "try again; if it keeps failing, check that devpts is mounted on /dev/pts"
            )
        }
    }

    /// Raw mode on the slave: what a host's ``SerialTransport`` sets too, so bytes pass untouched
    /// even before it opens the slave.
    private static func makeRaw(_ slave: Int32) throws(TransportError) {
        var settings = termios()
        guard tcgetattr(slave, &settings) == 0 else {
            let code = errno
            throw TransportError(
                "cannot read the pseudo-terminal's settings: \(SystemError(code).description)",
                errno: code,
                advice: "try again; if it keeps failing, check that devpts is mounted on /dev/pts"
            )
        }
        cfmakeraw(&settings)
        settings.c_cflag |= tcflag_t(CLOCAL | CREAD)
        guard tcsetattr(slave, TCSANOW, &settings) == 0 else {
            let code = errno
            throw TransportError(
                "cannot put the pseudo-terminal in raw mode: \(SystemError(code).description)",
                errno: code,
                advice: "try again; if it keeps failing, check that devpts is mounted on /dev/pts"
            )
        }
    }

    private static func path(ofSlave slave: Int32) throws(TransportError) -> String {
        // ttyname_r writes a NUL-terminated path into this buffer (PATH_MAX bytes is plenty).
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX))
        let result = buffer.withUnsafeMutableBufferPointer { bytes -> Int32 in
            guard let base = bytes.baseAddress else { return ERANGE }
            return ttyname_r(slave, base, bytes.count)
        }
        guard result == 0 else {
            throw TransportError(
                "cannot find the pseudo-terminal's device path: \(SystemError(result).description)",
                errno: result,
                advice: "check that /dev/pts is mounted and visible in this mount namespace"
            )
        }
        let utf8 = buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }
        return String(decoding: utf8, as: UTF8.self)
    }
}
