import Testing
@testable import USBHost
import USBTransport

/// The descriptor layouts of real accessories (PROTOCOL.md §7), as bytes, through the host's
/// parser and ``USBFunctionLocation/find(_:in:activeConfiguration:)``. Where §7 does not publish
/// a byte (a string index, the class of FLIR ONE's native interfaces), the value here is
/// marked as assumed.
@Suite struct FieldLayoutTests {
    /// Geek szitman "supercamera" (§7.3): wTotalLength 64, bus powered, 100 mA; interface 0 the
    /// iAP2 interface on IN 0x82 / OUT 0x02; interface 1 a native interface (alt 1: IN 0x81 /
    /// OUT 0x01). The string indices (4, 5) are assumed.
    static let supercameraConfiguration: [UInt8] = [
        0x09, 0x02, 0x40, 0x00, 0x02, 0x01, 0x00, 0x80, 0x32,
        0x09, 0x04, 0x00, 0x00, 0x02, 0xFF, 0xF0, 0x00, 0x04,
        0x07, 0x05, 0x82, 0x02, 0x00, 0x02, 0x00,
        0x07, 0x05, 0x02, 0x02, 0x00, 0x02, 0x00,
        0x09, 0x04, 0x01, 0x00, 0x00, 0xFF, 0xF0, 0x01, 0x05,
        0x09, 0x04, 0x01, 0x01, 0x02, 0xFF, 0xF0, 0x01, 0x05,
        0x07, 0x05, 0x81, 0x02, 0x00, 0x02, 0x00,
        0x07, 0x05, 0x01, 0x02, 0x00, 0x02, 0x00,
    ]
    /// Its device descriptor: bcdUSB 2.00, class EF/02/01, bMaxPacketSize0 64, 2ce3:3828
    /// (bcdDevice assumed 1.00), strings 1–3, one configuration.
    static let supercameraDevice: [UInt8] = [18, 0x01, 0x00, 0x02, 0xEF, 0x02, 0x01, 64, 0xE3, 0x2C, 0x28, 0x38, 0x00, 0x01, 1, 2, 3, 1]

    /// FLIR ONE (§7.1): bConfigurationValue 3; interface 0 the iAP2 interface (IN 0x81 / OUT
    /// 0x02); interfaces 1 and 2 with an empty alternate setting 0 and a bulk pair in 1 (IN 0x83
    /// / OUT 0x04, IN 0x85 / OUT 0x06), all 512 bytes. The classes of interfaces 1 and 2 are not
    /// published: FF/F0/01 assumed; string indices 5–7 assumed.
    static let flirOneConfiguration: [UInt8] = {
        var body: [UInt8] = [
            0x09, 0x04, 0x00, 0x00, 0x02, 0xFF, 0xF0, 0x00, 0x05,
            0x07, 0x05, 0x81, 0x02, 0x00, 0x02, 0x00,
            0x07, 0x05, 0x02, 0x02, 0x00, 0x02, 0x00,
        ]
        for (number, string, inAddress, outAddress) in [(UInt8(1), UInt8(6), UInt8(0x83), UInt8(0x04)), (2, 7, 0x85, 0x06)] {
            body += [0x09, 0x04, number, 0x00, 0x00, 0xFF, 0xF0, 0x01, string]
            body += [0x09, 0x04, number, 0x01, 0x02, 0xFF, 0xF0, 0x01, string]
            body += [0x07, 0x05, inAddress, 0x02, 0x00, 0x02, 0x00, 0x07, 0x05, outAddress, 0x02, 0x00, 0x02, 0x00]
        }
        let total = 9 + body.count
        return [0x09, 0x02, UInt8(total & 0xFF), UInt8(total >> 8), 0x03, 0x03, 0x00, 0x80, 0xFA] + body
    }()
    /// Its device descriptor: class 0/0/0, bMaxPacketSize0 64, 09cb:1996, bcdDevice 0x0108.
    static let flirOneDevice: [UInt8] = [18, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, 64, 0xCB, 0x09, 0x96, 0x19, 0x08, 0x01, 1, 2, 3, 1]

    @Test func theSupercameraIsFoundWithItsReversedEndpointsAndItsNativeInterface() throws {
        let device = try USBDeviceDescriptor(parsing: Self.supercameraDevice)
        #expect(device.deviceClass == 0xEF && device.idString == "2ce3:3828")
        let configuration = try USBConfigurationDescriptor(parsing: Self.supercameraConfiguration)
        #expect(configuration.value == 1 && configuration.interfaces.count == 3)
        let found = try #require(USBFunctionLocation.find(.iAP2, in: [configuration], activeConfiguration: 1))
        #expect(!found.needsConfigurationChange)
        #expect(found.interface.number == 0 && found.interface.nameIndex == 4)
        #expect(found.bulkIn.address == 0x82 && found.bulkOut.address == 0x02 && found.bulkIn.packetSize == 512)
        let natives = found.nativeInterfaces
        #expect(natives.count == 1)
        #expect(natives.first?.number == 1 && natives.first?.alternateSetting == 1 && natives.first?.nameIndex == 5)
        #expect(natives.first?.bulkIn.address == 0x81 && natives.first?.bulkOut.address == 0x01)
        // Named by its protocol string, it is the one that protocol opens.
        let named = USBAccessoryTransport.nativeInterface(for: "com.useeplus.protocol", among: natives,
                                                          names: [1: "com.useeplus.protocol"], device: "supercamera")
        #expect((try? named.get())?.number == 1)
    }

