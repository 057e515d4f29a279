package import USBDescriptors
internal import CLibUSB
internal import QueueConfinement
package import Dispatch

/// How the USB layer behaves.
package struct USBContextOptions: Sendable, Hashable {
    /// Bulk IN transfers always queued per accessory (each over its own ring slot).
    package var inTransfers = 4
    /// Bytes per IN transfer, or `nil` to choose per device (the default): 65,536 where usbfs
    /// says the host controller does scatter-gather (one URB carries the whole transfer, and any
    /// link packet fits in one transfer, so the frame scanner reads every packet in place), and
    /// 16,384 elsewhere: there libusb splits larger transfers into chained 16 KiB URBs, which
    /// loses data on some controllers (the Raspberry Pi's dwc2) when a short packet ends them
    /// (PROTOCOL.md §4.6). The size in use is in ``USBPipeCounters/inTransferSize``.
    package var inTransferSize: Int? = nil
    /// The automatic ``inTransferSize`` with and without scatter-gather.
    package static let largeInTransferSize = 65_536
    /// The automatic ``inTransferSize`` where the host controller lacks scatter-gather (bytes):
    /// one 16 KiB URB per transfer, which libusb never splits.
    package static let splitInTransferSize = 16_384
    /// OUT transfers in flight at most; further frames wait in order.
    package var outTransfers = 8
    /// Bytes per OUT slot: one whole link packet (at most 65535 bytes).
    package var outTransferSize = 65_536
    /// The most transmit buffers of ``outTransferSize`` bytes in usbfs DMA memory lent to the
    /// link for the packets it sends: a packet is laid out there by the writer, sent from there
    /// and kept there until acknowledged, so it is copied once. Eight are made at open, more
    /// while every one is held (packets queued in the sessions' buffers and in flight), up to
    /// this many. Packets that find none free (over the limit, without device memory, or past
    /// the kernel's usbfs memory limit, `usbfs_memory_mb`, 16 MiB for all devices by default) go
    /// through the OUT slots: one copy more. 0 turns them off.
    package var transmitBuffers = 64
    /// Take ring slots from usbfs DMA memory (`libusb_dev_mem_alloc`) when the kernel offers it.
    package var useDeviceMemory = true
    /// Detach a kernel driver bound to the iAP interface (none is expected) instead of failing.
    package var detachKernelDriver = true
    /// Use libusb hotplug notifications; false (or no hotplug support) polls the device list.
    package var hotplug = true
    /// How often the device list is polled without hotplug.
    package var pollInterval: Duration = .seconds(1)
    /// OUT transfer timeout; doubles after each timeout up to the maximum, back after a success.
    package var outTimeoutMilliseconds: UInt32 = 2_000
    /// The longest the OUT transfer timeout grows to by doubling, in milliseconds.
    package var maxOutTimeoutMilliseconds: UInt32 = 30_000
    /// Transfer errors in a row after which the transport gives up. The transfers in flight when
    /// one fails count as one; each round is retried after a back-off of 20 ms doubling to 1 s,
    /// so the default 8 spans about 2.3 s.
    package var maxConsecutiveErrors = 8
    /// Frames allowed to wait for a free OUT slot (the link window keeps it far below this).
    package var maxQueuedFrames = 1_024
    /// How long a teardown waits for libusb to give cancelled transfers back.
    package var teardownTimeoutMilliseconds = 2_000
    /// Timeout of each string-descriptor read at open.
    package var stringTimeoutMilliseconds: UInt32 = 1_000

    /// The defaults, which suit accessories on any Linux host controller.
    package init() {}
}

/// A device came or went.
package enum USBDeviceEvent: Sendable {
    /// A device appeared (at start, every device already there arrives once).
    case arrived(USBDeviceInfo)
    /// A device went away (unplugged, reset or re-enumerated after a reboot): the info it arrived with.
    case left(USBDeviceInfo)
}

struct DeviceKey: Hashable { var bus: UInt8; var address: UInt8 }

extension USBDeviceInfo {
    /// The device's bus and address, as a key of the context's table of known devices.
    var key: DeviceKey { DeviceKey(bus: bus, address: address) }
}

