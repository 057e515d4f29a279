internal import Glibc
internal import SystemCalls

// The terminal settings of a serial port: raw mode, 8N1, its speed.

extension SerialTransport {
    /// Raw mode, 8N1, no flow control, `CLOCAL | CREAD`, reads that return what is there.
    ///
    /// `VMIN` is 1 with `VTIME` 0: with `O_NONBLOCK` an empty line then reads as `EAGAIN`. (With
    /// `VMIN` 0 Linux returns 0 from an empty tty, which looks exactly like a hang-up.)
    static func configureTerminal(_ descriptor: Int32, name: String, speed: speed_t?, baudRate: Int?) throws(TransportError) {
        var settings = termios()
        guard tcgetattr(descriptor, &settings) == 0 else {
            let code = errno
            if code == ENOTTY || code == EINVAL {
                throw TransportError(
                    "\(name) is not a terminal, so not a serial port",
                    kind: .unsupported,
                    errno: code,
                    advice: "name the adapter's serial device instead, e.g. /dev/ttyUSB0 (ls /dev/ttyUSB* /dev/ttyACM* lists them)"
                )
            }
            throw TransportError(
                "cannot read the serial settings of \(name): \(SystemError(code).description)",
                errno: code,
                advice: "unplug the adapter, plug it back in and try again"
            )
        }
        cfmakeraw(&settings)
        settings.c_cflag &= ~tcflag_t(CSIZE | PARENB | CSTOPB)
        settings.c_cflag &= ~tcflag_t(CRTSCTS)
        settings.c_cflag |= tcflag_t(CS8 | CLOCAL | CREAD)
        settings.c_iflag &= ~tcflag_t(IXON | IXOFF | IXANY)
        // c_cc is imported as a tuple; its bytes are indexed by the VMIN / VTIME constants.
        withUnsafeMutableBytes(of: &settings.c_cc) { controlCharacters in
            controlCharacters[Int(VMIN)] = 1
            controlCharacters[Int(VTIME)] = 0
        }
        if let speed {
            guard cfsetispeed(&settings, speed) == 0, cfsetospeed(&settings, speed) == 0 else {
                throw unsupportedSpeedError(name: name, baudRate: baudRate, errno: errno)
            }
        }
        guard tcsetattr(descriptor, TCSANOW, &settings) == 0 else {
            let code = errno
            if code == EINVAL, speed != nil {
                throw unsupportedSpeedError(name: name, baudRate: baudRate, errno: code)
            }
            throw TransportError(
                "cannot configure \(name): \(SystemError(code).description)",
                errno: code,
                advice: "unplug the adapter, plug it back in and try again"
            )
        }
        // tcsetattr succeeds when any one setting took; check the speed really did.
        if let speed {
            var applied = termios()
            if tcgetattr(descriptor, &applied) == 0, cfgetospeed(&applied) != speed {
                throw unsupportedSpeedError(name: name, baudRate: baudRate, errno: nil)
            }
        }
    }

    private static func unsupportedSpeedError(name: String, baudRate: Int?, errno code: Int32?) -> TransportError {
        let rate = baudRate.map(String.init) ?? "the requested rate"
        return TransportError(
            "\(name) does not accept baud rate \(rate)",
            kind: .unsupported,
            errno: code,
            advice: "try a lower rate, e.g. \(name):\(SerialPortSpec.defaultBaudRate); the accessory must use the same one"
        )
    }
}