    @Test func theFLIROneIsFoundInConfigurationThreeWithTwoNativeInterfaces() throws {
        let device = try USBDeviceDescriptor(parsing: Self.flirOneDevice)
        #expect(device.deviceClass == 0 && device.release == 0x0108 && device.idString == "09cb:1996")
        let configuration = try USBConfigurationDescriptor(parsing: Self.flirOneConfiguration)
        #expect(configuration.value == 3)
        // Active (the kernel selects the only configuration, whatever its value).
        let found = try #require(USBFunctionLocation.find(.iAP2, in: [configuration], activeConfiguration: 3))
        #expect(found.configurationValue == 3 && !found.needsConfigurationChange)
        #expect(found.interface.number == 0 && found.bulkIn.address == 0x81 && found.bulkOut.address == 0x02)
        #expect(found.nativeInterfaces.map(\.number) == [1, 2])
        #expect(found.nativeInterfaces.map(\.alternateSetting) == [1, 1])
        #expect(found.nativeInterfaces.map(\.bulkIn.address) == [0x83, 0x85])
        #expect(found.nativeInterfaces.map(\.bulkOut.address) == [0x04, 0x06])
        // Unconfigured (or configured otherwise): configuration 3 is the one to select, not 1.
        let unconfigured = try #require(USBFunctionLocation.find(.iAP2, in: [configuration], activeConfiguration: nil))
        #expect(unconfigured.configurationValue == 3 && unconfigured.needsConfigurationChange)
        #expect(USBFunctionLocation.find(.iAP2, in: [configuration], activeConfiguration: 1)?.configurationValue == 3)
        // Two named native interfaces: each protocol opens its own; an unnamed protocol is refused with the names.
        let names: [UInt8: String] = [1: "com.flir.rosebud.frame", 2: "com.flir.rosebud.fileio"]
        let natives = found.nativeInterfaces
        #expect((try? USBAccessoryTransport.nativeInterface(for: "com.flir.rosebud.fileio", among: natives, names: names,
                                                            device: "FLIR ONE").get())?.number == 2)
        let refused = USBAccessoryTransport.nativeInterface(for: "com.flir.rosebud.config", among: natives, names: names, device: "FLIR ONE")
        guard case let .failure(error) = refused else { Issue.record("an unnamed protocol must be refused"); return }
        #expect(error.message.contains("none is named 'com.flir.rosebud.config'"))
    }

    @Test func aMiscellaneousClassDeviceWithoutAnInterfaceAssociationIsMatchedByItsInterfaces() throws {
        // EF/02/01 promises an interface association descriptor; the supercamera has none. The
        // host matches interfaces, never the device class, so the same configuration with an
        // IAD in front is found the same way.
        let plain = try USBConfigurationDescriptor(parsing: Self.supercameraConfiguration)
        var withAssociation = Array(Self.supercameraConfiguration.prefix(9)) + [0x08, 0x0B, 0x00, 0x02, 0xFF, 0xF0, 0x00, 0x00]
        withAssociation += Self.supercameraConfiguration.dropFirst(9)
        withAssociation[2] = UInt8(withAssociation.count)
        let associated = try USBConfigurationDescriptor(parsing: withAssociation)
        let a = try #require(USBFunctionLocation.find(.iAP2, in: [plain], activeConfiguration: 1))
        let b = try #require(USBFunctionLocation.find(.iAP2, in: [associated], activeConfiguration: 1))
        #expect(a == b)
    }

    @Test func theDJIAndTD300LayoutsStillMatch() throws {
        // TD300 (§7.2): iAP2 interface 0 on OUT 0x01 / IN 0x81, native interface 1 alt 1 on IN 0x82 / OUT 0x02: the DJI shape.
        let configuration = try USBConfigurationDescriptor(parsing: djiConfiguration)
        let found = try #require(USBFunctionLocation.find(.iAP2, in: [configuration], activeConfiguration: 1))
        #expect(found.bulkIn.address == 0x81 && found.bulkOut.address == 0x01)
        #expect(found.nativeInterfaces.map(\.bulkIn.address) == [0x82])
    }
}
