@testable import AccessoryHost
@testable import AccessoryHostUSB
import AccessoryGadget
import AccessorySimulator
import Dispatch
import IAPTransport
import Testing
import TestSupport
import TestThreads
@testable import USBHost
import USBDescriptors
import USBTransport

/// A configuration descriptor: the 9-byte header (value 1, bus powered, string `name`) before
/// `body`, with wTotalLength and bNumInterfaces counted from it.
func configurationBytes(_ body: [UInt8], value: UInt8 = 1, name: UInt8 = 0) -> [UInt8] {
    var interfaces = Set<UInt8>()
    var offset = 0
    while offset + 1 < body.count, body[offset] >= 2 {
        if body[offset + 1] == 0x04 { interfaces.insert(body[offset + 2]) }
        offset += Int(body[offset])
    }
    let total = 9 + body.count
    return [0x09, 0x02, UInt8(total & 0xFF), UInt8(total >> 8), UInt8(interfaces.count), value, name, 0x80, 0x32] + body
}

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

    /// Native Instruments Traktor Kontrol S2 Mk2 (17cc:1320, §7.9): the iAP interface is
    /// interface 5 "iAP Interface" FF/F0/00 with bulk OUT 0x03 and bulk IN 0x84 (512) and an
    /// interrupt IN 0x85 (64 bytes, bInterval 6), beside USB Audio 2, HID and DFU interfaces.
    /// §7.9 names those classes, not their order or contents: interfaces 0–4 here (an interface
    /// association, audio control with its class-specific header, two audio streaming
    /// interfaces with an isochronous setting, HID with its HID descriptor and interrupt
    /// endpoints, DFU with its functional descriptor) and the string indices are assumed.
    static let traktorConfiguration: [UInt8] = configurationBytes([
        0x08, 0x0B, 0x00, 0x03, 0x01, 0x00, 0x20, 0x00,             // interface association: 0–2, audio
        0x09, 0x04, 0x00, 0x00, 0x00, 0x01, 0x01, 0x20, 0x00,       // if 0: audio control (UAC2)
        0x09, 0x24, 0x01, 0x00, 0x02, 0x08, 0x40, 0x00, 0x00,       //   class-specific header
        0x09, 0x04, 0x01, 0x00, 0x00, 0x01, 0x02, 0x20, 0x00,       // if 1 alt 0: audio streaming, no endpoints
        0x09, 0x04, 0x01, 0x01, 0x01, 0x01, 0x02, 0x20, 0x00,       // if 1 alt 1
        0x07, 0x05, 0x01, 0x05, 0x28, 0x01, 0x01,                   //   isochronous OUT 0x01
        0x08, 0x25, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,             //   class-specific endpoint
        0x09, 0x04, 0x02, 0x00, 0x00, 0x01, 0x02, 0x20, 0x00,       // if 2 alt 0: audio streaming
        0x09, 0x04, 0x02, 0x01, 0x01, 0x01, 0x02, 0x20, 0x00,       // if 2 alt 1
        0x07, 0x05, 0x82, 0x05, 0x28, 0x01, 0x01,                   //   isochronous IN 0x82
        0x09, 0x04, 0x03, 0x00, 0x02, 0x03, 0x00, 0x00, 0x00,       // if 3: HID
        0x09, 0x21, 0x11, 0x01, 0x00, 0x01, 0x22, 0x40, 0x00,       //   HID descriptor
        0x07, 0x05, 0x81, 0x03, 0x40, 0x00, 0x01,                   //   interrupt IN 0x81
        0x07, 0x05, 0x02, 0x03, 0x40, 0x00, 0x01,                   //   interrupt OUT 0x02
        0x09, 0x04, 0x04, 0x00, 0x00, 0xFE, 0x01, 0x01, 0x00,       // if 4: DFU
        0x09, 0x21, 0x0B, 0xFF, 0x00, 0x00, 0x04, 0x10, 0x01,       //   DFU functional descriptor
        0x09, 0x04, 0x05, 0x00, 0x03, 0xFF, 0xF0, 0x00, 0x05,       // if 5: "iAP Interface"
        0x07, 0x05, 0x03, 0x02, 0x00, 0x02, 0x00,                   //   bulk OUT 0x03, 512
        0x07, 0x05, 0x84, 0x02, 0x00, 0x02, 0x00,                   //   bulk IN 0x84, 512
        0x07, 0x05, 0x85, 0x03, 0x40, 0x00, 0x06,                   //   interrupt IN 0x85, 64, bInterval 6
    ], name: 4)

    /// QNX usblauncher's head-unit template (§7.9) at full speed: FF/F0/00 with an interrupt IN
    /// endpoint first (bInterval 4), then bulk IN and bulk OUT of 64 bytes. The endpoint
    /// addresses are assumed.
    static let interruptFirstConfiguration: [UInt8] = configurationBytes([
        0x09, 0x04, 0x00, 0x00, 0x03, 0xFF, 0xF0, 0x00, 0x04,
        0x07, 0x05, 0x83, 0x03, 0x40, 0x00, 0x04,
        0x07, 0x05, 0x81, 0x02, 0x40, 0x00, 0x00,
        0x07, 0x05, 0x02, 0x02, 0x40, 0x00, 0x00,
    ])

    /// MobIR Air (§7.9): the generic gadget ids 0525:a4a0, configuration string "MFI Configure",
    /// interface 0 FF/F0/00 with bulk 0x82/0x02 of 64 bytes (full speed), interface 1 FF/F0/01
    /// (alt 1: bulk 0x81/0x01) named `com.guidesensmart.mobir-air`. String indices 4 and 5 and
    /// bulk 0x81/0x01's 64 bytes are assumed.
    static let mobirConfiguration: [UInt8] = configurationBytes([
        0x09, 0x04, 0x00, 0x00, 0x02, 0xFF, 0xF0, 0x00, 0x00,
        0x07, 0x05, 0x82, 0x02, 0x40, 0x00, 0x00,
        0x07, 0x05, 0x02, 0x02, 0x40, 0x00, 0x00,
        0x09, 0x04, 0x01, 0x00, 0x00, 0xFF, 0xF0, 0x01, 0x05,
        0x09, 0x04, 0x01, 0x01, 0x02, 0xFF, 0xF0, 0x01, 0x05,
        0x07, 0x05, 0x81, 0x02, 0x40, 0x00, 0x00,
        0x07, 0x05, 0x01, 0x02, 0x40, 0x00, 0x00,
    ], name: 4)
    /// Its device descriptor: class 0/0/0, bMaxPacketSize0 64, 0525:a4a0 (bcdDevice assumed).
    static let mobirDevice: [UInt8] = [18, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, 64, 0x25, 0x05, 0xA0, 0xA4, 0x00, 0x01, 1, 2, 3, 1]

    @Test func theTraktorsIAPInterfaceIsFoundAsInterfaceFiveBesideAudioHIDAndDFU() throws {
        let configuration = try USBConfigurationDescriptor(parsing: Self.traktorConfiguration)
        #expect(Set(configuration.interfaces.map(\.number)) == [0, 1, 2, 3, 4, 5])
        let found = try #require(USBFunctionLocation.find(.iAP2, in: [configuration], activeConfiguration: 1))
        #expect(found.interface.number == 5 && found.interface.nameIndex == 5)
        #expect(found.bulkIn.address == 0x84 && found.bulkOut.address == 0x03)
        #expect(found.bulkIn.packetSize == 512 && found.bulkOut.packetSize == 512)
        // The interrupt endpoint is parsed (the interface has three) but is never the pipe.
        #expect(found.interface.endpoints.map(\.address) == [0x03, 0x84, 0x85])
        #expect(found.interface.endpoints[2].description == "EP 0x85 IN interrupt 64" && found.interface.endpoints[2].interval == 6)
        // The HID interface's interrupt pair and the isochronous endpoints are another interface's.
        #expect(found.nativeInterfaces.isEmpty)
    }

    @Test func anInterruptEndpointBeforeTheBulkPairIsSkippedAtFullSpeed() throws {
        let configuration = try USBConfigurationDescriptor(parsing: Self.interruptFirstConfiguration)
        let found = try #require(USBFunctionLocation.find(.iAP2, in: [configuration], activeConfiguration: 1))
        #expect(found.interface.endpoints.first?.description == "EP 0x83 IN interrupt 64")
        #expect(found.bulkIn.address == 0x81 && found.bulkOut.address == 0x02)
        #expect(found.bulkIn.packetSize == 64 && found.bulkOut.packetSize == 64)
    }

    @Test func theMobIRAirIsFoundByItsClassUnderTheGenericGadgetIDs() throws {
        let device = try USBDeviceDescriptor(parsing: Self.mobirDevice)
        #expect(device.idString == "0525:a4a0")
        let configuration = try USBConfigurationDescriptor(parsing: Self.mobirConfiguration)
        #expect(configuration.nameIndex == 4)
        let found = try #require(USBFunctionLocation.find(.iAP2, in: [configuration], activeConfiguration: 1))
        #expect(found.interface.number == 0 && found.bulkIn.address == 0x82 && found.bulkOut.address == 0x02)
        #expect(found.bulkOut.packetSize == 64)
        #expect(found.nativeInterfaces.map(\.number) == [1])
        #expect(found.nativeInterfaces.first?.bulkIn.address == 0x81 && found.nativeInterfaces.first?.bulkOut.address == 0x01)
    }

    @Test func theSeekThermalLayoutMatches() throws {
        // Seek Thermal PIR206 (§7.9): interface 0 FF/F0/00 with bulk OUT 0x01 and IN 0x81,
        // interface 1 FF/F0/01 (alt 1: OUT 0x02, IN 0x82); packet sizes assumed 512.
        let configuration = try USBConfigurationDescriptor(parsing: configurationBytes([
            0x09, 0x04, 0x00, 0x00, 0x02, 0xFF, 0xF0, 0x00, 0x00,
            0x07, 0x05, 0x01, 0x02, 0x00, 0x02, 0x00,
            0x07, 0x05, 0x81, 0x02, 0x00, 0x02, 0x00,
            0x09, 0x04, 0x01, 0x00, 0x00, 0xFF, 0xF0, 0x01, 0x04,
            0x09, 0x04, 0x01, 0x01, 0x02, 0xFF, 0xF0, 0x01, 0x04,
            0x07, 0x05, 0x02, 0x02, 0x00, 0x02, 0x00,
            0x07, 0x05, 0x82, 0x02, 0x00, 0x02, 0x00,
        ]))
        let found = try #require(USBFunctionLocation.find(.iAP2, in: [configuration], activeConfiguration: 1))
        #expect(found.bulkIn.address == 0x81 && found.bulkOut.address == 0x01)
        #expect(found.nativeInterfaces.map(\.bulkIn.address) == [0x82] && found.nativeInterfaces.map(\.bulkOut.address) == [0x02])
    }

    /// The simulated accessory's own descriptors for every layout (what its FunctionFS gadget
    /// writes), read back by the host's parser: the iAP2 interface is found at the layout's
    /// number with the bulk pair the gadget writes frames to, at every speed, and the
    /// interrupt endpoints are beside it.
    @Test(arguments: USBDescriptorLayout.allCases)
    func theGadgetsFunctionFSDescriptorsOfEachLayoutAreFoundByTheHost(_ layout: USBDescriptorLayout) throws {
        let descriptors = try FunctionFSDescriptors(layout: layout)
        let files = descriptors.iAP2EndpointFiles
        let inAddress = try #require(descriptors.endpoints.first { $0.fileName == files.in }).address
        let outAddress = try #require(descriptors.endpoints.first { $0.fileName == files.out }).address
        for speed in USBGadgetSpeed.allCases {
            let configuration = try USBConfigurationDescriptor(parsing: configurationBytes(descriptors.block(for: speed)))
            let found = try #require(USBFunctionLocation.find(.iAP2, in: [configuration], activeConfiguration: 1), "\(layout) at \(speed)")
            #expect(found.interface.number == layout.iAP2InterfaceNumber)
            #expect(found.bulkIn.address == inAddress && found.bulkOut.address == outAddress, "\(layout) at \(speed)")
            #expect(found.bulkIn.packetSize == speed.bulkMaxPacketSize)
            let interrupts = configuration.interfaces.flatMap(\.endpoints).filter { $0.attributes & 3 == 3 }
            #expect(interrupts.count == (layout == .sixthInterface ? 2 : layout.hasInterruptEndpoint ? 1 : 0))
            #expect(interrupts.allSatisfy { $0.isIn && $0.packetSize == 64 && $0.interval == (speed == .full ? 4 : 6) })
            #expect(Set(configuration.interfaces.map(\.number)).count == (layout == .sixthInterface ? 6 : 1))
        }
    }

    @Test func theDJIAndTD300LayoutsStillMatch() throws {
        // TD300 (§7.2): iAP2 interface 0 on OUT 0x01 / IN 0x81, native interface 1 alt 1 on IN 0x82 / OUT 0x02: the DJI shape.
        let configuration = try USBConfigurationDescriptor(parsing: djiConfiguration)
        let found = try #require(USBFunctionLocation.find(.iAP2, in: [configuration], activeConfiguration: 1))
        #expect(found.bulkIn.address == 0x81 && found.bulkOut.address == 0x01)
        #expect(found.nativeInterfaces.map(\.bulkIn.address) == [0x82])
    }
}

