import AccessorySimulator
import IAPLink
import Testing

@Suite("Simulated accessory")
struct SimulatorTests {
    @Test("the handshake identifies the accessory with the profile's fields")
    func handshake() throws {
        let profile = try SimulatorProfile.named("multi-sensor")
        var harness = try SimHarness(profile: profile)
        let ok1 = harness.connect()
        #expect(ok1)
        let identity = try #require(harness.device.identity)
        #expect(identity.name == profile.accessory.name)
        #expect(identity.modelIdentifier == profile.accessory.model)
        #expect(identity.manufacturer == profile.accessory.manufacturer)
        #expect(identity.serialNumber == profile.accessory.serialNumber)
        #expect(identity.firmwareVersion == profile.accessory.firmwareVersion)
        #expect(identity.hardwareVersion == profile.accessory.hardwareVersion)
        #expect(identity.protocols == profile.identity().protocols)
        #expect(harness.accessoryEvents.contains(.identified(profile.identity())))
        #expect(harness.accessory.isRunning)
    }

    @Test("echo returns exactly the bytes sent (200 KiB)")
    func echo() throws {
        var harness = try SimHarness(profile: try .named("multi-sensor"))
        let ok2 = harness.connect()
        #expect(ok2)
        let id = try harness.open("com.example.echo")
        #expect(harness.accessoryEvents.contains(.sessionOpened(sessionID: id, protocolName: "com.example.echo")))
        let data = testBytes(200 * 1_024, seed: 1)
        var sent = 0
        var received: [UInt8] = []
        let done = try harness.run { h in
            sent = try h.write(id, data, from: sent)
            received += h.device.read(id)
            return received.count >= data.count
        }
        #expect(done)
        #expect(received == data)
        let statistics = try #require(harness.accessory.statistics(for: id))
        #expect(statistics.bytesIn == data.count)
        #expect(statistics.bytesOut == data.count)
        #expect(statistics.crc32In == CRC32.checksum(data))
    }

    @Test("sink counts the bytes and their CRC-32, and reports them when the session closes")
    func sink() throws {
        var harness = try SimHarness(profile: try .named("multi-sensor"))
        let ok3 = harness.connect()
        #expect(ok3)
        let id = try harness.open("com.example.sink")
        let data = testBytes(300_001, seed: 2)
        var sent = 0
        let ok4 = try harness.run { h in
            sent = try h.write(id, data, from: sent)
            return h.accessory.statistics(for: id)?.bytesIn == data.count
        }
        #expect(ok4)
        let statistics = try #require(harness.accessory.statistics(for: id))
        #expect(statistics.crc32In == CRC32.checksum(data))
        #expect(statistics.bytesOut == 0)
        #expect(harness.device.bytesAvailable(id) == 0)

        harness.device.closeSession(id, now: harness.now)
        let ok5 = harness.run(until: harness.now + .seconds(1)) { $0.accessory.statistics(for: id) == nil }
        #expect(ok5)
        let closed = harness.events { event -> SessionStatistics? in
            if case let .sessionClosed(sessionID, name, _, statistics) = event, sessionID == id, name == "com.example.sink" { return statistics }
            return nil
        }
        #expect(closed.first?.bytesIn == data.count)
        #expect(closed.first?.crc32In == CRC32.checksum(data))
    }

    @Test("source delivers exactly its byte count of the documented pattern, then nothing")
    func source() throws {
        let profile = try SimulatorProfile.named("multi-sensor")
        let count = try #require(profile.protocols.first { $0.behaviour == .source }?.sourceBytes)
        var harness = try SimHarness(profile: profile)
        let ok6 = harness.connect()
        #expect(ok6)
        let id = try harness.open("com.example.source")
        var received: [UInt8] = []
        let ok7 = harness.run { h in
            received += h.device.read(id)
            return received.count >= count
        }
        #expect(ok7)
        // Nothing more comes.
        harness.run(until: harness.now + .seconds(2)) { h in
            received += h.device.read(id)
            return false
        }
        #expect(received.count == count)
        let pattern = (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }
        #expect(received == pattern)
        #expect(SimulatedAccessory.sourcePatternByte(at: 1) == 38)
        #expect(harness.accessoryEvents.contains(.sourceFinished(sessionID: id, bytes: count)))
    }

