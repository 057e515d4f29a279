internal import Glibc

/// A serial port named the way a person types it: `DEVICE[:BAUD]`, e.g. `/dev/ttyUSB0:115200`.
///
/// The baud rate defaults to ``defaultBaudRate`` and must be one of ``supportedBaudRates``.
/// Device paths may themselves contain colons (`/dev/serial/by-path/pci-0000:00:14.0-usb-0:1:1.0-port0`):
/// only a final `:` followed by letters and digits alone is read as the baud rate.
public struct SerialPortSpec: Sendable, Hashable, CustomStringConvertible {
    /// The baud rate used when the text names none: 115200, what MFi UART accessories use.
    public static let defaultBaudRate = 115_200

    /// The baud rates a ``SerialTransport`` can set, slowest first.
    public static let supportedBaudRates: [Int] = [
        9_600, 19_200, 38_400, 57_600, 115_200, 230_400, 460_800, 921_600,
        1_000_000, 1_500_000, 2_000_000, 3_000_000,
    ]

    /// The device to open, e.g. `/dev/ttyUSB0`.
    public let path: String
    /// The line speed in bits per second, one of ``supportedBaudRates``.
    public let baudRate: Int

    /// A spec from its parts.
    ///
    /// - Throws: ``TransportError`` when `path` is empty or `baudRate` is not one of
    ///   ``supportedBaudRates``; the message lists the rates to pick from.
    public init(path: String, baudRate: Int = SerialPortSpec.defaultBaudRate) throws(TransportError) {
        guard !path.isEmpty else {
            throw TransportError(
                "missing serial device path",
                advice: "name the device like /dev/ttyUSB0 or /dev/ttyUSB0:115200 (ls /dev/ttyUSB* /dev/ttyACM* shows the adapters)"
            )
        }
        guard Self.speedConstant(for: baudRate) != nil else {
            throw TransportError(
                "unsupported baud rate \(baudRate) for \(path)",
                advice: Self.supportedRatesAdvice
            )
        }
        self.path = path
        self.baudRate = baudRate
    }

    /// Parses `DEVICE[:BAUD]`, e.g. `/dev/ttyS0`, `/dev/ttyUSB0:921600`.
    ///
    /// - Throws: ``TransportError`` naming the bad part: a missing device (`:115200`), a missing
    ///   baud after the colon (`/dev/ttyS0:`), a baud that is not a number, or a rate that is not
    ///   supported (the message lists the supported rates).
    public init(parsing text: String) throws(TransportError) {
        let example = "write it like /dev/ttyUSB0 or /dev/ttyUSB0:115200"
        guard let colon = text.lastIndex(of: ":") else {
            try self.init(path: text)
            return
        }
        let device = String(text[..<colon])
        let rate = String(text[text.index(after: colon)...])
        let rateLooksLikeBaud = rate.unicodeScalars.allSatisfy { scalar in
            scalar.isASCII && (("0"..."9").contains(scalar) || ("a"..."z").contains(scalar) || ("A"..."Z").contains(scalar))
        }
        guard rateLooksLikeBaud else {
            // A colon inside the device name itself (udev's by-path names have them).
            try self.init(path: text)
            return
        }
        guard !device.isEmpty else {
            throw TransportError("missing serial device path before \":\(rate)\" in \"\(text)\"", advice: example)
        }
        guard !rate.isEmpty else {
            throw TransportError(
                "missing baud rate after \":\" in \"\(text)\"",
                advice: "drop the colon to use \(Self.defaultBaudRate), or \(Self.supportedRatesAdvice)"
            )
        }
        guard rate.unicodeScalars.allSatisfy({ ("0"..."9").contains($0) }), let baud = Int(rate) else {
            throw TransportError("baud rate \"\(rate)\" in \"\(text)\" is not a number", advice: Self.supportedRatesAdvice)
        }
        guard Self.speedConstant(for: baud) != nil else {
            throw TransportError("unsupported baud rate \(rate) in \"\(text)\"", advice: Self.supportedRatesAdvice)
        }
        try self.init(path: device, baudRate: baud)
    }

    /// `DEVICE:BAUD`, which ``init(parsing:)`` reads back.
    public var description: String { "\(path):\(baudRate)" }

    /// The termios `B…` constant for this spec's baud rate.
    var speed: speed_t {
        // Every initializer checked the rate, so the fallback is never taken.
        Self.speedConstant(for: baudRate) ?? speed_t(B115200)
    }

    private static var supportedRatesAdvice: String {
        "use one of " + supportedBaudRates.map(String.init).joined(separator: ", ")
    }

    /// Maps a rate in bits per second to its termios constant; `nil` for unsupported rates.
    static func speedConstant(for baudRate: Int) -> speed_t? {
        switch baudRate {
        case 9_600: speed_t(B9600)
        case 19_200: speed_t(B19200)
        case 38_400: speed_t(B38400)
        case 57_600: speed_t(B57600)
        case 115_200: speed_t(B115200)
        case 230_400: speed_t(B230400)
        case 460_800: speed_t(B460800)
        case 921_600: speed_t(B921600)
        case 1_000_000: speed_t(B1000000)
        case 1_500_000: speed_t(B1500000)
        case 2_000_000: speed_t(B2000000)
        case 3_000_000: speed_t(B3000000)
        default: nil
        }
    }
}
