// serial-echo: the smallest program on AccessoryHost's core. It serves one accessory on a serial
// port and echoes bytes through one of its protocols, with nothing but the core (`AccessoryHost`)
// and the serial transports (`IAPTransport`): it links neither libusb, libdbus nor libcrypto
// (tools/examples/serial-only-demo.sh checks that with ldd).
//
// Usage: serial-echo PORT[:BAUD] [PROTOCOL] [BYTES]
//   (default protocol com.example.echo, 1 MiB; exits 0 when the echo is byte-exact)
import AccessoryHost
import Glibc
import IAPTransport

/// Writes `line` to standard error.
func complain(_ line: String) {
    var text = line + "\n"
    text.withUTF8 { bytes in _ = write(2, bytes.baseAddress, bytes.count) }
}

let arguments = Array(CommandLine.arguments.dropFirst())
guard let port = arguments.first else {
    complain("usage: serial-echo PORT[:BAUD] [PROTOCOL] [BYTES]")
    exit(64)
}
let protocolString = arguments.count > 1 ? arguments[1] : "com.example.echo"
let total = arguments.count > 2 ? Int(arguments[2]) ?? 1 << 20 : 1 << 20

func fail(_ message: String) -> Never {
    complain("serial-echo: \(message)")
    exit(1)
}

let manager = AccessoryManager(configuration: .init(supportedProtocols: [protocolString]))
do {
    manager.attach(try SerialTransport(spec: try SerialPortSpec(parsing: port)))
} catch {
    fail("\(error)")
}
guard let accessory = await manager.waitForAccessory(timeout: .seconds(30)) else { fail("no accessory identified on \(port) within 30 s") }
print("accessory: \(accessory.name) (\(accessory.manufacturer)), protocols \(accessory.protocolStrings.joined(separator: ", "))")
do {
    let session = try await accessory.openSession(for: protocolString)
    let sent = (0..<total).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }
    async let writing: Void = {
        try await session.write(sent)
        try await session.drain()
    }()
    var received: [UInt8] = []
    received.reserveCapacity(total)
    while received.count < total, let chunk = try await session.read(maxBytes: 65_536) { received += chunk }
    try await writing
    guard received == sent else { fail("the echo differs (\(received.count) of \(total) bytes back)") }
    print("echoed \(total) bytes on \(protocolString), byte for byte")
    session.close()
} catch {
    fail("\(error)")
}
await manager.shutdown()