/// One libusb context with its Dispatch event loop: lists devices, follows hotplug (or polls),
/// and opens accessories as ``USBAccessoryTransport``s.
///
/// Everything runs on ``queue`` (give it the queue that owns your protocol state, as
/// `AccessoryManager` does, and no hop is needed). No thread blocks inside libusb: the loop
/// calls `libusb_handle_events_timeout_completed` with a zero timeout when a source fires, and
/// the calls that wait for the device (opening it, which reads its configuration;
/// SET_CONFIGURATION, SET_INTERFACE, CLEAR_FEATURE(HALT)) run on a separate setup queue.
package final class USBContext: @unchecked Sendable {
    // Sendability: every stored var is touched on `queue` only.

    /// The queue that runs the event loop, every callback and every call that says "call on queue".
    package let queue: DispatchQueue
    /// The options the context was made with (transfer sizes and counts, hotplug, timeouts).
    package let options: USBContextOptions
    /// The interfaces that make a device one this context opens.
    package let function: USBFunctionMatch
    let backend: any USBBackend
    let setupQueue = DispatchQueue(label: "USBHost.setup")
    private var known: [DeviceKey: (OpaquePointer, USBDeviceInfo)] = [:]
    private var monitor: ((USBDeviceEvent) -> Void)?
    private var pollTimer: (any DispatchSourceTimer)?
    private var shutDown = false
    /// Opens in flight and transports not yet finished: libusb's context outlives them all.
    private var openTransports = 0
    /// Signalled once the event loop has stopped and libusb's context is gone.
    private let exited = DispatchSemaphore(value: 0)
    /// Device references taken to open devices that monitoring did not report.
    private var extraReferences: [OpaquePointer] = []

    /// Starts libusb and its event loop on `queue`.
    ///
    /// - Throws: ``USBHostError`` of kind ``USBHostError/Kind/unavailable`` on a machine without USB.
    /// - Parameters:
    ///   - queue: the queue the event loop and every callback run on (give it the queue that
    ///     owns your protocol state, and no hop is needed).
    ///   - function: the interfaces that make a device one this context opens.
    ///   - options: transfer sizes and counts, hotplug or polling, timeouts.
    package convenience init(queue: DispatchQueue, function: USBFunctionMatch, options: USBContextOptions = USBContextOptions()) throws(USBHostError) {
        let backend = try LibUSBBackend(queue: queue)
        self.init(backend: backend, queue: queue, function: function, options: options)
    }

    init(backend: any USBBackend, queue: DispatchQueue, function: USBFunctionMatch, options: USBContextOptions) {
        self.backend = backend
        self.queue = queue
        self.function = function
        self.options = options
        QueueMark.mark(queue)
    }

    /// Whether devices are followed by hotplug notifications (else by polling).
    package var usesHotplug: Bool { options.hotplug && backend.hasHotplug }

    /// How many times the event loop has woken up so far (an idle open accessory should add none).
    package var eventLoopWakeups: Int { backend.wakeups }

    /// Every USB device now, accessories or not. Call on ``queue``.
    package func devices() throws(USBHostError) -> [USBDeviceInfo] {
        dispatchPrecondition(condition: .onQueue(queue))
        let snapshots = try backend.listDevices().get()
        defer { for snapshot in snapshots { backend.releaseDevice(snapshot.device) } }
        return snapshots.map { info($0) }
    }

    func info(_ snapshot: DeviceSnapshot) -> USBDeviceInfo {
        USBDeviceInfo(bus: snapshot.bus, address: snapshot.address, portPath: snapshot.portPath, descriptor: snapshot.descriptor,
                      configurations: snapshot.configurations, activeConfiguration: snapshot.activeConfiguration,
                      function: USBFunctionLocation.find(function, in: snapshot.configurations, activeConfiguration: snapshot.activeConfiguration))
    }

    /// Reports every device present now, then arrivals and departures, to `handler` on
    /// ``queue``: through libusb hotplug when it works here, else by polling every
    /// ``USBContextOptions/pollInterval``. Call on ``queue``, once.
    package func startMonitoring(_ handler: @escaping (USBDeviceEvent) -> Void) throws(USBHostError) {
        dispatchPrecondition(condition: .onQueue(queue))
        precondition(monitor == nil, "startMonitoring is called once per context")
        // A context shut down meanwhile (its manager stopped as USB started) has let libusb go.
        guard !shutDown else { return }
        monitor = handler
        if usesHotplug {
            // Changes are handled after the libusb call that reported them returns (libusb holds
            // its event lock during callbacks); the snapshot holds a device reference till then.
            let status = backend.startHotplug { [weak self] change in
                guard let queue = self?.queue else { return }
                let carried = QueueBound(change, on: queue)
                queue.async { [weak self] in self?.hotplug(carried.value) }
            }
            if status == 0 { return }
        }
        poll()
        let timer = DispatchSource.makeTimerSource(queue: queue)
        let (seconds, attoseconds) = options.pollInterval.components
        let interval = DispatchTimeInterval.nanoseconds(Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000))
        timer.schedule(deadline: .now() + interval, repeating: interval, leeway: .milliseconds(100))
        timer.setEventHandler { [weak self] in self?.poll() }
        timer.resume()
        pollTimer = timer
    }

    private func hotplug(_ change: HotplugChange) {
        switch change {
        case let .arrived(snapshot):
            // libusb may report one arrival twice: a device that appears while the callback is
            // registered with LIBUSB_HOTPLUG_ENUMERATE comes from the enumeration and again from
            // the hotplug queue (libusb's hotplug documentation). Opening it twice would fail the
            // second claim with "in use by usbfs" (our own handle): the repeat is dropped.
            if let previous = known[DeviceKey(bus: snapshot.bus, address: snapshot.address)], previous.0 == snapshot.device {
                backend.releaseDevice(snapshot.device)
                return
            }
            let info = info(snapshot)
            if let previous = known.updateValue((snapshot.device, info), forKey: info.key) { backend.releaseDevice(previous.0) }
            monitor?(.arrived(info))
        case let .left(device):
            guard let entry = known.first(where: { $0.value.0 == device }) else { return }
            known.removeValue(forKey: entry.key)
            backend.releaseDevice(device)
            monitor?(.left(entry.value.1))
        }
    }

    /// The polling fallback: compares the device list with the last one.
    func poll() {
        guard !shutDown, case let .success(snapshots) = backend.listDevices() else { return }
        var seen = Set<DeviceKey>()
        for snapshot in snapshots {
            let info = info(snapshot)
            seen.insert(info.key)
            if known[info.key] == nil {
                known[info.key] = (snapshot.device, info)
                monitor?(.arrived(info))
            } else {
                backend.releaseDevice(snapshot.device)
            }
        }
        for (key, entry) in known where !seen.contains(key) {
            known.removeValue(forKey: key)
            backend.releaseDevice(entry.0)
            monitor?(.left(entry.1))
        }
    }

    /// Opens an accessory: opens the device, reads its strings, selects the configuration with
    /// the iAP interface when another is active, detaches a kernel driver if one is bound (and
    /// the options allow), claims the interface, and hands back the transport (not yet
    /// activated). `completion` runs on ``queue``.
    package func open(_ device: USBDeviceInfo, completion: @escaping (Result<USBAccessoryTransport, USBHostError>) -> Void) {
        dispatchPrecondition(condition: .onQueue(queue))
        guard let location = device.function else {
            return completion(.failure(USBHostError(.notAnAccessory, "\(device) has no interface of class \(function.main) with a bulk pair")))
        }
        guard known[device.key] != nil || findDevice(device.key) != nil else {
            return completion(.failure(USBHostError(.noDevice, "\(device) is no longer connected")))
        }
        // An open in flight keeps the context alive as an open transport does: its steps use
        // libusb from the setup queue and from transfer callbacks until it ends.
        openTransports += 1
        let completion: (Result<USBAccessoryTransport, USBHostError>) -> Void = { [self] result in
            if case .failure = result { transportFinished() }
            completion(result)
        }
        // Opening asks the device for its configuration (the backend's open is a setup-queue
        // call); the rest continues on the queue.
        let backend = self.backend
        let carried = QueueBound(completion, on: queue)
        setupQueue.async { [self] in
            let opened = QueueBound(backend.open(bus: device.bus, address: device.address), on: queue)
            queue.async { [self] in
                let completion = carried.value
                switch opened.value {
                case let .success(handle):
                    readStrings(device, handle: handle, location: location, completion: completion)
                case let .failure(failure):
                    let status = failure.code
                    let error = status == LIBUSB_ERROR_ACCESS.rawValue
                        ? USBHostError(.access, "cannot open \(device) (\(device.devicePath)): permission denied",
                                   advice: USBHostError.accessAdvice(devicePath: device.devicePath), code: status)
                        : USBHostError(code: status, "cannot open \(device) (\(device.devicePath))")
                    completion(.failure(error))
                }
            }
        }
    }

    /// Reads the device's strings (and the native interfaces' names) on a freshly opened handle,
    /// then configures and claims.
    private func readStrings(_ device: USBDeviceInfo, handle: OpaquePointer, location: USBFunctionLocation,
                             completion: @escaping (Result<USBAccessoryTransport, USBHostError>) -> Void) {
        let native = location.nativeInterfaces
        StringReader(backend: backend, handle: handle, descriptor: device.descriptor, extra: native.map(\.nameIndex),
                     timeout: options.stringTimeoutMilliseconds).read { [self] strings in
            // Continue after the libusb call that completed the last read has returned: the
            // steps below may close the device, which deadlocks inside a transfer callback.
            var named = device
            named.manufacturer = strings.manufacturer
            named.product = strings.product
            named.serialNumber = strings.serialNumber
            for interface in native {
                if let name = strings.extra[interface.nameIndex] { named.nativeInterfaceNames[interface.number] = name }
            }
            let next = QueueBound({ [self] in configure(named, handle: handle, location: location, completion: completion) }, on: queue)
            queue.async { next.value() }
        }
    }

    private func findDevice(_ key: DeviceKey) -> OpaquePointer? {
        guard case let .success(snapshots) = backend.listDevices() else { return nil }
        var found: OpaquePointer?
        for snapshot in snapshots {
            if found == nil, snapshot.bus == key.bus, snapshot.address == key.address {
                found = snapshot.device
            } else {
                backend.releaseDevice(snapshot.device)
            }
        }
        if let found { extraReferences.append(found) } // released at shutdown; open() takes its own
        return found
    }

    private func configure(_ device: USBDeviceInfo, handle: OpaquePointer, location: USBFunctionLocation,
                           completion: @escaping (Result<USBAccessoryTransport, USBHostError>) -> Void) {
        guard location.needsConfigurationChange else { return claim(device, handle: handle, location: location, completion: completion) }
        let backend = self.backend
        let onSetup = QueueBound(handle, on: setupQueue)
        let carried = QueueBound((handle, completion), on: queue)
        setupQueue.async { [self] in
            let status = backend.setConfiguration(onSetup.value, location.configurationValue)
            queue.async { [self] in
                let (handle, completion) = carried.value
                guard status == 0 else {
                    backend.close(handle)
                    let advice = status == LIBUSB_ERROR_BUSY.rawValue
                        ? "another interface of the active configuration is in use (\(holders(of: device))); the host has to select configuration \(location.configurationValue) for the iAP interface"
                        : nil
                    return completion(.failure(USBHostError(code: status, "cannot select configuration \(location.configurationValue) of \(device)", advice: advice)))
                }
                claim(device, handle: handle, location: location, completion: completion)
            }
        }
    }

    private func claim(_ device: USBDeviceInfo, handle: OpaquePointer, location: USBFunctionLocation,
                       completion: @escaping (Result<USBAccessoryTransport, USBHostError>) -> Void) {
        let number = location.interface.number
        if backend.kernelDriverActive(handle, interface: number) == 1 {
            let driver = backend.kernelDriverName(bus: device.bus, portPath: device.portPath, configuration: location.configurationValue,
                                                  interface: number) ?? "a kernel driver"
            if options.detachKernelDriver {
                let status = backend.detachKernelDriver(handle, interface: number)
                if status != 0 {
                    backend.close(handle)
                    return completion(.failure(USBHostError(code: status, "cannot detach \(driver) from interface \(number) of \(device)",
                                                        advice: "unbind it by hand: echo \(device.location):\(location.configurationValue).\(number) | sudo tee /sys/bus/usb/drivers/\(driver)/unbind")))
                }
            } else {
                backend.close(handle)
                return completion(.failure(USBHostError(.busy, "interface \(number) of \(device) is held by the kernel driver \(driver)",
                                                    advice: "allow detaching it (drop --no-detach), or unbind it: echo \(device.location):\(location.configurationValue).\(number) | sudo tee /sys/bus/usb/drivers/\(driver)/unbind",
                                                    code: LIBUSB_ERROR_BUSY.rawValue)))
            }
        }
        let deviceHandle = USBDeviceHandle(backend: backend, handle: handle, queue: queue, setupQueue: setupQueue)
        let status = deviceHandle.claimInterface(number)
        guard status == 0 else {
            deviceHandle.close()
            let error: USBHostError = switch status {
            case LIBUSB_ERROR_BUSY.rawValue:
                USBHostError(.busy, "interface \(number) of \(device) is in use by \(holders(of: device, interface: number, configuration: location.configurationValue))",
                         advice: "stop the other program (find it with: fuser -v \(device.devicePath)) and try again", code: status)
            case LIBUSB_ERROR_ACCESS.rawValue:
                USBHostError(.access, "cannot claim interface \(number) of \(device): permission denied",
                         advice: USBHostError.accessAdvice(devicePath: device.devicePath), code: status)
            default:
                USBHostError(code: status, "cannot claim interface \(number) of \(device)")
            }
            return completion(.failure(error))
        }
        var options = options
        options.inTransferSize = options.inTransferSize ?? automaticInTransferSize(for: device)
        let transport = USBAccessoryTransport(device: device, handle: deviceHandle, location: location, options: options,
                                              description: device.description, onFinished: { [self] in transportFinished() })
        completion(.success(transport))
    }

    /// An open that failed, or a transport that finished its teardown: the context exits with
    /// the last one when it was shut down.
    private func transportFinished() {
        openTransports -= 1
        if shutDown, openTransports == 0 { exit() }
    }

    /// 64 KiB IN transfers where usbfs reports scatter-gather for the device's controller (a
    /// transfer is then one URB), 16 KiB otherwise (see ``USBContextOptions/inTransferSize``).
    private func automaticInTransferSize(for device: USBDeviceInfo) -> Int {
        let capabilities = backend.usbfsCapabilities(bus: device.bus, address: device.address) ?? 0
        return capabilities & usbfsCapabilityBulkScatterGather != 0 ? USBContextOptions.largeInTransferSize : USBContextOptions.splitInTransferSize
    }

    /// Who holds an interface: the kernel driver sysfs names, else another process.
    private func holders(of device: USBDeviceInfo, interface: UInt8? = nil, configuration: UInt8? = nil) -> String {
        if let interface, let configuration,
           let driver = backend.kernelDriverName(bus: device.bus, portPath: device.portPath, configuration: configuration, interface: interface) {
            return "the kernel driver \(driver)"
        }
        return "another process, such as usbmuxd or a second iapctl"
    }

    /// Stops monitoring, and the event loop once every transport it opened has finished its
    /// teardown (which needs the loop). Call on ``queue``.
    package func shutdown() {
        dispatchPrecondition(condition: .onQueue(queue))
        guard !shutDown else { return }
        shutDown = true
        pollTimer?.cancel()
        pollTimer = nil
        monitor = nil
        backend.stopHotplug()
        for (pointer, _) in known.values { backend.releaseDevice(pointer) }
        for pointer in extraReferences { backend.releaseDevice(pointer) }
        known.removeAll()
        extraReferences.removeAll()
        if openTransports == 0 { exit() }
    }

    private func exit() {
        backend.shutdown()
        exited.signal()
    }

    /// Waits (off ``queue``) until the context is gone after ``shutdown()``: every transport has
    /// finished and libusb's context was freed. Returns false after `timeout`.
    ///
    /// A program that makes a new context soon after (a second manager, a benchmark's next
    /// phase) waits here: libusb 1.0.26 can trip over a context that is being freed while its
    /// hotplug thread delivers a device that just arrived to every context.
    package func waitUntilExited(timeout: DispatchTime) -> Bool {
        dispatchPrecondition(condition: .notOnQueue(queue))
        guard exited.wait(timeout: timeout) == .success else { return false }
        exited.signal() // for any other waiter
        return true
    }
}

