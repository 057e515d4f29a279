internal import AccessorySimulator

// The blobs a FunctionFS function reads from its `ep0` before it can be bound, and the events it
// writes back. Pure values: no I/O here (``GadgetTransport`` writes and reads them).
//
// Everything on the wire is little-endian. The layouts are the kernel's
// `include/uapi/linux/usb/functionfs.h` and `ch9.h`.

/// The USB speeds a FunctionFS function describes itself for.
package enum USBGadgetSpeed: String, Sendable, CaseIterable, Hashable {
    /// Full speed (12 Mbit/s): bulk endpoints of 64 bytes.
    case full
    /// High speed (480 Mbit/s): bulk endpoints of 512 bytes.
    case high
    /// SuperSpeed (5 Gbit/s): bulk endpoints of 1024 bytes, each followed by a SuperSpeed
    /// endpoint companion descriptor.
    case superSpeed

    /// `wMaxPacketSize` of a bulk endpoint at this speed (the largest USB allows).
    package var bulkMaxPacketSize: Int {
        switch self {
        case .full: 64
        case .high: 512
        case .superSpeed: 1024
        }
    }
}

/// Why a ``FunctionFSDescriptors`` cannot be built.
package struct FunctionFSError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What is wrong and what to do about it.
    package var message: String

    /// Creates an error with its message.
    package init(_ message: String) { self.message = message }

    /// The message.
    package var description: String { message }
}

