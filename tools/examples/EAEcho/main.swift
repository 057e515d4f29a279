// The entry point: the one file that differs from the iOS app. On iOS, UIApplicationMain runs
// the main run loop and the app's Info.plist declares its protocols
// (UISupportedExternalAccessoryProtocols); here the entry point declares them, says where
// accessories are attached, starts the app and runs the main run loop.
//
// Usage: ea-echo [--simulate | --serial DEVICE[:BAUD]] [--bytes N]
//   --simulate   a simulated accessory in process (the built-in multi-sensor profile)
//   --serial     an accessory on a serial port; without either, USB accessories are used

import AccessorySimulator
import ExternalAccessory
import Foundation

var arguments = CommandLine.arguments.dropFirst()
var simulate = false
var serialPorts: [String] = []
var bytes = 4 << 20
while let argument = arguments.popFirst() {
    switch argument {
    case "--simulate": simulate = true
    case "--serial": serialPorts.append(arguments.popFirst() ?? "")
    case "--bytes": bytes = Int(arguments.popFirst() ?? "") ?? -1
    default:
        FileHandle.standardError.write(Data("usage: ea-echo [--simulate | --serial DEVICE[:BAUD]] [--bytes N]\n".utf8))
        exit(64)
    }
}
guard bytes > 0 else {
    FileHandle.standardError.write(Data("ea-echo: --bytes takes a positive count\n".utf8))
    exit(64)
}

EAAccessoryManager.configure(EAHostOptions(supportedProtocols: ["com.example.echo"], usb: !simulate, serialPorts: serialPorts))
let app = EchoTester(protocolString: "com.example.echo", totalBytes: bytes)
app.finished = { success in exit(success ? 0 : 1) }
app.start()
// The simulated accessory lives as long as the app.
let simulator = simulate ? try SimulatorRunner(profile: SimulatorProfile.builtIn(named: "multi-sensor")!,
                                               attachment: .memory { [host = EAAccessoryManager.shared().host] in host.attach($0) }) : nil
simulator?.start()
// A minute at most: a script that runs this must not wait for ever for an accessory.
_ = Timer.scheduledTimer(withTimeInterval: 60, repeats: false) { _ in
    FileHandle.standardError.write(Data("ea-echo: no accessory finished the echo within a minute\n".utf8))
    exit(69)
}
RunLoop.main.run()
