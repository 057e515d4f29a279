internal import USBDescriptors
internal import CLibUSB
internal import Dispatch
internal import Glibc
internal import Synchronization

/// A device as the backend lists it. Holds one reference on `device` (released with
/// ``USBBackend/releaseDevice(_:)``).
struct DeviceSnapshot {
    var device: OpaquePointer
    var bus: UInt8
    var address: UInt8
    var portPath: [UInt8]
    var descriptor: USBDeviceDescriptor
    var configurations: [USBConfigurationDescriptor]
    var activeConfiguration: UInt8?
}

/// Hotplug news from the backend.
enum HotplugChange {
    case arrived(DeviceSnapshot)
    case left(OpaquePointer)
}

/// The seam: every call the USB layer makes into libusb goes through this protocol, so tests can
/// inject each failure (BUSY, ACCESS, a stall, a vanished device…) under the real code paths
/// above it. Return values are libusb's: 0 or a negative `LIBUSB_ERROR_*`.
///
/// Threading: everything is called on the context's event queue except the calls marked
/// *setup queue*, which may wait for the device (a control transfer inside the kernel) and so
/// never run on the event queue.
protocol USBBackend: AnyObject, Sendable {
    /// Every device on the machine now.
    func listDevices() -> Result<[DeviceSnapshot], USBHostError>
    func releaseDevice(_ device: OpaquePointer)
    /// Whether hotplug notifications work here.
    var hasHotplug: Bool { get }
    /// Starts hotplug notifications (existing devices are reported first) on the event queue.
    func startHotplug(_ handler: @escaping (HotplugChange) -> Void) -> Int32
    func stopHotplug()

    /// Opens the device at `bus`/`address`. *Setup queue* (the real backend reads the active
    /// configuration from the device, a control transfer).
    func open(bus: UInt8, address: UInt8) -> Result<OpaquePointer, LibUSBStatus>
    func close(_ handle: OpaquePointer)
    /// 1 when a kernel driver is bound to the interface, 0 when none, or an error.
    func kernelDriverActive(_ handle: OpaquePointer, interface: UInt8) -> Int32
    func detachKernelDriver(_ handle: OpaquePointer, interface: UInt8) -> Int32
    /// The name of the kernel driver bound to an interface, from sysfs.
    func kernelDriverName(bus: UInt8, portPath: [UInt8], configuration: UInt8, interface: UInt8) -> String?
    /// What usbfs can do for the device at `bus`/`address` (`USBDEVFS_GET_CAPABILITIES`), or nil
    /// when it cannot be asked.
    func usbfsCapabilities(bus: UInt8, address: UInt8) -> UInt32?
    /// *Setup queue.*
    func setConfiguration(_ handle: OpaquePointer, _ value: UInt8) -> Int32
    func claimInterface(_ handle: OpaquePointer, _ interface: UInt8) -> Int32
    func releaseInterface(_ handle: OpaquePointer, _ interface: UInt8) -> Int32
    /// *Setup queue.*
    func clearHalt(_ handle: OpaquePointer, endpoint: UInt8) -> Int32
    /// SET_INTERFACE on a claimed interface. *Setup queue.*
    func setInterfaceAltSetting(_ handle: OpaquePointer, interface: UInt8, alternateSetting: UInt8) -> Int32
    /// A USB port reset (`libusb_reset_device`: `USBDEVFS_RESET`, then libusb claims the claimed
    /// interfaces again); LIBUSB_ERROR_NOT_FOUND when the device came back as another one or an
    /// interface could not be claimed again. *Setup queue* (it waits for the re-enumeration).
    func resetDevice(_ handle: OpaquePointer) -> Int32

    func allocateTransfer() -> UnsafeMutablePointer<libusb_transfer>?
    func freeTransfer(_ transfer: UnsafeMutablePointer<libusb_transfer>)
    func submit(_ transfer: UnsafeMutablePointer<libusb_transfer>) -> Int32
    func cancel(_ transfer: UnsafeMutablePointer<libusb_transfer>) -> Int32
    /// Memory usbfs maps for DMA (zero-copy), or nil when the kernel does not give it.
    func allocateDeviceMemory(_ handle: OpaquePointer, length: Int) -> UnsafeMutableRawPointer?
    func freeDeviceMemory(_ handle: OpaquePointer, _ pointer: UnsafeMutableRawPointer, length: Int)

