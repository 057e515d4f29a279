internal import USBDescriptors
internal import CLibUSB

/// A USB failure, with what a person can do about it.
package struct USBHostError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The kind of failure, for code that reacts to it.
    package enum Kind: String, Hashable, Sendable {
        /// No USB on this machine (no usbfs), or libusb could not start.
        case unavailable
        /// No permission to open the device node.
        case access
        /// The interface is held by a kernel driver or another process.
        case busy
        /// The device went away.
        case noDevice
        /// The device stalled a request it should have taken.
        case stall
        /// A transfer timed out.
        case timeout
        /// The device is not an accessory in USB host mode (no FF/F0/00 interface).
        case notAnAccessory
        /// Anything else libusb reported.
        case io
    }

    /// The kind of failure: what code decides on (never the message).
    package var kind: Kind
    /// What failed, e.g. "cannot claim interface 0 of 2ca3:1002 at 1-1.2".
    package var message: String
    /// What to do next.
    package var advice: String?
    /// libusb's error code, when the failure came from libusb.
    package var code: Int32?

    /// An error of `kind` saying `message` (what failed, naming the device), with `advice` (what
    /// to do next) and libusb's `code` when there is one.
    package init(_ kind: Kind, _ message: String, advice: String? = nil, code: Int32? = nil) {
        self.kind = kind
        self.message = message
        self.advice = advice
        self.code = code
    }

    /// An error from a libusb status, named after it.
    init(code: Int32, _ what: String, advice: String? = nil) {
        let kind: Kind = switch code {
        case LIBUSB_ERROR_ACCESS.rawValue: .access
        case LIBUSB_ERROR_BUSY.rawValue: .busy
        case LIBUSB_ERROR_NO_DEVICE.rawValue: .noDevice
        case LIBUSB_ERROR_PIPE.rawValue: .stall
        case LIBUSB_ERROR_TIMEOUT.rawValue: .timeout
        default: .io
        }
        self.init(kind, "\(what): \(errorName(code))", advice: advice, code: code)
    }

    package var description: String { advice.map { "\(message); \($0)" } ?? message }

    /// The advice for a device node this user may not open.
    static func accessAdvice(devicePath: String) -> String {
        "no permission to open \(devicePath): install the udev rule (sudo install -m 644 rules.d/70-mfi-accessory.rules "
            + "/etc/udev/rules.d/ && sudo udevadm control --reload-rules && sudo udevadm trigger --subsystem-match=usb), "
            + "then unplug and replug the accessory; without a desktop seat use rules.d/71-mfi-accessory-plugdev.rules "
            + "and join the plugdev group"
    }
}

/// A failure of a pipe or a device, named in words (kind ``USBHostError/Kind/io`` unless said).
func usbFailure(_ message: String, kind: USBHostError.Kind = .io, advice: String? = nil) -> USBHostError {
    USBHostError(kind, message, advice: advice)
}

/// Bytes lent from a USB IN slot for the duration of one handler call, on the context's queue.
/// Read them in place with ``withUnsafeBytes(_:)`` or take a copy with ``copied()``; never keep
/// the pointer.
package struct USBBorrowedBytes: @unchecked Sendable {
    // Sendability: handed to one handler call on the context's queue and not kept; the slot is
    // not touched until that call returns.
    private let bytes: UnsafeRawBufferPointer

    init(_ bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

    /// The number of bytes.
    package var count: Int { bytes.count }

    /// Runs `body` with the bytes in place; the pointer is valid only inside `body`.
    package func withUnsafeBytes<Result>(_ body: (UnsafeRawBufferPointer) throws -> Result) rethrows -> Result {
        try body(bytes)
    }

    /// A copy of the bytes.
    package func copied() -> [UInt8] { Array(bytes) }
}
