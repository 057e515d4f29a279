internal import Dispatch
internal import Glibc
internal import IAPTransport
internal import Synchronization
internal import SystemCalls

// Opening a FunctionFS instance's files and writing its descriptors and strings.

/// Opens a FunctionFS file with `flags`; the error says what a person can do about a failure.
func openEndpointFile(_ path: String, flags: Int32, stage: String) throws(TransportError) -> Int32 {
    switch SystemCall.open(path, flags) {
    case .success(let descriptor):
        return descriptor
    case .failure(let error):
        let code = error.code
        let advice: String
        switch code {
        case ENOENT where stage == "ep0":
            advice = "mount FunctionFS there first (mount -t functionfs <instance> <directory>, after modprobe usb_f_fs), or let iapctl simulate --gadget do it"
        case ENOENT:
            advice = "the kernel made no endpoint files, so it did not take the descriptors; see dmesg"
        case EACCES, EPERM:
            advice = "run as root, or mount FunctionFS with uid=<your uid>"
        case EBUSY:
            advice = "the function is closing; unmount and mount it again"
        default:
            advice = "check that FunctionFS is mounted there and that no other program uses it"
        }
        throw TransportError("cannot open \(path): \(error)", errno: code, advice: advice)
    }
}

/// Writes one setup blob to `ep0` in a single `write()`, as FunctionFS requires.
func writeSetupBlob(_ ep0: Int32, _ blob: [UInt8], path: String, what: String) throws(TransportError) {
    let result = blob.withUnsafeBytes { SystemCall.write(ep0, $0) }
    if case .success(blob.count) = result { return }
    let code = if case .failure(let error) = result { error.code } else { EIO }
    let advice: String
    switch code {
    case EINVAL:
        advice = "the kernel refused them; dmesg says why (an old kernel without SuperSpeed support in FunctionFS refuses HAS_SS_DESC)"
    case EBADFD, EBUSY:
        advice = "another program already configured this function; stop it, or unmount and mount FunctionFS again"
    default:
        advice = "unmount and mount FunctionFS again, then retry"
    }
    throw TransportError("cannot write the USB \(what) to \(path): \(SystemError(code).description)", errno: code, advice: advice)
}

/// `FUNCTIONFS_ENDPOINT_DESC`: `_IOR('g', 130, struct usb_endpoint_descriptor)` (9 bytes). It
/// reads back the endpoint descriptor of the speed the host connected at.
private let functionFSEndpointDescriptorRequest: UInt = (2 << 30) | (9 << 16) | (UInt(UInt8(ascii: "g")) << 8) | 130

/// The IN endpoint's `wMaxPacketSize` at the connected speed, or `nil` when the kernel cannot say.
func activeMaxPacketSize(_ descriptor: Int32) -> Int? {
    var bytes = [UInt8](repeating: 0, count: 9)
    let result = bytes.withUnsafeMutableBytes { ioctl(descriptor, functionFSEndpointDescriptorRequest, $0.baseAddress!) }
    guard result == 0, bytes[0] >= 7, bytes[1] == 0x05 else { return nil }
    let size = Int(UInt16(bytes[4]) | UInt16(bytes[5]) << 8) & 0x07FF
    return size >= 8 ? size : nil
}
