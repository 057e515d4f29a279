import AccessoryHost
import AccessorySimulator
import Dispatch
@testable import ExternalAccessory
import Foundation
import Testing

/// Issue 17: the ExternalAccessory facade against the simulator, in memory and over a
/// pseudo-terminal: notifications, filtering by declared protocols, EASession's streams with
/// the delegate events iOS documents, a disconnect mid-stream.
@Suite("ExternalAccessory: EAAccessoryManager, EAAccessory, EASession over the simulator", .timeLimit(.minutes(2)))
struct FacadeTests {
    static let profile = SimulatorProfile.builtIn(named: "multi-sensor")!

    @Test("connect and disconnect notifications on the main queue, in order, the delegate told first", arguments: SimulatedWire.allCases)
    func notificationsInOrder(wire: SimulatedWire) async throws {
        let manager = makeManager()
        defer { manager.stop() }
        manager.registerForLocalNotifications()
        let recorder = NotificationRecorder(manager)
        let runner = try wire.start(Self.profile, on: manager)
        var notes = recorder.stream.makeAsyncIterator()
        let connected = try #require(await notes.next())
        #expect(connected.0 == .EAAccessoryDidConnect)
        let accessory = connected.1
        #expect(accessory.isConnected)
        #expect(accessory.connectionID != EAConnectionIDNone)
        #expect(accessory.name == "Multi Sensor")
        #expect(accessory.protocolStrings.contains("com.example.echo"))
        #expect(accessory.dockType == "")
        #expect(!accessory.manufacturer.isEmpty && !accessory.modelNumber.isEmpty && !accessory.serialNumber.isEmpty)
        #expect(!accessory.firmwareRevision.isEmpty && !accessory.hardwareRevision.isEmpty)
        #expect(manager.connectedAccessories.map(\.connectionID) == [accessory.connectionID])
        #expect(manager.connectedAccessories.first === accessory, "the same object every time")
        let delegate = DisconnectDelegate()
        accessory.delegate = delegate
        runner.stop() // the accessory goes away
        let disconnected = try #require(await notes.next())
        #expect(disconnected.0 == .EAAccessoryDidDisconnect)
        #expect(disconnected.1 === accessory)
        #expect(!accessory.isConnected)
        #expect(delegate.calls.withLock { $0 } == [accessory.connectionID])
        #expect(manager.connectedAccessories.isEmpty)
        withExtendedLifetime(recorder) {}
    }

    @Test("only accessories declaring one of the app's protocols are listed and announced")
    func filteredByDeclaredProtocols() async throws {
        let manager = makeManager(declaring: ["com.example.not-there"])
        defer { manager.stop() }
        manager.registerForLocalNotifications()
        let recorder = NotificationRecorder(manager)
        let runner = try SimulatedWire.memory.start(Self.profile, on: manager)
        defer { runner.stop() }
        // The host identified it; the facade, which hears the same event, left it out.
        let found = try #require(await manager.host.waitForAccessory(timeout: .seconds(20)))
        #expect(found.name == "Multi Sensor")
        await settled(manager)
        #expect(manager.connectedAccessories.isEmpty, "listed although it declares none of the app's protocols")
        let watcher = makeManager() // declares echo: the same accessory is listed there
        defer { watcher.stop() }
        let listed = NotificationRecorder(watcher)
        watcher.registerForLocalNotifications()
        let other = try SimulatedWire.memory.start(Self.profile, on: watcher)
        defer { other.stop() }
        var iterator = listed.stream.makeAsyncIterator()
        _ = await iterator.next()
        #expect(watcher.connectedAccessories.count == 1)
        runner.stop()
        _ = await manager.host.waitUntilNoAccessory(timeout: .seconds(20))
        await settled(manager)
        #expect(manager.connectedAccessories.isEmpty)
        #expect(recorder.seen.withLock { $0 }.isEmpty, "the first manager announced an accessory it does not list")
        withExtendedLifetime((recorder, listed)) {}
    }

