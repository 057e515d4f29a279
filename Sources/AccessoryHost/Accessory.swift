public import Dispatch
public import IAPLink
public import IAPTransport
internal import Synchronization
internal import USBDescriptors

/// A connected accessory, as ExternalAccessory's EAAccessory describes one.
///
/// Created when an accessory has been authenticated and identified; ``isConnected`` turns false
/// when it goes away, and a reconnection is a new `Accessory` with a new ``connectionID``.
///
/// Thread safety: immutable but for ``isConnected``; every property and method may be used
/// from any thread or task.
public final class Accessory: Sendable, Identifiable, CustomStringConvertible {
    /// Unique while the manager runs; never 0 (0 means "no accessory").
    public let connectionID: Int
    /// Everything the accessory declared in identification.
    public let identity: AccessoryIdentity
    /// The kind of wire it is attached by.
    public let transportKind: TransportKind
    /// Where it is attached, e.g. `serial /dev/ttyUSB0 @ 115200`.
    public let location: String
    /// Whether it declares at least one of the manager's supported protocols (all accessories
    /// are listed; those without are marked).
    public let supportsConfiguredProtocols: Bool
    /// The USB device it is, for accessories on USB (vendor and product id, bus location,
    /// the descriptors' strings); nil on other transports. A script can follow an accessory
    /// that re-enumerates with another product id (a bootloader) by these.
    public let usbDevice: USBDevice?
    /// The accessory's Bluetooth address, for accessories on Bluetooth (its identification
    /// declared it in a BluetoothTransportComponent); nil on other transports.
    public let bluetoothAddress: BluetoothAddress?

    let connection: Connection
    private let connected = Atomic<Bool>(true)

    init(connectionID: Int, identity: AccessoryIdentity, transport: any Transport, supportsConfiguredProtocols: Bool,
         connection: Connection) {
        self.connectionID = connectionID
        self.identity = identity
        self.transportKind = transport.kind
        self.location = transport.description
        self.usbDevice = transport.capability(USBDeviceInfo.self).map(USBDevice.init)
        self.bluetoothAddress = transport.capability(BluetoothPeer.self)?.address
        self.supportsConfiguredProtocols = supportsConfiguredProtocols
        self.connection = connection
    }

    /// The ``connectionID`` (`Identifiable`).
    public var id: Int { connectionID }
    /// Whether the accessory is still attached.
    public var isConnected: Bool { connected.load(ordering: .acquiring) }
    func markDisconnected() { connected.store(false, ordering: .releasing) }

    /// The accessory's name, as it declared it in identification (not escaped: see
    /// ``description``).
    public var name: String { identity.name }
    /// Its manufacturer, as declared.
    public var manufacturer: String { identity.manufacturer }
    /// Its model (iAP2 ModelIdentifier), as declared.
    public var modelNumber: String { identity.modelIdentifier }
    /// Its serial number, as declared.
    public var serialNumber: String { identity.serialNumber }
    /// Its firmware version, as declared (for example `1.4.2`): what a firmware upgrade script
    /// compares before and after.
    public var firmwareRevision: String { identity.firmwareVersion }
    /// Its hardware version, as declared.
    public var hardwareRevision: String { identity.hardwareVersion }
    /// The kind of dock the accessory is, as EAAccessory's `dockType`: always empty here. No
    /// identification parameter that carries it is known (PROTOCOL.md lists none), so the host
    /// has nothing to report; it is kept for code written against EAAccessory.
    public var dockType: String { "" }
    /// The protocol the accessory speaks: iAP2, or legacy iAP1. Sessions, events and errors are
    /// the same for both; this is the one place that tells them apart.
    public var protocolVersion: IAPProtocolVersion { identity.protocolVersion }
    /// The EA protocol strings, in the order declared.
    public var protocolStrings: [String] { identity.protocols.map(\.name) }

    /// How many session bytes the host moved on this accessory's connection, and how many times
    /// it copied them on the way (its iAP2 endpoint's count: link sessions, both ways; iAP1 and
    /// native-transport sessions are not counted). Copies a transport makes below the endpoint
    /// are not included: none in memory, one per byte out into the OUT slot on USB (see
    /// docs/ARCHITECTURE.md). Do not call it from the manager's queue.
    public var dataPlaneStatistics: DataPlaneStatistics { connection.dataPlaneStatistics() }

    /// The host's iAP2 link counters on this connection: packets sent and received,
    /// retransmissions (and those held back), acknowledgements, out-of-order and refused
    /// packets; nil for iAP1 accessories and for those seen through iapd. A link that
    /// retransmits on a reliable wire (USB, RFCOMM) is sending faster than the accessory
    /// acknowledges. Do not call it from the manager's queue.
    public var linkStatistics: LinkStatistics? { connection.linkStatistics() }

    /// The id of the transport connection the accessory was identified on (iapd's metrics). An
    /// accessory identified again on the same connection (its link restarted) has a new
    /// ``connectionID`` but the same transport connection, whose counters (``linkStatistics``)
    /// go on from where they were.
    package var transportConnectionID: Int { connection.connectionID }

    /// ``linkStatistics`` read on the manager's queue, where the caller already is: no hop, and
    /// nothing sent or rescheduled (iapd's metrics). nil for iAP1 and remote accessories.
    package func linkStatisticsOnQueue() -> LinkStatistics? { connection.linkStatisticsOnQueue() }

    /// The accessory in one line: id, name, maker, model, serial, firmware and where it is. The
    /// accessory's strings are quoted exactly: escape the line (`escapedForTerminal` of
    /// AccessoryLogging) before showing it on a terminal.
    public var description: String {
        "\(connectionID): \(name) (\(manufacturer) \(modelNumber), serial \(serialNumber), firmware \(firmwareRevision)) on \(location)"
    }

    /// Opens the session for `protocolString`: one per protocol per accessory.
    ///
    /// - Throws: ``AccessoryError/unsupportedProtocol(_:available:)``,
    ///   ``AccessoryError/protocolInUse(_:)``, ``AccessoryError/disconnected(_:)``,
    ///   ``AccessoryError/sessionRefused(_:)``.
    public func openSession(for protocolString: String) async throws -> AccessorySession {
        try await connection.openSession(accessory: self, protocolString: protocolString)
    }

    /// Opens the session for `protocolString` and calls `completion` on `queue` with it or the
    /// reason it did not open (the errors of ``openSession(for:)``): for code that is not async,
    /// such as a Foundation run loop or a thread of its own. It never waits for a Swift task.
    public func openSession(for protocolString: String, queue: DispatchQueue,
                            completion: @escaping @Sendable (Result<AccessorySession, AccessoryError>) -> Void) {
        connection.openSession(accessory: self, protocolString: protocolString) { result in
            queue.async { completion(result) }
        }
    }
}