    /// How many times the event loop woke up (for the idle measurement).
    var wakeups: Int { get }
    func shutdown()
}

/// The real backend: one libusb context driven by Dispatch sources on the event queue.
final class LibUSBBackend: USBBackend, @unchecked Sendable {
    // Sendability: `context` is set once; libusb is thread-safe; `hotplug*` and the loop's
    // source table are confined to `queue` or guarded by `sources`.
    let context: OpaquePointer
    let queue: DispatchQueue
    private let sources = Mutex(SourceTable())
    private var timer: (any DispatchSourceTimer)?
    private let wakeupCount = Atomic<Int>(0)
    /// The usbfs descriptor each open handle wraps (``open(bus:address:)``), by handle address.
    private let wrappedDescriptors = Mutex<[UInt: Int32]>([:])
    private var hotplugHandle: libusb_hotplug_callback_handle = 0
    private var hotplugHandler: ((HotplugChange) -> Void)?
    private var stopped = false
    /// `ACCESSORYHOST_USB_DEBUG=1`: the event loop says on standard error which fds it watches
    /// and each wake-up (for diagnosing a loop that does not wake, or wakes too often).
    private let debug = getenv("ACCESSORYHOST_USB_DEBUG") != nil

    private func trace(_ text: @autoclosure () -> String) {
        if debug { let line = "usb-loop: \(text())\n"; _ = line.withCString { write(2, $0, strlen($0)) } }
    }

    init(queue: DispatchQueue) throws(USBHostError) {
        var context: OpaquePointer?
        let status = libusb_init(&context)
        guard status == 0, let context else {
            throw USBHostError(.unavailable, "USB is not available on this machine (libusb_init: \(errorName(status)))",
                           advice: "check that usbfs is mounted at /dev/bus/usb; serial accessories (--serial) still work")
        }
        self.context = context
        self.queue = queue
        startLoop()
    }

    // MARK: Event loop

    private func startLoop() {
        let me = Unmanaged.passUnretained(self).toOpaque()
        libusb_set_pollfd_notifiers(context, { fd, events, user in
            guard let user else { return }
            Unmanaged<LibUSBBackend>.fromOpaque(user).takeUnretainedValue().addSources(fd: fd, events: events)
        }, { fd, user in
            guard let user else { return }
            Unmanaged<LibUSBBackend>.fromOpaque(user).takeUnretainedValue().removeSources(fd: fd)
        }, me)
        if let list = libusb_get_pollfds(context) {
            var index = 0
            while let entry = list[index] {
                addSources(fd: entry.pointee.fd, events: entry.pointee.events)
                index += 1
            }
            libusb_free_pollfds(list)
        }
        if libusb_pollfds_handle_timeouts(context) == 0 {
            // Not on Linux (libusb uses a timerfd there), but honoured where it applies.
            let timer = DispatchSource.makeTimerSource(queue: queue)
            timer.setEventHandler { [weak self] in self?.handleEvents() }
            timer.schedule(deadline: .distantFuture)
            timer.resume()
            self.timer = timer
        }
    }