/// Reads the manufacturer, product and serial strings with asynchronous control transfers (no
/// blocking call on the event queue). Any failure just leaves that string nil.
final class StringReader {
    struct Strings {
        var manufacturer: String?
        var product: String?
        var serialNumber: String?
        /// Other strings asked for, by descriptor index.
        var extra: [UInt8: String] = [:]
    }

    private let backend: any USBBackend
    private let handle: OpaquePointer
    private let timeout: UInt32
    private var pending: [(UInt8, (inout Strings, String) -> Void)]
    private var strings = Strings()
    private var language: UInt16 = 0
    private var completion: ((Strings) -> Void)?
    private var transfer: UnsafeMutablePointer<libusb_transfer>?
    private var buffer = [UInt8](repeating: 0, count: 8 + 255)
    private var keepAlive: Unmanaged<StringReader>?

    init(backend: any USBBackend, handle: OpaquePointer, descriptor: USBDeviceDescriptor, extra: [UInt8] = [], timeout: UInt32) {
        self.backend = backend
        self.handle = handle
        self.timeout = timeout
        var pending: [(UInt8, (inout Strings, String) -> Void)] = [
            (descriptor.manufacturerIndex, { $0.manufacturer = $1 }), (descriptor.productIndex, { $0.product = $1 }),
            (descriptor.serialNumberIndex, { $0.serialNumber = $1 }),
        ]
        for index in Set(extra).sorted() { pending.append((index, { $0.extra[index] = $1 })) }
        self.pending = pending.filter { $0.0 != 0 }
    }

