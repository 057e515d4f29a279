// USB descriptors as values, parsed from the bytes a device sends (USB 2.0 §9.6), and the rule
// that finds a function's interfaces by class. Pure Swift with no imports, so the fuzzer can build it
// alone and code that only describes USB devices (the core, the accessory daemon's client) links no
// libusb.

/// Why descriptor bytes could not be parsed.
package struct USBDescriptorError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What was wrong, e.g. "configuration descriptor: wTotalLength 64 but 40 bytes".
    package var message: String
    /// An error saying `message`, which names the descriptor, the offset and the field that is wrong.
    package init(_ message: String) { self.message = message }
    package var description: String { message }
}

/// Direction and type of a USB endpoint.
package struct USBEndpointDescriptor: Hashable, Sendable, CustomStringConvertible {
    /// bEndpointAddress: bit 7 set for IN.
    package var address: UInt8
    /// bmAttributes: bits 0–1 are the transfer type.
    package var attributes: UInt8
    /// wMaxPacketSize (bits 0–10 are the size).
    package var maxPacketSize: UInt16
    /// bInterval: the polling interval of interrupt and isochronous endpoints (in frames or
    /// microframes, by speed); bulk endpoints ignore it.
    package var interval: UInt8

    /// An endpoint with the descriptor's raw fields (as parsed, or as a test or a gadget declares it).
    package init(address: UInt8, attributes: UInt8, maxPacketSize: UInt16, interval: UInt8 = 0) {
        self.address = address
        self.attributes = attributes
        self.maxPacketSize = maxPacketSize
        self.interval = interval
    }

    /// Device-to-host.
    package var isIn: Bool { address & 0x80 != 0 }
    /// A bulk endpoint.
    package var isBulk: Bool { attributes & 0x03 == 2 }
    /// The packet size in bytes (without the high-bandwidth multiplier bits).
    package var packetSize: Int { Int(maxPacketSize & 0x07FF) }

    package var description: String {
        let kind = ["control", "isochronous", "bulk", "interrupt"][Int(attributes & 3)]
        return "EP 0x\(String(address, radix: 16, uppercase: true)) \(isIn ? "IN" : "OUT") \(kind) \(packetSize)"
    }
}

/// One alternate setting of one interface.
package struct USBInterfaceDescriptor: Hashable, Sendable {
    /// bInterfaceNumber: what claiming and SET_INTERFACE name.
    package var number: UInt8
    /// bAlternateSetting: 0 is the setting in force after SET_CONFIGURATION; others are selected with
    /// SET_INTERFACE.
    package var alternateSetting: UInt8
    /// bInterfaceClass (0xFF: vendor-specific, as iAP2's interfaces are).
    package var interfaceClass: UInt8
    /// bInterfaceSubClass (0xF0 for iAP2's interfaces).
    package var interfaceSubclass: UInt8
    /// bInterfaceProtocol (0x00 for the iAP2 link interface, 0x01 for an EA native transport).
    package var interfaceProtocol: UInt8
    /// iInterface: index of the interface's name string, 0 for none.
    package var nameIndex: UInt8
    /// The endpoints of this alternate setting, in descriptor order (endpoint 0 is never listed).
    package var endpoints: [USBEndpointDescriptor]

    /// An alternate setting with the descriptor's raw fields and its endpoints.
    package init(number: UInt8, alternateSetting: UInt8 = 0, interfaceClass: UInt8, interfaceSubclass: UInt8, interfaceProtocol: UInt8,
                nameIndex: UInt8 = 0, endpoints: [USBEndpointDescriptor] = []) {
        self.number = number
        self.alternateSetting = alternateSetting
        self.interfaceClass = interfaceClass
        self.interfaceSubclass = interfaceSubclass
        self.interfaceProtocol = interfaceProtocol
        self.nameIndex = nameIndex
        self.endpoints = endpoints
    }

    /// Its class, subclass and protocol.
    package var classTriple: USBInterfaceClass {
        USBInterfaceClass(interfaceClass, interfaceSubclass, interfaceProtocol)
    }
    /// The first bulk IN endpoint.
    package var bulkIn: USBEndpointDescriptor? { endpoints.first { $0.isBulk && $0.isIn } }
    /// The first bulk OUT endpoint.
    package var bulkOut: USBEndpointDescriptor? { endpoints.first { $0.isBulk && !$0.isIn } }
}

