import CLibUSB
import Dispatch
import IAPTransport
import QueueConfinement
import Synchronization
import Testing
import TestThreads
@testable import USBHost
import USBDescriptors

/// The DJI Goggles 3 MFi configuration from PROTOCOL.md §4.2: FF/F0/00 "iAP Interface" with bulk
/// 0x81/0x01 (512), and FF/F0/01 with alternate setting 0 (no endpoints) and 1 (bulk 0x82/0x02).
let djiConfiguration: [UInt8] = [
    0x09, 0x02, 0x40, 0x00, 0x02, 0x01, 0x04, 0x80, 0x01,
    0x09, 0x04, 0x00, 0x00, 0x02, 0xFF, 0xF0, 0x00, 0x05,
    0x07, 0x05, 0x81, 0x02, 0x00, 0x02, 0x00,
    0x07, 0x05, 0x01, 0x02, 0x00, 0x02, 0x00,
    0x09, 0x04, 0x01, 0x00, 0x00, 0xFF, 0xF0, 0x01, 0x06,
    0x09, 0x04, 0x01, 0x01, 0x02, 0xFF, 0xF0, 0x01, 0x06,
    0x07, 0x05, 0x82, 0x02, 0x00, 0x02, 0x00,
    0x07, 0x05, 0x02, 0x02, 0x00, 0x02, 0x00,
]

/// A USB device as the fake backend serves it.
struct FakeDevice {
    var bus: UInt8 = 1
    var address: UInt8 = 5
    var portPath: [UInt8] = [1, 2]
    var descriptor = USBDeviceDescriptor(vendorID: 0x2CA3, productID: 0x1002, manufacturerIndex: 1, productIndex: 2, serialNumberIndex: 3)
    var configurations: [USBConfigurationDescriptor] = [try! USBConfigurationDescriptor(parsing: djiConfiguration)]
    var activeConfiguration: UInt8? = 1
    var strings: [UInt8: String] = [1: "DJI", 2: "Goggles 3", 3: "GG3-0042"]
    var pointer: OpaquePointer { OpaquePointer(bitPattern: 0x1000 + Int(bus) << 8 + Int(address))! }
}

/// The seam's test side: a scripted libusb. Every call is logged; each failure libusb can report
/// is a knob; transfers stay pending until the test completes them (by calling the real
/// completion callback, as libusb_handle_events would) or a wire answers them.
///
/// Confined to `queue` (the context's event queue) except `open`, `clearHalt`,
/// `setConfiguration` and `setInterfaceAltSetting`, which the layer calls on its setup queue;
/// the state is behind a lock for that reason.
final class FakeBackend: USBBackend, @unchecked Sendable {
    struct State {
        var devices: [FakeDevice] = [FakeDevice()]
        var log: [String] = []
        var openStatus: Int32 = 0
        var claimStatus: Int32 = 0
        var kernelDriver: String?
        /// What usbfsCapabilities answers (nil: the node cannot be asked).
        var usbfsCapabilities: UInt32?
        var detachStatus: Int32 = 0
        var setConfigurationStatus: Int32 = 0
        var clearHaltStatuses: [Int32] = []
        /// What SET_INTERFACE answers, in turn (0 once they run out).
        var altSettingStatuses: [Int32] = []
        /// The alternate setting selected per interface.
        var alternateSettings: [UInt8: UInt8] = [:]
        var claimed: Set<UInt8> = []
        var submitStatuses: [Int32] = []
        var zeroPacketFlagSupported = true
        var deviceMemory = true
        var hotplugSupported = true
        var completeCancelled = true
        /// What `resetDevice` returns.
        var resetStatus: Int32 = 0
        var vanished = false
        var openHandles = 0
        var deviceMemoryLive = 0
        var transfersLive = 0
        var submits = 0
        /// Every endpoint a bulk or interrupt transfer was submitted on.
        var submittedEndpoints: Set<UInt8> = []
        /// Each OUT transfer's length and whether it asked for a zero-length packet after it.
        var outTransfers: [(length: Int, zeroPacket: Bool)] = []
    }