    @Test("EASession's streams echo byte-exact, with openCompleted, hasSpaceAvailable, hasBytesAvailable and never a byte event without bytes",
          arguments: SimulatedWire.allCases)
    func streamsEcho(wire: SimulatedWire) async throws {
        let manager = makeManager()
        defer { manager.stop() }
        let runner = try wire.start(Self.profile, on: manager)
        defer { runner.stop() }
        let accessory = try #require(await waitForListed(manager))
        let loop = RunLoopThread()
        defer { loop.stop() }
        let app = StreamRecorder()
        let payload = testBytes(wire == .memory ? 2 << 20 : 256 << 10, seed: 3)
        #expect(await loop.run { app.open(accessory, "com.example.echo") })
        await loop.run { app.send(payload) }
        await next(app.done.stream)
        let (received, input, output, spurious) = await loop.run { (app.received, app.eventsOf(input: true), app.eventsOf(input: false), app.spurious) }
        #expect(received.count == payload.count)
        #expect(received == payload)
        #expect(input.first == .openCompleted)
        #expect(output.first == .openCompleted)
        #expect(input.contains(.hasBytesAvailable))
        #expect(output.dropFirst().first == .hasSpaceAvailable)
        #expect(spurious == 0, "\(spurious) hasBytesAvailable events found nothing to read")
        #expect(!input.contains(.endEncountered) && !input.contains(.errorOccurred))
        let statuses = await loop.run { (app.session!.inputStream!.streamStatus, app.session!.outputStream!.streamStatus) }
        #expect(statuses.0 == .open && statuses.1 == .open)
        await loop.run { app.close() }
    }

    @Test("EASession is nil for a protocol the app does not declare, one the accessory lacks, and one already open")
    func sessionsThatCannotOpen() async throws {
        let manager = makeManager(declaring: ["com.example.echo", "com.example.nowhere"])
        defer { manager.stop() }
        let runner = try SimulatedWire.memory.start(Self.profile, on: manager)
        defer { runner.stop() }
        let accessory = try #require(await waitForListed(manager))
        let loop = RunLoopThread()
        defer { loop.stop() }
        let outcomes = await loop.run { () -> [Bool] in
            let undeclared = EASession(accessory: accessory, forProtocol: "com.example.sink") // the accessory has it; the app does not declare it
            let missing = EASession(accessory: accessory, forProtocol: "com.example.nowhere")
            let first = EASession(accessory: accessory, forProtocol: "com.example.echo")
            let second = EASession(accessory: accessory, forProtocol: "com.example.echo")
            return [undeclared == nil, missing == nil, first != nil, second == nil]
        }
        #expect(outcomes == [true, true, true, true])
        // The first one went away with its closure: the protocol opens again.
        #expect(await loop.run { EASession(accessory: accessory, forProtocol: "com.example.echo") != nil })
    }

    @Test("the accessory going away mid-stream: what arrived is read, then endEncountered on both streams", arguments: SimulatedWire.allCases)
    func disconnectMidStream(wire: SimulatedWire) async throws {
        let manager = makeManager()
        defer { manager.stop() }
        let runner = try wire.start(Self.profile, on: manager)
        let accessory = try #require(await waitForListed(manager))
        let loop = RunLoopThread()
        defer { loop.stop() }
        let app = StreamRecorder()
        #expect(await loop.run { app.open(accessory, "com.example.echo") })
        // The app does not read at first: the echo backs up and the transfer stalls part way.
        let payload = testBytes(4 << 20, seed: 9)
        await loop.run {
            app.paused = true
            app.send(payload)
        }
        await next(app.firstBytes.stream)
        runner.stop() // the accessory vanishes with most of the payload not echoed
        await loop.run { app.resume() }
        await next(app.done.stream)
        let (received, input, statusIn) = await loop.run { (app.received, app.eventsOf(input: true), app.session!.inputStream!.streamStatus) }
        #expect(!received.isEmpty && received.count < payload.count, "\(received.count) of \(payload.count) bytes came back")
        #expect(received == Array(payload.prefix(received.count)), "what arrived is in order and intact")
        #expect(input.last == .endEncountered)
        #expect(statusIn == .atEnd)
        // The output ends too, and writes fail.
        await next(app.outputEnded.stream)
        let outputEvents = await loop.run { app.eventsOf(input: false).map(\.rawValue) }
        let outputError = await loop.run { app.session!.outputStream!.streamError.map { "\($0)" } }
        #expect(outputEvents.last == Stream.Event.endEncountered.rawValue, "output events \(outputEvents), error \(outputError ?? "none")")
        let write = await loop.run { [1, 2, 3].withUnsafeBufferPointer { app.session!.outputStream!.write($0.baseAddress!, maxLength: 3) } }
        #expect(write == -1)
        #expect(!accessory.isConnected)
        await loop.run { app.close() }
    }

    @Test("the Bluetooth picker says there is none, on the main queue")
    func bluetoothPickerFailsClearly() async throws {
        let manager = makeManager()
        defer { manager.stop() }
        let error = await withCheckedContinuation { (continuation: CheckedContinuation<String?, Never>) in
            manager.showBluetoothAccessoryPicker(withNameFilter: nil) { error in
                continuation.resume(returning: (error as? EABluetoothAccessoryPickerError).map { "\($0.code)|\($0.localizedDescription)" })
            }
        }
        let text = try #require(error)
        #expect(text.hasPrefix("resultFailed|"))
        #expect(text.contains("bluetoothctl"))
    }
}