    /// usbfs reports finished URBs as writable (POLLOUT), the event fd and timerfd as readable:
    /// one source per direction, each on its own dup() because libusb closes its fd right after
    /// it asks for the removal, and the number is reused at once.
    private func addSources(fd: Int32, events: Int16) {
        trace("watch fd \(fd) events 0x\(String(events, radix: 16))")
        var made: [any DispatchSourceProtocol] = []
        if events & Int16(POLLIN) != 0 {
            let copy = dup(fd)
            if copy >= 0 {
                let source = DispatchSource.makeReadSource(fileDescriptor: copy, queue: queue)
                source.setEventHandler { [weak self] in
                    self?.trace("fd \(fd) readable")
                    self?.handleEvents()
                }
                source.setCancelHandler { Glibc.close(copy) }
                made.append(source)
            }
        }
        if events & Int16(POLLOUT) != 0 {
            let copy = dup(fd)
            if copy >= 0 {
                let source = DispatchSource.makeWriteSource(fileDescriptor: copy, queue: queue)
                source.setEventHandler { [weak self] in
                    self?.trace("fd \(fd) writable")
                    self?.handleEvents()
                }
                source.setCancelHandler { Glibc.close(copy) }
                made.append(source)
            }
        }
        let replaced = sources.withLock { table -> [any DispatchSourceProtocol]? in
            defer { table.byFD[fd] = made }
            return table.byFD[fd]
        }
        for source in replaced ?? [] { source.cancel() }
        for source in made { source.resume() }
    }

    private func removeSources(fd: Int32) {
        trace("unwatch fd \(fd)")
        let removed = sources.withLock { $0.byFD.removeValue(forKey: fd) }
        for source in removed ?? [] { source.cancel() }
    }

    private func handleEvents() {
        guard !stopped else { return }
        wakeupCount.add(1, ordering: .relaxed)
        var zero = timeval()
        let status = libusb_handle_events_timeout_completed(context, &zero, nil)
        trace("wake-up \(wakeupCount.load(ordering: .relaxed)): handle_events \(status)")
        if let timer {
            var next = timeval()
            if libusb_get_next_timeout(context, &next) == 1 {
                let nanoseconds = Int(next.tv_sec) * 1_000_000_000 + Int(next.tv_usec) * 1_000
                timer.schedule(deadline: .now() + .nanoseconds(nanoseconds))
            } else {
                timer.schedule(deadline: .distantFuture)
            }
        }
    }

    var wakeups: Int { wakeupCount.load(ordering: .relaxed) }

    // MARK: Devices

    func listDevices() -> Result<[DeviceSnapshot], USBHostError> {
        var list: UnsafeMutablePointer<OpaquePointer?>?
        let count = libusb_get_device_list(context, &list)
        guard count >= 0, let list else {
            return .failure(USBHostError(code: Int32(count), "cannot list USB devices"))
        }
        defer { libusb_free_device_list(list, 1) }
        var snapshots: [DeviceSnapshot] = []
        for index in 0..<count {
            if let device = list[index], let snapshot = Self.snapshot(device) { snapshots.append(snapshot) }
        }
        return .success(snapshots)
    }

    /// Reads what libusb cached for `device` (no I/O on Linux: sysfs) and takes a reference.
    static func snapshot(_ device: OpaquePointer) -> DeviceSnapshot? {
        var raw = libusb_device_descriptor()
        guard libusb_get_device_descriptor(device, &raw) == 0 else { return nil }
        let descriptor = USBDeviceDescriptor(
            vendorID: raw.idVendor, productID: raw.idProduct, release: raw.bcdDevice, deviceClass: raw.bDeviceClass,
            manufacturerIndex: raw.iManufacturer, productIndex: raw.iProduct, serialNumberIndex: raw.iSerialNumber,
            configurationCount: raw.bNumConfigurations)
        var configurations: [USBConfigurationDescriptor] = []
        for index in 0..<raw.bNumConfigurations {
            var config: UnsafeMutablePointer<libusb_config_descriptor>?
            guard libusb_get_config_descriptor(device, index, &config) == 0, let config else { continue }
            configurations.append(convert(config.pointee))
            libusb_free_config_descriptor(config)
        }
        var active: UInt8?
        var activeConfig: UnsafeMutablePointer<libusb_config_descriptor>?
        if libusb_get_active_config_descriptor(device, &activeConfig) == 0, let activeConfig {
            active = activeConfig.pointee.bConfigurationValue
            libusb_free_config_descriptor(activeConfig)
        }
        var ports = [UInt8](repeating: 0, count: 8)
        let depth = libusb_get_port_numbers(device, &ports, Int32(ports.count))
        _ = libusb_ref_device(device)
        return DeviceSnapshot(device: device, bus: libusb_get_bus_number(device), address: libusb_get_device_address(device),
                              portPath: Array(ports.prefix(Int(max(depth, 0)))), descriptor: descriptor,
                              configurations: configurations, activeConfiguration: active)
    }

