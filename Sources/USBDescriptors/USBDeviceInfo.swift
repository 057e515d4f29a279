/// A USB device as the host sees it: where it is, what its descriptors say, and where its iAP
/// interface is (nil when it has none: not an accessory in USB host mode).
package struct USBDeviceInfo: Sendable, Hashable, CustomStringConvertible {
    /// The bus number (as lsusb and `/dev/bus/usb/BUS/…` show it).
    package var bus: UInt8
    /// The device address on its bus: assigned at enumeration, new after every replug or reset.
    package var address: UInt8
    /// Hub ports from the root, e.g. [1, 2].
    package var portPath: [UInt8]
    /// The device descriptor's identifying fields (vendor and product ids, string indexes).
    package var descriptor: USBDeviceDescriptor
    /// Every configuration the device offers, with its interfaces and endpoints.
    package var configurations: [USBConfigurationDescriptor]
    /// The bConfigurationValue in force, nil when the device is unconfigured (or it could not be read).
    package var activeConfiguration: UInt8?
    /// Where the function the context looks for is, nil for other devices.
    package var function: USBFunctionLocation?
    /// The strings read at open (nil until then, or when the device has none).
    package var manufacturer: String?
    /// The product name string (iProduct), read at open.
    package var product: String?
    /// The serial number string (iSerialNumber), read at open; part of ``stableIdentity``.
    package var serialNumber: String?
    /// The names (iInterface strings) of the native-transport interfaces, by interface number,
    /// read at open: by convention each is the EA protocol the interface carries.
    package var nativeInterfaceNames: [UInt8: String] = [:]

    /// A device as given: where it is and its device descriptor (configurations, function
    /// and strings empty until known): what a client of the accessory daemon rebuilds from the
    /// daemon's description.
    package init(bus: UInt8, address: UInt8, portPath: [UInt8], descriptor: USBDeviceDescriptor,
                configurations: [USBConfigurationDescriptor] = [], activeConfiguration: UInt8? = nil, function: USBFunctionLocation? = nil,
                manufacturer: String? = nil, product: String? = nil, serialNumber: String? = nil) {
        self.bus = bus
        self.address = address
        self.portPath = portPath
        self.descriptor = descriptor
        self.configurations = configurations
        self.activeConfiguration = activeConfiguration
        self.function = function
        self.manufacturer = manufacturer
        self.product = product
        self.serialNumber = serialNumber
    }

    /// `bus-port.port…` as the kernel names the device in sysfs, e.g. `1-1.2`: stable while the
    /// device stays in the same port, unlike the address.
    package var location: String {
        portPath.isEmpty ? "usb\(bus)" : "\(bus)-" + portPath.map(String.init).joined(separator: ".")
    }

    /// The usbfs node, e.g. `/dev/bus/usb/001/005`.
    package var devicePath: String { "/dev/bus/usb/\(Self.pad3(bus))/\(Self.pad3(address))" }

    /// A stable identity: the port path and, once read, the serial number.
    package var stableIdentity: String { serialNumber.map { "\(location)/\($0)" } ?? location }

    package var description: String {
        var text = "usb \(location) \(descriptor.idString)"
        if let product { text += " \(product)" }
        if let serialNumber, !serialNumber.isEmpty { text += " (serial \(serialNumber))" }
        return text
    }

    /// `value` in three decimal digits, as usbfs names buses and devices (`005`).
    package static func pad3(_ value: UInt8) -> String {
        let digits = String(value)
        return String(repeating: "0", count: 3 - digits.count) + digits
    }
}
