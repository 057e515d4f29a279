public import AccessoryHost
internal import AccessoryHostBluetooth
internal import AccessoryHostUSB
public import AccessoryLogging
internal import Dispatch
public import Foundation
internal import IAPAuthentication
internal import IAPTransport
internal import QueueConfinement
internal import Synchronization

/// Where the shared manager is told, on Linux, what iOS reads from the app's bundle and the
/// system: the protocols the app declares and where accessories are attached. Give it to
/// ``EAAccessoryManager/configure(_:)`` before the first ``EAAccessoryManager/shared()``;
/// without it the manager uses the defaults below.
public struct EAHostOptions: Sendable {
    /// The protocol strings the app speaks: iOS's `UISupportedExternalAccessoryProtocols`.
    /// Nil (the default) looks them up as ``EAAccessoryManager/declaredProtocols`` describes:
    /// the `EA_SUPPORTED_PROTOCOLS` environment variable, then an `Info.plist` beside the
    /// executable (or the main bundle's).
    public var supportedProtocols: [String]?
    /// Whether to follow USB accessories (hotplug). On by default; a machine without usbfs
    /// logs that once and goes on with the other transports.
    public var usb: Bool
    /// Serial ports to run the protocol on, as `DEVICE[:BAUD]` (for example
    /// `/dev/ttyUSB0:115200`). Also read from the `EA_SERIAL_PORTS` environment variable
    /// (comma-separated) when this is empty.
    public var serialPorts: [String]
    /// Whether to take accessories over Bluetooth as well (the iAP2 service registered with
    /// BlueZ; paired accessories connect to it). Off by default; also switched on by the
    /// `EA_BLUETOOTH=1` environment variable. Why it cannot start (BlueZ not running, the
    /// adapter off…) is logged with the command that fixes it.
    public var bluetooth: Bool
    /// Where the manager says why an accessory was not listed or a session did not open:
    /// standard error at warning level by default, as iOS logs to the console.
    public var logger: Logger

    /// The defaults: declarations looked up, USB followed, serial ports from the environment.
    public init(supportedProtocols: [String]? = nil, usb: Bool = true, serialPorts: [String] = [], bluetooth: Bool = false,
                logger: Logger = Logger(label: "ExternalAccessory", logLevel: .warning, handler: StderrLogHandler())) {
        self.supportedProtocols = supportedProtocols
        self.usb = usb
        self.bluetooth = bluetooth
        self.serialPorts = serialPorts
        self.logger = logger
    }
}

/// The shared manager's state before and after it is made.
private struct SharedManagerState: ~Copyable {
    var options = EAHostOptions()
    var manager: EAAccessoryManager?
}

private let sharedManager = Mutex(SharedManagerState())

/// Lists the accessories connected to the machine and announces their comings and goings: the
/// ExternalAccessory framework's `EAAccessoryManager`, on top of AccessoryHost's
/// `AccessoryManager`.
///
/// As on iOS, only accessories that declare at least one protocol the app declares are listed
/// and announced (``declaredProtocols``), notifications are posted only after
/// ``registerForLocalNotifications()``, and they are posted on the main queue (the main thread
/// of an app running its main run loop; after `dispatchMain()`, a thread of Dispatch): a Linux app runs
/// its main run loop (`RunLoop.main.run()`) or `dispatchMain()` as a UIKit app's does for it.
///
/// What Linux does not have: the Bluetooth accessory picker
/// (``showBluetoothAccessoryPicker(withNameFilter:completion:)`` completes with
/// ``EABluetoothAccessoryPickerError/Code/resultFailed``) and Wi-Fi accessory configuration
/// (`EAWiFiUnconfiguredAccessoryBrowser` is declared unavailable, so code using it does not
/// compile and says why).
///
/// Thread safety: every member may be used from any thread.
public final class EAAccessoryManager: NSObject, @unchecked Sendable {
    // Confinement: `state` is the only mutable storage, behind its lock.
    private struct State {
        var accessories: [Int: EAAccessory] = [:]
        /// Connection ids in the order the accessories came.
        var order: [Int] = []
        var registrations = 0
    }

