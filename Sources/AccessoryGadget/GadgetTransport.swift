package import AccessorySimulator
package import Dispatch
package import IAPTransport
internal import Glibc
internal import Synchronization
internal import SystemCalls

/// Where the gadget's link to the host stands, as the events on `ep0` tell it.
package enum GadgetConnection: String, Sendable, Hashable {
    /// Not bound to a USB device controller (before the first BIND, or after UNBIND).
    case unbound
    /// Bound, but the host has not configured the function (or it was reset: DISABLE). Frames
    /// sent now are dropped.
    case bound
    /// The host configured the function (ENABLE): the endpoints carry data.
    case enabled
    /// The bus is suspended; RESUME returns to the state before.
    case suspended
}

/// What a ``GadgetTransport`` has done so far.
package struct GadgetTransportStatistics: Sendable, Hashable {
    /// Frames written to the IN endpoint completely.
    package var framesSent = 0
    /// Bytes of those frames.
    package var bytesSent = 0
    /// Frames written as two writes (all but the last byte, then the last byte) so that the
    /// transfer ends with a short packet.
    package var shortPacketSplits = 0
    /// Frames dropped because the endpoints were down (not enabled, or a write failed).
    package var framesDropped = 0
    /// Reads from the OUT endpoint that returned data.
    package var reads = 0
    /// Bytes those reads returned.
    package var bytesReceived = 0
    /// Reads or writes that failed because the endpoint was down (each waits for the next ENABLE).
    package var endpointErrors = 0
    /// ``GadgetTransport/stallIn()`` requests performed (a `read()` on the IN endpoint).
    package var inHaltRequests = 0
    /// Of those, how many the kernel confirmed (`EBADMSG`: the endpoint is halted).
    package var inHalts = 0
    /// Events read from `ep0`.
    package var events = 0
    /// Control requests (SETUP events) answered: host-to-device ones acknowledged, device-to-host
    /// ones stalled.
    package var setupRequests = 0

    /// All zero.
    package init() {}
}

