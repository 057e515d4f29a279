@testable import AccessoryGadget
import AccessorySimulator
import IAPTransport
import Testing
import USBHost
import USBDescriptors
import USBTransport

/// The descriptors the GadgetFS gadget writes, read back with the host's own parser: what the
/// host will find is what the simulator serves.
@Suite("GadgetFS descriptors")
struct GadgetFSLayoutTests {
    static func layout(_ natives: [String] = ["com.example.native.echo", "com.example.native.sink"]) throws -> GadgetFSLayout {
        try GadgetFSLayout(vendorID: 0x1209, productID: 0x00BD, manufacturer: "Acme", product: "Streamer", serialNumber: "S-1",
                           nativeProtocols: natives)
    }

    @Test("each speed's configuration has the iAP2 interface and a native interface per protocol, with their bulk pairs")
    func configurationAsTheHostSeesIt() throws {
        let layout = try Self.layout()
        for (highSpeed, packet) in [(false, 64), (true, 512)] {
            let bytes = layout.configuration(highSpeed: highSpeed)
            #expect(Int(bytes[2]) | Int(bytes[3]) << 8 == bytes.count)
            let configuration = try USBConfigurationDescriptor(parsing: bytes)
            #expect(configuration.value == 1)
            let location = try #require(USBFunctionLocation.find(.iAP2, in: [configuration], activeConfiguration: 1))
            #expect(location.interface.number == 0)
            #expect(location.bulkIn.address == 0x81 && location.bulkOut.address == 0x02)
            #expect(Int(location.bulkIn.maxPacketSize) == packet)
            let natives = location.nativeInterfaces
            #expect(natives.map(\.number) == [1, 2])
            #expect(natives.map(\.alternateSetting) == [1, 1])
            #expect(natives.map(\.bulkIn.address) == [0x86, 0x8B])
            #expect(natives.map(\.bulkOut.address) == [0x07, 0x0C])
            #expect(natives.map(\.nameIndex) == [5, 6])
            // Alternate setting 0 of each native interface has no endpoints ("closed").
            #expect(location.companions.filter { $0.alternateSetting == 0 }.allSatisfy { $0.bulkIn == nil && $0.bulkOut == nil })
        }
    }

    @Test("the controller file gets tag 0, both configurations and the device descriptor")
    func setupBlob() throws {
        let layout = try Self.layout()
        let blob = layout.setupBlob
        #expect(blob.prefix(4) == [0, 0, 0, 0])
        let full = layout.configuration(highSpeed: false), high = layout.configuration(highSpeed: true)
        #expect(Array(blob[4..<(4 + full.count)]) == full)
        #expect(Array(blob[(4 + full.count)..<(4 + full.count + high.count)]) == high)
        let device = try USBDeviceDescriptor(parsing: Array(blob.suffix(18)))
        #expect(device.vendorID == 0x1209 && device.productID == 0x00BD)
        #expect(device.configurationCount == 1)
        #expect((device.manufacturerIndex, device.productIndex, device.serialNumberIndex) == (1, 2, 3))
        #expect(GadgetFSLayout.endpointBlob(0x86) == [1, 0, 0, 0, 7, 5, 0x86, 2, 64, 0, 0, 7, 5, 0x86, 2, 0, 2, 0])
    }

    @Test("string descriptors: languages, the three device strings, the interface names; nothing past them")
    func strings() throws {
        let layout = try Self.layout()
        #expect(layout.stringDescriptor(0) == [4, 3, 0x09, 0x04])
        func text(_ index: UInt8) -> String? {
            guard let bytes = layout.stringDescriptor(index), bytes.count == Int(bytes[0]), bytes[1] == 3 else { return nil }
            let units = stride(from: 2, to: bytes.count, by: 2).map { UInt16(bytes[$0]) | UInt16(bytes[$0 + 1]) << 8 }
            return String(decoding: units, as: UTF16.self)
        }
        #expect((1...6).map { text($0) } == ["Acme", "Streamer", "S-1", "iAP Interface", "com.example.native.echo", "com.example.native.sink"])
        #expect(layout.stringDescriptor(7) == nil)
    }

