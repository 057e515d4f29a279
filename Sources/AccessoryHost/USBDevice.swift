package import USBDescriptors

/// The USB device an accessory on USB is, as the host found it: where it sits on the bus, its
/// ids, the strings its descriptors name, and its native-transport interfaces. The core's own
/// value: the descriptors it is read from stay inside the package.
public struct USBDevice: Sendable, Hashable, CustomStringConvertible {
    /// Everything the host read of the device (descriptors, configurations, the iAP function).
    package let info: USBDeviceInfo

    /// The device as `info` describes it.
    package init(_ info: USBDeviceInfo) { self.info = info }

    /// The bus number (as lsusb and `/dev/bus/usb/BUS/…` show it).
    public var bus: UInt8 { info.bus }
    /// The device's address on its bus: new after every re-plug or reset.
    public var address: UInt8 { info.address }
    /// Hub ports from the root, e.g. [1, 2].
    public var portPath: [UInt8] { info.portPath }
    /// The vendor and product ids.
    public var usbID: USBID { USBID(vendorID: info.descriptor.vendorID, productID: info.descriptor.productID) }
    /// idVendor, the USB-IF vendor id.
    public var vendorID: UInt16 { info.descriptor.vendorID }
    /// idProduct, the vendor's product id (an accessory's bootloader often has another one).
    public var productID: UInt16 { info.descriptor.productID }
    /// bcdDevice, the device's release number.
    public var release: UInt16 { info.descriptor.release }
    /// The manufacturer string (iManufacturer), nil when the device has none.
    public var manufacturer: String? { info.manufacturer }
    /// The product string (iProduct), nil when the device has none.
    public var product: String? { info.product }
    /// The serial number string (iSerialNumber), nil when the device has none.
    public var serialNumber: String? { info.serialNumber }
    /// The names (iInterface strings) of the native-transport interfaces, by interface number:
    /// by convention each is the EA protocol the interface carries.
    public var nativeInterfaceNames: [UInt8: String] { info.nativeInterfaceNames }
    /// `bus-port.port…` as the kernel names the device in sysfs, e.g. `1-1.2`: stable while the
    /// device stays in the same port, unlike the address.
    public var location: String { info.location }
    /// The usbfs node, e.g. `/dev/bus/usb/001/005`.
    public var devicePath: String { info.devicePath }
    /// `usb LOCATION VID:PID PRODUCT (serial …)`.
    public var description: String { info.description }

    /// Whether two values describe the same device as far as they show: place, ids, release,
    /// strings and native interfaces (not the descriptors behind them, which a device learnt
    /// through iapd does not carry).
    public static func == (left: USBDevice, right: USBDevice) -> Bool {
        left.bus == right.bus && left.address == right.address && left.portPath == right.portPath && left.usbID == right.usbID
            && left.release == right.release && left.manufacturer == right.manufacturer && left.product == right.product
            && left.serialNumber == right.serialNumber && left.nativeInterfaceNames == right.nativeInterfaceNames
    }

    /// Hashes what `==` compares.
    public func hash(into hasher: inout Hasher) {
        hasher.combine(bus)
        hasher.combine(address)
        hasher.combine(portPath)
        hasher.combine(usbID)
        hasher.combine(release)
        hasher.combine(manufacturer)
        hasher.combine(product)
        hasher.combine(serialNumber)
        hasher.combine(nativeInterfaceNames)
    }
}