    private static func convert(_ config: libusb_config_descriptor) -> USBConfigurationDescriptor {
        var interfaces: [USBInterfaceDescriptor] = []
        for i in 0..<Int(config.bNumInterfaces) {
            let interface = config.interface[i]
            for a in 0..<Int(interface.num_altsetting) {
                let alt = interface.altsetting[a]
                var endpoints: [USBEndpointDescriptor] = []
                for e in 0..<Int(alt.bNumEndpoints) {
                    let endpoint = alt.endpoint[e]
                    endpoints.append(USBEndpointDescriptor(address: endpoint.bEndpointAddress, attributes: endpoint.bmAttributes,
                                                           maxPacketSize: endpoint.wMaxPacketSize, interval: endpoint.bInterval))
                }
                interfaces.append(USBInterfaceDescriptor(
                    number: alt.bInterfaceNumber, alternateSetting: alt.bAlternateSetting, interfaceClass: alt.bInterfaceClass,
                    interfaceSubclass: alt.bInterfaceSubClass, interfaceProtocol: alt.bInterfaceProtocol,
                    nameIndex: alt.iInterface, endpoints: endpoints))
            }
        }
        return USBConfigurationDescriptor(value: config.bConfigurationValue, nameIndex: config.iConfiguration,
                                          attributes: config.bmAttributes, maxPower: config.MaxPower, interfaces: interfaces)
    }

    func releaseDevice(_ device: OpaquePointer) { libusb_unref_device(device) }

    var hasHotplug: Bool { libusb_has_capability(UInt32(LIBUSB_CAP_HAS_HOTPLUG.rawValue)) != 0 }

    func startHotplug(_ handler: @escaping (HotplugChange) -> Void) -> Int32 {
        dispatchPrecondition(condition: .onQueue(queue))
        hotplugHandler = handler
        let events = Int32(LIBUSB_HOTPLUG_EVENT_DEVICE_ARRIVED.rawValue | LIBUSB_HOTPLUG_EVENT_DEVICE_LEFT.rawValue)
        // Callbacks run inside libusb_handle_events (on the event queue), and for ENUMERATE
        // inside this call (on the event queue too).
        return libusb_hotplug_register_callback(
            context, events, Int32(LIBUSB_HOTPLUG_ENUMERATE.rawValue), LIBUSB_HOTPLUG_MATCH_ANY, LIBUSB_HOTPLUG_MATCH_ANY,
            LIBUSB_HOTPLUG_MATCH_ANY, { _, device, event, user in
                guard let user, let device else { return 0 }
                let backend = Unmanaged<LibUSBBackend>.fromOpaque(user).takeUnretainedValue()
                if event == LIBUSB_HOTPLUG_EVENT_DEVICE_ARRIVED {
                    if let snapshot = LibUSBBackend.snapshot(device) { backend.hotplugHandler?(.arrived(snapshot)) }
                } else {
                    backend.hotplugHandler?(.left(device))
                }
                return 0
            }, Unmanaged.passUnretained(self).toOpaque(), &hotplugHandle)
    }

    func stopHotplug() {
        guard hotplugHandler != nil else { return }
        libusb_hotplug_deregister_callback(context, hotplugHandle)
        hotplugHandler = nil
    }

    // MARK: Handles

