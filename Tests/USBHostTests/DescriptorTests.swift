import Testing
@testable import USBHost
import AccessoryHost
import USBDescriptors
import USBTransport

@Suite struct DescriptorTests {
    @Test func usbIDsParseAsLsusbWritesThem() {
        #expect(USBID(parsing: "1209:00a1") == USBID(vendorID: 0x1209, productID: 0x00A1))
        #expect(USBID(parsing: "0x2CA3:0X1002") == USBID(vendorID: 0x2CA3, productID: 0x1002))
        #expect(USBID(parsing: "1:2")?.description == "0001:0002")
        for bad in ["", "1209", "1209:", ":00a1", "12090:1", "1209:00a1:1", "12g9:0001", "+123:1", "0x:1", " 1209:1"] {
            #expect(USBID(parsing: bad) == nil, "'\(bad)'")
        }
    }

    @Test func theDJIConfigurationParses() throws {
        let config = try USBConfigurationDescriptor(parsing: djiConfiguration)
        #expect(config.value == 1)
        #expect(config.nameIndex == 4)
        #expect(config.maxPower == 1)
        #expect(config.interfaces.count == 3)
        let iap = config.interfaces[0]
        #expect(iap.classTriple == .iAP2 && iap.classTriple != .iAPNativeTransport)
        #expect(iap.nameIndex == 5)
        #expect(iap.bulkIn == USBEndpointDescriptor(address: 0x81, attributes: 2, maxPacketSize: 512))
        #expect(iap.bulkOut == USBEndpointDescriptor(address: 0x01, attributes: 2, maxPacketSize: 512))
        #expect(config.interfaces[1].classTriple == .iAPNativeTransport && config.interfaces[1].endpoints.isEmpty)
        #expect(config.interfaces[2].alternateSetting == 1 && config.interfaces[2].bulkIn?.address == 0x82)
        #expect(config.interfaces[2].bulkOut?.packetSize == 512)
    }

    @Test func theIAPInterfaceIsFoundInTheActiveConfiguration() throws {
        let config = try USBConfigurationDescriptor(parsing: djiConfiguration)
        let found = try #require(USBFunctionLocation.find(.iAP2, in: [config], activeConfiguration: 1))
        #expect(found.configurationValue == 1 && !found.needsConfigurationChange)
        #expect(found.interface.number == 0 && found.bulkIn.address == 0x81 && found.bulkOut.address == 0x01)
        #expect(found.companions.map(\.alternateSetting) == [0, 1])
    }

    @Test func anotherConfigurationIsSelectedWhenTheActiveOneHasNoIAPInterface() throws {
        // Configuration 1: a usbmux-style FF/FE/02 and an FF/F0/01 only; configuration 2 has the iAP interface.
        let usbmux = USBConfigurationDescriptor(value: 1, interfaces: [
            USBInterfaceDescriptor(number: 0, interfaceClass: 0xFF, interfaceSubclass: 0xFE, interfaceProtocol: 0x02,
                                   endpoints: [.init(address: 0x85, attributes: 2, maxPacketSize: 512), .init(address: 0x04, attributes: 2, maxPacketSize: 512)]),
            USBInterfaceDescriptor(number: 1, interfaceClass: 0xFF, interfaceSubclass: 0xF0, interfaceProtocol: 0x01,
                                   endpoints: [.init(address: 0x86, attributes: 2, maxPacketSize: 512), .init(address: 0x06, attributes: 2, maxPacketSize: 512)]),
        ])
        var second = try USBConfigurationDescriptor(parsing: djiConfiguration)
        second.value = 2
        let found = try #require(USBFunctionLocation.find(.iAP2, in: [usbmux, second], activeConfiguration: 1))
        #expect(found.configurationValue == 2 && found.needsConfigurationChange)
        #expect(USBFunctionLocation.find(.iAP2, in: [usbmux], activeConfiguration: 1) == nil)
        // Unconfigured devices (no active configuration) need one selected too.
        #expect(USBFunctionLocation.find(.iAP2, in: [second], activeConfiguration: nil)?.needsConfigurationChange == true)
    }

    @Test func anIAPInterfaceWithoutABulkPairIsNotUsed() {
        let interruptOnly = USBConfigurationDescriptor(value: 1, interfaces: [
            USBInterfaceDescriptor(number: 0, interfaceClass: 0xFF, interfaceSubclass: 0xF0, interfaceProtocol: 0x00,
                                   endpoints: [.init(address: 0x83, attributes: 3, maxPacketSize: 8), .init(address: 0x01, attributes: 2, maxPacketSize: 64)]),
        ])
        #expect(USBFunctionLocation.find(.iAP2, in: [interruptOnly], activeConfiguration: 1) == nil)
    }

