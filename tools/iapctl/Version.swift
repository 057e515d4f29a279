import CLibUSB
import ProjectVersion

/// The project version and the libusb it runs on, e.g. `0.2.0 (libusb 1.0.26)`. The version
/// itself lives in one place, Sources/ProjectVersion.
func toolVersion() -> String {
    let version = libusb_get_version().pointee
    return "\(AccessoryHostVersion.string) (libusb \(version.major).\(version.minor).\(version.micro))"
}