    let queue: DispatchQueue
    let state = Mutex(State())
    /// Submitted and not completed, in submission order (event queue only).
    private(set) var pending: [UnsafeMutablePointer<libusb_transfer>] = []
    private var hotplugHandler: ((HotplugChange) -> Void)?
    private var memory: [UnsafeMutableRawPointer: Int] = [:]
    /// Signalled on every submit (for waits on retries that come after a back-off).
    let submitted = DispatchSemaphore(value: 0)

    // The wire mode: OUT bytes go to `wire`, what it receives completes IN transfers.
    private var wire: (any Transport)?
    private var inbound: [UInt8] = []
    /// The iAP2 interface's endpoints (the wire carries only these).
    var wireEndpoints: Set<UInt8> = [0x81, 0x01]

    // Native wires: selecting a native interface's data alternate setting joins its endpoints to
    // a fresh MemoryByteChannel pair, whose accessory side goes to `nativeOpener`; alternate
    // setting 0 closes it. Event queue only.
    struct NativeWire {
        var channel: MemoryByteChannel
        var inEndpoint: UInt8
        var outEndpoint: UInt8
    }
    private var nativeWires: [UInt8: NativeWire] = [:]
    /// Called (event queue) with the interface's name and the accessory side when a host opens
    /// a native interface.
    var nativeOpener: ((String, MemoryByteChannel) -> Void)?
    /// Capacity of each native wire's channels (small values exercise back-pressure).
    var nativeWireCapacity = 256 * 1_024

    init(queue: DispatchQueue) { self.queue = queue }

    /// Signalled on every log entry (for waits on the log: events, not polling).
    private let logged = DispatchSemaphore(value: 0)

    func record(_ entry: String) {
        state.withLock { $0.log.append(entry) }
        logged.signal()
    }
    var log: [String] { state.withLock { $0.log } }

    /// Blocks until `condition` holds of the log, judged after each entry; false when it did not
    /// within `timeout` (which only bounds a hang). For one waiter at a time.
    func waitForLog(timeout: DispatchTimeInterval = .seconds(20), until condition: ([String]) -> Bool) -> Bool {
        expectMayBlock("FakeBackend.waitForLog")
        let deadline = DispatchTime.now() + timeout
        while !condition(log) {
            if logged.wait(timeout: deadline) == .timedOut { return condition(log) }
        }
        return true
    }

    // MARK: USBBackend

    func listDevices() -> Result<[DeviceSnapshot], USBHostError> {
        .success(state.withLock { $0.devices }.map(snapshot))
    }

    func snapshot(_ device: FakeDevice) -> DeviceSnapshot {
        DeviceSnapshot(device: device.pointer, bus: device.bus, address: device.address, portPath: device.portPath,
                       descriptor: device.descriptor, configurations: device.configurations, activeConfiguration: device.activeConfiguration)
    }

    func releaseDevice(_ device: OpaquePointer) {}
    var hasHotplug: Bool { state.withLock { $0.hotplugSupported } }

    func startHotplug(_ handler: @escaping (HotplugChange) -> Void) -> Int32 {
        hotplugHandler = handler
        for device in state.withLock({ $0.devices }) { handler(.arrived(snapshot(device))) }
        return 0
    }

    func stopHotplug() { hotplugHandler = nil }

    /// Reports a present device's arrival again, as libusb may for a device that appeared while
    /// the hotplug callback was registered.
    func repeatArrival(_ device: FakeDevice) { hotplugHandler?(.arrived(snapshot(device))) }

    /// Plugs a device in (hotplug arrival when hotplug runs).
    func plug(_ device: FakeDevice) {
        state.withLock { $0.devices.append(device) }
        hotplugHandler?(.arrived(snapshot(device)))
    }

