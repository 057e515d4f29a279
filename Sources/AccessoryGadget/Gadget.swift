package import AccessorySimulator
internal import Glibc
internal import Synchronization
internal import SystemCalls

/// Why a ``USBGadget`` step failed: the path, the errno, and what to do.
package struct USBGadgetError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What kind of trouble it is, so a tool can pick its exit status.
    package enum Category: String, Sendable, Hashable {
        /// Not allowed: configfs, mounting and the UDC need root.
        case permission
        /// The kernel lacks something: configfs, libcomposite, usb_f_fs, or any USB device
        /// controller.
        case missingSupport
        /// Something is in the way: a gadget of that name, a controller used by another gadget,
        /// a mount point in use.
        case busy
        /// Anything else.
        case failed
    }

    /// What failed, naming the path, e.g. "cannot create …/usb_gadget/iapsim: File exists".
    package var message: String
    /// The file or directory that failed, when there is one.
    package var path: String?
    /// The errno, when a system call failed.
    package var errno: Int32?
    /// What to do next.
    package var advice: String?
    /// The kind of trouble.
    package var category: Category

    /// Creates an error.
    package init(_ message: String, path: String? = nil, errno: Int32? = nil, advice: String? = nil, category: Category = .failed) {
        self.message = message
        self.path = path
        self.errno = errno
        self.advice = advice
        self.category = category
    }

    /// The message followed by the advice.
    package var description: String {
        advice.map { "\(message); \($0)" } ?? message
    }
}

/// How to present the simulated accessory as a USB device.
package struct USBGadgetConfiguration: Sendable, Hashable {
    /// The gadget's directory name under ``configfsRoot``.
    package var name = "iapsim"
    /// `idVendor`: pid.codes' vendor id by default (0x1209, for open and test hardware).
    package var vendorID: UInt16 = 0x1209
    /// `idProduct`: pid.codes' test product id 0x0001 by default.
    package var productID: UInt16 = 0x0001
    /// `bcdUSB`: USB 2.0.
    package var usbVersion: UInt16 = 0x0200
    /// `bcdDevice`.
    package var deviceVersion: UInt16 = 0x0100
    /// `iManufacturer` (language 0x0409).
    package var manufacturer: String
    /// `iProduct`.
    package var product: String
    /// `iSerialNumber`.
    package var serialNumber: String
    /// The configuration's string.
    package var configurationName = "iAP2"
    /// `MaxPower` of the configuration, in mA (0…500).
    package var maxPowerMilliamps = 100
    /// The FunctionFS instance: the function is `functions/ffs.<instance>` and the file system
    /// is mounted with `<instance>` as its source.
    package var functionInstance = "iap2"
    /// Where gadgets are made (configfs).
    package var configfsRoot = "/sys/kernel/config/usb_gadget"
    /// Where FunctionFS is mounted; `nil` for `/dev/ffs-<instance>`. Created when missing (and
    /// then removed again).
    package var mountDirectory: String?
    /// The field layout to present (PROTOCOL.md §7): its device class, configuration value
    /// (the configuration is `configs/c.<value>`) and bcdDevice. The endpoint numbers are the
    /// kernel's choice on FunctionFS (see ``USBDescriptorLayout``); a ``GadgetFSDevice`` presents
    /// them too.
    package var layout: USBDescriptorLayout = .standard
    /// EA protocol names that get a native-transport interface each (offered, not served: see
    /// ``init(profile:)``; ``GadgetFSDevice`` serves them).
    package var nativeTransportProtocols: [String] = []
    /// Transfers kept queued on each bulk endpoint, as a device's controller keeps several (4 by
    /// default; 1 moves one transfer at a time with blocking calls, as before this existed).
    /// More than 1 needs the kernel's AIO; without it the gadget falls back to 1.
    package var queuedRequests = GadgetTransport.defaultQueuedRequests

    /// A configuration with these strings and defaults for the rest.
    package init(manufacturer: String, product: String, serialNumber: String) {
        self.manufacturer = manufacturer
        self.product = product
        self.serialNumber = serialNumber
    }

    /// A configuration whose strings come from a simulator profile's identity: its manufacturer,
    /// its name as the product, and its serial number.
    ///
    /// No native-transport interfaces: a FunctionFS gadget cannot serve them (FunctionFS does not
    /// tell user space which alternate setting the host selected, and before Linux 6.8 the
    /// composite layer refuses any but 0), and an interface offered but not served would leave a
    /// host's writes waiting. Set ``nativeTransportProtocols`` (e.g. to the profile's
    /// `nativeProtocolNames`) to offer them anyway, to test a host's half; ``GadgetFSDevice``
    /// serves them.
    package init(profile: SimulatorProfile) {
        self.init(manufacturer: profile.accessory.manufacturer, product: profile.accessory.name,
                  serialNumber: profile.accessory.serialNumber)
    }

    /// `VVVV:PPPP` in hex, e.g. `1209:0001`: the ids the gadget presents (the layout's, when it
    /// has its own).
    package var usbID: String { "\(hex4(layout.usbID?.vendorID ?? vendorID)):\(hex4(layout.usbID?.productID ?? productID))" }

    /// The directory FunctionFS is mounted at.
    package var resolvedMountDirectory: String { mountDirectory ?? "/dev/ffs-\(functionInstance)" }
}

