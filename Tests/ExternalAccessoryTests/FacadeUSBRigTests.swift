import AccessoryGadget
import AccessoryHost
import AccessorySimulator
import ExternalAccessory
import Foundation
import Testing

/// The facade on a real kernel USB stack: the simulator as a FunctionFS gadget on dummy_hcd,
/// found by USB hotplug through EAAccessoryManager. Runs in the qemu guest of tools/usb-rig
/// (its suite filter takes every suite named …USBRig…); skipped elsewhere.
@Suite(.serialized, .enabled(if: ProcessInfo.processInfo.environment["ACCESSORYHOST_USB_RIG"] != nil, "runs in the USB rig (tools/usb-rig)"))
struct FacadeUSBRigTests {
    @Test("EAAccessoryManager finds the USB accessory, announces it, and an EASession echoes 4 MiB byte-exact; unplugging ends the streams")
    func theFacadeOverUSB() async throws {
        let profile = try #require(SimulatorProfile.builtIn(named: "multi-sensor"))
        let udc = try #require(USBGadget.availableUDCs().first)
        var configuration = USBGadgetConfiguration(profile: profile)
        configuration.name = "rigea"
        configuration.functionInstance = "rigea"
        let gadget = try USBGadget(configuration: configuration)
        let runner = try SimulatorRunner(profile: profile, attachment: .transport(gadget.transport))
        runner.start()
        defer {
            try? gadget.unbind()
            runner.stop()
            try? gadget.remove()
        }
        let manager = EAAccessoryManager(options: EAHostOptions(supportedProtocols: ["com.example.echo"], usb: true))
        defer { manager.stop() }
        manager.registerForLocalNotifications()
        let notes = NotificationRecorder(manager)
        try gadget.bind(udc: udc)
        var iterator = notes.stream.makeAsyncIterator()
        let connected = try #require(await iterator.next())
        #expect(connected.0 == .EAAccessoryDidConnect)
        let accessory = connected.1
        #expect(accessory.accessory.transportKind == .usb)
        #expect(accessory.name == profile.identity().name)

        let loop = RunLoopThread()
        defer { loop.stop() }
        let app = StreamRecorder()
        #expect(await loop.run { app.open(accessory, "com.example.echo") })
        let payload = testBytes(4 << 20, seed: 1)
        await loop.run { app.send(payload) }
        await next(app.done.stream)
        #expect(await loop.run { app.received == payload })
        #expect(await loop.run { app.spurious } == 0)

        // Unplugged mid-stream: the streams end, the accessory is announced gone.
        await loop.run { app.send(testBytes(4 << 20, seed: 2)) }
        try gadget.unbind()
        await next(app.outputEnded.stream)
        let gone = try #require(await iterator.next())
        #expect(gone.0 == .EAAccessoryDidDisconnect && gone.1 === accessory)
        #expect(!accessory.isConnected)
        await loop.run { app.close() }
        withExtendedLifetime(notes) {}
    }
}
