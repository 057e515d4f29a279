package import Dispatch
import Glibc
package import IAPTransport
import Synchronization
import SystemCalls

/// The USB descriptors of a simulated accessory on GadgetFS: the iAP2 interface (FF/F0/00, a
/// bulk pair) and one native-transport interface per native protocol (FF/F0/01: alternate
/// setting 0 without endpoints, 1 with a bulk pair), at full and high speed.
///
/// Why GadgetFS: FunctionFS on kernels before 6.8 has no `get_alt` callback, so the kernel's
/// composite layer refuses SET_INTERFACE with an alternate setting other than 0 for it; and even
/// with one, FunctionFS does not tell user space which setting the host chose. GadgetFS hands
/// every SET_INTERFACE to user space, which then enables the interface's endpoints itself.
package struct GadgetFSLayout: Sendable, Hashable {
    /// A bulk endpoint pair: the controller's endpoint file names and the addresses used for them.
    package struct BulkPair: Sendable, Hashable {
        /// The IN endpoint's file name under the GadgetFS mount (e.g. "ep1in-bulk"): the accessory's
        /// bytes to the host are written there.
        package var inFile: String
        /// The OUT endpoint's file name under the GadgetFS mount (e.g. "ep2out-bulk"): the host's bytes
        /// are read there.
        package var outFile: String
        /// The IN endpoint's address in the descriptors (bit 7 set, e.g. 0x81), which must be the
        /// controller's endpoint the file stands for.
        package var inAddress: UInt8
        /// The OUT endpoint's address in the descriptors (e.g. 0x02).
        package var outAddress: UInt8
    }

    /// The USB vendor and product ids.
    package var vendorID: UInt16
    /// idProduct (a firmware update may come back under another one, as a bootloader does).
    package var productID: UInt16
    /// String descriptors 1, 2 and 3: manufacturer, product, serial number.
    package var manufacturer: String
    /// String descriptor 2: the product name the host reads (iProduct).
    package var product: String
    /// String descriptor 3: the serial number the host reads (iSerialNumber).
    package var serialNumber: String
    /// The protocols with a native-transport interface each (interface 1, 2, … in this order,
    /// named after the protocol).
    package var nativeProtocols: [String]
    /// The iAP2 interface's pair, then one per native protocol.
    package var pairs: [BulkPair]
    /// The field layout presented (PROTOCOL.md §7): the device class, the configuration value,
    /// bcdDevice and, through ``pairs``, the endpoint addresses.
    package var descriptorLayout: USBDescriptorLayout = .standard
    /// bcdDevice.
    package var deviceRelease: UInt16 = 0x0100

    /// dummy_hcd's bulk endpoints (PXA-style fixed function), in the order they are used.
    package static let dummyHCDPairs = [
        BulkPair(inFile: "ep1in-bulk", outFile: "ep2out-bulk", inAddress: 0x81, outAddress: 0x02),
        BulkPair(inFile: "ep6in-bulk", outFile: "ep7out-bulk", inAddress: 0x86, outAddress: 0x07),
        BulkPair(inFile: "ep11in-bulk", outFile: "ep12out-bulk", inAddress: 0x8B, outAddress: 0x0C),
    ]

    /// A layout on dummy_hcd's endpoints.
    ///
    /// - Throws: ``TransportError`` when there are more native protocols than endpoint pairs.
    package init(vendorID: UInt16, productID: UInt16, manufacturer: String, product: String, serialNumber: String,
                nativeProtocols: [String], pairs: [BulkPair] = GadgetFSLayout.dummyHCDPairs) throws(TransportError) {
        guard nativeProtocols.count + 1 <= pairs.count else {
            throw TransportError("\(nativeProtocols.count) native protocols need \(nativeProtocols.count + 1) bulk endpoint pairs; the controller has \(pairs.count)",
                                 advice: "mark fewer protocols native")
        }
        self.vendorID = vendorID
        self.productID = productID
        self.manufacturer = manufacturer
        self.product = product
        self.serialNumber = serialNumber
        self.nativeProtocols = nativeProtocols
        self.pairs = Array(pairs.prefix(nativeProtocols.count + 1))
    }

    /// A layout in the shape of `descriptorLayout` on dummy_hcd's endpoints: its device class,
    /// configuration value and bcdDevice, and its endpoint addresses, each on an endpoint file of
    /// the same number and direction where the controller has one (`ep2in-bulk` for 0x82), else
    /// on a free bulk file of that direction. dummy_hcd routes a transfer by the address in the
    /// descriptor the endpoint was enabled with, so the host sees the layout's numbers either
    /// way.
    ///
    /// - Throws: ``TransportError`` for more native protocols than endpoint files, or a layout only
    ///   the FunctionFS gadget presents (``USBDescriptorLayout/needsFunctionFS``).
    package init(vendorID: UInt16, productID: UInt16, manufacturer: String, product: String, serialNumber: String,
                nativeProtocols: [String], descriptorLayout: USBDescriptorLayout) throws(TransportError) {
        guard !descriptorLayout.needsFunctionFS else { throw descriptorLayout.functionFSOnly }
        var pairs = Self.dummyHCDPairs
        if descriptorLayout.placesEndpoints {
            var addresses = [descriptorLayout.iAP2Endpoints]
            for index in nativeProtocols.indices {
                guard let native = descriptorLayout.nativeEndpoints(index) else { break }
                addresses.append(native)
            }
            pairs = try Self.placing(addresses)
        }
        try self.init(vendorID: vendorID, productID: productID, manufacturer: manufacturer, product: product,
                      serialNumber: serialNumber, nativeProtocols: nativeProtocols, pairs: pairs)
        self.descriptorLayout = descriptorLayout
        if let release = descriptorLayout.deviceRelease { deviceRelease = release }
    }

    /// dummy_hcd's bulk-capable endpoint files by direction, in the controller's order (Linux
    /// 6.1): the PXA-style fixed ones, the SA-1100-style pair, then the generic ones (any type,
    /// no number of their own).
    static let dummyHCDInFiles = ["ep1in-bulk", "ep6in-bulk", "ep11in-bulk", "ep2in-bulk", "ep-bin", "ep-ein", "ep-gin", "ep-jin", "ep-lin"]
    static let dummyHCDOutFiles = ["ep2out-bulk", "ep7out-bulk", "ep12out-bulk", "ep1out-bulk", "ep-aout", "ep-cout", "ep-dout", "ep-fout",
                                   "ep-hout", "ep-iout", "ep-kout", "ep-mout"]

    /// Endpoint files for `addresses` (IN, OUT pairs): the file of the same number where there is
    /// one, else the first free one of the direction.
    static func placing(_ addresses: [(in: UInt8, out: UInt8)]) throws(TransportError) -> [BulkPair] {
        var freeIn = dummyHCDInFiles, freeOut = dummyHCDOutFiles
        func take(from files: inout [String]) -> String? { files.isEmpty ? nil : files.removeFirst() }
        // Exact numbers first, so a later pair does not take a file an earlier one needs.
        var chosen: [(String?, String?)] = addresses.map { _ in (nil, nil) }
        for (position, pair) in addresses.enumerated() {
            let inName = "ep\(pair.in & 0x0F)in", outName = "ep\(pair.out & 0x0F)out"
            if let index = freeIn.firstIndex(where: { $0 == inName || $0.hasPrefix(inName + "-") }) { chosen[position].0 = freeIn.remove(at: index) }
            if let index = freeOut.firstIndex(where: { $0 == outName || $0.hasPrefix(outName + "-") }) { chosen[position].1 = freeOut.remove(at: index) }
        }
        var pairs: [BulkPair] = []
        for (position, pair) in addresses.enumerated() {
            guard let inFile = chosen[position].0 ?? take(from: &freeIn),
                  let outFile = chosen[position].1 ?? take(from: &freeOut) else {
                throw TransportError("\(addresses.count) bulk endpoint pairs needed; the controller has \(min(dummyHCDInFiles.count, dummyHCDOutFiles.count))",
                                     advice: "mark fewer protocols native")
            }
            pairs.append(BulkPair(inFile: inFile, outFile: outFile, inAddress: pair.in, outAddress: pair.out))
        }
        return pairs
    }

    /// String index of the iAP2 interface's name; native interfaces follow.
    static let interfaceStringBase: UInt8 = 4

    static func packetSize(highSpeed: Bool) -> Int { highSpeed ? 512 : 64 }

    static func endpoint(_ address: UInt8, highSpeed: Bool) -> [UInt8] {
        let size = packetSize(highSpeed: highSpeed)
        return [7, 0x05, address, 0x02, UInt8(size & 0xFF), UInt8(size >> 8), 0]
    }

    /// The configuration descriptor with its interfaces and endpoints.
    func configuration(highSpeed: Bool) -> [UInt8] {
        var body: [UInt8] = []
        func interface(_ number: UInt8, alternate: UInt8, endpoints: UInt8, protocolCode: UInt8, string: UInt8) {
            body += [9, 0x04, number, alternate, endpoints, 0xFF, 0xF0, protocolCode, string]
        }
        interface(0, alternate: 0, endpoints: 2, protocolCode: 0x00, string: Self.interfaceStringBase)
        body += Self.endpoint(pairs[0].inAddress, highSpeed: highSpeed) + Self.endpoint(pairs[0].outAddress, highSpeed: highSpeed)
        for index in nativeProtocols.indices {
            let number = UInt8(index + 1)
            let string = Self.interfaceStringBase + number
            interface(number, alternate: 0, endpoints: 0, protocolCode: 0x01, string: string)
            interface(number, alternate: 1, endpoints: 2, protocolCode: 0x01, string: string)
            body += Self.endpoint(pairs[index + 1].inAddress, highSpeed: highSpeed)
                + Self.endpoint(pairs[index + 1].outAddress, highSpeed: highSpeed)
        }
        let total = 9 + body.count
        // Bus powered (bit 7, required), 100 mA.
        return [9, 0x02, UInt8(total & 0xFF), UInt8(total >> 8), UInt8(nativeProtocols.count + 1), descriptorLayout.configurationValue,
                0, 0x80, 50] + body
    }

    /// The device descriptor.
    var deviceDescriptor: [UInt8] {
        let deviceClass = descriptorLayout.deviceClass
        return [18, 0x01, 0x00, 0x02, deviceClass[0], deviceClass[1], deviceClass[2], 64, UInt8(vendorID & 0xFF), UInt8(vendorID >> 8),
                UInt8(productID & 0xFF), UInt8(productID >> 8), UInt8(deviceRelease & 0xFF), UInt8(deviceRelease >> 8), 1, 2, 3, 1]
    }

    /// What is written to the controller file: tag 0, the full-speed and high-speed
    /// configurations, the device descriptor.
    package var setupBlob: [UInt8] {
        [0, 0, 0, 0] + configuration(highSpeed: false) + configuration(highSpeed: true) + deviceDescriptor
    }

    /// What configures an endpoint file: tag 1, the full-speed and high-speed descriptors.
    static func endpointBlob(_ address: UInt8) -> [UInt8] {
        [1, 0, 0, 0] + endpoint(address, highSpeed: false) + endpoint(address, highSpeed: true)
    }

    /// String descriptor `index` (0: the language list), or nil for an unknown index.
    package func stringDescriptor(_ index: UInt8) -> [UInt8]? {
        if index == 0 { return [4, 0x03, 0x09, 0x04] }
        let strings = [manufacturer, product, serialNumber, FunctionFSDescriptors.iAPInterfaceName] + nativeProtocols
        let position = Int(index) - 1
        guard strings.indices.contains(position) else { return nil }
        let units = Array(strings[position].utf16.prefix(126))
        var descriptor: [UInt8] = [UInt8(2 + 2 * units.count), 0x03]
        for unit in units { descriptor += [UInt8(unit & 0xFF), UInt8(unit >> 8)] }
        return descriptor
    }
}

