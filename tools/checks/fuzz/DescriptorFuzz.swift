// libFuzzer target: USB configuration and device descriptors as a device might send them.
// Checks, on every input: no crash; a parsed configuration only holds what the bytes hold (each
// interface and endpoint came from a 9- or 7-byte descriptor inside wTotalLength); the iAP
// match only returns an FF/F0/00 interface with a bulk IN and a bulk OUT endpoint; each
// native-transport interface it lists is FF/F0/01 in a non-zero alternate setting with a bulk
// pair, once per interface number; string
// descriptors decode without reading past the bytes; `VID:PID` text parses without a crash and
// round-trips.
//
// Built with Sources/USBDescriptors/Descriptors.swift and Sources/AccessoryHost/USBID.swift
// compiled in (neither has imports).

@_cdecl("LLVMFuzzerTestOneInput")
public func descriptorFuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    if let config = try? USBConfigurationDescriptor(parsing: bytes) {
        let total = Int(bytes[2]) | Int(bytes[3]) << 8
        let endpoints = config.interfaces.reduce(0) { $0 + $1.endpoints.count }
        precondition(9 + config.interfaces.count * 9 + endpoints * 7 <= total, "more descriptors than bytes")
        let iAP = USBInterfaceClass(0xFF, 0xF0, 0x00), nativeClass = USBInterfaceClass(0xFF, 0xF0, 0x01)
        if let found = USBFunctionLocation.find(USBFunctionMatch(main: iAP, companion: nativeClass), in: [config], activeConfiguration: bytes.last) {
            precondition(found.interface.classTriple == iAP, "matched a non-iAP interface")
            precondition(found.bulkIn.isIn && found.bulkIn.isBulk && !found.bulkOut.isIn && found.bulkOut.isBulk, "bad endpoints")
            precondition(found.needsConfigurationChange == (config.value != bytes.last), "wrong configuration decision")
            let native = found.nativeInterfaces
            precondition(Set(native.map(\.number)).count == native.count, "a native interface listed twice")
            for item in native {
                precondition(item.alternateSetting != 0 && item.bulkIn.isIn && item.bulkIn.isBulk && !item.bulkOut.isIn && item.bulkOut.isBulk,
                             "a native interface without a bulk pair in a data setting")
                precondition(found.companions.contains { $0.number == item.number && $0.alternateSetting == item.alternateSetting && $0.classTriple == nativeClass },
                             "a native interface that is not FF/F0/01 in the configuration")
            }
        }
    }
    _ = try? USBDeviceDescriptor(parsing: bytes)
    if let text = decodeStringDescriptor(bytes) {
        precondition(text.utf16.count <= max(0, (min(Int(bytes[0]), bytes.count) - 2) / 2), "string longer than its descriptor")
    }
    // `--usb-id VID:PID` as a person types it: whatever parses prints back as the same ids.
    if let id = USBID(parsing: String(decoding: bytes, as: UTF8.self)) {
        precondition(USBID(parsing: id.description) == id, "a parsed USB id does not round-trip")
    }
    return 0
}
