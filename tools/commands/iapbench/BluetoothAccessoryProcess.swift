import AccessorySimulator
import BluetoothTransport
import CLIKit
import Dispatch
import Glibc
import IAPTransport

/// `iapbench bluetooth`'s accessory side in a process of its own (`iapbench
/// bluetooth-accessory`), so that the benchmark process's CPU time is the host's alone: it
/// connects from the accessory's adapter to the host's channel, then either echoes raw bytes
/// (the ceiling) or runs the simulated echo accessory over iAP2. It says `ready` once connected,
/// answers each input line with its CPU time and link counters (as `usb-gadget` does), and
/// disconnects when its input ends.
enum BluetoothAccessoryProcess {
    /// What runs on the connection.
    enum Mode: String, CaseIterable {
        /// Bytes echoed back as they come (the raw RFCOMM ceiling).
        case raw
        /// The simulated echo accessory, over iAP2.
        case simulator
    }

    static func serve(_ command: ParsedCommand) throws -> ExitCode {
        guard let mode = Mode(rawValue: command.value("mode") ?? "simulator"),
              let hostText = command.value("host"), let host = BluetoothAddress(hostText),
              let accessoryText = command.value("accessory"), let accessory = BluetoothAddress(accessoryText),
              let channel = try command.integer("channel", in: 1...30)
        else { throw ExitCode.usage }
        let connected = try BluetoothBenchmarks.connect(to: host, channel: UInt8(channel), from: accessory)
        var runner: SimulatorRunner?
        let echoed = DispatchSemaphore(value: 0)
        switch mode {
        case .raw:
            DispatchQueue(label: "iapbench.rfcomm-echo").async {
                BluetoothBenchmarks.echoLoop(connected.descriptor)
                echoed.signal()
            }
        case .simulator:
            var profile = LoopbackBenchmarks.echoProfile(sessions: 1, maxPacketLength: 65_535)
            profile.link.maxPacketLength = try command.integer("packet-length", in: 128...65_535) ?? 16_384
            profile.link.maxOutstandingPackets = try command.integer("window", in: 1...127) ?? 8
            profile.bluetoothAddress = connected.local.bytes
            // (The transport owns the descriptor from here, and closes it when it cannot be made.)
            let transport = try BluetoothTransport(descriptor: connected.descriptor, peer: BluetoothPeer(address: host, devicePath: ""))
            runner = try SimulatorRunner(profile: profile, attachment: .transport(transport))
            runner?.start()
            echoed.signal()
        }
        StandardOutput.write("ready\n")
        while readLine() != nil {
            let links = runner?.linkStatistics
            StandardOutput.write("cpu \(ProcessFigures.now().cpuSeconds) acks \(links?.acksSent ?? 0) packets \(links?.dataPacketsDelivered ?? 0)\n")
        }
        runner?.stop()
        if mode == .raw {
            // The host's side shut down first; the echo then ends (bounded by its 60 s poll).
            _ = shutdown(connected.descriptor, Int32(SHUT_RDWR))
            echoed.wait()
            _ = close(connected.descriptor) // only once the echo is done with it
        }
        return .success
    }
}
