internal import USBDescriptors
internal import ByteRing
internal import CLibUSB
internal import Dispatch
internal import QueueConfinement

/// One open device: its libusb handle and every call on the handle that claims and releases
/// interfaces, selects alternate settings, clears halts, resets the device or closes it. The
/// calls that wait for the device (SET_INTERFACE, CLEAR_FEATURE(HALT), the port reset) run on
/// the setup queue and report on the context's event queue; the others run where they are
/// called (the event queue).
///
/// The iAP2 transport owns it and closes it once every pipe over it has finished; the pipes
/// (``BulkPipe``, ``BulkPipeLifecycle``) use it and never close it.
final class USBDeviceHandle: @unchecked Sendable {
    // Sendability: nothing here changes after init; libusb allows its calls on a handle from any
    // thread, and those that may wait run on the setup queue by design.
    let backend: any USBBackend
    /// The libusb handle: only the engine's transfers and the device memory it allocates use it
    /// directly.
    let handle: OpaquePointer
    /// The context's event queue: where every completion of the calls below runs.
    let queue: DispatchQueue
    private let setupQueue: DispatchQueue

    init(backend: any USBBackend, handle: OpaquePointer, queue: DispatchQueue, setupQueue: DispatchQueue) {
        self.backend = backend
        self.handle = handle
        self.queue = queue
        self.setupQueue = setupQueue
    }

    /// Runs `body` now when called on the context's queue, else hops there.
    func onQueue(_ body: @escaping () -> Void) {
        if QueueMark.isCurrent(queue) {
            body()
        } else {
            let carried = QueueBound(body, on: queue)
            queue.async { carried.value() }
        }
    }

    /// Claims `interface` (libusb's status: 0, or why not).
    func claimInterface(_ interface: UInt8) -> Int32 { backend.claimInterface(handle, interface) }

    /// Releases a claimed `interface`.
    func releaseInterface(_ interface: UInt8) { _ = backend.releaseInterface(handle, interface) }

    /// Closes the device. Never from inside a transfer callback (libusb's lock is held there).
    func close() { backend.close(handle) }

    /// Selects `alternateSetting` of the claimed `interface` (SET_INTERFACE) on the setup queue;
    /// `completion` gets libusb's status on the context's queue.
    func selectAlternateSetting(_ alternateSetting: UInt8, of interface: UInt8, completion: @escaping (Int32) -> Void) {
        onSetupQueue(completion) { backend, handle in
            backend.setInterfaceAltSetting(handle, interface: interface, alternateSetting: alternateSetting)
        }
    }

    /// Clears a halt on `endpoint` (CLEAR_FEATURE(HALT)) on the setup queue; `completion` gets
    /// libusb's status on the context's queue. Call it once no transfer of that direction is in
    /// flight.
    func clearHalt(_ endpoint: UInt8, completion: @escaping (Int32) -> Void) {
        onSetupQueue(completion) { backend, handle in backend.clearHalt(handle, endpoint: endpoint) }
    }

    /// Resets the device (a USB port reset) on the setup queue; `completion` gets libusb's status
    /// on the context's queue.
    func reset(completion: @escaping (Int32) -> Void) {
        onSetupQueue(completion) { backend, handle in backend.resetDevice(handle) }
    }

    /// Usbfs device memory for ring slots and transmit buffers, when `enabled`.
    func slotAllocator(enabled: Bool) -> DeviceMemoryAllocator? {
        enabled ? DeviceMemoryAllocator(backend: backend, handle: handle) : nil
    }

    private func onSetupQueue(_ completion: @escaping (Int32) -> Void,
                              _ call: @escaping @Sendable (any USBBackend, OpaquePointer) -> Int32) {
        let carried = QueueBound(completion, on: queue)
        setupQueue.async { [self] in
            let status = call(backend, handle)
            queue.async { carried.value(status) }
        }
    }
}

/// Ring slot memory from usbfs (`libusb_dev_mem_alloc`): transfers then need no bounce buffer in
/// the kernel. Declined (nil) where the kernel does not offer it; the ring uses the heap then.
final class DeviceMemoryAllocator: SlotAllocator, @unchecked Sendable {
    // Sendability: used only by the ring's init and releaseMemory, on the event queue.
    let backend: any USBBackend
    let handle: OpaquePointer
    init(backend: any USBBackend, handle: OpaquePointer) {
        self.backend = backend
        self.handle = handle
    }
    func allocate(byteCount: Int) -> UnsafeMutableRawPointer? { backend.allocateDeviceMemory(handle, length: byteCount) }
    func deallocate(_ pointer: UnsafeMutableRawPointer, byteCount: Int) { backend.freeDeviceMemory(handle, pointer, length: byteCount) }
}