    @Test("more native protocols than the controller has bulk pairs is refused with what to do")
    func tooManyNativeProtocols() {
        #expect { try Self.layout(["a", "b", "c"]) } throws: { error in
            (error as? TransportError)?.description.contains("mark fewer protocols native") == true
        }
    }

    @Test("each field layout is presented as the host will find it: class, configuration value, endpoint numbers")
    func fieldLayouts() throws {
        let natives = ["com.example.native.echo", "com.example.native.sink"]
        for layout in USBDescriptorLayout.allCases where !layout.needsFunctionFS {
            let gadget = try GadgetFSLayout(vendorID: 0x1209, productID: 0x00C0, manufacturer: "Acme", product: "Field", serialNumber: "F-1",
                                            nativeProtocols: layout == .supercamera ? [natives[0]] : natives, descriptorLayout: layout)
            let device = try USBDeviceDescriptor(parsing: gadget.deviceDescriptor)
            #expect(device.deviceClass == layout.deviceClass[0], "\(layout)")
            let configuration = try USBConfigurationDescriptor(parsing: gadget.configuration(highSpeed: true))
            #expect(configuration.value == layout.configurationValue, "\(layout)")
            let found = try #require(USBFunctionLocation.find(.iAP2, in: [configuration], activeConfiguration: layout.configurationValue))
            #expect(found.interface.number == 0)
            // Every endpoint address is distinct, and every file is used once.
            let addresses = configuration.interfaces.flatMap(\.endpoints).map(\.address)
            #expect(Set(addresses).count == addresses.count, "\(layout): \(addresses)")
            let files = gadget.pairs.flatMap { [$0.inFile, $0.outFile] }
            #expect(Set(files).count == files.count, "\(layout): \(files)")
            switch layout {
            case .supercamera:
                #expect(device.deviceClass == 0xEF && gadget.deviceDescriptor[5] == 0x02 && gadget.deviceDescriptor[6] == 0x01)
                #expect(found.bulkIn.address == 0x82 && found.bulkOut.address == 0x02)
                #expect(found.nativeInterfaces.map(\.bulkIn.address) == [0x81] && found.nativeInterfaces.map(\.bulkOut.address) == [0x01])
                // The files of the same numbers: dummy_hcd's SA-1100-style pair and its PXA-style one.
                #expect(gadget.pairs.map(\.inFile) == ["ep2in-bulk", "ep1in-bulk"])
                #expect(gadget.pairs.map(\.outFile) == ["ep2out-bulk", "ep1out-bulk"])
            case .flirOne:
                #expect(device.release == 0x0108)
                #expect(found.bulkIn.address == 0x81 && found.bulkOut.address == 0x02)
                #expect(found.nativeInterfaces.map(\.number) == [1, 2])
                #expect(found.nativeInterfaces.map(\.bulkIn.address) == [0x83, 0x85])
                #expect(found.nativeInterfaces.map(\.bulkOut.address) == [0x04, 0x06])
            case .standard, .miscellaneousClass, .configurationThree:
                #expect(found.bulkIn.address == 0x81 && found.bulkOut.address == 0x02)
                #expect(found.nativeInterfaces.map(\.bulkIn.address) == [0x86, 0x8B])
            case .interruptFirst, .interruptAfter, .sixthInterface, .fullSpeed, .genericIDs:
                Issue.record("\(layout) is the FunctionFS gadget's")
            }
        }
        // The layouts with an interrupt endpoint, other interfaces, a speed or ids of their own
        // are refused, naming the gadget that presents them.
        for layout in USBDescriptorLayout.allCases where layout.needsFunctionFS {
            #expect { try GadgetFSLayout(vendorID: 0x1209, productID: 0x00C0, manufacturer: "Acme", product: "Field", serialNumber: "F-1",
                                         nativeProtocols: [], descriptorLayout: layout) } throws: { error in
                "\(error)".contains("does not present the layout '\(layout.rawValue)'") && "\(error)".contains("FunctionFS gadget")
            }
        }
        #expect(USBDescriptorLayout(named: "flir-one") == .flirOne && USBDescriptorLayout(named: "dji") == nil)
    }
}