    func read(_ completion: @escaping (Strings) -> Void) {
        guard !pending.isEmpty, let transfer = backend.allocateTransfer() else { return completion(strings) }
        self.completion = completion
        self.transfer = transfer
        keepAlive = Unmanaged.passRetained(self)
        request(index: 0) // string 0: the supported languages
    }

    private func request(index: UInt8) {
        guard let transfer else { return }
        buffer.withUnsafeMutableBufferPointer { bytes in
            // GET_DESCRIPTOR(STRING, index, language), device-to-host standard request.
            let setup: [UInt8] = [0x80, 0x06, index, 0x03, UInt8(language & 0xFF), UInt8(language >> 8), 255, 0]
            for (offset, byte) in setup.enumerated() { bytes[offset] = byte }
            transfer.pointee.dev_handle = handle
            transfer.pointee.endpoint = 0
            transfer.pointee.type = UInt8(LIBUSB_TRANSFER_TYPE_CONTROL.rawValue)
            transfer.pointee.timeout = timeout
            transfer.pointee.buffer = bytes.baseAddress
            transfer.pointee.length = Int32(bytes.count)
            transfer.pointee.flags = 0
            transfer.pointee.user_data = Unmanaged.passUnretained(self).toOpaque()
            transfer.pointee.callback = stringTransferCompleted
        }
        if backend.submit(transfer) != 0 { finish() }
    }