    /// Unplugs a device: in-flight transfers end with NO_DEVICE, as libusb reports a disconnect.
    func unplug(_ device: FakeDevice) {
        state.withLock {
            $0.devices.removeAll { $0.pointer == device.pointer }
            $0.vanished = true
        }
        hotplugHandler?(.left(device.pointer))
        while let transfer = pending.first { finish(transfer, status: LIBUSB_TRANSFER_NO_DEVICE, actual: 0) }
    }

    /// When set, `open` waits for it (an open held on the setup queue).
    let openGate = Mutex<DispatchSemaphore?>(nil)

    func open(bus: UInt8, address: UInt8) -> Result<OpaquePointer, LibUSBStatus> {
        dispatchPrecondition(condition: .notOnQueue(queue))
        openGate.withLock { $0 }?.wait()
        record("open")
        let status = state.withLock { $0.openStatus }
        guard status == 0 else { return .failure(LibUSBStatus(code: status)) }
        state.withLock { $0.openHandles += 1 }
        return .success(OpaquePointer(bitPattern: 0xABC0)!)
    }

    /// Inside a completion callback (libusb_handle_events): libusb_close there deadlocks on the
    /// real libusb, so the fake refuses it.
    private(set) var inCallback = false

    func close(_ handle: OpaquePointer) {
        precondition(!inCallback, "libusb_close inside a transfer callback deadlocks in libusb")
        record("close")
        state.withLock { $0.openHandles -= 1 }
    }

    func kernelDriverActive(_ handle: OpaquePointer, interface: UInt8) -> Int32 { state.withLock { $0.kernelDriver == nil ? 0 : 1 } }

    func detachKernelDriver(_ handle: OpaquePointer, interface: UInt8) -> Int32 {
        record("detach \(interface)")
        return state.withLock { state in
            if state.detachStatus == 0 { state.kernelDriver = nil }
            return state.detachStatus
        }
    }

    func kernelDriverName(bus: UInt8, portPath: [UInt8], configuration: UInt8, interface: UInt8) -> String? {
        state.withLock { $0.kernelDriver }
    }

    func usbfsCapabilities(bus: UInt8, address: UInt8) -> UInt32? {
        state.withLock { $0.usbfsCapabilities }
    }

    func setConfiguration(_ handle: OpaquePointer, _ value: UInt8) -> Int32 {
        dispatchPrecondition(condition: .notOnQueue(queue))
        record("set configuration \(value)")
        return state.withLock { $0.setConfigurationStatus }
    }

    func claimInterface(_ handle: OpaquePointer, _ interface: UInt8) -> Int32 {
        record("claim \(interface)")
        return state.withLock { state in
            if state.claimStatus == 0 { state.claimed.insert(interface) }
            return state.claimStatus
        }
    }

    func releaseInterface(_ handle: OpaquePointer, _ interface: UInt8) -> Int32 {
        record("release \(interface)")
        state.withLock { _ = $0.claimed.remove(interface) }
        return 0
    }

    func setInterfaceAltSetting(_ handle: OpaquePointer, interface: UInt8, alternateSetting: UInt8) -> Int32 {
        dispatchPrecondition(condition: .notOnQueue(queue))
        record("set interface \(interface) alt \(alternateSetting)")
        return state.withLock { state in
            guard state.claimed.contains(interface) else { return LIBUSB_ERROR_NOT_FOUND.rawValue }
            let status = state.altSettingStatuses.isEmpty ? 0 : state.altSettingStatuses.removeFirst()
            if status == 0 {
                state.alternateSettings[interface] = alternateSetting
                // Before the caller's own hop back to the queue: the wire is ready first.
                queue.async { self.nativeAlternateSettingChanged(interface, alternateSetting) }
            }
            return status
        }
    }

