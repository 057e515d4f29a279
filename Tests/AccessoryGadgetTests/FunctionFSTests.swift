import AccessoryGadget
import AccessorySimulator
import Testing

@Suite("FunctionFS descriptors and strings")
struct FunctionFSTests {
    /// Reads a little-endian u32 at `offset`.
    private func u32(_ bytes: [UInt8], _ offset: Int) -> UInt32 {
        (0..<4).reduce(UInt32(0)) { $0 | UInt32(bytes[offset + $1]) << (8 * $1) }
    }

    // The expected blocks, written out by hand from the USB 2.0 / 3.x chapter 9 layouts.
    private let iAPInterface: [UInt8] = [0x09, 0x04, 0x00, 0x00, 0x02, 0xFF, 0xF0, 0x00, 0x01]
    private let fullSpeedBlock: [UInt8] = [
        0x09, 0x04, 0x00, 0x00, 0x02, 0xFF, 0xF0, 0x00, 0x01, // interface 0, alt 0, 2 endpoints, FF/F0/00, iInterface 1
        0x07, 0x05, 0x81, 0x02, 0x40, 0x00, 0x00,             // bulk IN 0x81, 64 bytes
        0x07, 0x05, 0x02, 0x02, 0x40, 0x00, 0x00,             // bulk OUT 0x02, 64 bytes
    ]