/// The descriptors and strings of the simulated accessory's USB function, as the two blobs
/// FunctionFS reads from `ep0` (descriptors first, then strings).
///
/// The function has:
/// - **the iAP2 interface**: interface 0, alternate setting 0, class FF/F0/00, two endpoints,
///   `iInterface` 1 ("iAP Interface"): bulk IN `0x81` (endpoint file `ep1`) and bulk OUT
///   `0x02` (endpoint file `ep2`);
/// - **one EA native-transport interface per name** in ``nativeTransportProtocols`` (interface
///   1, 2, …): alternate setting 0 of class FF/F0/01 with no endpoints, and alternate setting 1 of
///   class FF/F0/01 with bulk IN `0x80 | (3 + 2k)` and bulk OUT `4 + 2k` for the k-th name
///   (k from 0; endpoint files `ep(3 + 2k)` and `ep(4 + 2k)`); `iInterface` names a string that
///   is the protocol name.
///
/// A ``layout`` of the field changes the iAP2 interface (PROTOCOL.md §7.9): ``USBDescriptorLayout/interruptFirst``
/// declares an interrupt IN endpoint (`ep1`) before the bulk pair (`ep2` IN, `ep3` OUT);
/// ``USBDescriptorLayout/interruptAfter`` declares bulk OUT (`ep1`), bulk IN (`ep2`), then the
/// interrupt IN endpoint (`ep3`); ``USBDescriptorLayout/sixthInterface`` declares interfaces 0–4
/// first (audio control, two audio streaming, HID with an interrupt IN endpoint `ep1`, DFU) and
/// the iAP2 interface as interface 5 with `ep2` OUT, `ep3` IN and the interrupt `ep4`. The
/// interrupt endpoints have 64-byte packets and are never written. ``iAP2EndpointFiles`` names
/// the bulk pair's files.
///
/// FunctionFS numbers the endpoint files in the order the endpoints are declared (`ep1` is the
/// first), whatever their addresses. The addresses only have to be distinct: when the function is
/// bound, the kernel gives each endpoint one the controller has, and the host sees those.
///
/// `wMaxPacketSize` is 64 at full speed, 512 at high speed and 1024 at SuperSpeed. Each
/// SuperSpeed endpoint carries a companion descriptor with `bMaxBurst` ``superSpeedMaxBurst``
/// (0 by default: one packet per burst, which every controller accepts; the USB probe rig also ran
/// with 15, which is faster where the controller supports it), `bmAttributes` 0 (no streams) and
/// `wBytesPerInterval` 0 (bulk).
package struct FunctionFSDescriptors: Sendable, Hashable {
    // MARK: Constants from functionfs.h and ch9.h

    /// `FUNCTIONFS_DESCRIPTORS_MAGIC_V2`: the descriptors blob with a flags word.
    package static let descriptorsMagicV2: UInt32 = 3
    /// `FUNCTIONFS_STRINGS_MAGIC`: the strings blob.
    package static let stringsMagic: UInt32 = 2
    /// `FUNCTIONFS_HAS_FS_DESC`: full-speed descriptors follow.
    package static let hasFullSpeedDescriptors: UInt32 = 1
    /// `FUNCTIONFS_HAS_HS_DESC`: high-speed descriptors follow.
    package static let hasHighSpeedDescriptors: UInt32 = 2
    /// `FUNCTIONFS_HAS_SS_DESC`: SuperSpeed descriptors follow.
    package static let hasSuperSpeedDescriptors: UInt32 = 4
    /// The language of the strings: US English.
    package static let languageUSEnglish: UInt16 = 0x0409
    /// The iAP2 interface's name ("the string matters" to Apple devices).
    package static let iAPInterfaceName = "iAP Interface"
    /// The most native-transport interfaces this layout numbers (endpoint numbers 3…14).
    package static let maxNativeTransports = SimulatorProfile.maxNativeTransports

    /// `USB_DT_INTERFACE`.
    static let interfaceDescriptorType: UInt8 = 0x04
    /// `USB_DT_ENDPOINT`.
    static let endpointDescriptorType: UInt8 = 0x05
    /// `USB_DT_SS_ENDPOINT_COMP`.
    static let superSpeedCompanionType: UInt8 = 0x30
    /// `USB_ENDPOINT_XFER_BULK`.
    static let bulkAttributes: UInt8 = 0x02
    /// `USB_DT_INTERFACE_SIZE`, `USB_DT_ENDPOINT_SIZE`, `USB_DT_SS_EP_COMP_SIZE`.
    static let interfaceDescriptorSize = 9
    static let endpointDescriptorSize = 7
    static let companionDescriptorSize = 6

    // MARK: Layout

    /// The EA protocol names that get a native-transport interface each, in interface order.
    package let nativeTransportProtocols: [String]
    /// `bMaxBurst` of every SuperSpeed endpoint companion descriptor (0…15).
    package let superSpeedMaxBurst: UInt8
    /// The field layout of the function's interfaces and endpoints (PROTOCOL.md §7.9): the iAP2
    /// interface's number, the other interfaces before it, and an interrupt IN endpoint before
    /// or after its bulk pair. Layouts that only change device fields describe the function as
    /// ``USBDescriptorLayout/standard`` does.
    package let layout: USBDescriptorLayout

    /// Describes the function.
    ///
    /// - Parameters:
    ///   - nativeTransportProtocols: EA protocol names, one native-transport interface each (at
    ///     most ``maxNativeTransports``).
    ///   - superSpeedMaxBurst: `bMaxBurst` for the SuperSpeed companion descriptors, 0…15.
    ///   - layout: the field layout of the interfaces and endpoints.
    /// - Throws: ``FunctionFSError`` for too many names, a name that is empty, holds a NUL or is
    ///   too long for a USB string descriptor (126 UTF-16 units), a burst above 15, or native
    ///   interfaces with a layout whose interfaces or endpoints are the field's.
    package init(nativeTransportProtocols: [String] = [], superSpeedMaxBurst: UInt8 = 0,
                layout: USBDescriptorLayout = .standard) throws(FunctionFSError) {
        guard nativeTransportProtocols.count <= Self.maxNativeTransports else {
            throw FunctionFSError(
                "\(nativeTransportProtocols.count) native-transport protocols given; at most \(Self.maxNativeTransports) fit the endpoint numbers, so list fewer")
        }
        for name in nativeTransportProtocols {
            try Self.checkString(name, what: "native-transport protocol name")
        }
        guard superSpeedMaxBurst <= 15 else {
            throw FunctionFSError("bMaxBurst \(superSpeedMaxBurst) is out of range; use 0…15")
        }
        guard nativeTransportProtocols.isEmpty || !layout.hasInterruptEndpoint else {
            throw FunctionFSError("the layout '\(layout.rawValue)' has no native-transport interfaces; "
                + "offer the native protocols with another layout (standard, supercamera, flir-one…) or none")
        }
        self.nativeTransportProtocols = nativeTransportProtocols
        self.superSpeedMaxBurst = superSpeedMaxBurst
        self.layout = layout
    }

    /// Checks that `text` can be a USB string: not empty, no NUL, at most 126 UTF-16 units.
    static func checkString(_ text: String, what: String) throws(FunctionFSError) {
        if text.isEmpty {
            throw FunctionFSError("the \(what) is empty; give it a value")
        }
        if text.utf8.contains(0) {
            throw FunctionFSError("the \(what) '\(text)' contains a NUL character; remove it")
        }
        if text.utf16.count > 126 {
            throw FunctionFSError("the \(what) '\(text)' is \(text.utf16.count) UTF-16 units long; a USB string holds at most 126")
        }
    }

    /// The strings, in index order: index 1 is ``iAPInterfaceName``, index 2 + k the k-th
    /// native-transport protocol name.
    package var strings: [String] { [Self.iAPInterfaceName] + nativeTransportProtocols }

    /// What an endpoint is for.
    package enum EndpointRole: Sendable, Hashable {
        /// The iAP2 interface's bulk IN endpoint: the accessory's link packets.
        case iAP2In
        /// The iAP2 interface's bulk OUT endpoint: the host's link packets.
        case iAP2Out
        /// An interrupt IN endpoint (the iAP2 interface's or another interface's) that the
        /// simulated accessory never writes: the host must ignore it.
        case interrupt
        /// A native-transport interface's bulk endpoint.
        case native
    }

    /// One endpoint of the function and the file FunctionFS gives it.
    package struct Endpoint: Sendable, Hashable {
        /// The file in the mounted function directory: `ep1`, `ep2`, …
        package var fileName: String
        /// The declared `bEndpointAddress` (bit 7 set for IN).
        package var address: UInt8
        /// The interface it belongs to.
        package var interfaceNumber: UInt8
        /// What it is for.
        package var role: EndpointRole = .native
        /// Whether data flows to the host (write the file) rather than from it (read the file).
        package var isIn: Bool { address & 0x80 != 0 }
    }

    /// One declared item of a speed's block: an interface setting or an endpoint.
    private enum Item {
        /// number, alternate setting, endpoint count, class triple, string index.
        case interface(UInt8, UInt8, UInt8, (UInt8, UInt8, UInt8), UInt8)
        case endpoint(UInt8, EndpointRole, interface: UInt8)
    }

    /// Every interface setting and endpoint, in declaration order.
    private var items: [Item] {
        var items: [Item] = []
        let iAP2 = layout.iAP2InterfaceNumber
        if layout == .sixthInterface {
            // Audio control, two audio streaming (UAC2's protocol 0x20), HID with an interrupt
            // IN endpoint, DFU (FE/01/01): no class-specific descriptors.
            items.append(.interface(0, 0, 0, (0x01, 0x01, 0x20), 0))
            items.append(.interface(1, 0, 0, (0x01, 0x02, 0x20), 0))
            items.append(.interface(2, 0, 0, (0x01, 0x02, 0x20), 0))
            items.append(.interface(3, 0, 1, (0x03, 0x00, 0x00), 0))
            items.append(.endpoint(0x83, .interrupt, interface: 3))
            items.append(.interface(4, 0, 0, (0xFE, 0x01, 0x01), 0))
        }
        items.append(.interface(iAP2, 0, layout.hasInterruptEndpoint ? 3 : 2, (0xFF, 0xF0, 0x00), 1))
        switch layout {
        case .interruptFirst:
            items += [.endpoint(0x83, .interrupt, interface: iAP2), .endpoint(0x81, .iAP2In, interface: iAP2),
                      .endpoint(0x02, .iAP2Out, interface: iAP2)]
        case .interruptAfter, .sixthInterface:
            items += [.endpoint(0x03, .iAP2Out, interface: iAP2), .endpoint(0x84, .iAP2In, interface: iAP2),
                      .endpoint(0x85, .interrupt, interface: iAP2)]
        default:
            items += [.endpoint(0x81, .iAP2In, interface: iAP2), .endpoint(0x02, .iAP2Out, interface: iAP2)]
        }
        for index in nativeTransportProtocols.indices {
            let number = iAP2 + UInt8(index + 1)
            let string = UInt8(index + 2)
            let (inAddress, outAddress) = Self.nativeEndpointAddresses(index)
            items.append(.interface(number, 0, 0, (0xFF, 0xF0, 0x01), string))
            items.append(.interface(number, 1, 2, (0xFF, 0xF0, 0x01), string))
            items.append(.endpoint(inAddress, .native, interface: number))
            items.append(.endpoint(outAddress, .native, interface: number))
        }
        return items
    }

    /// Every endpoint in declaration order, with its file name.
    package var endpoints: [Endpoint] {
        var result: [Endpoint] = []
        for case let .endpoint(address, role, interface) in items {
            result.append(Endpoint(fileName: "ep\(result.count + 1)", address: address, interfaceNumber: interface, role: role))
        }
        return result
    }

    /// The files of the iAP2 interface's bulk IN and OUT endpoints (`ep1` and `ep2` unless an
    /// interrupt endpoint or another interface's comes first).
    package var iAP2EndpointFiles: (in: String, out: String) {
        let all = endpoints
        return (all.first { $0.role == .iAP2In }?.fileName ?? "ep1", all.first { $0.role == .iAP2Out }?.fileName ?? "ep2")
    }

    /// The IN and OUT addresses of the k-th native-transport interface.
    static func nativeEndpointAddresses(_ index: Int) -> (UInt8, UInt8) {
        (0x80 | UInt8(3 + 2 * index), UInt8(4 + 2 * index))
    }

    /// `USB_ENDPOINT_XFER_INT`.
    static let interruptAttributes: UInt8 = 0x03
    /// wMaxPacketSize of the interrupt endpoints (the Traktor's, §7.9).
    static let interruptMaxPacketSize: UInt16 = 64

    /// The interrupt endpoints' bInterval: 4 frames (4 ms) at full speed, 6 (2⁵ microframes,
    /// 4 ms) at high speed and SuperSpeed, as QNX's template has it (§7.9).
    static func interruptInterval(_ speed: USBGadgetSpeed) -> UInt8 { speed == .full ? 4 : 6 }

    // MARK: Descriptors blob

    /// How many descriptors one speed's block holds: per interface setting one, per endpoint one
    /// (two at SuperSpeed, with the companion).
    package func descriptorCount(for speed: USBGadgetSpeed) -> Int {
        let perEndpoint = speed == .superSpeed ? 2 : 1
        return items.reduce(0) { count, item in
            if case .endpoint = item { return count + perEndpoint }
            return count + 1
        }
    }

    /// One speed's descriptors, back to back, in declaration order.
    ///
    /// Interface descriptor (9 bytes): `bLength` u8 = 9, `bDescriptorType` u8 = 4,
    /// `bInterfaceNumber` u8, `bAlternateSetting` u8, `bNumEndpoints` u8, `bInterfaceClass` u8,
    /// `bInterfaceSubClass` u8, `bInterfaceProtocol` u8, `iInterface` u8.
    ///
    /// Endpoint descriptor (7 bytes): `bLength` u8 = 7, `bDescriptorType` u8 = 5,
    /// `bEndpointAddress` u8, `bmAttributes` u8 = 2 (bulk) or 3 (interrupt), `wMaxPacketSize`
    /// u16 LE (bulk: the speed's; interrupt: 64), `bInterval` u8 (bulk 0; interrupt 4 at full
    /// speed, 6 otherwise).
    ///
    /// SuperSpeed endpoint companion (6 bytes, after each endpoint at SuperSpeed): `bLength` u8 =
    /// 6, `bDescriptorType` u8 = 0x30, `bMaxBurst` u8 (interrupt: 0), `bmAttributes` u8 = 0,
    /// `wBytesPerInterval` u16 LE = 0 (bulk) or 64 (interrupt).
    package func block(for speed: USBGadgetSpeed) -> [UInt8] {
        var bytes: [UInt8] = []
        for item in items {
            switch item {
            case let .interface(number, alternate, endpoints, triple, string):
                bytes += [UInt8(Self.interfaceDescriptorSize), Self.interfaceDescriptorType, number, alternate, endpoints,
                          triple.0, triple.1, triple.2, string]
            case let .endpoint(address, role, _):
                let interrupt = role == .interrupt
                bytes += [UInt8(Self.endpointDescriptorSize), Self.endpointDescriptorType, address,
                          interrupt ? Self.interruptAttributes : Self.bulkAttributes]
                appendLittleEndian(interrupt ? Self.interruptMaxPacketSize : UInt16(speed.bulkMaxPacketSize), to: &bytes)
                bytes.append(interrupt ? Self.interruptInterval(speed) : 0)
                if speed == .superSpeed {
                    bytes += [UInt8(Self.companionDescriptorSize), Self.superSpeedCompanionType, interrupt ? 0 : superSpeedMaxBurst, 0]
                    appendLittleEndian(interrupt ? Self.interruptMaxPacketSize : 0, to: &bytes)
                }
            }
        }
        return bytes
    }

    /// The blob written to `ep0` first (`FUNCTIONFS_DESCRIPTORS_MAGIC_V2`):
    ///
    /// | offset | size | field |
    /// |---|---|---|
    /// | 0 | u32 LE | magic = 3 |
    /// | 4 | u32 LE | length of the whole blob |
    /// | 8 | u32 LE | flags = `HAS_FS_DESC` 1 \| `HAS_HS_DESC` 2 \| `HAS_SS_DESC` 4 = 7 |
    /// | 12 | u32 LE | full-speed descriptor count |
    /// | 16 | u32 LE | high-speed descriptor count |
    /// | 20 | u32 LE | SuperSpeed descriptor count |
    /// | 24 | … | the full-speed block, then the high-speed block, then the SuperSpeed block |
    ///
    /// (see ``block(for:)`` for a block's descriptors).
    package var descriptorsBlob: [UInt8] {
        let speeds: [USBGadgetSpeed] = [.full, .high, .superSpeed]
        let blocks = speeds.map(block(for:))
        let headerSize = 12 + 4 * speeds.count
        var bytes: [UInt8] = []
        bytes.reserveCapacity(headerSize + blocks.reduce(0) { $0 + $1.count })
        appendLittleEndian(Self.descriptorsMagicV2, to: &bytes)
        appendLittleEndian(UInt32(headerSize + blocks.reduce(0) { $0 + $1.count }), to: &bytes)
        appendLittleEndian(Self.hasFullSpeedDescriptors | Self.hasHighSpeedDescriptors | Self.hasSuperSpeedDescriptors, to: &bytes)
        for speed in speeds {
            appendLittleEndian(UInt32(descriptorCount(for: speed)), to: &bytes)
        }
        for block in blocks { bytes += block }
        return bytes
    }

    // MARK: Strings blob

    /// The blob written to `ep0` second (`FUNCTIONFS_STRINGS_MAGIC`):
    ///
    /// | offset | size | field |
    /// |---|---|---|
    /// | 0 | u32 LE | magic = 2 |
    /// | 4 | u32 LE | length of the whole blob |
    /// | 8 | u32 LE | `str_count`: strings per language (``strings``.count) |
    /// | 12 | u32 LE | `lang_count` = 1 |
    /// | 16 | u16 LE | language = 0x0409 |
    /// | 18 | … | each string in UTF-8, NUL-terminated, in index order (1, 2, …) |
    package var stringsBlob: [UInt8] {
        let texts = strings
        var body: [UInt8] = []
        appendLittleEndian(Self.languageUSEnglish, to: &body)
        for text in texts {
            body += Array(text.utf8)
            body.append(0)
        }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(16 + body.count)
        appendLittleEndian(Self.stringsMagic, to: &bytes)
        appendLittleEndian(UInt32(16 + body.count), to: &bytes)
        appendLittleEndian(UInt32(texts.count), to: &bytes)
        appendLittleEndian(UInt32(1), to: &bytes)
        bytes += body
        return bytes
    }
}