    private func nativeAlternateSettingChanged(_ number: UInt8, _ alternateSetting: UInt8) {
        nativeWires.removeValue(forKey: number)?.channel.close()
        guard alternateSetting != 0 else { return }
        let device = state.withLock { $0.devices.first }
        guard let device, let configuration = device.configurations.first,
              let setting = configuration.interfaces.first(where: { $0.number == number && $0.alternateSetting == alternateSetting }),
              let bulkIn = setting.bulkIn, let bulkOut = setting.bulkOut else { return }
        let name = device.strings[setting.nameIndex] ?? ""
        let (host, accessory) = MemoryByteChannel.pair(name: "fake native \(number)", capacity: nativeWireCapacity)
        nativeWires[number] = NativeWire(channel: host, inEndpoint: bulkIn.address, outEndpoint: bulkOut.address)
        host.activate(queue: queue) { [weak self] _ in self?.pumpNative() }
        nativeOpener?(name, accessory)
    }

    /// Moves bytes between pending native transfers and the native wires: an OUT transfer
    /// completes once its wire took all of it (it waits otherwise: back-pressure), an IN transfer
    /// completes with what the wire has.
    func pumpNative() {
        for wire in nativeWires.values {
            while let out = pending.first(where: { $0.pointee.endpoint == wire.outEndpoint }) {
                let length = Int(out.pointee.length)
                let offset = nativeOutProgress[out] ?? 0
                let bytes = Array(UnsafeRawBufferPointer(start: out.pointee.buffer, count: length)[offset...])
                let taken = bytes.isEmpty ? 0 : wire.channel.write(bytes[...])
                nativeOutProgress[out] = offset + taken
                guard offset + taken == length else { break }
                nativeOutProgress[out] = nil
                finish(out, status: LIBUSB_TRANSFER_COMPLETED, actual: length)
            }
            while wire.channel.readableByteCount > 0, let transfer = pending.first(where: { $0.pointee.endpoint == wire.inEndpoint }) {
                var count = 0
                let room = Int(transfer.pointee.length)
                while count < room, let took = wire.channel.withReadableBytes({ span -> (consumed: Int, result: Int) in
                    let n = min(room - count, span.byteCount)
                    span.withUnsafeBytes { UnsafeMutableRawPointer(transfer.pointee.buffer! + count).copyMemory(from: $0.baseAddress!, byteCount: n) }
                    return (n, n)
                }), took > 0 { count += took }
                finish(transfer, status: LIBUSB_TRANSFER_COMPLETED, actual: count)
            }
        }
    }
    private var nativeOutProgress: [UnsafeMutablePointer<libusb_transfer>: Int] = [:]

    func clearHalt(_ handle: OpaquePointer, endpoint: UInt8) -> Int32 {
        dispatchPrecondition(condition: .notOnQueue(queue))
        record("clear halt 0x\(String(endpoint, radix: 16))")
        return state.withLock { $0.clearHaltStatuses.isEmpty ? 0 : $0.clearHaltStatuses.removeFirst() }
    }

    func resetDevice(_ handle: OpaquePointer) -> Int32 {
        dispatchPrecondition(condition: .notOnQueue(queue))
        record("reset device")
        return state.withLock { $0.resetStatus }
    }

    func allocateTransfer() -> UnsafeMutablePointer<libusb_transfer>? {
        state.withLock { $0.transfersLive += 1 }
        return libusb_alloc_transfer(0)
    }

    func freeTransfer(_ transfer: UnsafeMutablePointer<libusb_transfer>) {
        precondition(!pending.contains(transfer), "a transfer was freed while libusb still owned it")
        state.withLock { $0.transfersLive -= 1 }
        libusb_free_transfer(transfer)
    }

