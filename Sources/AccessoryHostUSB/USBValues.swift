package import USBHost

// USB's settings, failures and counters as the product shows them. USBHost (libusb) is no
// product: these are AccessoryHostUSB's own values, each made from (or turned into) USBHost's.

/// How the USB source behaves: transfers, buffers, timeouts and how devices are followed. The
/// defaults suit accessories on any Linux host controller.
public struct USBOptions: Sendable, Hashable {
    /// The settings in USBHost's form.
    package var context = USBContextOptions()

    /// The defaults.
    public init() {}

    /// Bulk IN transfers always queued per accessory (each over its own ring slot).
    public var inTransfers: Int {
        get { context.inTransfers }
        set { context.inTransfers = newValue }
    }
    /// Bytes per IN transfer, or `nil` to choose per device (the default): 65,536 where usbfs
    /// says the host controller does scatter-gather (one URB carries the whole transfer, and any
    /// link packet fits in one transfer, so the frame scanner reads every packet in place), and
    /// 16,384 elsewhere: there libusb splits larger transfers into chained 16 KiB URBs, which
    /// loses data on some controllers (the Raspberry Pi's dwc2) when a short packet ends them
    /// (PROTOCOL.md §4.6). The size in use is in ``USBPipeStatistics/inTransferSize``.
    public var inTransferSize: Int? {
        get { context.inTransferSize }
        set { context.inTransferSize = newValue }
    }
    /// OUT transfers in flight at most; further frames wait in order.
    public var outTransfers: Int {
        get { context.outTransfers }
        set { context.outTransfers = newValue }
    }
    /// Bytes per OUT slot: one whole link packet (at most 65535 bytes).
    public var outTransferSize: Int {
        get { context.outTransferSize }
        set { context.outTransferSize = newValue }
    }
    /// The most transmit buffers of ``outTransferSize`` bytes in usbfs DMA memory lent to the
    /// link for the packets it sends: a packet is laid out there by the writer, sent from there
    /// and kept there until acknowledged, so it is copied once. Eight are made at open, more
    /// while every one is held (packets queued in the sessions' buffers and in flight), up to
    /// this many. Packets that find none free (over the limit, without device memory, or past
    /// the kernel's usbfs memory limit, `usbfs_memory_mb`, 16 MiB for all devices by default) go
    /// through the OUT slots: one copy more. 0 turns them off.
    public var transmitBuffers: Int {
        get { context.transmitBuffers }
        set { context.transmitBuffers = newValue }
    }
    /// Take ring slots from usbfs DMA memory (`libusb_dev_mem_alloc`) when the kernel offers it.
    public var useDeviceMemory: Bool {
        get { context.useDeviceMemory }
        set { context.useDeviceMemory = newValue }
    }
    /// Detach a kernel driver bound to the iAP interface (none is expected) instead of failing.
    public var detachKernelDriver: Bool {
        get { context.detachKernelDriver }
        set { context.detachKernelDriver = newValue }
    }
    /// Use libusb hotplug notifications; false (or no hotplug support) polls the device list.
    public var hotplug: Bool {
        get { context.hotplug }
        set { context.hotplug = newValue }
    }
    /// How often the device list is polled without hotplug.
    public var pollInterval: Duration {
        get { context.pollInterval }
        set { context.pollInterval = newValue }
    }
    /// OUT transfer timeout; doubles after each timeout up to the maximum, back after a success.
    public var outTimeoutMilliseconds: UInt32 {
        get { context.outTimeoutMilliseconds }
        set { context.outTimeoutMilliseconds = newValue }
    }
    /// The longest the OUT transfer timeout grows to by doubling, in milliseconds.
    public var maxOutTimeoutMilliseconds: UInt32 {
        get { context.maxOutTimeoutMilliseconds }
        set { context.maxOutTimeoutMilliseconds = newValue }
    }
    /// Transfer errors in a row after which the transport gives up. The transfers in flight when
    /// one fails count as one; each round is retried after a back-off of 20 ms doubling to 1 s,
    /// so the default 8 spans about 2.3 s.
    public var maxConsecutiveErrors: Int {
        get { context.maxConsecutiveErrors }
        set { context.maxConsecutiveErrors = newValue }
    }
    /// Frames allowed to wait for a free OUT slot (the link window keeps it far below this).
    public var maxQueuedFrames: Int {
        get { context.maxQueuedFrames }
        set { context.maxQueuedFrames = newValue }
    }
    /// How long a teardown waits for libusb to give cancelled transfers back.
    public var teardownTimeoutMilliseconds: Int {
        get { context.teardownTimeoutMilliseconds }
        set { context.teardownTimeoutMilliseconds = newValue }
    }
    /// Timeout of each string-descriptor read at open.
    public var stringTimeoutMilliseconds: UInt32 {
        get { context.stringTimeoutMilliseconds }
        set { context.stringTimeoutMilliseconds = newValue }
    }
}

/// Counters of one USB accessory's bulk pipes (transfers, bytes, stalls, zero-length packets,
/// slots in device memory…): ``AccessoryHost/AccessoryManager/usbStatistics(of:)``.
public struct USBPipeStatistics: Sendable, Hashable {
    /// The counters in USBHost's form.
    package let counters: USBPipeCounters

