public import AccessoryHost
internal import AccessoryLogging
public import Foundation


/// Tells an accessory's delegate that it went away (iOS's `EAAccessoryDelegate`). The method
/// has a default that does nothing, as the optional Objective-C method has on iOS.
public protocol EAAccessoryDelegate: AnyObject {
    /// The accessory disconnected: called on the main queue, before the
    /// `EAAccessoryDidDisconnect` notification.
    func accessoryDidDisconnect(_ accessory: EAAccessory)
}

extension EAAccessoryDelegate {
    /// Does nothing: implement it to hear of the disconnection.
    public func accessoryDidDisconnect(_ accessory: EAAccessory) {}
}

/// A connected accessory, as iOS's `EAAccessory` describes it: its identity as it declared it
/// in identification, its protocols, whether it is still connected, and a delegate told when
/// it goes away. A reconnection is a new object with a new ``connectionID``.
///
/// Thread safety: the properties may be read from any thread; the delegate is called on the
/// main queue.
public final class EAAccessory: NSObject, @unchecked Sendable {
    /// The AccessoryHost accessory underneath (Linux only): for the native API beside the facade,
    /// for example `Accessory.usbDevice`.
    public let accessory: Accessory
    /// What the app declares and where failures are said (from the manager that listed it).
    let declaredProtocols: Set<String>
    let logger: Logger
    private let delegateBox = Locked(WeakDelegate())

    init(_ accessory: Accessory, declaredProtocols: Set<String>, logger: Logger) {
        self.accessory = accessory
        self.declaredProtocols = declaredProtocols
        self.logger = logger
    }

    /// Whether the accessory is still attached.
    public var isConnected: Bool { accessory.isConnected }
    /// Unique while the process runs; never ``EAConnectionIDNone``.
    public var connectionID: Int { accessory.connectionID }
    /// Its manufacturer, as declared.
    public var manufacturer: String { accessory.manufacturer }
    /// Its name, as declared.
    public var name: String { accessory.name }
    /// Its model, as declared.
    public var modelNumber: String { accessory.modelNumber }
    /// Its serial number, as declared.
    public var serialNumber: String { accessory.serialNumber }
    /// Its firmware version, as declared.
    public var firmwareRevision: String { accessory.firmwareRevision }
    /// Its hardware version, as declared.
    public var hardwareRevision: String { accessory.hardwareRevision }
    /// The kind of dock: always empty (see `Accessory.dockType`).
    public var dockType: String { accessory.dockType }
    /// Every protocol the accessory declares, in its order (those the app does not declare too:
    /// an ``EASession`` opens only the app's).
    public var protocolStrings: [String] { accessory.protocolStrings }

    /// Told when the accessory disconnects; not retained.
    public var delegate: (any EAAccessoryDelegate)? {
        get { delegateBox.withLock { $0.value } }
        set { delegateBox.withLock { $0.value = newValue } }
    }

    /// The accessory in one line, as `Accessory.description`.
    public override var description: String { accessory.description }
}

/// A delegate held without retaining it.
private struct WeakDelegate {
    weak var value: (any EAAccessoryDelegate)?
}