    @Test func malformedConfigurationsAreRefusedWithTheReason() {
        func reason(_ bytes: [UInt8]) -> String? {
            do { _ = try USBConfigurationDescriptor(parsing: bytes); return nil } catch { return error.message }
        }
        #expect(reason(Array(djiConfiguration.prefix(5))) == "configuration descriptor: 5 bytes, need at least 9")
        #expect(reason(Array(djiConfiguration.prefix(40))) == "configuration descriptor: wTotalLength 64 but 40 bytes")
        var zeroLength = djiConfiguration
        zeroLength[9] = 0
        #expect(reason(zeroLength) == "descriptor at offset 9: bLength 0 with 55 bytes left")
        var lying = djiConfiguration
        lying[57] = 0x20 // the last endpoint claims 32 bytes
        #expect(reason(lying) == "descriptor at offset 57: bLength 32 with 7 bytes left")
        let endpointFirst: [UInt8] = [0x09, 0x02, 0x10, 0x00, 0x01, 0x01, 0x00, 0x80, 0x01, 0x07, 0x05, 0x81, 0x02, 0x00, 0x02, 0x00]
        #expect(reason(endpointFirst) == "endpoint descriptor at offset 9 before any interface")
        var wrongType = djiConfiguration
        wrongType[1] = 0x01
        #expect(reason(wrongType) == "configuration descriptor: type 0x1 at offset 1, expected 0x02")
    }

    @Test func classSpecificDescriptorsAreSkipped() throws {
        // An interface association and a class-specific descriptor between the interfaces.
        var bytes = Array(djiConfiguration.prefix(9)) + [0x08, 0x0B, 0x00, 0x02, 0xFF, 0xF0, 0x00, 0x00, 0x05, 0x24, 0x00, 0x10, 0x01]
        bytes += djiConfiguration.dropFirst(9)
        bytes[2] = UInt8(bytes.count)
        let config = try USBConfigurationDescriptor(parsing: bytes)
        #expect(config.interfaces.count == 3 && config.interfaces[0].endpoints.count == 2)
    }

    @Test func everyTruncationAndEveryByteValueIsHandled() {
        // A small exhaustive fuzz: no input crashes; the parse either fails or stays within the bytes.
        for length in 0...djiConfiguration.count {
            _ = try? USBConfigurationDescriptor(parsing: Array(djiConfiguration.prefix(length)))
        }
        for position in djiConfiguration.indices {
            for value in [0, 1, 2, 7, 9, 0x40, 0xFF] as [UInt8] {
                var bytes = djiConfiguration
                bytes[position] = value
                if let config = try? USBConfigurationDescriptor(parsing: bytes) {
                    #expect(config.interfaces.count <= 7)
                }
            }
        }
    }

    @Test func deviceDescriptorsAndStrings() throws {
        let bytes: [UInt8] = [18, 1, 0x00, 0x02, 0, 0, 0, 64, 0xA3, 0x2C, 0x02, 0x10, 0x00, 0x01, 1, 2, 3, 1]
        let device = try USBDeviceDescriptor(parsing: bytes)
        #expect(device.idString == "2ca3:1002")
        #expect(device.serialNumberIndex == 3 && device.release == 0x0100)
        #expect(throws: USBDescriptorError.self) { try USBDeviceDescriptor(parsing: Array(bytes.prefix(17))) }
        #expect(decodeStringDescriptor([12, 3, 0x69, 0, 0x41, 0, 0x50, 0, 0x20, 0, 0xE9, 0]) == "iAP é")
        #expect(decodeStringDescriptor([2, 3]) == "")
        #expect(decodeStringDescriptor([4, 2, 0, 0]) == nil)
        #expect(decodeStringDescriptor([200, 3, 0x41, 0]) == "A") // a lying bLength is cut to the bytes there
    }

    @Test func locationsAndPaths() {
        let info = USBDeviceInfo(bus: 3, address: 17, portPath: [1, 4, 2], descriptor: USBDeviceDescriptor(vendorID: 0x05AC, productID: 0x12A8),
                                 configurations: [], serialNumber: "X1")
        #expect(info.location == "3-1.4.2")
        #expect(info.devicePath == "/dev/bus/usb/003/017")
        #expect(info.stableIdentity == "3-1.4.2/X1")
        #expect(info.description == "usb 3-1.4.2 05ac:12a8 (serial X1)")
    }
}