    /// The AccessoryHost manager underneath (Linux only): attach further transports to it
    /// (`host.attach(_:)`, a simulated accessory for an app's tests), or use the native API
    /// beside the facade.
    public let host: AccessoryManager
    /// The protocols the app declares (iOS's `UISupportedExternalAccessoryProtocols`), as found
    /// when the manager was made: ``EAHostOptions/supportedProtocols`` when given, else the
    /// comma-separated `EA_SUPPORTED_PROTOCOLS` environment variable, else the
    /// `UISupportedExternalAccessoryProtocols` array of an `Info.plist` beside the executable or
    /// in the main bundle. Empty means the app declared none, and then (as on iOS) no accessory
    /// is listed; the manager says so on its logger.
    public let declaredProtocols: [String]
    private let logger: Logger
    private let state = Mutex(State())
    /// Where the host's events are handled, in order.
    let eventQueue = DispatchQueue(label: "ExternalAccessory.events")
    private var subscription: EventSubscription?

    /// The shared accessory manager, made (and started) on first use with the options given
    /// to ``configure(_:)``.
    public class func shared() -> EAAccessoryManager {
        sharedManager.withLock { shared in
            if let manager = shared.manager { return manager }
            let manager = EAAccessoryManager(options: shared.options)
            shared.manager = manager
            return manager
        }
    }

    /// Sets how the shared manager finds accessories and what the app declares (Linux only).
    /// Call it before the first ``shared()``, in the app's entry point.
    ///
    /// - Returns: false when the shared manager exists already (the options are not applied).
    @discardableResult
    public class func configure(_ options: EAHostOptions) -> Bool {
        sharedManager.withLock { shared in
            guard shared.manager == nil else { return false }
            shared.options = options
            return true
        }
    }

    /// A manager of its own (Linux only; apps use ``shared()``): for tests, or a tool that
    /// runs several. It starts at once; ``stop()`` ends it.
    public init(options: EAHostOptions) {
        let declared = options.supportedProtocols ?? Self.lookUpDeclaredProtocols()
        declaredProtocols = declared
        logger = options.logger
        // Verified and reported, every accessory accepted: what the core leaves to its users.
        host = AccessoryManager(configuration: .init(supportedProtocols: declared, authentication: VerifyingAuthentication(mode: .record), logger: options.logger))
        super.init()
        if declared.isEmpty {
            logger.warning("the app declares no accessory protocols, so no accessory is listed: declare them in EAHostOptions.supportedProtocols, EA_SUPPORTED_PROTOCOLS, or UISupportedExternalAccessoryProtocols in an Info.plist beside the executable")
        }
        subscription = host.onEvent(queue: eventQueue) { [weak self] event in
            self?.handle(event)
        }
        var ports = options.serialPorts
        if ports.isEmpty, let listed = ProcessInfo.processInfo.environment["EA_SERIAL_PORTS"] {
            ports = listed.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        }
        for port in ports {
            do {
                host.attach(try SerialTransport(spec: try SerialPortSpec(parsing: port)))
            } catch {
                logger.error("serial port \(port): \(error)")
            }
        }
        if options.usb {
            do {
                try host.startUSB()
            } catch {
                logger.notice("USB accessories are not followed: \(error)")
            }
        }
        if options.bluetooth || ProcessInfo.processInfo.environment["EA_BLUETOOTH"] == "1" {
            let host = self.host
            let logger = self.logger
            Task {
                do { try await host.startBluetooth() } catch { logger.error("Bluetooth accessories are not taken: \(error)") }
            }
        }
    }

    /// Stops the manager (Linux only): accessories disconnect and their sessions end. The shared
    /// manager runs as long as the process does.
    public func stop() {
        host.stop()
    }

    /// The accessories connected now that declare a protocol the app declares, in the order
    /// they came.
    public var connectedAccessories: [EAAccessory] {
        state.withLock { state in state.order.compactMap { state.accessories[$0] } }
    }

    /// Starts posting `EAAccessoryDidConnect` and
    /// `EAAccessoryDidDisconnect` (on `NotificationCenter.default`, on the
    /// main queue). Calls nest: each one is undone by one ``unregisterForLocalNotifications()``.
    public func registerForLocalNotifications() {
        state.withLock { $0.registrations += 1 }
    }