    @Test("the header: magic 3, the total length, flags FS|HS|SS, then the three counts back to back")
    func header() throws {
        let blob = try FunctionFSDescriptors().descriptorsBlob
        #expect(Array(blob[0..<24]) == [
            0x03, 0x00, 0x00, 0x00, // FUNCTIONFS_DESCRIPTORS_MAGIC_V2
            0x69, 0x00, 0x00, 0x00, // 105 bytes in all
            0x07, 0x00, 0x00, 0x00, // HAS_FS_DESC | HAS_HS_DESC | HAS_SS_DESC
            0x03, 0x00, 0x00, 0x00, // full speed: interface + 2 endpoints
            0x03, 0x00, 0x00, 0x00, // high speed: the same
            0x05, 0x00, 0x00, 0x00, // SuperSpeed: interface + 2 × (endpoint + companion)
        ])
        #expect(blob.count == 105)
        #expect(Int(u32(blob, 4)) == blob.count)
    }

    @Test("the full-speed block byte by byte, then high speed with 512-byte packets")
    func fullAndHighSpeedBlocks() throws {
        let layout = try FunctionFSDescriptors()
        let blob = layout.descriptorsBlob
        #expect(Array(blob[24..<47]) == fullSpeedBlock)
        #expect(layout.block(for: .full) == fullSpeedBlock)
        let highSpeed: [UInt8] = iAPInterface + [
            0x07, 0x05, 0x81, 0x02, 0x00, 0x02, 0x00,
            0x07, 0x05, 0x02, 0x02, 0x00, 0x02, 0x00,
        ]
        #expect(Array(blob[47..<70]) == highSpeed)
    }

    @Test("SuperSpeed endpoints are 1024 bytes and each carries a 6-byte companion (bMaxBurst as asked)")
    func superSpeedBlock() throws {
        let superSpeed: [UInt8] = iAPInterface + [
            0x07, 0x05, 0x81, 0x02, 0x00, 0x04, 0x00,
            0x06, 0x30, 0x00, 0x00, 0x00, 0x00,
            0x07, 0x05, 0x02, 0x02, 0x00, 0x04, 0x00,
            0x06, 0x30, 0x00, 0x00, 0x00, 0x00,
        ]
        #expect(Array(try FunctionFSDescriptors().descriptorsBlob[70...]) == superSpeed)
        let bursting = try FunctionFSDescriptors(superSpeedMaxBurst: 15).block(for: .superSpeed)
        #expect(bursting[18] == 15 && bursting[31] == 15)
    }

    @Test("the strings blob: magic 2, length, one string, one language (0x0409), NUL-terminated UTF-8")
    func stringsBlob() throws {
        let blob = try FunctionFSDescriptors().stringsBlob
        #expect(blob == [
            0x02, 0x00, 0x00, 0x00, // FUNCTIONFS_STRINGS_MAGIC
            0x20, 0x00, 0x00, 0x00, // 32 bytes in all
            0x01, 0x00, 0x00, 0x00, // str_count
            0x01, 0x00, 0x00, 0x00, // lang_count
            0x09, 0x04,             // en-US
        ] + Array("iAP Interface".utf8) + [0x00])
    }

    @Test("a native-transport interface: alt 0 without endpoints, alt 1 with a bulk pair, named by its protocol")
    func nativeTransport() throws {
        let layout = try FunctionFSDescriptors(nativeTransportProtocols: ["com.example.echo"])
        let blob = layout.descriptorsBlob
        #expect(blob.count == 213)
        #expect(Int(u32(blob, 4)) == 213)
        #expect([u32(blob, 12), u32(blob, 16), u32(blob, 20)] == [7, 7, 11])
        let native: [UInt8] = [
            0x09, 0x04, 0x01, 0x00, 0x00, 0xFF, 0xF0, 0x01, 0x02, // interface 1, alt 0, no endpoints, FF/F0/01, string 2
            0x09, 0x04, 0x01, 0x01, 0x02, 0xFF, 0xF0, 0x01, 0x02, // interface 1, alt 1, 2 endpoints
            0x07, 0x05, 0x83, 0x02, 0x40, 0x00, 0x00,             // bulk IN 0x83 (ep3)
            0x07, 0x05, 0x04, 0x02, 0x40, 0x00, 0x00,             // bulk OUT 0x04 (ep4)
        ]
        #expect(Array(blob[24..<79]) == fullSpeedBlock + native)
        #expect(layout.endpoints.map(\.fileName) == ["ep1", "ep2", "ep3", "ep4"])
        #expect(layout.endpoints.map(\.address) == [0x81, 0x02, 0x83, 0x04])
        #expect(layout.endpoints.map(\.isIn) == [true, false, true, false])
        let strings = layout.stringsBlob
        #expect(u32(strings, 4) == 49)
        #expect(u32(strings, 8) == 2)
        #expect(Array(strings[18...]) == Array("iAP Interface".utf8) + [0] + Array("com.example.echo".utf8) + [0])
    }

    @Test("an interrupt IN endpoint before the bulk pair (interrupt-first): ep1 interrupt, ep2 IN, ep3 OUT; bInterval 4 at full speed, 6 above")
    func interruptFirst() throws {
        let layout = try FunctionFSDescriptors(layout: .interruptFirst)
        #expect(layout.block(for: .full) == [
            0x09, 0x04, 0x00, 0x00, 0x03, 0xFF, 0xF0, 0x00, 0x01, // interface 0, 3 endpoints
            0x07, 0x05, 0x83, 0x03, 0x40, 0x00, 0x04,             // interrupt IN 0x83, 64 bytes, 4 ms
            0x07, 0x05, 0x81, 0x02, 0x40, 0x00, 0x00,             // bulk IN 0x81
            0x07, 0x05, 0x02, 0x02, 0x40, 0x00, 0x00,             // bulk OUT 0x02
        ])
        #expect(layout.block(for: .high)[9..<16] == [0x07, 0x05, 0x83, 0x03, 0x40, 0x00, 0x06])
        // SuperSpeed: the interrupt endpoint's companion says 64 bytes per interval.
        #expect(layout.block(for: .superSpeed)[16..<22] == [0x06, 0x30, 0x00, 0x00, 0x40, 0x00])
        #expect([layout.descriptorCount(for: .full), layout.descriptorCount(for: .superSpeed)] == [4, 7])
        #expect(layout.endpoints.map(\.role) == [.interrupt, .iAP2In, .iAP2Out])
        #expect(layout.iAP2EndpointFiles == ("ep2", "ep3"))
    }

    @Test("the Traktor's shapes: OUT, IN, then interrupt (interrupt-after); the iAP2 interface 5 after audio, HID and DFU (sixth-interface)")
    func interruptAfterAndSixthInterface() throws {
        let after = try FunctionFSDescriptors(layout: .interruptAfter)
        #expect(after.endpoints.map(\.address) == [0x03, 0x84, 0x85])
        #expect(after.iAP2EndpointFiles == ("ep2", "ep1"))
        let sixth = try FunctionFSDescriptors(layout: .sixthInterface)
        let block = sixth.block(for: .high)
        var classes: [[UInt8]] = []
        var offset = 0
        while offset < block.count {
            if block[offset + 1] == 0x04 { classes.append(Array(block[offset + 2...offset + 7])) }
            offset += Int(block[offset])
        }
        #expect(classes == [[0, 0, 0, 0x01, 0x01, 0x20], [1, 0, 0, 0x01, 0x02, 0x20], [2, 0, 0, 0x01, 0x02, 0x20],
                            [3, 0, 1, 0x03, 0x00, 0x00], [4, 0, 0, 0xFE, 0x01, 0x01], [5, 0, 3, 0xFF, 0xF0, 0x00]])
        #expect(sixth.endpoints.map(\.fileName) == ["ep1", "ep2", "ep3", "ep4"])
        #expect(sixth.endpoints.map(\.interfaceNumber) == [3, 5, 5, 5])
        #expect(sixth.iAP2EndpointFiles == ("ep3", "ep2"))
        // Layouts that change only device fields describe the function as the standard one does.
        for layout in [USBDescriptorLayout.fullSpeed, .genericIDs, .supercamera, .flirOne] {
            #expect(try FunctionFSDescriptors(layout: layout).descriptorsBlob == FunctionFSDescriptors().descriptorsBlob)
        }
    }

    @Test("impossible layouts are refused with a reason")
    func refusals() {
        #expect(throws: FunctionFSError.self) { try FunctionFSDescriptors(nativeTransportProtocols: (0..<7).map { "p\($0)" }) }
        #expect(throws: FunctionFSError.self) { try FunctionFSDescriptors(nativeTransportProtocols: [""]) }
        #expect(throws: FunctionFSError.self) { try FunctionFSDescriptors(nativeTransportProtocols: [String(repeating: "x", count: 127)]) }
        #expect(throws: FunctionFSError.self) { try FunctionFSDescriptors(superSpeedMaxBurst: 16) }
        #expect { try FunctionFSDescriptors(nativeTransportProtocols: ["com.example.echo"], layout: .sixthInterface) } throws: { error in
            "\(error)".contains("has no native-transport interfaces")
        }
    }

    @Test("ep0 events decode from their 12-byte records")
    func events() throws {
        let record: [UInt8] = [0x40, 0x51, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00]
        let event = try #require(FunctionFSEvent(record[...]))
        #expect(event.kind == .setup)
        #expect(event.setup == USBSetupRequest(requestType: 0x40, request: 0x51, value: 1, index: 2, length: 0))
        #expect(!event.setup.isDeviceToHost)
        #expect(event.bytes == record)
        #expect(FunctionFSEvent(kind: .enable).bytes == [0, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0])
        #expect(FunctionFSEvent(record[..<11]) == nil)
        #expect(FunctionFSEvent([0, 0, 0, 0, 0, 0, 0, 0, 0x09, 0, 0, 0][...])?.kind == nil)
    }
}