/// The field layouts of §7.9 through the whole host over the USB layer's real code (the fake
/// libusb wired to the simulated accessory): the host finds and claims the iAP2 interface by
/// its class alone, whatever its number, the interfaces beside it, an interrupt endpoint, the
/// packet size or the vendor and product ids; it claims nothing else and never touches the
/// interrupt endpoint; the accessory is identified and echoes.
@Suite(.ownThread) struct FieldLayoutOverUSBTests {
    struct Case: Sendable, CustomStringConvertible {
        var description: String
        var device: USBDeviceDescriptor
        var configuration: [UInt8]
        var strings: [UInt8: String]
        var interface: UInt8
        var bulk: (in: UInt8, out: UInt8)
        var packetSize: Int
        /// A kernel driver bound to the interface by the device's ids (usbtest takes 0525:a4a0).
        var kernelDriver: String?
    }

    static let cases: [Case] = [
        Case(description: "Traktor: interface 5 beside audio, HID and DFU, interrupt IN after the pair",
             device: USBDeviceDescriptor(vendorID: 0x17CC, productID: 0x1320, manufacturerIndex: 1, productIndex: 2, serialNumberIndex: 3),
             configuration: FieldLayoutTests.traktorConfiguration,
             strings: [1: "Native Instruments", 2: "Traktor Kontrol S2 MK2", 3: "TRK-0001", 4: "S2", 5: "iAP Interface"],
             interface: 5, bulk: (0x84, 0x03), packetSize: 512),
        Case(description: "head-unit template: interrupt IN before the pair, 64-byte packets",
             device: USBDeviceDescriptor(vendorID: 0x1209, productID: 0x00F1, manufacturerIndex: 1, productIndex: 2, serialNumberIndex: 3),
             configuration: FieldLayoutTests.interruptFirstConfiguration,
             strings: [1: "Head Unit", 2: "iAP2 Template", 3: "HU-0001", 4: "iAP Interface"],
             interface: 0, bulk: (0x81, 0x02), packetSize: 64),
        Case(description: "MobIR Air: generic ids 0525:a4a0 with usbtest bound, 64-byte packets",
             device: try! USBDeviceDescriptor(parsing: FieldLayoutTests.mobirDevice),
             configuration: FieldLayoutTests.mobirConfiguration,
             strings: [1: "Guide", 2: "MobIR Air", 3: "MOBIR-0001", 4: "MFI Configure", 5: "com.guidesensmart.mobir-air"],
             interface: 0, bulk: (0x82, 0x02), packetSize: 64, kernelDriver: "usbtest"),
    ]