    /// Opens the usbfs node itself and hands the descriptor to libusb (`libusb_wrap_sys_device`)
    /// instead of `libusb_open`, which is what keeps libusb 1.0.26 from aborting the process.
    ///
    /// The rule: a device handle's libusb mutex must only ever be locked and unlocked in pairs,
    /// because `libusb_close` destroys it and libusb asserts that the destroy succeeds. libusb
    /// 1.0.26 (Debian 12) breaks that itself: `libusb_set_interface_alt_setting` on a handle whose
    /// device libusb has marked detached unlocks the handle's mutex without having locked it
    /// (libusb issue #1199, fixed in 1.0.27), so the next `libusb_close` fails
    /// `pthread_mutex_destroy` (EBUSY) and aborts. libusb marks a device detached on its own udev
    /// thread as soon as the kernel reports the unplug, so no ordering on our queues can keep a
    /// SET_INTERFACE (a native transport opening or closing) from meeting an accessory that just
    /// went away. A wrapped handle has a device of its own that libusb never lists and so never
    /// marks detached: its SET_INTERFACE always reaches the kernel, which answers ENODEV
    /// (LIBUSB_ERROR_NO_DEVICE) for a vanished device, with the mutex taken and released in pairs.
    /// The descriptor is ours: closed after `libusb_close` (``close(_:)``).
    ///
    /// Setup queue: wrapping reads the descriptors and asks the device for its configuration
    /// (GET_CONFIGURATION, a control transfer of up to a second).
    func open(bus: UInt8, address: UInt8) -> Result<OpaquePointer, LibUSBStatus> {
        let path = "/dev/bus/usb/\(USBDeviceInfo.pad3(bus))/\(USBDeviceInfo.pad3(address))"
        let descriptor = Glibc.open(path, O_RDWR | O_CLOEXEC)
        guard descriptor >= 0 else {
            // libusb's own mapping of open(2) errors (linux_usbfs.c).
            let code: libusb_error = switch errno {
            case EACCES, EPERM: LIBUSB_ERROR_ACCESS
            case ENOENT, ENODEV, ENXIO: LIBUSB_ERROR_NO_DEVICE
            default: LIBUSB_ERROR_IO
            }
            return .failure(LibUSBStatus(code: code.rawValue))
        }
        var handle: OpaquePointer?
        let status = libusb_wrap_sys_device(context, Int(descriptor), &handle)
        guard status == 0, let handle else {
            _ = Glibc.close(descriptor)
            return .failure(LibUSBStatus(code: status == 0 ? LIBUSB_ERROR_OTHER.rawValue : status))
        }
        wrappedDescriptors.withLock { $0[UInt(bitPattern: handle)] = descriptor }
        return .success(handle)
    }

    /// Closes the handle, then the usbfs descriptor it wraps (libusb leaves a wrapped one open).
    func close(_ handle: OpaquePointer) {
        libusb_close(handle)
        let descriptor = wrappedDescriptors.withLock { $0.removeValue(forKey: UInt(bitPattern: handle)) }
        if let descriptor { _ = Glibc.close(descriptor) }
    }
    func kernelDriverActive(_ handle: OpaquePointer, interface: UInt8) -> Int32 { libusb_kernel_driver_active(handle, Int32(interface)) }
    func detachKernelDriver(_ handle: OpaquePointer, interface: UInt8) -> Int32 { libusb_detach_kernel_driver(handle, Int32(interface)) }

