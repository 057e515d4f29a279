internal import USBDescriptors
internal import CLibUSB
package import Dispatch

extension USBAccessoryTransport {
    /// The names of the accessory's native-transport interfaces (their iInterface strings, by
    /// convention the EA protocol each carries), in interface order.
    package var nativeProtocolNames: [String] {
        nativeInterfaces.compactMap { device.nativeInterfaceNames[$0.number] }
    }

    /// Opens the native-transport interface that carries `protocolName`: the one whose name
    /// (iInterface) is the protocol, or the only one there is. It is claimed, and alternate
    /// setting 1 is selected on the setup queue (SET_INTERFACE is a control transfer the kernel
    /// waits for); `completion` then gets a ``USBNativePipe`` (not yet activated), on `queue`.
    ///
    /// Fails, saying what to do, when the configuration has no such interface, when it is
    /// already open, when another program holds it, or when the accessory refuses the
    /// alternate setting.
    package func openNativePipe(for protocolName: String, queue replyQueue: DispatchQueue,
                               completion: @escaping @Sendable (Result<USBNativePipe, USBHostError>) -> Void) {
        let reply: @Sendable (Result<USBNativePipe, USBHostError>) -> Void = { [queue] result in
            if replyQueue === queue { completion(result) } else { replyQueue.async { completion(result) } }
        }
        queue.async { [self] in openNative(protocolName, reply: reply) }
    }

    /// The interface for `protocolName`: by name, else the only one.
    static func nativeInterface(for protocolName: String, among interfaces: [NativeInterfaceLocation],
                                names: [UInt8: String], device: String) -> Result<NativeInterfaceLocation, USBHostError> {
        if let named = interfaces.first(where: { names[$0.number] == protocolName }) { return .success(named) }
        if interfaces.count == 1, let only = interfaces.first { return .success(only) }
        if interfaces.isEmpty {
            return .failure(usbFailure("\(device) declares '\(protocolName)' on a native transport but has no native-transport interface (FF/F0/01 with a bulk pair) in its configuration",
                                           advice: "the accessory's descriptors and its identification disagree; ask its maker, or use a protocol it carries on the iAP2 link"))
        }
        let listed = interfaces.map { "\($0.number) (\(names[$0.number].map { "'\($0)'" } ?? "unnamed"))" }.joined(separator: ", ")
        return .failure(usbFailure("\(device) has \(interfaces.count) native-transport interfaces, \(listed), and none is named '\(protocolName)'",
                                       advice: "the accessory should name each native interface after its protocol (iInterface)"))
    }

    private func openNative(_ protocolName: String, reply: @escaping @Sendable (Result<USBNativePipe, USBHostError>) -> Void) {
        guard case .running = state else {
            return reply(.failure(usbFailure("\(description) is closed")))
        }
        let target: NativeInterfaceLocation
        switch Self.nativeInterface(for: protocolName, among: nativeInterfaces, names: device.nativeInterfaceNames, device: description) {
        case let .success(found): target = found
        case let .failure(error): return reply(.failure(error))
        }
        let number = target.number
        if let closing = nativePipes[number], !closing.isOpen {
            // The previous session on this interface is still closing (alternate setting 0 and
            // the release are on their way): open once it has finished.
            opensAfterClose[number, default: []].append { [self] in openNative(protocolName, reply: reply) }
            return
        }
        guard nativePipes[number] == nil, !nativeOpening.contains(number) else {
            return reply(.failure(usbFailure("native-transport interface \(number) of \(description) already carries an open session",
                                                 advice: "close that session first")))
        }
        let claimed = deviceHandle.claimInterface(number)
        guard claimed == 0 else {
            let advice = claimed == LIBUSB_ERROR_BUSY.rawValue
                ? "another program holds it; stop it (find it with: fuser -v \(device.devicePath)) and try again"
                : "unplug and replug the accessory"
            return reply(.failure(usbFailure("cannot claim native-transport interface \(number) of \(description): \(errorName(claimed))", advice: advice)))
        }
        nativeOpening.insert(number)
        lifecycle.setupCall({ deviceHandle.selectAlternateSetting(target.alternateSetting, of: number, completion: $0) }) { [self] status in
            nativeOpening.remove(number)
            guard case .running = state else {
                deviceHandle.releaseInterface(number)
                lifecycle.finishIfDrained()
                return reply(.failure(usbFailure("\(description) closed while '\(protocolName)' was opening")))
            }
            guard status == 0 else {
                deviceHandle.releaseInterface(number)
                if status == LIBUSB_ERROR_NO_DEVICE.rawValue { deviceGone() }
                // usbfs reports a stalled SET_INTERFACE as EPIPE, which libusb passes on as
                // LIBUSB_ERROR_OTHER (PIPE from other backends).
                let advice = status == LIBUSB_ERROR_PIPE.rawValue || status == LIBUSB_ERROR_OTHER.rawValue
                    ? "the accessory refused (stalled) SET_INTERFACE for the alternate setting. A Linux FunctionFS gadget cannot accept any alternate setting but 0 on kernels without FunctionFS's get_alt callback (added upstream in December 2023; Debian 12's 6.1 lacks it)"
                    : "unplug and replug the accessory"
                return reply(.failure(usbFailure("cannot select alternate setting \(target.alternateSetting) of native-transport interface \(number) of \(description): \(errorName(status))",
                                                     advice: advice)))
            }
            var pipeOptions = options
            pipeOptions.outTransferSize = USBContextOptions.largeInTransferSize
            let pipe = USBNativePipe(
                device: deviceHandle, location: target, options: pipeOptions, inTransferSize: pipe.statistics.inTransferSize,
                description: "\(device.location) interface \(number) ('\(protocolName)')",
                onFinished: { [weak self] pipe in
                    guard let self else { return }
                    if self.nativePipes[pipe.interfaceNumber] === pipe { self.nativePipes[pipe.interfaceNumber] = nil }
                    for open in self.opensAfterClose.removeValue(forKey: pipe.interfaceNumber) ?? [] { open() }
                    self.lifecycle.finishIfDrained()
                })
            // Tracked even when it failed to start: its teardown still uses the handle.
            nativePipes[number] = pipe
            guard pipe.isOpen else {
                return reply(.failure(usbFailure("cannot allocate libusb transfers for \(pipe.description)")))
            }
            reply(.success(pipe))
        }
    }

    /// The native pipes open now (tests).
    var openNativePipes: [USBNativePipe] { nativePipes.values.sorted { $0.interfaceNumber < $1.interfaceNumber } }
}