    /// Stops the notifications ``registerForLocalNotifications()`` started.
    public func unregisterForLocalNotifications() {
        state.withLock { $0.registrations = max(0, $0.registrations - 1) }
    }

    /// iOS's Bluetooth accessory picker. Linux has none: `completion` is called on the main
    /// thread with ``EABluetoothAccessoryPickerError/Code/resultFailed``, whose description says
    /// what to do instead (pair with `bluetoothctl`, then take Bluetooth accessories with
    /// ``EAHostOptions/bluetooth``).
    public func showBluetoothAccessoryPicker(withNameFilter predicate: NSPredicate?,
                                             completion: EABluetoothAccessoryPickerCompletion? = nil) {
        guard let completion else { return }
        let box = QueueBound(completion, on: .main)
        DispatchQueue.main.async { box.value(EABluetoothAccessoryPickerError(.resultFailed)) }
    }

    /// Whether the app declares `protocolString`.
    func declares(_ protocolString: String) -> Bool { declaredProtocols.contains(protocolString) }

    private func handle(_ event: AccessoryEvent) {
        switch event {
        case let .connected(accessory):
            let declared = Set(declaredProtocols)
            guard accessory.protocolStrings.contains(where: declared.contains) else {
                logger.notice("accessory \(accessory.name) is not listed: it declares none of the app's protocols (\(accessory.protocolStrings.joined(separator: ", ")))")
                return
            }
            let wrapped = EAAccessory(accessory, declaredProtocols: declared, logger: logger)
            let notify = state.withLock { state -> Bool in
                state.accessories[accessory.connectionID] = wrapped
                state.order.append(accessory.connectionID)
                return state.registrations > 0
            }
            if notify { post(.EAAccessoryDidConnect, wrapped) }
        case let .disconnected(accessory, _):
            let (gone, notify) = state.withLock { state -> (EAAccessory?, Bool) in
                state.order.removeAll { $0 == accessory.connectionID }
                return (state.accessories.removeValue(forKey: accessory.connectionID), state.registrations > 0)
            }
            guard let gone else { return }
            DispatchQueue.main.async {
                gone.delegate?.accessoryDidDisconnect(gone)
                if notify { Self.postNow(.EAAccessoryDidDisconnect, gone, from: self) }
            }
        case let .failed(location, reason):
            logger.notice("\(location): \(reason)")
        case let .appLaunchRequested(accessory, request):
            let (listed, notify) = state.withLock { state in (state.accessories[accessory.connectionID], state.registrations > 0) }
            guard let listed, notify else { return }
            let bundleIdentifier = request.bundleIdentifier
            DispatchQueue.main.async {
                NotificationCenter.default.post(name: .EAAccessoryDidRequestAppLaunch, object: self,
                                                userInfo: [EAAccessoryKey: listed, EAAccessoryAppBundleIdentifierKey: bundleIdentifier])
            }
        }
    }

    private func post(_ name: Notification.Name, _ accessory: EAAccessory) {
        DispatchQueue.main.async { Self.postNow(name, accessory, from: self) }
    }

    private static func postNow(_ name: Notification.Name, _ accessory: EAAccessory, from manager: EAAccessoryManager) {
        NotificationCenter.default.post(name: name, object: manager, userInfo: [EAAccessoryKey: accessory])
    }

    /// The declarations of the environment, else of an Info.plist.
    static func lookUpDeclaredProtocols() -> [String] {
        if let listed = ProcessInfo.processInfo.environment["EA_SUPPORTED_PROTOCOLS"] {
            return listed.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        }
        let key = "UISupportedExternalAccessoryProtocols"
        if let declared = Bundle.main.object(forInfoDictionaryKey: key) as? [String] { return declared }
        guard let executable = Bundle.main.executableURL else { return [] }
        let plist = executable.deletingLastPathComponent().appendingPathComponent("Info.plist")
        guard let data = try? Data(contentsOf: plist),
              let dictionary = try? PropertyListSerialization.propertyList(from: data, format: nil) as? [String: Any] else { return [] }
        return dictionary[key] as? [String] ?? []
    }
}