    func kernelDriverName(bus: UInt8, portPath: [UInt8], configuration: UInt8, interface: UInt8) -> String? {
        let port = portPath.isEmpty ? "usb\(bus)" : "\(bus)-" + portPath.map(String.init).joined(separator: ".")
        let link = "/sys/bus/usb/devices/\(port):\(configuration).\(interface)/driver"
        var buffer = [CChar](repeating: 0, count: 512)
        let count = readlink(link, &buffer, buffer.count - 1)
        guard count > 0 else { return nil }
        let target = String(decoding: buffer.prefix(count).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return target.split(separator: "/").last.map(String.init)
    }

    func usbfsCapabilities(bus: UInt8, address: UInt8) -> UInt32? {
        // libusb keeps its own descriptor private: ask through a second one (usbfs allows several
        // opens; this one claims nothing and is closed at once).
        let path = "/dev/bus/usb/\(USBDeviceInfo.pad3(bus))/\(USBDeviceInfo.pad3(address))"
        let descriptor = Glibc.open(path, O_RDWR | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { _ = Glibc.close(descriptor) }
        var capabilities: UInt32 = 0
        guard ioctl(descriptor, usbfsGetCapabilities, &capabilities) == 0 else { return nil }
        return capabilities
    }

    func setConfiguration(_ handle: OpaquePointer, _ value: UInt8) -> Int32 { libusb_set_configuration(handle, Int32(value)) }
    func claimInterface(_ handle: OpaquePointer, _ interface: UInt8) -> Int32 { libusb_claim_interface(handle, Int32(interface)) }
    func releaseInterface(_ handle: OpaquePointer, _ interface: UInt8) -> Int32 { libusb_release_interface(handle, Int32(interface)) }
    func clearHalt(_ handle: OpaquePointer, endpoint: UInt8) -> Int32 { libusb_clear_halt(handle, endpoint) }
    func resetDevice(_ handle: OpaquePointer) -> Int32 { libusb_reset_device(handle) }
    func setInterfaceAltSetting(_ handle: OpaquePointer, interface: UInt8, alternateSetting: UInt8) -> Int32 {
        libusb_set_interface_alt_setting(handle, Int32(interface), Int32(alternateSetting))
    }

    func allocateTransfer() -> UnsafeMutablePointer<libusb_transfer>? { libusb_alloc_transfer(0) }
    func freeTransfer(_ transfer: UnsafeMutablePointer<libusb_transfer>) { libusb_free_transfer(transfer) }
    func submit(_ transfer: UnsafeMutablePointer<libusb_transfer>) -> Int32 { libusb_submit_transfer(transfer) }
    func cancel(_ transfer: UnsafeMutablePointer<libusb_transfer>) -> Int32 { libusb_cancel_transfer(transfer) }

    func allocateDeviceMemory(_ handle: OpaquePointer, length: Int) -> UnsafeMutableRawPointer? {
        libusb_dev_mem_alloc(handle, length).map { UnsafeMutableRawPointer($0) }
    }

    func freeDeviceMemory(_ handle: OpaquePointer, _ pointer: UnsafeMutableRawPointer, length: Int) {
        _ = libusb_dev_mem_free(handle, pointer.assumingMemoryBound(to: UInt8.self), length)
    }

    /// Stops the loop and ends the context. Call on the event queue, after every handle closed.
    func shutdown() {
        dispatchPrecondition(condition: .onQueue(queue))
        guard !stopped else { return }
        trace("shutdown: hotplug off")
        stopHotplug()
        stopped = true
        libusb_set_pollfd_notifiers(context, nil, nil, nil)
        let all = sources.withLock { table -> [any DispatchSourceProtocol] in
            defer { table.byFD.removeAll() }
            return table.byFD.values.flatMap { $0 }
        }
        for source in all { source.cancel() }
        timer?.cancel()
        timer = nil
        trace("shutdown: libusb_exit")
        libusb_exit(context)
        trace("shutdown: done")
    }
}

/// The Dispatch sources of each libusb fd. libusb may call the notifiers on another thread
/// (inside any libusb call), hence the lock.
struct SourceTable: @unchecked Sendable {
    // Sendability: only reached through the backend's Mutex; the sources themselves are
    // thread-safe Dispatch objects.
    var byFD: [Int32: [any DispatchSourceProtocol]] = [:]
}

/// A libusb status as an error value (0 is never one).
struct LibUSBStatus: Error {
    var code: Int32
}

/// libusb's name for an error code, e.g. `LIBUSB_ERROR_BUSY`.
/// `USBDEVFS_GET_CAPABILITIES` from linux/usbdevice_fs.h: `_IOR('U', 26, __u32)`.
let usbfsGetCapabilities: UInt = 0x8004_551A
/// `USBDEVFS_CAP_BULK_SCATTER_GATHER`: the controller takes a large bulk transfer as one URB.
let usbfsCapabilityBulkScatterGather: UInt32 = 0x08

func errorName(_ code: Int32) -> String {
    String(cString: libusb_error_name(code))
}