// MARK: - Events

/// A control request from the host (`struct usb_ctrlrequest`, 8 bytes).
package struct USBSetupRequest: Sendable, Hashable, CustomStringConvertible {
    /// `bmRequestType` (u8): bit 7 set for device-to-host, bits 5–6 the type, 0–4 the recipient.
    package var requestType: UInt8
    /// `bRequest` (u8).
    package var request: UInt8
    /// `wValue` (u16 LE).
    package var value: UInt16
    /// `wIndex` (u16 LE).
    package var index: UInt16
    /// `wLength` (u16 LE): bytes in the data stage.
    package var length: UInt16

    /// Creates a request from its fields.
    package init(requestType: UInt8, request: UInt8, value: UInt16, index: UInt16, length: UInt16) {
        self.requestType = requestType
        self.request = request
        self.value = value
        self.index = index
        self.length = length
    }

    /// Whether the data stage goes to the host (the function must write or stall).
    package var isDeviceToHost: Bool { requestType & 0x80 != 0 }

    /// The five fields, e.g. `bmRequestType 0x40 bRequest 0x51 wValue 0x0001 wIndex 0x0000 wLength 0`.
    package var description: String {
        func hex<T: FixedWidthInteger>(_ value: T, _ digits: Int) -> String {
            let text = String(value, radix: 16)
            return String(repeating: "0", count: max(0, digits - text.count)) + text
        }
        return "bmRequestType 0x\(hex(requestType, 2)) bRequest 0x\(hex(request, 2)) wValue 0x\(hex(value, 4)) "
            + "wIndex 0x\(hex(index, 4)) wLength \(length)"
    }
}