/// A configuration: its value and every interface alternate setting in it, in descriptor order.
package struct USBConfigurationDescriptor: Hashable, Sendable {
    /// bConfigurationValue (what SET_CONFIGURATION takes).
    package var value: UInt8
    /// iConfiguration: index of the configuration's name string, 0 for none.
    package var nameIndex: UInt8
    /// bmAttributes: bit 7 is always set, bit 6 self-powered, bit 5 remote wake-up.
    package var attributes: UInt8
    /// bMaxPower in units of 2 mA (USB 2) or 8 mA (USB 3).
    package var maxPower: UInt8
    /// Every alternate setting of every interface, in descriptor order (an interface with several
    /// settings appears once per setting).
    package var interfaces: [USBInterfaceDescriptor]

    /// A configuration with the descriptor's raw fields and its interfaces (as a test or a gadget
    /// declares one).
    package init(value: UInt8, nameIndex: UInt8 = 0, attributes: UInt8 = 0x80, maxPower: UInt8 = 0, interfaces: [USBInterfaceDescriptor]) {
        self.value = value
        self.nameIndex = nameIndex
        self.attributes = attributes
        self.maxPower = maxPower
        self.interfaces = interfaces
    }

    /// Parses a whole configuration descriptor with its interface and endpoint descriptors, as
    /// GET_DESCRIPTOR(CONFIGURATION) returns it. Class-specific and unknown descriptors are
    /// skipped; endpoints before the first interface are an error.
    ///
    /// - Throws: ``USBDescriptorError`` naming the offset and the field that is wrong.
    package init(parsing bytes: [UInt8]) throws(USBDescriptorError) {
        guard bytes.count >= 9 else { throw USBDescriptorError("configuration descriptor: \(bytes.count) bytes, need at least 9") }
        guard bytes[1] == 0x02 else { throw USBDescriptorError("configuration descriptor: type 0x\(String(bytes[1], radix: 16)) at offset 1, expected 0x02") }
        guard bytes[0] >= 9 else { throw USBDescriptorError("configuration descriptor: bLength \(bytes[0]), need at least 9") }
        let total = Int(bytes[2]) | Int(bytes[3]) << 8
        guard total >= 9, total <= bytes.count else {
            throw USBDescriptorError("configuration descriptor: wTotalLength \(total) but \(bytes.count) bytes")
        }
        value = bytes[5]
        nameIndex = bytes[6]
        attributes = bytes[7]
        maxPower = bytes[8]
        interfaces = []
        var offset = Int(bytes[0])
        while offset < total {
            let length = Int(bytes[offset])
            guard length >= 2, offset + length <= total else {
                throw USBDescriptorError("descriptor at offset \(offset): bLength \(length) with \(total - offset) bytes left")
            }
            switch bytes[offset + 1] {
            case 0x04:
                guard length >= 9 else { throw USBDescriptorError("interface descriptor at offset \(offset): bLength \(length), need 9") }
                interfaces.append(USBInterfaceDescriptor(
                    number: bytes[offset + 2], alternateSetting: bytes[offset + 3], interfaceClass: bytes[offset + 5],
                    interfaceSubclass: bytes[offset + 6], interfaceProtocol: bytes[offset + 7], nameIndex: bytes[offset + 8]))
            case 0x05:
                guard length >= 7 else { throw USBDescriptorError("endpoint descriptor at offset \(offset): bLength \(length), need 7") }
                guard !interfaces.isEmpty else { throw USBDescriptorError("endpoint descriptor at offset \(offset) before any interface") }
                interfaces[interfaces.count - 1].endpoints.append(USBEndpointDescriptor(
                    address: bytes[offset + 2], attributes: bytes[offset + 3],
                    maxPacketSize: UInt16(bytes[offset + 4]) | UInt16(bytes[offset + 5]) << 8, interval: bytes[offset + 6]))
            default:
                break // class-specific, interface association, SuperSpeed companion…
            }
            offset += length
        }
    }
}