/// The simulated accessory's end of a USB cable: the iAP2 bulk pipes of a FunctionFS function,
/// with this machine as the USB device (``TransportKind/gadget``).
///
/// ``init(functionDirectory:nativeTransportProtocols:superSpeedMaxBurst:)`` opens `ep0` of a
/// mounted FunctionFS instance, writes ``FunctionFSDescriptors`` (descriptors, then strings),
/// opens the endpoint files the kernel then creates (`ep1`, bulk IN: written to send to the
/// host; `ep2`, bulk OUT: read to receive from it) and starts the **ep0 thread**, which reads
/// the function's events (BIND, ENABLE, DISABLE, SETUP…) and keeps ``connection``. The UDC can
/// be bound from then on (``USBGadget`` does that).
///
/// ``activate(queue:handler:)`` starts two more threads:
/// - the **reader** reads the OUT endpoint 64 KiB at a time (a multiple of every speed's
///   packet size, so the kernel never receives more than was asked for, and more than a link
///   packet, which the host sends one per transfer) and delivers each read as `.received` on
///   the queue;
/// - the **writer** takes the frames given to ``send(_:)`` in order and writes each to the
///   IN endpoint, ending every transfer with a short packet (see ``send(_:)``).
///
/// Both keep several requests queued in the kernel (`queuedRequests`, 4 by default, with
/// Linux's AIO), as a device's controller does, so that the host's next transfer finds a
/// request waiting; a read is then copied out of its request's buffer into an array of its
/// size, and a frame into its request's buffer. With one request (or without AIO) they block in
/// `read()` and `write()` instead, the read going straight into the array delivered.
///
/// While the function is not enabled (no host, unbound, reset), endpoint I/O fails (`EAGAIN`,
/// `ESHUTDOWN`…): the reader then waits for the next ENABLE the ep0 thread sees instead of
/// retrying, and frames sent meanwhile are dropped: the iAP2 link retransmits what matters.
/// `.closed` comes only after ``cancel()`` (`.closed(nil)`) or when `ep0` itself fails (the
/// function is gone); never for a host that comes and goes.
///
/// ``cancel()`` stops all three threads and waits for them before it closes the files, so no
/// thread or descriptor outlives it. Threads blocked in the kernel are woken with `SIGURG`,
/// sent to those threads only (``interruptSignal``); the transport installs a handler that does
/// nothing for it unless the process already handles that signal, and never sets `SA_RESTART`.
///
/// The EA native-transport interfaces' endpoint files (``FunctionFSDescriptors/endpoints``
/// from `ep3` on) are not opened here.
package final class GadgetTransport: Transport {
    /// What a person reads, e.g. `usb gadget /dev/ffs-iap2`.
    package let description: String
    /// Always ``TransportKind/gadget``.
    package var kind: TransportKind { .gadget }
    /// The mounted FunctionFS directory, or `nil` for descriptors handed in directly.
    package let functionDirectory: String?
    /// The descriptors written to `ep0`, or `nil` for descriptors handed in directly.
    package let descriptors: FunctionFSDescriptors?

    /// Transfers a FunctionFS transport keeps queued on each bulk endpoint unless told otherwise.
    package static let defaultQueuedRequests = 4

    /// The signal that wakes the transport's threads from blocking calls when it closes.
    package static var interruptSignal: Int32 { SIGURG }

    private let core: GadgetCore

    /// Configures the FunctionFS function mounted at `functionDirectory` and starts watching
    /// its `ep0`.
    ///
    /// - Parameters:
    ///   - functionDirectory: where the FunctionFS instance is mounted (it holds `ep0`).
    ///   - nativeTransportProtocols: EA protocol names that get a native-transport interface
    ///     each (see ``FunctionFSDescriptors``).
    ///   - superSpeedMaxBurst: `bMaxBurst` of the SuperSpeed companion descriptors.
    ///   - queuedRequests: transfers kept queued on each bulk endpoint with the kernel's AIO
    ///     (1: one blocking `read()` or `write()` at a time; also what is done without AIO).
    ///   - layout: the field layout of the interfaces and endpoints (see
    ///     ``FunctionFSDescriptors``); the frames go over the iAP2 interface's bulk pair whatever
    ///     comes before it.
    /// - Throws: ``TransportError`` naming the file that failed and what to do: mount FunctionFS
    ///   first (`ENOENT`), run as root (`EACCES`), stop the other program that configured the
    ///   function (`EBUSY`), or read the kernel log when the kernel refuses the descriptors.
    package convenience init(functionDirectory: String, nativeTransportProtocols: [String] = [],
                            superSpeedMaxBurst: UInt8 = 0,
                            queuedRequests: Int = GadgetTransport.defaultQueuedRequests,
                            layout descriptorLayout: USBDescriptorLayout = .standard) throws(TransportError) {
        let layout: FunctionFSDescriptors
        do {
            layout = try FunctionFSDescriptors(nativeTransportProtocols: nativeTransportProtocols,
                                               superSpeedMaxBurst: superSpeedMaxBurst, layout: descriptorLayout)
        } catch {
            throw TransportError("cannot describe the USB function: \(error.message)")
        }
        let directory = functionDirectory.hasSuffix("/") ? String(functionDirectory.dropLast()) : functionDirectory
        let ep0 = try openEndpointFile(directory + "/ep0", flags: O_RDWR | O_CLOEXEC, stage: "ep0")
        var opened = [ep0]
        do throws(TransportError) {
            try writeSetupBlob(ep0, layout.descriptorsBlob, path: directory + "/ep0", what: "descriptors")
            try writeSetupBlob(ep0, layout.stringsBlob, path: directory + "/ep0", what: "strings")
            let files = layout.iAP2EndpointFiles
            let inEndpoint = try openEndpointFile(directory + "/" + files.in, flags: O_RDWR | O_NONBLOCK | O_CLOEXEC, stage: "endpoint")
            opened.append(inEndpoint)
            let outEndpoint = try openEndpointFile(directory + "/" + files.out, flags: O_RDWR | O_NONBLOCK | O_CLOEXEC, stage: "endpoint")
            opened.append(outEndpoint)
            let core = try GadgetCore(
                ep0: ep0, inEndpoint: inEndpoint, outEndpoint: outEndpoint,
                maxPacket: nil, isFunctionFS: true, name: "usb gadget \(directory)",
                retryInterval: .milliseconds(500), queuedRequests: queuedRequests)
            self.init(core: core, description: "usb gadget \(directory)", functionDirectory: directory, descriptors: layout)
        } catch {
            for descriptor in opened { _ = Glibc.close(descriptor) }
            throw error
        }
    }

    /// Runs over descriptors opened elsewhere: what the tests use, with pipes or socket pairs in
    /// place of the endpoint files. The transport owns and closes all of them.
    ///
    /// - Parameters:
    ///   - ep0: where the 12-byte FunctionFS events come from, or `nil` for none (the
    ///     connection is then ``GadgetConnection/enabled`` for good, and any endpoint error
    ///     closes the transport).
    ///   - inEndpoint: written with the frames (the IN endpoint, `ep1`).
    ///   - outEndpoint: read for the host's bytes (the OUT endpoint, `ep2`).
    ///   - maxPacket: the IN endpoint's `wMaxPacketSize` for the short-packet rule (at least 2).
    ///   - isFunctionFS: whether these are FunctionFS files (a read of 0 bytes is then a
    ///     zero-length packet, not the end of the file, and the IN endpoint's packet size is
    ///     asked of the kernel after each ENABLE).
    ///   - retryInterval: how long an endpoint error waits for an ENABLE before trying again.
    convenience init(ep0: Int32?, inEndpoint: Int32, outEndpoint: Int32, maxPacket: Int, isFunctionFS: Bool = false,
         retryInterval: Duration = .milliseconds(500), description: String = "usb gadget (descriptors)") throws(TransportError) {
        let core = try GadgetCore(
            ep0: ep0, inEndpoint: inEndpoint, outEndpoint: outEndpoint, maxPacket: max(2, maxPacket),
            isFunctionFS: isFunctionFS, name: description, retryInterval: retryInterval)
        self.init(core: core, description: description, functionDirectory: nil, descriptors: nil)
    }

    private init(core: GadgetCore, description: String, functionDirectory: String?, descriptors: FunctionFSDescriptors?) {
        self.core = core
        self.description = description
        self.functionDirectory = functionDirectory
        self.descriptors = descriptors
    }

    deinit {
        // Released without cancel(): stop the threads and close the files, silently.
        core.teardown(reason: nil, deliver: false, waitIfBusy: false)
    }

    /// Where the link to the host stands now.
    package var connection: GadgetConnection { core.connection }

    /// Counts of what the transport did.
    package var statistics: GadgetTransportStatistics { core.statistics }

    /// Calls `handler` with every change of ``connection``, on the ep0 thread: it must return
    /// quickly and must not wait for the queue the transport was activated on. Handlers add up
    /// (a ``SimulatorRunner`` running over this transport has one) and are called in the order
    /// they were added; ``cancel()`` drops them.
    package func onConnectionChange(_ handler: @escaping @Sendable (GadgetConnection) -> Void) {
        core.addConnectionObserver(handler)
    }

    /// Starts the reader and writer threads; events go to `handler` on `queue` (serial).
    ///
    /// Activating again does nothing; activating a transport that was cancelled first delivers
    /// `.closed(nil)`.
    package func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) {
        core.activate(queue: queue, handler: handler)
    }

    /// Queues one frame for the IN endpoint; the writer thread writes frames in order. Never
    /// blocks.
    ///
    /// Zero-length-packet rule: the host keeps IN transfers of 16 or 64 KiB queued, and a USB transfer
    /// ends only at a packet shorter than `wMaxPacketSize` (or when its buffer is full). A frame
    /// whose length is a multiple of the packet size ends with a full packet, so the host's
    /// transfer would stay open and the frame would sit in the host controller until the next
    /// write. FunctionFS cannot ask for a zero-length packet, so such a frame is written in two
    /// writes: all but its last byte (which ends with a short packet), then the last byte alone.
    /// The host's frame scanner joins the two. The packet size is the one the kernel reports for
    /// the speed in use (64 when it cannot say: every larger bulk size is a multiple of it).
    ///
    /// Frames sent while the function is not enabled, or whose write fails, are dropped.
    package func send(_ frame: [UInt8]) {
        core.send(frame)
    }

    /// Halts the IN endpoint once, after the frames already sent: the host's next IN transfer
    /// ends with a STALL, and writes work again after the host clears the halt
    /// (`CLEAR_FEATURE(ENDPOINT_HALT)`, which libusb sends for `libusb_clear_halt`).
    ///
    /// FunctionFS halts an endpoint when it is used against its direction: the writer thread
    /// `read()`s the IN endpoint file, which the kernel answers with `EBADMSG` once the halt is
    /// set (``GadgetTransportStatistics/inHalts``). It is done between two writes, because
    /// most controllers refuse to halt an IN endpoint with a transfer queued. Does nothing while
    /// the function is not enabled.
    package func stallIn() {
        core.stallIn()
    }

    /// Closes the transport: wakes and joins the three threads, closes the files, then delivers
    /// `.closed(nil)` unless a close was already delivered. Frames not yet written are dropped.
    /// Returns once the threads have ended. Calling it again does nothing.
    package func cancel() {
        core.teardown(reason: nil, deliver: true, waitIfBusy: true)
    }

    // Test hooks.

    /// Threads started and not yet ended.
    var runningThreads: Int { core.runningThreads.load(ordering: .acquiring) }

    /// The start of this transport's thread names (`gadget<n>`; then `-ep0`, `-in`, `-out`).
    var threadNamePrefix: String { core.threadPrefix }

    /// Every descriptor the transport holds: the three endpoints and its wake pipe's two ends
    /// (-1 where there is none); `cancel()` closes them all.
    var fileDescriptors: [Int32] { [core.ep0, core.inEndpoint, core.outEndpoint, core.wakeReader, core.wakeWriter] }

    /// Calls `handler` on the reader or writer thread after each endpoint error is counted.
    func onEndpointError(_ handler: @escaping @Sendable () -> Void) {
        core.state.withLock { $0.endpointErrorObserver = handler }
    }
}

extension GadgetTransport: HostReconnectingWire {
    /// ``connection`` as the simulator's runner sees it: unbound and bound are no host.
    package var hostConnection: HostConnectionState { HostConnectionState(connection) }

    /// Calls `handler` with every change of ``hostConnection`` (see ``onConnectionChange(_:)``).
    package func onHostConnectionChange(_ handler: @escaping @Sendable (HostConnectionState) -> Void) {
        onConnectionChange { handler(HostConnectionState($0)) }
    }
}

extension HostConnectionState {
    init(_ connection: GadgetConnection) {
        switch connection {
        case .unbound, .bound: self = .absent
        case .enabled: self = .configured
        case .suspended: self = .suspended
        }
    }
}