    @Test("several behaviours run side by side on one link")
    func concurrentSessions() throws {
        var harness = try SimHarness(profile: try .named("multi-sensor"))
        let ok8 = harness.connect()
        #expect(ok8)
        let echo = try harness.open("com.example.echo")
        let telemetry = try harness.open("com.example.telemetry")
        let source = try harness.open("com.example.source")
        let first = testBytes(50_000, seed: 5)
        let second = testBytes(30_000, seed: 6)
        var sent = (0, 0)
        var received: ([UInt8], [UInt8], Int) = ([], [], 0)
        let ok9 = try harness.run { h in
            sent.0 = try h.write(echo, first, from: sent.0)
            sent.1 = try h.write(telemetry, second, from: sent.1)
            received.0 += h.device.read(echo)
            received.1 += h.device.read(telemetry)
            received.2 += h.device.read(source).count
            return received.0.count == first.count && received.1.count == second.count && received.2 == 1 << 20
        }
        #expect(ok9)
        #expect(received.0 == first)
        #expect(received.1 == second)
        #expect(harness.accessory.sessionStatistics.map(\.sessionID) == [echo, telemetry, source].sorted())
    }

    @Test("a host that stops reading an echo session does not grow the simulator's memory; resuming gets every byte")
    func echoBackPressure() throws {
        var profile = try SimulatorProfile.named("multi-sensor")
        profile.link.maxPacketLength = 1_024
        var harness = try SimHarness(profile: profile, deviceBufferLimit: 32_768, accessoryBufferLimit: 32_768)
        let ok10 = harness.connect()
        #expect(ok10)
        let id = try harness.open("com.example.echo")
        let data = testBytes(512 * 1_024, seed: 4)
        var sent = 0
        var peak = 0
        var refused = false
        // The host writes what it can but reads nothing for 2 s of virtual time.
        let pauseEnd = harness.now + .seconds(2)
        harness.run(until: pauseEnd) { h in
            if let written = try? h.write(id, data, from: sent) {
                refused = refused || (written == sent && sent < data.count)
                sent = written
            }
            peak = max(peak, h.accessory.bufferedBytes)
            #expect(h.accessory.bufferedBytes <= h.accessory.bufferedBytesLimit)
            #expect(h.accessory.endpoint.iap2!.link.queuedCount <= h.accessory.endpoint.iap2!.link.sendQueueLimit)
            return false
        }
        #expect(refused, "the host's writes never backed up")
        #expect(sent < data.count)
        #expect(peak <= harness.accessory.bufferedBytesLimit)
        // The echo holds what it read and could not write back (one received chunk, a view of
        // the packet it arrived in), never more than its limit.
        let pending = harness.accessory.statistics(for: id)?.pendingBytes ?? 0
        #expect(pending > 0 && pending <= SimulatedAccessory.pendingLimit)
        let held = harness.accessory.bufferedBytes
        // Still no reading: nothing grows.
        harness.run(until: harness.now + .milliseconds(500)) { h in
            sent = (try? h.write(id, data, from: sent)) ?? sent
            return false
        }
        #expect(harness.accessory.bufferedBytes <= held)
        #expect(harness.device.link.state == .connected)

        var received: [UInt8] = []
        let ok11 = harness.run(until: harness.now + .seconds(120)) { h in
            sent = (try? h.write(id, data, from: sent)) ?? sent
            received += h.device.read(id)
            return received.count >= data.count
        }
        #expect(ok11)
        #expect(received == data)
    }