    /// The statistics `counters` hold.
    package init(_ counters: USBPipeCounters) { self.counters = counters }

    /// IN transfers completed (their bytes: ``bytesIn``).
    public var inTransfers: Int { counters.inTransfers }
    /// Bytes the completed IN transfers carried (the accessory's bytes, before any framing is
    /// checked).
    public var bytesIn: Int { counters.bytesIn }
    /// IN transfers that ended with no data (a zero-length packet).
    public var zeroLengthIn: Int { counters.zeroLengthIn }
    /// OUT transfers completed (their bytes: ``bytesOut``).
    public var outTransfers: Int { counters.outTransfers }
    /// Bytes the completed OUT transfers carried (link packets, headers included).
    public var bytesOut: Int { counters.bytesOut }
    /// OUT transfers sent with a zero-length packet after them (length a multiple of wMaxPacketSize).
    public var zeroLengthOut: Int { counters.zeroLengthOut }
    /// Endpoint stalls cleared.
    public var stalls: Int { counters.stalls }
    /// Device resets that succeeded (the transport resets a device that stopped answering).
    public var deviceResets: Int { counters.deviceResets }
    /// IN transfers where the device sent more than asked (babble).
    public var overflows: Int { counters.overflows }
    /// OUT transfers that timed out (the link retransmits what they carried).
    public var timeouts: Int { counters.timeouts }
    /// Other transfer errors retried.
    public var errors: Int { counters.errors }
    /// Frames that waited for a free OUT slot.
    public var queuedFrames: Int { counters.queuedFrames }
    /// Frame bytes copied into OUT slots (frames handed over as arrays) or copied by usbfs
    /// (frames in heap memory): the OUT copies on USB.
    public var bytesCopiedOut: Int { counters.bytesCopiedOut }
    /// Frame bytes sent from transmit buffers in device memory where the writer laid them out:
    /// no copy (the transmit buffers).
    public var bytesSentInPlace: Int { counters.bytesSentInPlace }
    /// Transmit buffers in device memory made so far (see ``USBOptions/transmitBuffers``).
    public var transmitBuffers: Int { counters.transmitBuffers }
    /// Ring slots in memory usbfs maps for DMA (zero-copy).
    public var deviceMemorySlots: Int { counters.deviceMemorySlots }
    /// Ring slots on the heap: the kernel offered no device memory (or ``USBOptions/useDeviceMemory``
    /// is off), so usbfs copies each transfer.
    public var heapSlots: Int { counters.heapSlots }
    /// Bytes per IN transfer (see ``USBOptions/inTransferSize``).
    public var inTransferSize: Int { counters.inTransferSize }
    /// IN slots lent to the reader beyond the delivery (received bytes kept where they arrived).
    public var inSlotsLent: Int { counters.inSlotsLent }
    /// Lent IN slots whose bytes were moved out (copied) because the reader held them too long,
    /// or still held them at close (the bytes so copied: ``bytesEvacuated``).
    public var inSlotsEvacuated: Int { counters.inSlotsEvacuated }
    /// The bytes moved out of those slots (one copy each, off the normal path).
    public var bytesEvacuated: Int { counters.bytesEvacuated }
    /// Transfers still owned by libusb when the teardown gave up waiting for them (leaked rather
    /// than freed under libusb's feet). Always 0 unless the kernel misbehaves.
    public var abandonedTransfers: Int { counters.abandonedTransfers }
}

/// A USB failure, with what a person can do about it.
///
/// Decide on ``kind``, never on the message: the message is for people and may change.
public struct USBError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The kind of failure, for code that reacts to it.
    public enum Kind: String, Hashable, Sendable {
        /// No USB on this machine (no usbfs), or libusb could not start.
        case unavailable
        /// No permission to open the device node.
        case access
        /// The interface is held by a kernel driver or another process.
        case busy
        /// The device went away.
        case noDevice
        /// The device stalled a request it should have taken.
        case stall
        /// A transfer timed out.
        case timeout
        /// The device is not an accessory in USB host mode (no FF/F0/00 interface).
        case notAnAccessory
        /// Anything else libusb reported.
        case io
    }

    /// The kind of failure: what code decides on (never the message).
    public var kind: Kind
    /// What failed, e.g. "cannot claim interface 0 of 2ca3:1002 at 1-1.2".
    public var message: String
    /// What to do next.
    public var advice: String?
    /// libusb's error code, when the failure came from libusb.
    public var code: Int32?

    /// An error of `kind` saying `message`, with `advice` and libusb's `code` when there is one.
    public init(_ kind: Kind, _ message: String, advice: String? = nil, code: Int32? = nil) {
        self.kind = kind
        self.message = message
        self.advice = advice
        self.code = code
    }

    /// The error `error` of the USB layer.
    package init(_ error: USBHostError) {
        let kind: Kind = switch error.kind {
        case .unavailable: .unavailable
        case .access: .access
        case .busy: .busy
        case .noDevice: .noDevice
        case .stall: .stall
        case .timeout: .timeout
        case .notAnAccessory: .notAnAccessory
        case .io: .io
        }
        self.init(kind, error.message, advice: error.advice, code: error.code)
    }

    /// The message, then the advice after a semicolon.
    public var description: String { advice.map { "\(message); \($0)" } ?? message }
}