    func submit(_ transfer: UnsafeMutablePointer<libusb_transfer>) -> Int32 {
        dispatchPrecondition(condition: .onQueue(queue))
        defer { submitted.signal() }
        let (status, zlpSupported, vanished) = state.withLock { state -> (Int32, Bool, Bool) in
            state.submits += 1
            return (state.submitStatuses.isEmpty ? 0 : state.submitStatuses.removeFirst(), state.zeroPacketFlagSupported, state.vanished)
        }
        if vanished { return LIBUSB_ERROR_NO_DEVICE.rawValue }
        if status != 0 { return status }
        if transfer.pointee.flags & UInt8(LIBUSB_TRANSFER_ADD_ZERO_PACKET.rawValue) != 0, !zlpSupported {
            return LIBUSB_ERROR_NOT_SUPPORTED.rawValue
        }
        if transfer.pointee.type == UInt8(LIBUSB_TRANSFER_TYPE_CONTROL.rawValue) {
            answerControl(transfer)
            return 0
        }
        let endpoint = transfer.pointee.endpoint
        let zeroPacket = transfer.pointee.flags & UInt8(LIBUSB_TRANSFER_ADD_ZERO_PACKET.rawValue) != 0
        state.withLock { state in
            state.submittedEndpoints.insert(endpoint)
            if endpoint & 0x80 == 0 { state.outTransfers.append((Int(transfer.pointee.length), zeroPacket)) }
        }
        pending.append(transfer)
        if wire != nil { queue.async { self.pumpWire() } }
        if !nativeWires.isEmpty { queue.async { self.pumpNative() } }
        return 0
    }

    func cancel(_ transfer: UnsafeMutablePointer<libusb_transfer>) -> Int32 {
        record("cancel 0x\(String(transfer.pointee.endpoint, radix: 16))")
        guard pending.contains(transfer) else { return LIBUSB_ERROR_NOT_FOUND.rawValue }
        let (complete, vanished) = state.withLock { ($0.completeCancelled, $0.vanished) }
        if complete {
            let carried = QueueBound(transfer, on: queue)
            queue.async {
                if self.pending.contains(carried.value) { self.finish(carried.value, status: LIBUSB_TRANSFER_CANCELLED, actual: 0) }
            }
        }
        return vanished ? LIBUSB_ERROR_NO_DEVICE.rawValue : 0
    }

    func allocateDeviceMemory(_ handle: OpaquePointer, length: Int) -> UnsafeMutableRawPointer? {
        guard state.withLock({ $0.deviceMemory }) else { return nil }
        let pointer = UnsafeMutableRawPointer.allocate(byteCount: length, alignment: 4096)
        memory[pointer] = length
        state.withLock { $0.deviceMemoryLive += 1 }
        return pointer
    }

    func freeDeviceMemory(_ handle: OpaquePointer, _ pointer: UnsafeMutableRawPointer, length: Int) {
        precondition(memory.removeValue(forKey: pointer) == length, "device memory freed with the wrong length")
        precondition(state.withLock { $0.openHandles } > 0, "device memory freed after the handle was closed")
        state.withLock { $0.deviceMemoryLive -= 1 }
        record("free device memory")
        pointer.deallocate()
    }

    func isDeviceMemory(_ pointer: UnsafeRawPointer) -> Bool {
        memory.contains { pointer >= UnsafeRawPointer($0.key) && pointer < UnsafeRawPointer($0.key) + $0.value }
    }

    var wakeups: Int { 0 }
    func shutdown() { record("shutdown") }

    // MARK: Driving transfers (event queue)

    /// The pending transfers on IN (or OUT) endpoints.
    func pendingTransfers(in direction: Bool) -> [UnsafeMutablePointer<libusb_transfer>] {
        pending.filter { ($0.pointee.endpoint & 0x80 != 0) == direction }
    }

    /// Completes the oldest pending IN transfer with `bytes` (truncated to its length unless the
    /// status is OVERFLOW) and `status`. Returns the buffer the bytes went to.
    @discardableResult
    func completeIn(_ bytes: [UInt8], status: libusb_transfer_status = LIBUSB_TRANSFER_COMPLETED) -> UnsafeMutableRawPointer? {
        guard let transfer = pendingTransfers(in: true).first else { return nil }
        let count = min(bytes.count, Int(transfer.pointee.length))
        let buffer = UnsafeMutableRawPointer(transfer.pointee.buffer!)
        bytes.prefix(count).withUnsafeBytes { buffer.copyMemory(from: $0.baseAddress!, byteCount: count) }
        finish(transfer, status: status, actual: count)
        return buffer
    }