/// The iAP2 interface of a ``GadgetFSDevice`` as a ``Transport``: its endpoints exist only once
/// the host configured the device, so this relays to a ``GadgetTransport`` made then, and drops
/// frames sent before (the iAP2 link repeats what matters).
package final class GadgetFSTransport: Transport, Sendable {
    package let description: String
    package var kind: TransportKind { .gadget }
    private let state = Mutex<(queue: DispatchQueue?, handler: (@Sendable (TransportEvent) -> Void)?, inner: GadgetTransport?, cancelled: Bool)>((nil, nil, nil, false))

    init(description: String) { self.description = description }

    package func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) {
        let inner = state.withLock { state -> GadgetTransport? in
            state.queue = queue
            state.handler = handler
            return state.inner
        }
        if let inner { forward(inner, queue: queue) }
    }

    package func send(_ frame: [UInt8]) {
        state.withLock { $0.inner }?.send(frame)
    }

    package func cancel() {
        let (inner, target) = state.withLock { state in
            defer {
                state.inner = nil
                state.cancelled = true
                state.handler = nil
            }
            return (state.inner, state.cancelled ? nil : state.queue.flatMap { queue in state.handler.map { (queue, $0) } })
        }
        inner?.cancel()
        if let (queue, handler) = target { queue.async { handler(.closed(nil)) } }
    }

    /// The host configured the device: the endpoints of the iAP2 interface now work.
    func attach(_ inner: GadgetTransport) {
        let queue = state.withLock { state -> DispatchQueue?? in
            guard !state.cancelled else { return .none }
            state.inner = inner
            return .some(state.queue)
        }
        switch queue {
        case .none: inner.cancel()
        case let .some(queue?): forward(inner, queue: queue)
        case .some(nil): break
        }
    }

    /// The host unconfigured or left: the endpoints are gone until the next configuration.
    func detach() {
        let inner = state.withLock { state -> GadgetTransport? in
            defer { state.inner = nil }
            return state.inner
        }
        inner?.cancel()
    }

    private func forward(_ inner: GadgetTransport, queue: DispatchQueue) {
        inner.activate(queue: queue) { [weak self] event in
            // The relay outlives each configuration: an inner close is not the end.
            if case .closed = event { return }
            self?.deliver(event, from: inner)
        }
    }

    private func deliver(_ event: TransportEvent, from inner: GadgetTransport) {
        let handler = state.withLock { $0.inner === inner ? $0.handler : nil }
        handler?(event)
    }
}