    @Test("dropped and corrupted frames still deliver byte-exact through link retransmission")
    func dropAndCorrupt() throws {
        var profile = try SimulatorProfile.named("multi-sensor")
        profile.link.retransmissionTimeoutMs = 100
        profile.faults = .init(dropRate: 0.1, corruptRate: 0.1, seed: 42)
        var harness = try SimHarness(profile: profile)
        let ok12 = harness.connect()
        #expect(ok12)
        let id = try harness.open("com.example.echo")
        let data = testBytes(96 * 1_024, seed: 9)
        var sent = 0
        var received: [UInt8] = []
        let ok13 = try harness.run(until: .seconds(300)) { h in
            sent = try h.write(id, data, from: sent)
            received += h.device.read(id)
            return received.count >= data.count
        }
        #expect(ok13)
        #expect(received == data)
        #expect(harness.accessory.faultCounters.framesDropped > 0)
        #expect(harness.accessory.faultCounters.framesCorrupted > 0)
        #expect(harness.accessory.endpoint.iap2!.link.statistics.retransmissions > 0)
    }

    @Test("the delay fault holds frames and shows in nextDeadline")
    func delay() throws {
        var profile = try SimulatorProfile.named("firmware-updater")
        profile.faults.delayMs = 50
        var accessory = try SimulatedAccessory(profile: profile)
        accessory.start(now: .zero)
        #expect(!accessory.hasOutput)
        #expect(accessory.takeOutput().isEmpty)
        #expect(accessory.nextDeadline == .milliseconds(50))
        accessory.advance(to: .milliseconds(49))
        #expect(accessory.takeOutput().isEmpty)
        accessory.advance(to: .milliseconds(50))
        #expect(accessory.takeOutput().count == 1)

        var harness = try SimHarness(profile: profile)
        let ok14 = harness.connect()
        #expect(ok14)
        #expect(harness.now >= .milliseconds(200), "a handshake of several round trips, each delayed by 50 ms")
    }

    @Test("vanishAfterBytes reports vanish and the accessory goes silent")
    func vanish() throws {
        var profile = try SimulatorProfile.named("multi-sensor")
        profile.faults.vanishAfterBytes = 10_000
        var harness = try SimHarness(profile: profile)
        let ok15 = harness.connect()
        #expect(ok15)
        let id = try harness.open("com.example.echo")
        let data = testBytes(50_000, seed: 3)
        var sent = 0
        let ok16 = try harness.run { h in
            sent = try h.write(id, data, from: sent)
            _ = h.device.read(id)
            return h.accessoryEvents.contains(.vanish)
        }
        #expect(ok16)
        harness.cut()
        #expect(harness.accessory.lifecycle == .vanished)
        #expect(harness.accessory.nextDeadline == nil)
        #expect(!harness.accessory.hasOutput)
        harness.accessory.receive([0xFF, 0x5A], now: harness.now)
        harness.accessory.advance(to: harness.now + .seconds(5))
        #expect(harness.accessory.takeOutput().isEmpty)
        #expect(harness.accessory.takeEvents().isEmpty)
        #expect(harness.accessoryEvents.filter { $0 == .vanish }.count == 1)
    }

    @Test("stopReadingAfterBytes stops reading at exactly that count")
    func stopReading() throws {
        var profile = try SimulatorProfile.named("multi-sensor")
        profile.faults.stopReadingAfterBytes = 5_000
        var harness = try SimHarness(profile: profile)
        let ok17 = harness.connect()
        #expect(ok17)
        let id = try harness.open("com.example.sink")
        let data = testBytes(20_000, seed: 8)
        var sent = 0
        harness.run(until: harness.now + .seconds(1)) { h in
            sent = (try? h.write(id, data, from: sent)) ?? sent
            return false
        }
        #expect(harness.accessory.statistics(for: id)?.bytesIn == 5_000)
        #expect(harness.accessory.statistics(for: id)?.crc32In == CRC32.checksum(data[..<5_000]))
        #expect(harness.accessoryEvents.contains(.readingStopped(afterBytes: 5_000)))
    }
}