extension NSNotification.Name {
    /// Posted (after ``EAAccessoryManager/registerForLocalNotifications()``) on the main queue
    /// when an accessory the app can talk to is connected; `userInfo[EAAccessoryKey]` is the
    /// ``EAAccessory``.
    public static let EAAccessoryDidConnect = NSNotification.Name("EAAccessoryDidConnectNotification")
    /// Posted (after ``EAAccessoryManager/registerForLocalNotifications()``) on the main queue
    /// when a listed accessory goes away; `userInfo[EAAccessoryKey]` is the ``EAAccessory``,
    /// whose `isConnected` is false by then.
    public static let EAAccessoryDidDisconnect = NSNotification.Name("EAAccessoryDidDisconnectNotification")
    /// Linux only (iOS answers the request itself, offering to open the app): posted (after
    /// ``EAAccessoryManager/registerForLocalNotifications()``) on the main queue when a listed
    /// accessory asks for an application to be launched (RequestAppLaunch);
    /// `userInfo[EAAccessoryKey]` is the ``EAAccessory`` and
    /// `userInfo[EAAccessoryAppBundleIdentifierKey]` the bundle identifier it named (a `String`,
    /// empty when it named none).
    public static let EAAccessoryDidRequestAppLaunch = NSNotification.Name("EAAccessoryDidRequestAppLaunchNotification")
}

/// The `userInfo` key of the application's bundle identifier in
/// `EAAccessoryDidRequestAppLaunch` (Linux only).
public let EAAccessoryAppBundleIdentifierKey = "EAAccessoryAppBundleIdentifierKey"

/// The `userInfo` key of the accessory in the connect and disconnect notifications.
public let EAAccessoryKey = "EAAccessoryKey"
/// The `userInfo` key iOS uses for the accessory the Bluetooth picker selected (never set
/// here: Linux has no picker).
public let EAAccessorySelectedKey = "EAAccessorySelectedKey"
/// The connection id that means "no accessory".
public let EAConnectionIDNone: Int = 0

/// What the Bluetooth accessory picker completes with: nil when an accessory was chosen.
public typealias EABluetoothAccessoryPickerCompletion = ((any Error)?) -> Void

/// The Bluetooth accessory picker's errors (iOS's `EABluetoothAccessoryPickerError`).
public struct EABluetoothAccessoryPickerError: Error, CustomNSError, LocalizedError, Sendable {
    /// Why the picker finished without an accessory.
    public enum Code: Int, Sendable {
        /// The accessory is connected already.
        case alreadyConnected = 0
        /// No accessory was found.
        case resultNotFound = 1
        /// The user cancelled.
        case resultCancelled = 2
        /// The picker failed: on Linux, always (there is no picker).
        case resultFailed = 3
    }

    /// The error domain, as on iOS.
    public static let errorDomain = "EABluetoothAccessoryPickerErrorDomain"
    /// Why.
    public let code: Code

    /// An error with `code`.
    public init(_ code: Code) { self.code = code }

    /// The code as `NSError` carries it.
    public var errorCode: Int { code.rawValue }

    /// The description as `NSError` carries it (its `localizedDescription`).
    public var errorUserInfo: [String: Any] { [NSLocalizedDescriptionKey: errorDescription ?? ""] }

    /// What happened and what to do instead.
    public var errorDescription: String? {
        switch code {
        case .resultFailed:
            "There is no Bluetooth accessory picker on Linux: pair the accessory with bluetoothctl (bluetoothctl pair ADDRESS), then take Bluetooth accessories with EAHostOptions(bluetooth: true) or EA_BLUETOOTH=1"
        case .alreadyConnected: "The accessory is already connected"
        case .resultNotFound: "No accessory was found"
        case .resultCancelled: "The picker was cancelled"
        }
    }
}

/// iOS's browser of Wi-Fi accessories that wait to be configured (Wireless Accessory
/// Configuration). Linux has no such service: the type exists only to say so where code uses it.
@available(*, unavailable, message: "Wireless Accessory Configuration is an iOS service with no Linux counterpart; configure the accessory's Wi-Fi through its own protocol over an EASession")
public final class EAWiFiUnconfiguredAccessoryBrowser {}
