import AccessorySimulator
import BluetoothTransport
import CLIKit
import Dispatch
import IAPTransport
import Synchronization

// `iapctl simulate` as a Bluetooth accessory: connecting out to a host's iAP2 channel
// (`--bluetooth`), or advertising the accessory's own iAP service and waiting for the host
// (`--bluetooth-advertise`).
extension SimulateCommand {
    static let bluetoothUsage = "iapctl simulate --bluetooth ADDRESS:CHANNEL [--bluetooth-from ADDRESS] [--profile NAME|PATH]"
    static let advertiseUsage = "iapctl simulate --bluetooth-advertise CHANNEL [--profile NAME|PATH]"

    /// `--bluetooth-advertise`: the simulator as a Bluetooth accessory as real ones are
    /// (PROTOCOL.md §7.11): its iAP service advertised through BlueZ only under the accessory's
    /// UUID `…caff`, on RFCOMM `channel`, and a simulated accessory run for each host that
    /// connects to it, declaring the address of the adapter the host came in on. Until Ctrl-C.
    static func runBluetoothAdvertising(_ command: ParsedCommand, channel text: String, profile: SimulatorProfile) throws -> ExitCode {
        guard let channel = UInt8(text), (1...30).contains(channel) else {
            throw UsageError("'\(text)' is not an RFCOMM channel: give one from 1 to 30", usage: advertiseUsage, commandPath: command.path)
        }
        let interrupt = Interrupt()
        let adapters = Mutex<[String: BluetoothAddress]>([:])
        let runners = Mutex<[SimulatorRunner]>([])
        let events = eventPrinter(command)
        let queue = DispatchQueue(label: "iapctl.simulate.bluetooth")
        let service: BluetoothProfile
        do {
            service = try blockingAwait {
                try await BluetoothProfile.advertiseAccessory(channel: channel, queue: queue) { transport in
                    var accessory = profile
                    if let local = adapters.withLock({ $0[transport.peer.adapter] }) { accessory.bluetoothAddress = local.bytes }
                    do {
                        let runner = try SimulatorRunner(profile: accessory, attachment: .transport(transport))
                        runners.withLock { $0.append(runner) }
                        runner.start(events: events)
                        StandardError.write("the host \(transport.peer.address) connected through \(transport.peer.adapter)\n")
                    } catch {
                        StandardError.write("cannot serve the host \(transport.peer.address): \(error)\n")
                        transport.cancel()
                    }
                }
            }
            let known = try blockingAwait { try await service.adapterAddresses() }
            adapters.withLock { $0 = known }
        } catch let error as BlueZError {
            throw ToolError(description: "\(error)", exitCode: error.kind == .permission ? .noPermission : .unavailable)
        }
        StandardError.write("simulating '\(profile.identity().name.escapedForTerminal)' as a Bluetooth accessory advertising "
            + "\(BluetoothProfile.accessoryIAP2UUID) only, on RFCOMM channel \(channel); connect with: iapctl --bluetooth-connect ADDRESS list\n"
            + "press Ctrl-C to stop\n")
        interrupt.wait()
        for runner in runners.withLock({ $0 }) { runner.stop() }
        service.stop()
        return .success
    }

    /// `--bluetooth`: the simulator as a Bluetooth accessory, connected over RFCOMM to a host's
    /// iAP2 channel; its identification declares the local adapter's address. Until Ctrl-C or
    /// the host hangs up.
    static func runBluetooth(_ command: ParsedCommand, target: String, profile: SimulatorProfile) throws -> ExitCode {
        let parts = target.split(separator: ":")
        guard parts.count == 7, let channel = UInt8(parts[6]), (1...30).contains(channel),
              let address = BluetoothAddress(parts[0..<6].joined(separator: ":"))
        else {
            throw UsageError("'\(target)' is not ADDRESS:CHANNEL, e.g. 00:1A:7D:DA:71:13:3 (channel 1-30)", usage: bluetoothUsage,
                             commandPath: command.path)
        }
        var local: BluetoothAddress?
        if let text = command.value("bluetooth-from") {
            guard let parsed = BluetoothAddress(text) else {
                throw UsageError("'\(text)' is not a Bluetooth address", usage: bluetoothUsage, commandPath: command.path)
            }
            local = parsed
        }
        let interrupt = Interrupt()
        let connected: (descriptor: Int32, local: BluetoothAddress)
        let from = local
        do {
            connected = try blockingAwait { try await RFCOMMSocket.connect(to: address, channel: channel, from: from) }
        } catch let error as BlueZError {
            throw ToolError(description: "\(error)", exitCode: error.kind == .permission ? .noPermission : .unavailable)
        }
        var accessory = profile
        accessory.bluetoothAddress = connected.local.bytes
        let transport: BluetoothTransport
        let runner: SimulatorRunner
        do {
            transport = try BluetoothTransport(descriptor: connected.descriptor, peer: BluetoothPeer(address: address, devicePath: ""))
            runner = try SimulatorRunner(profile: accessory, attachment: .transport(transport))
        } catch {
            throw ToolError(description: "\(error)", exitCode: .dataError)
        }
        runner.start(events: eventPrinter(command))
        StandardError.write("simulating '\(profile.identity().name.escapedForTerminal)' over Bluetooth from \(connected.local) to \(address) "
            + "channel \(channel); press Ctrl-C to stop\n")
        interrupt.wait()
        runner.stop()
        return .success
    }
}