/// The device descriptor's identifying fields.
package struct USBDeviceDescriptor: Hashable, Sendable {
    /// idVendor, the USB-IF vendor id.
    package var vendorID: UInt16
    /// idProduct, the vendor's product id (an accessory's bootloader often has another one).
    package var productID: UInt16
    /// bcdDevice, the device's release number.
    package var release: UInt16
    /// bDeviceClass: 0 when each interface names its own class (as iAP2 accessories do).
    package var deviceClass: UInt8
    /// iManufacturer: index of the manufacturer's name string, 0 for none.
    package var manufacturerIndex: UInt8
    /// iProduct: index of the product's name string, 0 for none.
    package var productIndex: UInt8
    /// iSerialNumber: index of the serial number string, 0 for none.
    package var serialNumberIndex: UInt8
    /// bNumConfigurations: how many configurations the device offers.
    package var configurationCount: UInt8

    /// A device descriptor with the given fields (as a test or a gadget declares one).
    package init(vendorID: UInt16, productID: UInt16, release: UInt16 = 0, deviceClass: UInt8 = 0, manufacturerIndex: UInt8 = 0,
                productIndex: UInt8 = 0, serialNumberIndex: UInt8 = 0, configurationCount: UInt8 = 1) {
        self.vendorID = vendorID
        self.productID = productID
        self.release = release
        self.deviceClass = deviceClass
        self.manufacturerIndex = manufacturerIndex
        self.productIndex = productIndex
        self.serialNumberIndex = serialNumberIndex
        self.configurationCount = configurationCount
    }

    /// Parses the 18-byte device descriptor.
    package init(parsing bytes: [UInt8]) throws(USBDescriptorError) {
        guard bytes.count >= 18, bytes[0] >= 18 else { throw USBDescriptorError("device descriptor: \(bytes.count) bytes, need 18") }
        guard bytes[1] == 0x01 else { throw USBDescriptorError("device descriptor: type 0x\(String(bytes[1], radix: 16)) at offset 1, expected 0x01") }
        self.init(vendorID: UInt16(bytes[8]) | UInt16(bytes[9]) << 8, productID: UInt16(bytes[10]) | UInt16(bytes[11]) << 8,
                  release: UInt16(bytes[12]) | UInt16(bytes[13]) << 8, deviceClass: bytes[4], manufacturerIndex: bytes[14],
                  productIndex: bytes[15], serialNumberIndex: bytes[16], configurationCount: bytes[17])
    }

    /// `vvvv:pppp` in lower-case hex, as lsusb writes it.
    package var idString: String { Self.hex4(vendorID) + ":" + Self.hex4(productID) }

    static func hex4(_ value: UInt16) -> String {
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: 4 - digits.count) + digits
    }
}

/// An interface's class, subclass and protocol: what a function is recognised by.
package struct USBInterfaceClass: Hashable, Sendable, CustomStringConvertible {
    /// bInterfaceClass.
    package var classCode: UInt8
    /// bInterfaceSubClass.
    package var subclass: UInt8
    /// bInterfaceProtocol.
    package var protocolCode: UInt8

    /// The triple `classCode/subclass/protocolCode`.
    package init(_ classCode: UInt8, _ subclass: UInt8, _ protocolCode: UInt8) {
        self.classCode = classCode
        self.subclass = subclass
        self.protocolCode = protocolCode
    }

    /// `FF/F0/00` in upper-case hex.
    package var description: String {
        [classCode, subclass, protocolCode].map { USBInterfaceClass.hex2($0) }.joined(separator: "/")
    }

    private static func hex2(_ value: UInt8) -> String {
        let digits = String(value, radix: 16, uppercase: true)
        return digits.count == 1 ? "0" + digits : digits
    }
}

/// What a host looks for on a device: a main interface of one class with a bulk pair, and
/// companion interfaces of another class in the same configuration, each opened by selecting an
/// alternate setting that has a bulk pair. The host's protocol layer says which classes (the
/// `USBTransport` module gives the iAP2 ones); this layer only matches them.
package struct USBFunctionMatch: Hashable, Sendable {
    /// The class of the interface the function runs over.
    package var main: USBInterfaceClass
    /// The class of the companion interfaces, if the function has any.
    package var companion: USBInterfaceClass?

    /// Matches `main` with a bulk pair, and `companion` interfaces beside it.
    package init(main: USBInterfaceClass, companion: USBInterfaceClass? = nil) {
        self.main = main
        self.companion = companion
    }
}

