import CLibUSB

/// The project version and the libusb it runs on, e.g. `0.1.0 (libusb 1.0.26)`.
func toolVersion() -> String {
    let version = libusb_get_version().pointee
    return "\(AccessoryHostVersion.string) (libusb \(version.major).\(version.minor).\(version.micro))"
}

enum AccessoryHostVersion {
    static let string = "0.1.0-dev"
}
