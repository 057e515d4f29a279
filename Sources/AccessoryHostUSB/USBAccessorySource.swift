public import AccessoryHost
public import Dispatch
internal import Glibc
internal import QueueConfinement
package import USBHost
internal import USBTransport

/// USB as a source of accessories for an ``AccessoryHost/AccessoryManager``: libusb's hotplug
/// (or polling) finds every device with an iAP interface, and each one opened becomes a
/// connection of the manager. Made by ``AccessoryHost/AccessoryManager/startUSB(options:)``.
public final class USBAccessorySource: AccessorySource {
    /// The libusb context the source runs, on the manager's queue.
    package let context: USBContext

    init(context: USBContext) { self.context = context }

    /// Releases every device once its transfers are back and frees the context.
    public func stop() { context.shutdown() }

    /// Waits until libusb's context is gone (a transport that had to abandon transfers the
    /// kernel never gave back leaves it alive on purpose: then until `deadline`).
    public func waitUntilReleased(deadline: DispatchTime) { _ = context.waitUntilExited(timeout: deadline) }

    /// Follows the devices: every accessory that arrives is opened and attached to `manager`.
    func start(on manager: AccessoryManager) {
        let logger = manager.configuration.logger
        let context = self.context
        QueueMark.run(on: manager.queue) {
            do {
                try context.startMonitoring { [weak manager] event in
                    guard let manager else { return }
                    Self.handle(event, context: context, manager: manager)
                }
                logger.debug("USB: following devices by \(context.usesHotplug ? "hotplug" : "polling")")
            } catch {
                logger.error("USB: \(error)")
            }
        }
    }

    private static func handle(_ event: USBDeviceEvent, context: USBContext, manager: AccessoryManager) {
        let logger = manager.configuration.logger
        switch event {
        case let .arrived(device):
            guard device.function != nil else {
                logger.trace("USB: \(device) has no iAP interface")
                return
            }
            logger.info("USB: accessory \(device) at \(device.devicePath)")
            let opening = manager.beginOpening()
            context.open(device) { result in
                switch result {
                case let .success(transport):
                    opening.attach(USBIAPTransport(transport))
                case let .failure(error):
                    logger.error("USB: \(error)")
                    opening.fail(location: "usb \(device.location) \(device.descriptor.idString)", reason: error.description)
                }
            }
        case let .left(device):
            guard device.function != nil else { return }
            logger.info("USB: \(device) unplugged")
        }
    }
}

extension AccessoryManager {
    /// Starts finding USB accessories: every device with an iAP interface (FF/F0/00), present
    /// now or plugged in later, is opened and its accessory authenticated and identified, then
    /// announced like any other. Devices are followed by libusb hotplug, or by polling where
    /// hotplug is missing or turned off in `options`.
    ///
    /// A device that cannot be opened (permissions, another program holds it) is reported as
    /// ``AccessoryHost/AccessoryEvent/failed(location:reason:)`` with what to do about it.
    ///
    /// - Throws: ``USBError`` of kind `.unavailable` when the machine has no USB (no
    ///   usbfs); other transports keep working.
    ///
    /// With `AccessoryManager.Configuration.daemon` `.automatic` (the default)
    /// and the daemon's socket present, the accessories come through the daemon instead
    /// (`AccessoryManager.connectToDaemon(socketPath:)`): the same `Accessory`
    /// and `AccessorySession` API, shared with other processes. When the daemon cannot be
    /// reached, that is logged and devices are opened here.
    public func startUSB(options: USBOptions = USBOptions()) throws(USBError) {
        if configuration.daemon == .automatic, access(configuration.daemonSocketPath, F_OK) == 0 {
            do {
                try connectToDaemon()
                return
            } catch {
                configuration.logger.warning("\(error); opening USB devices directly")
            }
        }
        let context: USBContext
        do {
            context = try USBContext(queue: queue, function: .iAP2, options: options.context)
        } catch {
            throw USBError(error)
        }
        startUSB(context: context)
    }

    /// Starts USB discovery on `context`, which must run on ``AccessoryHost/AccessoryManager/queue``.
    func startUSB(context: USBContext) {
        precondition(context.queue === queue, "the USB context must run on the manager's queue")
        let source = USBAccessorySource(context: context)
        guard addSource(source) else { return QueueMark.run(on: queue) { context.shutdown() } }
        source.start(on: self)
    }

    /// The counters of a USB accessory's bulk pipes (transfers, bytes, stalls, zero-length
    /// packets, slots in device memory…); nil for accessories on other transports.
    public func usbStatistics(of accessory: Accessory) -> USBPipeStatistics? {
        accessory.transportCapability(USBPipeCounters.self).map(USBPipeStatistics.init)
    }

    /// The USB context, once ``startUSB(options:)`` ran.
    package var usbContext: USBContext? { source(USBAccessorySource.self)?.context }
}
