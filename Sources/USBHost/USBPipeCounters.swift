internal import USBDescriptors
/// Counters of one USB accessory's bulk pipes, for `iapctl` and the tests.
package struct USBPipeCounters: Sendable, Hashable {
    /// IN transfers completed, and the bytes they carried.
    package var inTransfers = 0
    /// Bytes the completed IN transfers carried (the accessory's bytes, before any framing is
    /// checked).
    package var bytesIn = 0
    /// IN transfers that ended with no data (a zero-length packet).
    package var zeroLengthIn = 0
    /// OUT transfers completed, and the bytes they carried.
    package var outTransfers = 0
    /// Bytes the completed OUT transfers carried (link packets, headers included).
    package var bytesOut = 0
    /// OUT transfers sent with a zero-length packet after them (length a multiple of wMaxPacketSize).
    package var zeroLengthOut = 0
    /// Endpoint stalls cleared.
    package var stalls = 0
    /// Device resets (``USBAccessoryTransport/resetDevice(completion:)``) that succeeded.
    package var deviceResets = 0
    /// IN transfers where the device sent more than asked (babble).
    package var overflows = 0
    /// OUT transfers that timed out (the link retransmits what they carried).
    package var timeouts = 0
    /// Other transfer errors retried.
    package var errors = 0
    /// Frames that waited for a free OUT slot.
    package var queuedFrames = 0
    /// Frame bytes copied into OUT slots (frames handed over as arrays) or copied by usbfs
    /// (frames in heap memory): the OUT copies on USB.
    package var bytesCopiedOut = 0
    /// Frame bytes sent from transmit buffers in device memory where the writer laid them out:
    /// no copy (``USBAccessoryTransport/transmitBuffers``).
    package var bytesSentInPlace = 0
    /// Transmit buffers in device memory made so far (see ``USBContextOptions/transmitBuffers``).
    package var transmitBuffers = 0
    /// Ring slots in memory usbfs maps for DMA (zero-copy), and on the heap.
    package var deviceMemorySlots = 0
    /// Ring slots on the heap: the kernel offered no device memory (or ``USBContextOptions/useDeviceMemory``
    /// is off), so usbfs copies each transfer.
    package var heapSlots = 0
    /// Bytes per IN transfer (see ``USBContextOptions/inTransferSize``).
    package var inTransferSize = 0
    /// IN slots lent to the reader beyond the delivery (``USBAccessoryTransport/Event/lent(_:)``).
    package var inSlotsLent = 0
    /// Lent IN slots whose bytes were moved out (copied) because the reader held them too long,
    /// or still held them at close, and the bytes so copied.
    package var inSlotsEvacuated = 0
    /// The bytes moved out of those slots (one copy each, off the normal path).
    package var bytesEvacuated = 0
    /// Transfers still owned by libusb when the teardown gave up waiting for them (leaked rather
    /// than freed under libusb's feet). Always 0 unless the kernel misbehaves.
    package var abandonedTransfers = 0
}