/// A configfs USB gadget (Linux as the USB device) whose one function is a FunctionFS instance
/// that a ``GadgetTransport`` drives: the simulated accessory behind a real USB device
/// controller (a board's OTG port, or `dummy_hcd` for a host on the same machine).
///
/// ``init(configuration:)`` builds it, in this order (root only):
/// 1. `<configfsRoot>/<name>` with `idVendor`, `idProduct`, `bcdUSB`, `bcdDevice`, and
///    `strings/0x409` (`manufacturer`, `product`, `serialnumber`);
/// 2. configuration `configs/c.<value>` (1, or the layout's value) with `MaxPower` and
///    `strings/0x409/configuration`, and the layout's `bDeviceClass`, `bDeviceSubClass`,
///    `bDeviceProtocol` and `bcdDevice`;
/// 3. function `functions/ffs.<instance>`, linked into `c.1`;
/// 4. FunctionFS mounted at the mount directory (created when missing);
/// 5. the ``transport``, which writes the descriptors and strings to `ep0`.
///
/// Only then can the gadget be bound to a controller with ``bind(udc:)``: the kernel refuses
/// to bind a FunctionFS function that has no descriptors yet. ``remove()`` undoes everything in
/// reverse order. A step that fails undoes the steps before it.
package final class USBGadget: Sendable {
    /// How the gadget was made.
    package let configuration: USBGadgetConfiguration
    /// `<configfsRoot>/<name>`.
    package let gadgetDirectory: String
    /// Where FunctionFS is mounted.
    package let functionDirectory: String
    /// The iAP2 pipes of the function: run the simulator over it.
    package let transport: GadgetTransport

    /// What exists, for undoing it.
    private struct Built: Sendable {
        /// configfs directories, in creation order.
        var directories: [String] = []
        var link: String?
        /// The mount point, once FunctionFS is mounted there.
        var mountedAt: String?
        /// Whether the mount point was created (and so is removed again).
        var createdMountDirectory: String?
        var boundUDC: String?
        var removed = false
    }

    private let built: Mutex<Built>

    /// The directory that lists the USB device controllers.
    package static let udcClassDirectory = "/sys/class/udc"

    /// What to load when something is missing.
    static let moduleAdvice = "load the gadget modules (modprobe libcomposite usb_f_fs; plus dummy_hcd for a virtual controller) and run as root"

    /// Builds the gadget and configures its function (see the type's description).
    ///
    /// - Throws: ``USBGadgetError`` naming the path that failed, with its errno and advice.
    package init(configuration: USBGadgetConfiguration) throws(USBGadgetError) {
        let root = configuration.configfsRoot.hasSuffix("/") ? String(configuration.configfsRoot.dropLast()) : configuration.configfsRoot
        let gadget = "\(root)/\(configuration.name)"
        let mountDirectory = configuration.resolvedMountDirectory
        var record = Built()
        do throws(USBGadgetError) {
            try Self.check(configuration)
            try Self.makeDirectory(gadget, record: &record, root: root, name: configuration.name)
            let layout = configuration.layout
            try Self.writeAttribute("\(gadget)/idVendor", "0x\(hex4(layout.usbID?.vendorID ?? configuration.vendorID))")
            try Self.writeAttribute("\(gadget)/idProduct", "0x\(hex4(layout.usbID?.productID ?? configuration.productID))")
            try Self.writeAttribute("\(gadget)/bcdUSB", "0x\(hex4(configuration.usbVersion))")
            if let speed = layout.maxSpeed {
                try Self.writeAttribute("\(gadget)/max_speed", speed, advice: "this kernel cannot limit a gadget's speed "
                    + "(configfs max_speed came with Linux 5.11); use another layout than '\(layout.rawValue)'")
            }
            try Self.writeAttribute("\(gadget)/bcdDevice", "0x\(hex4(layout.deviceRelease ?? configuration.deviceVersion))")
            for (attribute, value) in zip(["bDeviceClass", "bDeviceSubClass", "bDeviceProtocol"], layout.deviceClass) {
                try Self.writeAttribute("\(gadget)/\(attribute)", "0x\(String(value, radix: 16))")
            }
            let strings = "\(gadget)/strings/0x409"
            try Self.makeDirectory(strings, record: &record)
            try Self.writeAttribute("\(strings)/manufacturer", configuration.manufacturer)
            try Self.writeAttribute("\(strings)/product", configuration.product)
            try Self.writeAttribute("\(strings)/serialnumber", configuration.serialNumber)
            let config = "\(gadget)/configs/c.\(layout.configurationValue)"
            try Self.makeDirectory(config, record: &record)
            try Self.writeAttribute("\(config)/MaxPower", String(configuration.maxPowerMilliamps))
            try Self.makeDirectory("\(config)/strings/0x409", record: &record)
            try Self.writeAttribute("\(config)/strings/0x409/configuration", layout.configurationName ?? configuration.configurationName)
            let function = "\(gadget)/functions/ffs.\(configuration.functionInstance)"
            try Self.makeDirectory(function, record: &record, isFunction: true)
            let link = "\(config)/ffs.\(configuration.functionInstance)"
            guard symlink(function, link) == 0 else {
                let code = errno
                throw USBGadgetError("cannot link \(function) into \(config): \(SystemError(code).description)", path: link, errno: code,
                                     advice: Self.advice(for: code), category: Self.category(for: code))
            }
            record.link = link
            try Self.mountFunctionFS(instance: configuration.functionInstance, at: mountDirectory, record: &record)
        } catch {
            Self.undo(&record, transport: nil)
            throw error
        }
        let transport: GadgetTransport
        do {
            transport = try GadgetTransport(functionDirectory: mountDirectory,
                                            nativeTransportProtocols: configuration.nativeTransportProtocols,
                                            queuedRequests: configuration.queuedRequests, layout: configuration.layout)
        } catch {
            Self.undo(&record, transport: nil)
            throw USBGadgetError(error.message, path: mountDirectory, errno: error.errno, advice: error.advice,
                                 category: error.errno == EACCES || error.errno == EPERM ? .permission : .failed)
        }
        self.configuration = configuration
        self.gadgetDirectory = gadget
        self.functionDirectory = mountDirectory
        self.transport = transport
        self.built = Mutex(record)
    }

    /// The controller the gadget is bound to, or `nil`.
    package var boundUDC: String? { built.withLock { $0.boundUDC } }

    /// The USB device controllers of this machine (the names in `/sys/class/udc`), sorted;
    /// empty when there are none or the kernel has no gadget support.
    package static func availableUDCs() -> [String] {
        guard let directory = opendir(udcClassDirectory) else { return [] }
        defer { closedir(directory) }
        var names: [String] = []
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { bytes in
                String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return names.sorted()
    }

    /// The first controller of ``availableUDCs()``.
    ///
    /// - Throws: ``USBGadgetError`` (``USBGadgetError/Category/missingSupport``) saying what to
    ///   load when there is none.
    package static func defaultUDC() throws(USBGadgetError) -> String {
        if let first = availableUDCs().first { return first }
        var status = stat()
        if stat(udcClassDirectory, &status) != 0 {
            throw USBGadgetError(
                "this kernel has no USB device-mode support (\(udcClassDirectory) does not exist)", path: udcClassDirectory,
                errno: ENOENT,
                advice: "use a kernel with USB gadget support (CONFIG_USB_GADGET), then modprobe dummy_hcd for a virtual controller",
                category: .missingSupport)
        }
        throw USBGadgetError(
            "no USB device controller (\(udcClassDirectory) is empty)", path: udcClassDirectory,
            advice: "modprobe dummy_hcd for a virtual one, or enable the board's device-mode (OTG) controller",
            category: .missingSupport)
    }

    /// Binds the gadget to the controller `udc` (a name from ``availableUDCs()``): the host on
    /// the other side sees the device appear.
    ///
    /// - Throws: ``USBGadgetError`` when the controller does not exist or is taken.
    package func bind(udc: String) throws(USBGadgetError) {
        let path = "\(gadgetDirectory)/UDC"
        do {
            try Self.writeAttribute(path, udc + "\n")
        } catch {
            switch error.errno {
            case ENODEV?:
                let known = Self.availableUDCs()
                throw USBGadgetError(
                    "cannot bind the gadget to \(udc): there is no such controller", path: path, errno: error.errno,
                    advice: known.isEmpty ? "modprobe dummy_hcd for a virtual controller"
                        : "pick one of: \(known.joined(separator: ", "))",
                    category: .missingSupport)
            case EBUSY?:
                throw USBGadgetError(
                    "cannot bind the gadget to \(udc): another gadget uses it", path: path, errno: error.errno,
                    advice: "unbind that gadget (echo \"\" > <gadget>/UDC) or pick another controller",
                    category: .busy)
            default:
                throw error
            }
        }
        built.withLock { $0.boundUDC = udc }
    }

    /// Unbinds the gadget from its controller: the host sees the device go away. Does nothing
    /// when it is not bound.
    ///
    /// - Throws: ``USBGadgetError`` when the kernel refuses.
    package func unbind() throws(USBGadgetError) {
        try Self.unbind(gadgetDirectory: gadgetDirectory)
        built.withLock { $0.boundUDC = nil }
    }

    private static func unbind(gadgetDirectory: String) throws(USBGadgetError) {
        do {
            try writeAttribute("\(gadgetDirectory)/UDC", "\n")
        } catch {
            // ENODEV: it was not bound.
            if error.errno == ENODEV || error.errno == ENOENT { return }
            throw error
        }
    }

    /// Undoes everything in reverse order: unbinds, closes the transport, unmounts FunctionFS
    /// (and removes the mount directory when it was created), removes the function's link from
    /// the configuration, then the directories of the configuration, the function, the strings
    /// and the gadget. Every step is tried; the first failure is thrown. Calling it again does
    /// nothing.
    ///
    /// - Throws: ``USBGadgetError`` for the first step that failed.
    package func remove() throws(USBGadgetError) {
        // Taken out of the lock: closing the transport joins its ep0 thread, whose connection
        // handler may ask this object for its state.
        let taken = built.withLock { record -> Built? in
            guard !record.removed else { return nil }
            let copy = record
            record = Built()
            record.removed = true
            return copy
        }
        guard var record = taken else { return }
        if let failure = Self.undo(&record, transport: transport, gadgetDirectory: gadgetDirectory) { throw failure }
    }

    deinit {
        // Left without remove(): the gadget stays in configfs, which outlives the process.
        // Closing the transport at least lets a later run clean up.
        transport.cancel()
    }

    // MARK: Steps

    private static func check(_ configuration: USBGadgetConfiguration) throws(USBGadgetError) {
        for (name, value) in [("gadget name", configuration.name), ("function instance", configuration.functionInstance)] {
            if value.isEmpty || value.contains("/") || value == "." || value == ".." {
                throw USBGadgetError("the \(name) '\(value)' is not a valid directory name; use letters, digits, - and _")
            }
        }
        for (name, value) in [("manufacturer", configuration.manufacturer), ("product", configuration.product),
                              ("serial number", configuration.serialNumber), ("configuration name", configuration.configurationName)] {
            if value.utf16.count > 126 || value.utf8.contains(0) || value.utf8.contains(10) {
                throw USBGadgetError("the \(name) '\(value)' cannot be a USB string; keep it to 126 characters on one line")
            }
        }
        if !(0...500).contains(configuration.maxPowerMilliamps) {
            throw USBGadgetError("MaxPower \(configuration.maxPowerMilliamps) mA is out of range; use 0…500")
        }
    }

    private static func makeDirectory(_ path: String, record: inout Built, root: String? = nil, name: String? = nil,
                                      isFunction: Bool = false) throws(USBGadgetError) {
        guard mkdir(path, 0o755) == 0 else {
            let code = errno
            let advice: String
            let category: USBGadgetError.Category
            switch code {
            case ENOENT where root != nil:
                advice = "configfs has no usb_gadget directory: \(moduleAdvice); mount configfs if needed (mount -t configfs none /sys/kernel/config)"
                category = .missingSupport
            case ENOENT where isFunction, ENODEV where isFunction:
                advice = "the FunctionFS function is not available: \(moduleAdvice)"
                category = .missingSupport
            case EEXIST where root != nil:
                advice = "a gadget named \(name ?? "") exists already (a run that did not clean up?); remove it, or choose another name"
                category = .busy
            default:
                advice = Self.advice(for: code)
                category = Self.category(for: code)
            }
            throw USBGadgetError("cannot create \(path): \(SystemError(code).description)", path: path, errno: code, advice: advice,
                                 category: category)
        }
        record.directories.append(path)
    }

    private static func mountFunctionFS(instance: String, at directory: String, record: inout Built) throws(USBGadgetError) {
        if mkdir(directory, 0o755) == 0 {
            record.createdMountDirectory = directory
        } else if errno != EEXIST {
            let code = errno
            throw USBGadgetError("cannot create the mount point \(directory): \(SystemError(code).description)", path: directory, errno: code,
                                 advice: advice(for: code), category: category(for: code))
        }
        guard mount(instance, directory, "functionfs", 0, nil) == 0 else {
            let code = errno
            let advice: String
            let category: USBGadgetError.Category
            switch code {
            case ENODEV:
                advice = "the kernel does not know FunctionFS: \(moduleAdvice)"
                category = .missingSupport
            case EBUSY:
                advice = "FunctionFS '\(instance)' is mounted already, or \(directory) is in use; unmount it (umount \(directory)) and retry"
                category = .busy
            default:
                advice = Self.advice(for: code)
                category = Self.category(for: code)
            }
            throw USBGadgetError("cannot mount FunctionFS '\(instance)' at \(directory): \(SystemError(code).description)", path: directory,
                                 errno: code, advice: advice, category: category)
        }
        record.mountedAt = directory
    }

    /// Undoes `record` in reverse order; returns the first failure.
    @discardableResult
    private static func undo(_ record: inout Built, transport: GadgetTransport?, gadgetDirectory: String? = nil) -> USBGadgetError? {
        var first: USBGadgetError?
        func note(_ error: USBGadgetError) { if first == nil { first = error } }
        let gadget = gadgetDirectory ?? record.directories.first
        if let gadget {
            do { try unbind(gadgetDirectory: gadget) } catch { note(error) }
            record.boundUDC = nil
        }
        // The transport holds ep0 and the endpoint files open, which keeps the mount busy.
        transport?.cancel()
        if let target = record.mountedAt {
            if umount2(target, 0) != 0, errno != EINVAL, errno != ENOENT {
                let code = errno
                note(USBGadgetError("cannot unmount \(target): \(SystemError(code).description)", path: target, errno: code,
                                    advice: code == EBUSY ? "a program still has its files open (fuser -vm \(target)); stop it, then umount \(target)"
                                        : advice(for: code),
                                    category: category(for: code)))
            }
            record.mountedAt = nil
        }
        if let mountDirectory = record.createdMountDirectory, rmdir(mountDirectory) != 0, errno != ENOENT {
            let code = errno
            note(USBGadgetError("cannot remove \(mountDirectory): \(SystemError(code).description)", path: mountDirectory, errno: code,
                                advice: advice(for: code), category: category(for: code)))
        }
        record.createdMountDirectory = nil
        if let link = record.link {
            if unlink(link) != 0, errno != ENOENT {
                let code = errno
                note(USBGadgetError("cannot remove the link \(link): \(SystemError(code).description)", path: link, errno: code,
                                    advice: advice(for: code), category: category(for: code)))
            }
            record.link = nil
        }
        // Reverse creation order: the configuration's strings, the configuration, the function,
        // the gadget's strings, the gadget.
        for directory in record.directories.reversed() {
            if rmdir(directory) != 0, errno != ENOENT {
                let code = errno
                note(USBGadgetError("cannot remove \(directory): \(SystemError(code).description)", path: directory, errno: code,
                                    advice: advice(for: code), category: category(for: code)))
            }
        }
        record.directories = []
        return first
    }

    /// Writes `value` to the configfs attribute at `path`; `missing` is the advice when the
    /// attribute does not exist (an older kernel's gadget), instead of loading the modules.
    private static func writeAttribute(_ path: String, _ value: String, advice missing: String? = nil) throws(USBGadgetError) {
        let descriptor: Int32
        switch SystemCall.open(path, O_WRONLY | O_CLOEXEC) {
        case .success(let opened): descriptor = opened
        case .failure(let error):
            throw USBGadgetError("cannot open \(path): \(error)", path: path, errno: error.code,
                                 advice: error.code == ENOENT ? missing ?? advice(for: error.code) : advice(for: error.code),
                                 category: error.code == ENOENT && missing != nil ? .missingSupport : category(for: error.code))
        }
        defer { _ = close(descriptor) }
        let bytes = Array(value.utf8)
        // One write: a configfs attribute takes its value whole.
        let result = bytes.withUnsafeBytes { SystemCall.write(descriptor, $0) }
        if case .success(bytes.count) = result { return }
        let error = if case .failure(let error) = result { error } else { SystemError(EIO) }
        throw USBGadgetError("cannot write '\(value.trimmingNewline)' to \(path): \(error)", path: path,
                             errno: error.code, advice: advice(for: error.code), category: category(for: error.code))
    }

    private static func advice(for code: Int32) -> String {
        switch code {
        case EACCES, EPERM, EROFS: "run as root (configfs, mounting and the UDC need it)"
        case ENOENT, ENODEV: moduleAdvice
        case EBUSY: "something else uses it; unbind or stop it and retry"
        default: "check the kernel log (dmesg) for the reason"
        }
    }

    private static func category(for code: Int32) -> USBGadgetError.Category {
        switch code {
        case EACCES, EPERM, EROFS: .permission
        case ENOENT, ENODEV: .missingSupport
        case EBUSY, EEXIST: .busy
        default: .failed
        }
    }
}

/// Four hex digits.
func hex4(_ value: UInt16) -> String {
    let text = String(value, radix: 16)
    return String(repeating: "0", count: max(0, 4 - text.count)) + text
}

extension String {
    fileprivate var trimmingNewline: String { hasSuffix("\n") ? String(dropLast()) : self }
}