    fileprivate func completed() {
        guard let transfer else { return }
        let ok = transfer.pointee.status == LIBUSB_TRANSFER_COMPLETED
        let count = max(0, min(Int(transfer.pointee.actual_length), 255))
        let reply = Array(buffer[8..<(8 + count)])
        if language == 0 {
            // The first language of string 0; US English when the device gives none.
            language = ok && reply.count >= 4 && reply[1] == 0x03 ? UInt16(reply[2]) | UInt16(reply[3]) << 8 : 0x0409
        } else {
            let (_, store) = pending.removeFirst()
            if ok, let text = decodeStringDescriptor(reply) { store(&strings, text) }
        }
        if let (index, _) = pending.first { request(index: index) } else { finish() }
    }

    private func finish() {
        if let transfer { backend.freeTransfer(transfer) }
        transfer = nil
        let completion = self.completion
        self.completion = nil
        let strings = self.strings
        keepAlive?.release()
        keepAlive = nil
        completion?(strings)
    }
}

private func stringTransferCompleted(_ transfer: UnsafeMutablePointer<libusb_transfer>?) {
    guard let transfer, let user = transfer.pointee.user_data else { return }
    Unmanaged<StringReader>.fromOpaque(user).takeUnretainedValue().completed()
}

/// The version of the libusb this process runs on, e.g. `1.0.26` (what `iapctl --version` shows).
package var libusbVersion: String {
    let version = libusb_get_version().pointee
    return "\(version.major).\(version.minor).\(version.micro)"
}