    /// Completes the oldest pending OUT transfer; returns its bytes, flags and timeout.
    @discardableResult
    func completeOut(status: libusb_transfer_status = LIBUSB_TRANSFER_COMPLETED) -> (bytes: [UInt8], flags: UInt8, timeout: UInt32)? {
        guard let transfer = pendingTransfers(in: false).first else { return nil }
        let length = Int(transfer.pointee.length)
        let bytes = length == 0 ? [] : Array(UnsafeRawBufferPointer(start: transfer.pointee.buffer, count: length))
        let result = (bytes, transfer.pointee.flags, transfer.pointee.timeout)
        finish(transfer, status: status, actual: status == LIBUSB_TRANSFER_COMPLETED ? length : 0)
        return result
    }

    func finish(_ transfer: UnsafeMutablePointer<libusb_transfer>, status: libusb_transfer_status, actual: Int) {
        pending.removeAll { $0 == transfer }
        nativeOutProgress[transfer] = nil
        transfer.pointee.status = status
        transfer.pointee.actual_length = Int32(actual)
        inCallback = true
        transfer.pointee.callback(transfer)
        inCallback = false
    }

    private func answerControl(_ transfer: UnsafeMutablePointer<libusb_transfer>) {
        let setup = UnsafeMutableRawPointer(transfer.pointee.buffer!)
        let request = setup.load(fromByteOffset: 1, as: UInt8.self)
        let index = setup.load(fromByteOffset: 2, as: UInt8.self)
        let type = setup.load(fromByteOffset: 3, as: UInt8.self)
        var reply: [UInt8] = []
        if request == 6, type == 3 {
            if index == 0 {
                reply = [4, 3, 0x09, 0x04]
            } else if let text = state.withLock({ $0.devices.first?.strings[index] }) {
                let units = Array(text.utf16)
                reply = [UInt8(2 + units.count * 2), 3] + units.flatMap { [UInt8($0 & 0xFF), UInt8($0 >> 8)] }
            }
        }
        reply.withUnsafeBytes { (setup + 8).copyMemory(from: $0.baseAddress ?? UnsafeRawPointer(setup), byteCount: reply.count) }
        let carried = QueueBound(transfer, on: queue)
        let count = reply.count
        queue.async {
            let transfer = carried.value
            transfer.pointee.status = count == 0 ? LIBUSB_TRANSFER_STALL : LIBUSB_TRANSFER_COMPLETED
            transfer.pointee.actual_length = Int32(count)
            self.inCallback = true
            transfer.pointee.callback(transfer)
            self.inCallback = false
        }
    }

    // MARK: Wire mode

    /// Connects the bulk pipes to `transport` (the accessory's side of a memory pair): every OUT
    /// transfer is sent to it whole and completes; what it sends completes IN transfers.
    func connect(wire transport: any Transport) {
        wire = transport
        transport.activate(queue: queue) { [self] event in
            if case let .received(bytes) = event {
                inbound += bytes
                pumpWire()
            }
        }
    }

    private func pumpWire() {
        guard let wire else { return }
        while let out = pendingTransfers(in: false).first(where: { wireEndpoints.contains($0.pointee.endpoint) }) {
            let length = Int(out.pointee.length)
            if length > 0 { wire.send(Array(UnsafeRawBufferPointer(start: out.pointee.buffer, count: length))) }
            finish(out, status: LIBUSB_TRANSFER_COMPLETED, actual: length)
        }
        while !inbound.isEmpty, let transfer = pendingTransfers(in: true).first(where: { wireEndpoints.contains($0.pointee.endpoint) }) {
            let count = min(inbound.count, Int(transfer.pointee.length))
            inbound.withUnsafeBytes { UnsafeMutableRawPointer(transfer.pointee.buffer!).copyMemory(from: $0.baseAddress!, byteCount: count) }
            inbound.removeFirst(count)
            finish(transfer, status: LIBUSB_TRANSFER_COMPLETED, actual: count)
        }
    }
}
