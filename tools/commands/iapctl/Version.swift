import ProjectVersion
import USBHost

/// The project version and the libusb it runs on, e.g. `0.3.0 (libusb 1.0.26)`. The version
/// itself lives in one place, Sources/ProjectVersion.
func toolVersion() -> String {
    "\(AccessoryHostVersion.string) (libusb \(libusbVersion))"
}