/// A simulated accessory as a USB device through GadgetFS (`/dev/gadget`): the iAP2 interface
/// as ``transport`` and native-transport interfaces that open when the host selects their
/// alternate setting 1 (``onNativeOpen(_:)``) and close with 0.
///
/// GadgetFS binds to the first device controller without a driver when the descriptors are
/// written, and there is one GadgetFS device per system. A thread reads `ep0`'s events:
/// it answers string requests, enables the iAP2 endpoints at SET_CONFIGURATION, and the native
/// ones at SET_INTERFACE. Needs root and the `gadgetfs` module.
package final class GadgetFSDevice: Sendable {
    /// Where GadgetFS is mounted.
    package let mountPoint: String
    /// The descriptors and endpoint pairs the device was set up with.
    package let layout: GadgetFSLayout
    /// The iAP2 interface.
    package let transport: GadgetFSTransport
    private let ep0: Int32
    private let mountedHere: Bool
    private let state = Mutex(State())

    struct State {
        var highSpeed = true
        var nativeOpen: (@Sendable (String, any ByteChannel) -> Void)?
        var natives: [Int: EndpointByteChannel] = [:]
        /// The alternate setting of each native interface (for GET_INTERFACE).
        var alternates: [Int: UInt8] = [:]
        var threads: [WorkerThread] = []
        var stopping = false
        var log: [String] = []
        var trace: (@Sendable (String) -> Void)?
    }

    /// Calls `handler` with each line of ``log`` as it is written (any thread).
    package func onTrace(_ handler: @escaping @Sendable (String) -> Void) {
        state.withLock { $0.trace = handler }
    }

    /// Mounts GadgetFS if needed, writes the descriptors (which binds to a controller) and starts
    /// answering the host.
    ///
    /// - Throws: ``TransportError`` saying what to do: load the module, run as root, free a
    ///   controller.
    package init(layout: GadgetFSLayout, mountPoint: String = "/dev/gadget") throws(TransportError) {
        self.layout = layout
        self.mountPoint = mountPoint
        transport = GadgetFSTransport(description: "usb gadget (GadgetFS)")
        var mounted = false
        if !Self.isMounted(mountPoint) {
            _ = mkdir(mountPoint, 0o755)
            guard mount("gadgetfs", mountPoint, "gadgetfs", 0, nil) == 0 else {
                let code = errno
                throw TransportError("cannot mount GadgetFS on \(mountPoint): \(SystemError(code).description)", errno: code,
                                     advice: code == ENODEV ? "load the module: modprobe gadgetfs" : "run as root")
            }
            mounted = true
        }
        mountedHere = mounted
        guard let controller = Self.controllerFile(in: mountPoint) else {
            if mounted { _ = umount2(mountPoint, 0) }
            throw TransportError("GadgetFS at \(mountPoint) has no controller file", advice: "load a device controller driver (e.g. modprobe dummy_hcd)")
        }
        let descriptor: Int32
        switch SystemCall.open(mountPoint + "/" + controller, O_RDWR | O_CLOEXEC) {
        case .success(let opened): descriptor = opened
        case .failure(let error):
            let code = error.code
            if mounted { _ = umount2(mountPoint, 0) }
            throw TransportError("cannot open \(mountPoint)/\(controller): \(SystemError(code).description)", errno: code,
                                 advice: code == EBUSY ? "another program drives GadgetFS; stop it" : "run as root")
        }
        ep0 = descriptor
        let blob = layout.setupBlob
        let written = blob.withUnsafeBytes { SystemCall.write(descriptor, $0) }
        guard case .success(blob.count) = written else {
            let code = if case .failure(let error) = written { error.code } else { errno }
            _ = Glibc.close(descriptor)
            if mounted { _ = umount2(mountPoint, 0) }
            throw TransportError("the kernel refused the GadgetFS descriptors: \(SystemError(code).description)", errno: code,
                                 advice: "free a device controller (unbind another gadget) or read the kernel log")
        }
        switch spawnThread(name: "gadgetfs-ep0", body: { [self] in watchEndpointZero() }) {
        case let .success(thread): state.withLock { $0.threads.append(thread) }
        case let .failure(error):
            _ = Glibc.close(descriptor)
            if mounted { _ = umount2(mountPoint, 0) }
            throw error
        }
    }

    /// Calls `handler` (on the ep0 thread) with the protocol and a channel not yet activated each
    /// time the host selects alternate setting 1 of a native interface.
    package func onNativeOpen(_ handler: @escaping @Sendable (String, any ByteChannel) -> Void) {
        state.withLock { $0.nativeOpen = handler }
    }

    /// What the ep0 thread did, for a person debugging a gadget.
    package var log: [String] { state.withLock { $0.log } }

    /// Disconnects: stops the ep0 thread, closes the endpoints (their channels end), closes the
    /// controller file (which unbinds) and unmounts GadgetFS if it mounted it.
    package func stop() {
        guard let threads = state.withLock({ state -> [WorkerThread]? in
            guard !state.stopping else { return nil }
            state.stopping = true
            defer { state.threads = [] }
            return state.threads
        }) else { return }
        note("stopping: joining the ep0 thread")
        let me = pthread_self()
        for thread in threads {
            // Called from a handler on the ep0 thread: it ends by itself once the handler returns.
            if pthread_equal(thread.handle, me) != 0 { pthread_detach(thread.handle) } else { interruptAndJoin(thread) }
        }
        // Collected after the join: a SET_INTERFACE handled meanwhile has stored its channel.
        let natives = state.withLock { state -> [EndpointByteChannel] in
            defer { state.natives = [:] }
            return Array(state.natives.values)
        }
        note("stopping: closing \(natives.count) native channels")
        for channel in natives { channel.close() }
        note("stopping: closing the iAP2 interface")
        transport.detach()
        _ = Glibc.close(ep0)
        if mountedHere { _ = umount2(mountPoint, 0) }
        note("stopped")
    }

    deinit { stop() }

    // MARK: ep0

    private static func isMounted(_ path: String) -> Bool {
        guard let file = fopen("/proc/mounts", "r") else { return false }
        defer { fclose(file) }
        var line = [CChar](repeating: 0, count: 4_096)
        while fgets(&line, Int32(line.count), file) != nil {
            let text = line.withUnsafeBytes { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            let fields = text.split(separator: " ")
            if fields.count > 2, fields[1] == path, fields[2] == "gadgetfs" { return true }
        }
        return false
    }

    /// The controller file: the one entry that is not an endpoint (`ep…`).
    private static func controllerFile(in directory: String) -> String? {
        guard let dir = opendir(directory) else { return nil }
        defer { closedir(dir) }
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name != ".", name != "..", !name.hasPrefix("ep") { return name }
        }
        return nil
    }

    private var stopping: Bool { state.withLock { $0.stopping } }

    private func note(_ line: String) {
        let trace = state.withLock { state in
            if state.log.count < 200 { state.log.append(line) }
            return state.trace
        }
        trace?(line)
    }

    private func watchEndpointZero() {
        let eventSize = 12
        var buffer = [UInt8](repeating: 0, count: eventSize * 5)
        while !stopping {
            let count: Int
            // A signal wakes this thread to stop: an interrupted read goes back to the check.
            switch buffer.withUnsafeMutableBytes({ SystemCall.read(ep0, into: $0, retry: { !stopping }) }) {
            case .success(let read): count = read
            case .failure(let error) where error.code == EIDRM || error.kind == .wouldBlock || error.kind == .interrupted: continue
            case .failure(let error):
                note("reading ep0 failed: \(error)")
                return
            }
            var offset = 0
            while offset + eventSize <= count {
                let event = Array(buffer[offset..<(offset + eventSize)])
                offset += eventSize
                let type = UInt32(event[8]) | UInt32(event[9]) << 8 | UInt32(event[10]) << 16 | UInt32(event[11]) << 24
                switch type {
                case 1: // CONNECT, with the speed (USB_SPEED_HIGH is 3)
                    let speed = UInt32(event[0]) | UInt32(event[1]) << 8
                    state.withLock { $0.highSpeed = speed >= 3 }
                    note("connect, speed \(speed)")
                case 2: // DISCONNECT
                    note("disconnect")
                    tearDown()
                case 3: // SETUP
                    setup(Array(event[0..<8]))
                default: // NOP, SUSPEND
                    break
                }
            }
        }
    }

    /// Acknowledges a control request without data (the status stage), or stalls one.
    private func acknowledge() {
        var byte: UInt8 = 0
        _ = withUnsafeMutableBytes(of: &byte) { SystemCall.read(ep0, into: UnsafeMutableRawBufferPointer(rebasing: $0[..<0])) }
    }

    private func stall(deviceToHost: Bool) {
        var byte: UInt8 = 0
        if deviceToHost {
            _ = withUnsafeMutableBytes(of: &byte) { SystemCall.read(ep0, into: UnsafeMutableRawBufferPointer(rebasing: $0[..<0])) }
        } else {
            _ = withUnsafeBytes(of: &byte) { SystemCall.write(ep0, UnsafeRawBufferPointer(rebasing: $0[..<0])) }
        }
    }

    private func setup(_ request: [UInt8]) {
        let type = request[0], code = request[1]
        let value = UInt16(request[2]) | UInt16(request[3]) << 8
        let index = UInt16(request[4]) | UInt16(request[5]) << 8
        let length = Int(UInt16(request[6]) | UInt16(request[7]) << 8)
        switch (type, code) {
        case (0x80, 6) where value >> 8 == 3: // GET_DESCRIPTOR (string)
            guard let descriptor = layout.stringDescriptor(UInt8(value & 0xFF)) else { return stall(deviceToHost: true) }
            let answer = Array(descriptor.prefix(length))
            _ = answer.withUnsafeBytes { SystemCall.write(ep0, $0) }
        case (0x00, 9): // SET_CONFIGURATION (the kernel already took it; the endpoints are ours)
            tearDown()
            if value != 0 { configureIAP2() }
            note("set configuration \(value)")
            acknowledge()
        case (0x01, 11): // SET_INTERFACE
            note("set interface \(index) alternate setting \(value)")
            let native = Int(index) - 1
            guard layout.nativeProtocols.indices.contains(native) else {
                return index == 0 && value == 0 ? acknowledge() : stall(deviceToHost: false)
            }
            guard value <= 1 else { return stall(deviceToHost: false) }
            closeNative(native)
            state.withLock { $0.alternates[native] = 0 }
            // A setting 1 that cannot be served is refused, not acknowledged: the host's writes
            // would otherwise wait on endpoints nobody reads.
            if value == 1 {
                guard openNative(native) else { return stall(deviceToHost: false) }
                state.withLock { $0.alternates[native] = 1 }
            }
            acknowledge()
        case (0x81, 10): // GET_INTERFACE
            let native = Int(index) - 1
            guard index == 0 || layout.nativeProtocols.indices.contains(native) else { return stall(deviceToHost: true) }
            let setting = index == 0 ? 0 : state.withLock { $0.alternates[native] ?? 0 }
            let answer = [setting]
            _ = answer.withUnsafeBytes { SystemCall.write(ep0, UnsafeRawBufferPointer(rebasing: $0.prefix(min(1, length)))) }
        default:
            note("stalled request \(type) \(code) value \(value) index \(index)")
            stall(deviceToHost: type & 0x80 != 0)
        }
    }

    /// Opens and enables the two endpoint files of `pair`; nil (noted) when the kernel refuses.
    private func enable(_ pair: GadgetFSLayout.BulkPair) -> (in: Int32, out: Int32)? {
        var opened: [Int32] = []
        for (file, address) in [(pair.inFile, pair.inAddress), (pair.outFile, pair.outAddress)] {
            let blob = GadgetFSLayout.endpointBlob(address)
            let opening = SystemCall.open(mountPoint + "/" + file, O_RDWR | O_CLOEXEC)
            let descriptor = (try? opening.get()) ?? -1
            let written = opening.flatMap { descriptor in blob.withUnsafeBytes { SystemCall.write(descriptor, $0) } }
            guard case .success(blob.count) = written else {
                let code = if case .failure(let error) = written { error.code } else { errno }
                note("cannot enable \(file): \(SystemError(code).description)")
                if descriptor >= 0 { _ = Glibc.close(descriptor) }
                for other in opened { _ = Glibc.close(other) }
                return nil
            }
            opened.append(descriptor)
        }
        return (opened[0], opened[1])
    }

    private var packetSize: Int { GadgetFSLayout.packetSize(highSpeed: state.withLock { $0.highSpeed }) }

    private func configureIAP2() {
        guard !stopping, let (inEndpoint, outEndpoint) = enable(layout.pairs[0]) else { return }
        do {
            let inner = try GadgetTransport(ep0: nil, inEndpoint: inEndpoint, outEndpoint: outEndpoint, maxPacket: packetSize,
                                            isFunctionFS: true, description: transport.description)
            transport.attach(inner)
        } catch {
            note("cannot start the iAP2 interface: \(error)")
        }
    }

    /// Enables native interface `index` and hands its channel to the handler; false when it
    /// cannot be served (no handler, the kernel refused the endpoints, stopping).
    private func openNative(_ index: Int) -> Bool {
        let name = layout.nativeProtocols[index]
        guard let handler = state.withLock({ $0.stopping ? nil : $0.nativeOpen }) else {
            note("native interface \(index + 1) selected with nobody to serve it: refused")
            return false
        }
        guard let (inEndpoint, outEndpoint) = enable(layout.pairs[index + 1]) else { return false }
        do {
            let channel = try EndpointByteChannel(inEndpoint: inEndpoint, outEndpoint: outEndpoint, maxPacket: packetSize,
                                                  description: "GadgetFS interface \(index + 1) (\(name))")
            state.withLock { $0.natives[index] = channel }
            handler(name, channel)
            return true
        } catch {
            note("cannot start native interface \(index + 1): \(error)")
            return false
        }
    }

    private func closeNative(_ index: Int) {
        state.withLock { $0.natives.removeValue(forKey: index) }?.close()
    }

    private func tearDown() {
        let natives = state.withLock { state -> [EndpointByteChannel] in
            defer {
                state.natives = [:]
                state.alternates = [:]
            }
            return Array(state.natives.values)
        }
        if !natives.isEmpty { note("closing \(natives.count) native channel\(natives.count == 1 ? "" : "s")") }
        for channel in natives { channel.close() }
        transport.detach()
        note("endpoints closed")
    }
}
