import AccessoryHost
import AccessoryHostUSB
import Testing
@testable import USBHost
import USBDescriptors

/// AccessoryHostUSB's own values are USBHost's, shown: the defaults, the counters and the kinds
/// of failure pass through unchanged.
@Suite("AccessoryHostUSB's own values: what USBHost's say, unchanged")
struct ProductValuesTests {
    @Test("USBOptions' defaults are USBHost's, and what is set reaches USBHost's options")
    func options() {
        var options = USBOptions()
        #expect(options.context == USBContextOptions())
        options.inTransfers = 9
        options.hotplug = false
        options.pollInterval = .milliseconds(250)
        #expect(options.context.inTransfers == 9 && !options.context.hotplug && options.context.pollInterval == .milliseconds(250))
    }

    @Test("USBError keeps the kind, message, advice and code of each USBHost failure")
    func errors() {
        let kinds: [USBHostError.Kind] = [.unavailable, .access, .busy, .noDevice, .stall, .timeout, .notAnAccessory, .io]
        for kind in kinds {
            let error = USBError(USBHostError(kind, "cannot \(kind)", advice: "do this", code: -3))
            #expect(error.kind.rawValue == kind.rawValue)
            #expect(error.description == "cannot \(kind); do this" && error.code == -3)
        }
    }

    @Test("USBDevice shows the device's place, ids and strings, and compares by them")
    func device() {
        var info = USBDeviceInfo(bus: 1, address: 5, portPath: [1, 2], descriptor: USBDeviceDescriptor(vendorID: 0x2CA3, productID: 0x1002, release: 0x0100),
                                 serialNumber: "SN1")
        let device = USBDevice(info)
        #expect(device.usbID == USBID(vendorID: 0x2CA3, productID: 0x1002) && device.release == 0x0100)
        #expect(device.location == "1-1.2" && device.devicePath == "/dev/bus/usb/001/005" && device.serialNumber == "SN1")
        info.configurations = [] // what a device learnt through iapd lacks; not part of the comparison
        info.activeConfiguration = 1
        #expect(USBDevice(info) == device && USBDevice(info).hashValue == device.hashValue)
        info.serialNumber = "SN2"
        #expect(USBDevice(info) != device)
    }
}
