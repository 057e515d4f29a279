package import USBDescriptors
package import Dispatch
package import IAPTransport
package import USBHost
package import IAPLink
internal import ByteRing

// The adapter between the USB layer, which knows nothing of iAP, and the transports the link
// runs over: the iAP2 interface classes, `Transport` over a `USBAccessoryTransport`, and
// `ByteChannel` over a `USBNativePipe`. Nothing here copies: events are mapped one to one.

extension USBInterfaceClass {
    /// The iAP2 interface of an accessory in USB host mode: vendor class FF, subclass F0, protocol 00.
    package static let iAP2 = USBInterfaceClass(0xFF, 0xF0, 0x00)
    /// An EA native-transport interface: FF/F0/01 (PROTOCOL.md §4.3).
    package static let iAPNativeTransport = USBInterfaceClass(0xFF, 0xF0, 0x01)
}

extension USBFunctionMatch {
    /// An MFi accessory in USB host mode: the iAP2 interface and its native-transport interfaces.
    package static let iAP2 = USBFunctionMatch(main: .iAP2, companion: .iAPNativeTransport)
}

extension USBHostError {
    /// The same failure as a ``TransportError`` (what the manager reports).
    package var transportError: TransportError {
        let mapped: TransportError.Kind = switch kind {
        case .access: .permission
        case .busy: .busy
        case .noDevice: .hungUp
        case .timeout: .timedOut
        default: .failed
        }
        return TransportError(message, kind: mapped, advice: advice)
    }
}

/// A USB accessory's iAP2 interface as a ``Transport``: the frames the link sends go out as one
/// bulk OUT transfer each, and what arrives is lent in place from the IN slot
/// beyond the call (``TransportEvent/lent(_:)``) when the handler runs on the USB context's queue.
///
/// It offers the accessory's native-transport interfaces (``nativeTransports``) and, through
/// ``capability(_:)``, the pipe's ``USBPipeCounters``, the ``USBDeviceInfo``, the
/// ``USBAccessoryTransport`` itself and a `DeviceReset`.
package final class USBIAPTransport: Transport, NativeTransportProvider {
    /// The USB pipe under this transport.
    package let pipe: USBAccessoryTransport

    /// Runs the link over `pipe` (opened by `USBContext.open`, not yet activated).
    package init(_ pipe: USBAccessoryTransport) { self.pipe = pipe }

    /// The pipe's description, e.g. `usb 1-1.2 2ca3:1002`.
    package var description: String { pipe.description }
    /// Always ``TransportKind/usb``.
    package var kind: TransportKind { .usb }

    /// Starts the pipe; its events reach `handler` on `queue` as transport events.
    package func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) {
        pipe.activate(queue: queue, lendingInSlots: true) { event in
            switch event {
            case let .borrowed(bytes): bytes.withUnsafeBytes { handler(.borrowed(BorrowedBytes($0))) }
            case let .lent(lease): handler(.lent(LentBytes(lease)))
            case let .received(bytes): handler(.received(bytes))
            case let .closed(error): handler(.closed(error?.transportError))
            }
        }
    }

    /// Sends one frame in one bulk OUT transfer.
    package func send(_ frame: [UInt8]) { pipe.send(frame) }

    /// Sends one frame in one bulk OUT transfer: a packet the link laid out in one of the
    /// pipe's transmit buffers goes from there, without a copy.
    package func send(frame: LinkFrame) {
        switch frame {
        case let .bytes(bytes): pipe.send(bytes)
        case let .buffer(buffer): pipe.send(buffer: buffer.packet)
        }
    }

    /// Closes the pipe and the device.
    package func cancel() { pipe.cancel() }

    /// This transport opens the accessory's native-transport interfaces itself.
    package var nativeTransports: (any NativeTransportProvider)? { self }

    /// The pipe's ``USBPipeCounters``, its ``USBDeviceInfo``, the ``USBAccessoryTransport``, or
    /// a `DeviceReset` that resets the USB device in place
    /// (``USBAccessoryTransport/resetDevice(completion:)``). Call on the USB context's queue.
    package func capability<Value>(_ type: Value.Type) -> Value? {
        if type == DeviceReset.self {
            return DeviceReset { [pipe] done in pipe.resetDevice { done($0?.transportError) } } as? Value
        }
        if type == USBPipeCounters.self { return pipe.statistics as? Value }
        if type == PacketBufferPool.self { return pipe.transmitBuffers as? Value }
        if type == USBDeviceInfo.self { return pipe.device as? Value }
        if type == USBAccessoryTransport.self { return pipe as? Value }
        return nil
    }

    /// The names of the accessory's native-transport interfaces (their iInterface strings).
    package var nativeProtocolNames: [String] { pipe.nativeProtocolNames }

    /// Opens the native-transport interface that carries `protocolName` as a ``ByteChannel``.
    package func openNativeChannel(for protocolName: String, queue: DispatchQueue,
                                  completion: @escaping @Sendable (Result<any ByteChannel, TransportError>) -> Void) {
        pipe.openNativePipe(for: protocolName, queue: queue) { result in
            completion(result.map { USBNativeChannel($0) }.mapError(\.transportError))
        }
    }
}

/// A USB native-transport pipe as a ``ByteChannel`` (the reader works on the IN slots in place).
package final class USBNativeChannel: ByteChannel {
    /// The USB pipe under this channel.
    package let pipe: USBNativePipe

    /// Wraps `pipe` (not yet activated).
    package init(_ pipe: USBNativePipe) { self.pipe = pipe }

    /// The pipe's description.
    package var description: String { pipe.description }

    /// Starts the pipe; its events reach `handler` on `queue` as channel events.
    package func activate(queue: DispatchQueue, handler: @escaping @Sendable (ByteChannelEvent) -> Void) {
        pipe.activate(queue: queue) { event in
            switch event {
            case .readable: handler(.readable)
            case .writable: handler(.writable)
            case let .closed(error): handler(.closed(error?.transportError))
            }
        }
    }

    /// Lends the readable bytes in place (see ``USBNativePipe/withReadableBytes(_:)``).
    package func withReadableBytes<Result>(_ body: (RawSpan) throws -> (consumed: Int, result: Result)) rethrows -> Result? {
        try pipe.withReadableBytes(body)
    }

    /// Bytes that can be read now.
    package var readableByteCount: Int { pipe.readableByteCount }
    /// Copies as much of `bytes` as the OUT slots take; returns how much.
    package func write(_ bytes: ArraySlice<UInt8>) -> Int { pipe.write(bytes) }
    /// Whether ``write(_:)`` would take bytes now.
    package var isWritable: Bool { pipe.isWritable }
    /// Bytes taken and not yet acknowledged by the device.
    package var unsentByteCount: Int { pipe.unsentByteCount }
    /// Bytes the device took.
    package var bytesDelivered: Int { pipe.bytesDelivered }
    /// Ends the session on the accessory and releases the interface.
    package func close() { pipe.close() }
}