    @Test(arguments: FieldLayoutOverUSBTests.cases)
    func aFieldLayoutIsClaimedByItsClassIdentifiedAndEchoes(_ field: Case) async throws {
        let manager = AccessoryManager(configuration: .init(supportedProtocols: ["com.example.echo"]))
        let fake = FakeBackend(queue: manager.queue)
        fake.state.withLock { state in
            state.devices = [FakeDevice(descriptor: field.device, configurations: [try! USBConfigurationDescriptor(parsing: field.configuration)],
                                        strings: field.strings)]
            state.kernelDriver = field.kernelDriver
        }
        fake.wireEndpoints = [field.bulk.in, field.bulk.out]
        let (hostSide, accessorySide) = MemoryTransport.pair(name: "usb wire")
        let profile = try #require(SimulatorProfile.builtIn(named: "multi-sensor"))
        let runner = try SimulatorRunner(profile: profile, attachment: .transport(accessorySide))
        manager.queue.sync { fake.connect(wire: hostSide) }
        runner.start()
        manager.startUSB(context: USBContext(backend: fake, queue: manager.queue, function: .iAP2, options: USBContextOptions()))
        defer {
            manager.stop()
            runner.stop()
        }
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(20)), "\(field)")
        #expect(accessory.name == "Multi Sensor")
        let function = try #require(accessory.usbDevice?.info.function)
        #expect(function.interface.number == field.interface)
        #expect(function.bulkIn.address == field.bulk.in && function.bulkOut.address == field.bulk.out)
        #expect(function.bulkOut.packetSize == field.packetSize)

        let session = try await accessory.openSession(for: "com.example.echo")
        let payload = bytes(300_000) { UInt8(truncatingIfNeeded: $0 &* 29 &+ $0 >> 7) }
        async let sent: Void = session.write(payload)
        var received: [UInt8] = []
        while received.count < payload.count, let chunk = try await session.read() { received += chunk }
        try await sent
        #expect(received == payload, "\(field): echo")
        session.close()

        let log = manager.queue.sync { fake.log }
        #expect(log.filter { $0.hasPrefix("claim ") } == ["claim \(field.interface)"], "\(field): claims only the iAP2 interface")
        if field.kernelDriver != nil {
            #expect(log.contains("detach \(field.interface)"), "\(field): the driver bound by the ids is detached from the iAP2 interface")
        }
        fake.state.withLock { state in
            #expect(state.submittedEndpoints == [field.bulk.in, field.bulk.out], "\(field): transfers on the bulk pair only")
            // The short-packet rule at the layout's packet size: a transfer of whole packets ends with a zero-length packet.
            let whole = state.outTransfers.filter { $0.length > 0 && $0.length % field.packetSize == 0 }
            let missing = whole.filter { !$0.zeroPacket }.count
            #expect(missing == 0, "\(field): \(whole.count) OUT transfers of whole \(field.packetSize)-byte packets")
        }
    }
}