/// One event read from `ep0` (`struct usb_functionfs_event`, 12 bytes):
///
/// | offset | size | field |
/// |---|---|---|
/// | 0 | 8 | the setup request (meaningful for ``Kind/setup`` only) |
/// | 8 | u8 | type |
/// | 9 | 3 | padding |
package struct FunctionFSEvent: Sendable, Hashable {
    /// The size of one event record.
    package static let size = 12

    /// The event types (`enum usb_functionfs_event_type`).
    package enum Kind: UInt8, Sendable, Hashable, CaseIterable {
        /// The function was bound to a controller.
        case bind = 0
        /// The function was unbound.
        case unbind = 1
        /// The host selected a configuration with the function: the endpoints work.
        case enable = 2
        /// The endpoints stopped (reset, unconfigured, disconnected).
        case disable = 3
        /// A control request for the function; it must be answered on `ep0`.
        case setup = 4
        /// The bus was suspended.
        case suspend = 5
        /// The bus resumed.
        case resume = 6
    }

    /// The type; `nil` for a type this code does not know (it is skipped).
    package var kind: Kind?
    /// The raw type byte.
    package var rawType: UInt8
    /// The setup request (zeros unless ``kind`` is ``Kind/setup``).
    package var setup: USBSetupRequest

    /// Creates an event of a known kind.
    package init(kind: Kind, setup: USBSetupRequest = USBSetupRequest(requestType: 0, request: 0, value: 0, index: 0, length: 0)) {
        self.kind = kind
        self.rawType = kind.rawValue
        self.setup = setup
    }

    /// Decodes one record; `bytes` must hold ``size`` bytes from its start index.
    package init?(_ bytes: ArraySlice<UInt8>) {
        guard bytes.count >= Self.size else { return nil }
        let base = bytes.startIndex
        func u16(_ offset: Int) -> UInt16 { UInt16(bytes[base + offset]) | UInt16(bytes[base + offset + 1]) << 8 }
        setup = USBSetupRequest(requestType: bytes[base], request: bytes[base + 1], value: u16(2), index: u16(4), length: u16(6))
        rawType = bytes[base + 8]
        kind = Kind(rawValue: rawType)
    }

    /// The 12-byte record (what the kernel writes; tests feed these to a transport).
    package var bytes: [UInt8] {
        var result = [setup.requestType, setup.request]
        appendLittleEndian(setup.value, to: &result)
        appendLittleEndian(setup.index, to: &result)
        appendLittleEndian(setup.length, to: &result)
        result += [rawType, 0, 0, 0]
        return result
    }
}

/// Appends `value` little-endian (least significant byte first).
func appendLittleEndian<T: FixedWidthInteger>(_ value: T, to bytes: inout [UInt8]) {
    for shift in stride(from: 0, to: T.bitWidth, by: 8) {
        bytes.append(UInt8(truncatingIfNeeded: value >> shift))
    }
}
