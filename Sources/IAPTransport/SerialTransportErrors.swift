internal import Glibc
internal import SystemCalls

// The errors a serial transport throws and closes with, each with what to do about it.

extension SerialTransport {
    /// What to do about a device that cannot be opened, naming its real owner and group: a
    /// pseudo-terminal is its creator's (its group, `tty`, only lets others write to it), a
    /// serial adapter is usually the `dialout` group's, but some systems use `uucp` or a udev
    /// rule's own group.
    static func permissionAdvice(path: String) -> String {
        var status = stat()
        guard stat(path, &status) == 0 else {
            return "check who may open it: ls -l \(path)"
        }
        let owner = getpwuid(status.st_uid).map { String(cString: $0.pointee.pw_name) } ?? String(status.st_uid)
        let group = getgrgid(status.st_gid).map { String(cString: $0.pointee.gr_name) } ?? String(status.st_gid)
        let groupCanOpen = status.st_mode & 0o060 == 0o060
        if path.hasPrefix("/dev/pts/") || !groupCanOpen {
            return "\(path) is \(owner)'s alone (group \(group) may not open it for reading and writing): run as \(owner), "
                + "or create the pseudo-terminal as this user"
        }
        return "\(path) belongs to the group '\(group)': add your user to it (sudo usermod -aG \(group) $USER, then log in again), "
            + "or install a udev rule that gives the device to a group you are in"
    }

    static func openError(path: String, errno code: Int32) -> TransportError {
        switch code {
        case ENOENT:
            TransportError(
                "cannot open \(path): no such device",
                kind: .notFound,
                errno: code,
                advice: "is the adapter plugged in? ls /dev/ttyUSB* /dev/ttyACM* lists the serial adapters"
            )
        case EACCES, EPERM:
            TransportError(
                "cannot open \(path): permission denied",
                kind: .permission,
                errno: code,
                advice: permissionAdvice(path: path)
            )
        case EBUSY:
            TransportError(
                "cannot open \(path): the device is busy",
                kind: .busy,
                errno: code,
                advice: "another program has it open (iapd, or another iapctl; fuser -v \(path) shows which): close it, or go through iapd (iapctl without --serial)"
            )
        case EIO:
            TransportError(
                "cannot open \(path): input/output error",
                errno: code,
                advice: "the adapter may be failing or half unplugged; unplug it, plug it back in and try again"
            )
        case ENXIO, ENODEV:
            TransportError(
                "cannot open \(path): no hardware behind this device node",
                kind: .notFound,
                errno: code,
                advice: "pick the port the adapter really is on (ls /dev/ttyUSB* /dev/ttyACM*, or dmesg | grep tty)"
            )
        default:
            TransportError(
                "cannot open \(path): \(SystemError(code).description)",
                errno: code,
                advice: "check the device path (ls /dev/ttyUSB* /dev/ttyACM*) and try again"
            )
        }
    }
    static func stalledError(name: String, waiting: Int) -> TransportError {
        TransportError(
            "\(name) stopped taking data: \(waiting) bytes were waiting to be written",
            kind: .stalled,
            advice: "the accessory is not reading its input (hung, or flow control holding the line); reset it and connect again"
        )
    }

    static func unactivatedError(name: String, waiting: Int) -> TransportError {
        TransportError(
            "\(name) was sent \(waiting) bytes before it was activated, more than the \(outputLimit) it keeps",
            kind: .stalled,
            advice: "activate the transport before sending this much (nothing is written until then); open the port again"
        )
    }

    static func hangUpError(name: String, errno code: Int32?) -> TransportError {
        TransportError(
            "\(name) hung up",
            kind: .hungUp,
            errno: code,
            advice: "the adapter was unplugged or the other end of the pseudo-terminal closed; reconnect it and open the port again"
        )
    }

    static func readError(name: String, errno code: Int32) -> TransportError {
        TransportError(
            "reading from \(name) failed: \(SystemError(code).description)",
            errno: code,
            advice: "open the port again; if this repeats, dmesg shows what the adapter's driver reports"
        )
    }

    static func writeError(name: String, errno code: Int32) -> TransportError {
        if code == EPIPE || code == EIO {
            return hangUpError(name: name, errno: code)
        }
        return TransportError(
            "writing to \(name) failed: \(SystemError(code).description)",
            errno: code,
            advice: "open the port again; if this repeats, dmesg shows what the adapter's driver reports"
        )
    }
}