/// Where a device's function is, as a ``USBFunctionMatch`` found it.
package struct USBFunctionLocation: Hashable, Sendable {
    /// The configuration that has the interface.
    package var configurationValue: UInt8
    /// Whether that configuration has to be selected first (it is not the active one).
    package var needsConfigurationChange: Bool
    /// The main interface (alternate setting 0 unless only another one has the endpoints).
    package var interface: USBInterfaceDescriptor
    /// Its bulk IN endpoint.
    package var bulkIn: USBEndpointDescriptor
    /// Its bulk OUT endpoint.
    package var bulkOut: USBEndpointDescriptor
    /// The companion interfaces of the same configuration, every alternate setting.
    package var companions: [USBInterfaceDescriptor]

    /// The companion interfaces that can carry data: for each interface number, the alternate
    /// setting that has a bulk IN and a bulk OUT endpoint (normally 1; alternate setting 0 has
    /// none and means "closed"), in interface order.
    package var nativeInterfaces: [NativeInterfaceLocation] {
        var found: [NativeInterfaceLocation] = []
        for number in Set(companions.map(\.number)).sorted() {
            let settings = companions.filter { $0.number == number && $0.alternateSetting != 0 }
                .sorted { $0.alternateSetting < $1.alternateSetting }
            guard let open = settings.first(where: { $0.bulkIn != nil && $0.bulkOut != nil }),
                  let bulkIn = open.bulkIn, let bulkOut = open.bulkOut else { continue }
            let name = companions.first { $0.number == number && $0.nameIndex != 0 }?.nameIndex ?? open.nameIndex
            found.append(NativeInterfaceLocation(number: number, alternateSetting: open.alternateSetting, nameIndex: name,
                                                 bulkIn: bulkIn, bulkOut: bulkOut))
        }
        return found
    }

    /// Finds the function: an interface of `match.main`'s class with a bulk IN and a bulk OUT
    /// endpoint, in the active configuration if it has one, else in the first configuration that
    /// does (which the host then selects, as usbmuxd does for its interface). Nil when no
    /// configuration has one.
    package static func find(_ match: USBFunctionMatch, in configurations: [USBConfigurationDescriptor],
                            activeConfiguration: UInt8?) -> USBFunctionLocation? {
        func candidate(_ configuration: USBConfigurationDescriptor) -> USBFunctionLocation? {
            for interface in configuration.interfaces where interface.classTriple == match.main {
                guard let bulkIn = interface.bulkIn, let bulkOut = interface.bulkOut else { continue }
                return USBFunctionLocation(
                    configurationValue: configuration.value,
                    needsConfigurationChange: configuration.value != activeConfiguration,
                    interface: interface, bulkIn: bulkIn, bulkOut: bulkOut,
                    companions: configuration.interfaces.filter { match.companion != nil && $0.classTriple == match.companion })
            }
            return nil
        }
        if let active = configurations.first(where: { $0.value == activeConfiguration }), let found = candidate(active) { return found }
        for configuration in configurations {
            if let found = candidate(configuration) { return found }
        }
        return nil
    }
}

/// A companion interface that carries data once opened (iAP's EA native transport, PROTOCOL.md
/// §4.3): selecting ``alternateSetting`` (normally 1) opens the protocol's session and gives it
/// the bulk pair; alternate setting 0, which has no endpoints, closes it.
package struct NativeInterfaceLocation: Hashable, Sendable {
    /// bInterfaceNumber.
    package var number: UInt8
    /// The alternate setting with the bulk pair.
    package var alternateSetting: UInt8
    /// iInterface: the index of its name string (the EA protocol name, by convention), 0 for none.
    package var nameIndex: UInt8
    /// The bulk IN endpoint of that setting: the accessory's bytes for the session.
    package var bulkIn: USBEndpointDescriptor
    /// The bulk OUT endpoint of that setting: the host's bytes for the session.
    package var bulkOut: USBEndpointDescriptor

    /// A native interface at `number`, opened by selecting `alternateSetting`, with its bulk pair.
    package init(number: UInt8, alternateSetting: UInt8, nameIndex: UInt8, bulkIn: USBEndpointDescriptor, bulkOut: USBEndpointDescriptor) {
        self.number = number
        self.alternateSetting = alternateSetting
        self.nameIndex = nameIndex
        self.bulkIn = bulkIn
        self.bulkOut = bulkOut
    }
}

/// Decodes a string descriptor (UTF-16LE after a 2-byte header); nil when it is not one.
package func decodeStringDescriptor(_ bytes: [UInt8]) -> String? {
    guard bytes.count >= 2, bytes[1] == 0x03 else { return nil }
    let length = min(Int(bytes[0]), bytes.count)
    guard length >= 2 else { return nil }
    var units: [UInt16] = []
    var index = 2
    while index + 1 < length {
        units.append(UInt16(bytes[index]) | UInt16(bytes[index + 1]) << 8)
        index += 2
    }
    return String(decoding: units, as: UTF16.self)
}
