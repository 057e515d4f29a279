import CLIKit
import Glibc
import IAPInspect
import IAPTransport
import Synchronization
import SystemCalls

/// `--trace-file FILE.pcapng` (or `--trace-format pcapng`): every frame of every accessory in
/// pcapng, one interface per transport, for Wireshark with `tools/clients/wireshark/iap.lua`.
final class PcapTraceFile: Sendable {
    /// The open file, shared with the recorder's writes.
    private final class Handle: Sendable {
        let file: Mutex<UnsafeMutablePointer<FILE>?>
        init(_ file: sending UnsafeMutablePointer<FILE>) { self.file = Mutex(file) }
    }

    private let handle: Handle
    private let recorder: PcapngTraceRecorder

    /// Whether the options ask for pcapng: `--trace-format pcapng`, or a `--trace-file` ending
    /// in `.pcapng` with no format given.
    static func wanted(_ command: ParsedCommand) throws -> Bool {
        let path = command.value("trace-file")
        switch command.value("trace-format") ?? "auto" {
        case "pcapng":
            guard path != nil else {
                throw UsageError("a pcapng trace goes to a file: add --trace-file FILE.pcapng",
                                 usage: "iapctl --trace-file FILE.pcapng …", commandPath: command.path)
            }
            return true
        case "text": return false
        default: return path?.hasSuffix(".pcapng") ?? false
        }
    }

    init(path: String) throws {
        guard let handle = fopen(path, "wb") else {
            throw ToolError(description: "cannot write the trace file '\(path)': \(SystemError.last.text)", exitCode: .ioError)
        }
        let shared = Handle(handle)
        self.handle = shared
        recorder = PcapngTraceRecorder(application: "iapctl \(toolVersion())", clock: {
            var now = timespec()
            clock_gettime(CLOCK_REALTIME, &now)
            return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
        }, write: { bytes in
            shared.file.withLock { file in
                guard let file else { return }
                _ = bytes.withUnsafeBytes { fwrite($0.baseAddress, 1, $0.count, file) }
                fflush(file)
            }
        })
    }

    /// `transport`, traced into the file as an interface of its own.
    func tap(_ transport: any Transport) -> any Transport {
        let recorder = self.recorder
        let wire = CaptureTransport(transport.kind)
        let interface = recorder.addInterface(name: transport.description, description: "iAP accessory on \(wire.name): \(transport.description)",
                                              transport: wire)
        return TracingTransport(transport) { direction, bytes in
            recorder.record(direction == .out ? .hostToAccessory : .accessoryToHost, bytes, on: interface)
        }
    }

    func finish() {
        handle.file.withLock { file in
            if let file { fclose(file) }
            file = nil
        }
    }
}

extension CaptureTransport {
    /// The capture's name for a transport of `kind` (one mapping for every pcapng tap of iapctl).
    init(_ kind: TransportKind) {
        switch kind {
        case .memory: self = .memory
        case .serial: self = .serial
        case .usb: self = .usb
        case .gadget: self = .gadget
        case .bluetooth: self = .bluetooth
        }
    }
}
