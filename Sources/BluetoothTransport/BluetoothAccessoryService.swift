package import Dispatch
package import IAPTransport

// The accessory's side of iAP over Bluetooth, as real accessories have it (PROTOCOL.md §7.11):
// an SDP record under the accessory's own UUID, an RFCOMM channel, and the Apple device (here
// the host) connecting to it. For the simulated accessory; a host never needs it.

extension BluetoothProfile {
    /// The UUID the accessory side registers its profile object under with BlueZ. It is not
    /// advertised: the record (``accessoryServiceRecord(channel:name:)``) names only
    /// ``accessoryIAP2UUID``. A UUID of its own, because one bluetoothd serves both sides on a
    /// machine with two adapters (the rig), and the host's client profile holds
    /// ``accessoryIAP2UUID`` there.
    package static let accessoryRecordUUID = "4163636f-7279-486f-7374-000000000001"

    /// The SDP record of an accessory's iAP service, in BlueZ's XML form: service class
    /// ``accessoryIAP2UUID`` only, RFCOMM on `channel`, in the public browse group, named
    /// `name` ("Wireless iAP", as the Double 2 names it, §7.6).
    package static func accessoryServiceRecord(channel: UInt8, name: String = "Wireless iAP") -> String {
        let escaped = name.replacingAll("&", with: "&amp;").replacingAll("<", with: "&lt;").replacingAll(">", with: "&gt;")
            .replacingAll("\"", with: "&quot;")
        let hex = String(channel, radix: 16)
        return """
            <?xml version="1.0" encoding="UTF-8" ?>
            <record>
              <attribute id="0x0001"><sequence><uuid value="\(accessoryIAP2UUID)" /></sequence></attribute>
              <attribute id="0x0004"><sequence>
                <sequence><uuid value="0x0100" /></sequence>
                <sequence><uuid value="0x0003" /><uint8 value="0x\(hex.count == 1 ? "0" + hex : hex)" /></sequence>
              </sequence></attribute>
              <attribute id="0x0005"><sequence><uuid value="0x1002" /></sequence></attribute>
              <attribute id="0x0100"><text value="\(escaped)" /></attribute>
            </record>
            """
    }

    /// Advertises an accessory's iAP service as real accessories do (PROTOCOL.md §7.11): BlueZ
    /// gets a server profile whose SDP record (``accessoryServiceRecord(channel:name:)``) names
    /// only ``accessoryIAP2UUID`` on RFCOMM `channel`, on every adapter, and hands each host
    /// that connects to it over as a ``BluetoothTransport`` through `connection` (on `queue`).
    /// Neither authentication nor authorization is required of the host (a paired host is
    /// served as an unpaired one). ``stop()`` withdraws it.
    ///
    /// - Parameters:
    ///   - channel: the RFCOMM channel, 1–30 (the record names it, so BlueZ cannot pick it).
    ///   - name: the service's name in the record.
    ///   - busAddress: the D-Bus bus BlueZ is on; nil for the system bus.
    ///   - adapter: only connections through this adapter (e.g. `hci1`); nil for any.
    /// - Throws: ``BlueZError`` with the fix: a channel out of range, no bus, BlueZ not
    ///   running, no adapter, adapter off, the D-Bus policy, the record refused.
    package static func advertiseAccessory(channel: UInt8, name: String = "Wireless iAP", busAddress: String? = nil, adapter: String? = nil,
                                          queue: DispatchQueue,
                                          connection: @escaping @Sendable (BluetoothTransport) -> Void) async throws(BlueZError) -> BluetoothProfile {
        guard (1...30).contains(channel) else {
            throw BlueZError(.failed, "RFCOMM channel \(channel) is out of range", advice: "choose a channel from 1 to 30")
        }
        let options = BluetoothProfileOptions(busAddress: busAddress, channel: UInt16(channel), requireAuthentication: false, serviceName: name,
                                       adapter: adapter, profilePath: "/org/accessoryhost/accessory")
        let registration = Registration(
            path: options.profilePath, uuid: accessoryRecordUUID,
            options: .dictionary([
                "Name": .string(name),
                "Channel": .uint16(UInt16(channel)),
                "Role": .string("server"),
                "RequireAuthentication": .bool(false),
                "RequireAuthorization": .bool(false),
                "AutoConnect": .bool(false),
                "ServiceRecord": .string(accessoryServiceRecord(channel: channel, name: name)),
            ]),
            what: "registering the accessory's iAP service record (\(accessoryIAP2UUID), RFCOMM channel \(channel))")
        return try await register(options: options, registrations: [registration], queue: queue, connection: connection)
    }
}

extension BluetoothProfile {
    /// The address of each adapter BlueZ has, by name (`hci0`): what an accessory declares in
    /// its identification for the connections that come in on that adapter
    /// (``BluetoothPeer/adapter``).
    ///
    /// - Throws: ``BlueZError`` when BlueZ cannot be asked.
    package func adapterAddresses() async throws(BlueZError) -> [String: BluetoothAddress] {
        var addresses: [String: BluetoothAddress] = [:]
        for (path, interfaces) in try await managedObjects(doing: "listing adapters") {
            guard let adapter = interfaces["org.bluez.Adapter1"]?.dictionary, let text = adapter["Address"]?.string,
                  let address = BluetoothAddress(text) else { continue }
            addresses[String(path.split(separator: "/").last ?? "")] = address
        }
        return addresses
    }
}

extension String {
    /// Every `target` replaced by `replacement` (Foundation-free).
    fileprivate func replacingAll(_ target: Character, with replacement: String) -> String {
        var result = ""
        for character in self {
            if character == target { result += replacement } else { result.append(character) }
        }
        return result
    }
}
