/// Which accessories an application or a script is looking for.
///
/// Every kind of condition that has values must hold; a kind with several values holds when any
/// of them does. So `names: ["Updater", "Updater Boot"], usbIDs: [0x1209:0x0001]` matches an
/// accessory named either way on that USB id. An empty filter matches every accessory.
///
/// Conditions on what an accessory declares (name, serial number, firmware, protocols) compare
/// exactly; USB ids match only accessories on USB. Following an accessory across a
/// re-enumeration (a bootloader with another product id, firmware that renames the device) is a
/// matter of listing both identities.
public struct AccessoryFilter: Sendable, Hashable, CustomStringConvertible {
    /// Accessory names (IdentificationInformation's Name).
    public var names: [String]
    /// Serial numbers.
    public var serialNumbers: [String]
    /// Firmware revisions.
    public var firmwareRevisions: [String]
    /// EA protocol strings: the accessory must declare one of them.
    public var protocols: [String]
    /// USB vendor and product ids.
    public var usbIDs: [USBID]

    /// A filter; each list left empty matches every accessory, and an accessory must match
    /// every list that is not.
    public init(names: [String] = [], serialNumbers: [String] = [], firmwareRevisions: [String] = [],
                protocols: [String] = [], usbIDs: [USBID] = []) {
        self.names = names
        self.serialNumbers = serialNumbers
        self.firmwareRevisions = firmwareRevisions
        self.protocols = protocols
        self.usbIDs = usbIDs
    }

    /// Whether the filter has no conditions (it matches everything).
    public var isEmpty: Bool {
        names.isEmpty && serialNumbers.isEmpty && firmwareRevisions.isEmpty && protocols.isEmpty && usbIDs.isEmpty
    }

    /// Whether `accessory` meets every condition.
    public func matches(_ accessory: Accessory) -> Bool {
        matches(identity: (accessory.name, accessory.serialNumber, accessory.firmwareRevision, accessory.protocolStrings),
                usbID: accessory.usbDevice?.usbID)
    }

    func matches(identity: (name: String, serial: String, firmware: String, protocols: [String]), usbID: USBID?) -> Bool {
        (names.isEmpty || names.contains(identity.name))
            && (serialNumbers.isEmpty || serialNumbers.contains(identity.serial))
            && (firmwareRevisions.isEmpty || firmwareRevisions.contains(identity.firmware))
            && (protocols.isEmpty || protocols.contains { identity.protocols.contains($0) })
            && (usbIDs.isEmpty || usbID.map { usbIDs.contains($0) } == true)
    }

    /// The conditions as a person reads them, e.g. `name "Updater", USB 1209:0001 or 1209:0002`;
    /// `any accessory` when there are none.
    public var description: String {
        func list(_ label: String, _ values: [String]) -> String? {
            values.isEmpty ? nil : "\(label) " + values.joined(separator: " or ")
        }
        let parts = [
            list("name", names.map { "\"\($0)\"" }), list("serial number", serialNumbers.map { "\"\($0)\"" }),
            list("firmware", firmwareRevisions.map { "\"\($0)\"" }), list("protocol", protocols),
            list("USB", usbIDs.map(\.description)),
        ].compactMap { $0 }
        return parts.isEmpty ? "any accessory" : parts.joined(separator: ", ")
    }
}
