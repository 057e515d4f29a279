import AccessorySimulator
import IAPLink
import Testing

@Suite("Firmware update")
struct FirmwareUpdateTests {
    /// A connected firmware updater with its session open.
    private func updater(_ profile: SimulatorProfile? = nil) throws -> (SimHarness, UInt16) {
        var harness = try SimHarness(profile: try profile ?? .named("firmware-updater"))
        let ok1 = harness.connect()
        #expect(ok1)
        let id = try harness.open("com.example.firmware")
        return (harness, id)
    }

    @Test("a 1 MiB update ends with DONE 0, then the reboot event with the new version")
    func wholeUpdate() throws {
        let profile = try SimulatorProfile.named("firmware-updater")
        var (harness, id) = try updater(profile)
        let image = testBytes(1 << 20, seed: 21)
        let crc = CRC32.checksum(image)
        var client = FirmwareClient()

        try harness.exchange(id, FirmwareClient.begin(size: image.count, crc: crc, version: "1.1.0"), client: &client) {
            !$0.messages.isEmpty
        }
        let ready = try #require(client.messages.first)
        #expect(ready.type == 0x81)
        #expect(ready.body.count == 4)
        let chunkSize = Int(ready.value)
        #expect(chunkSize == 16_384)
        #expect(harness.accessoryEvents.contains(.firmwareUpdateBegan(sessionID: id, version: "1.1.0", imageSize: image.count)))

        let ok2 = try harness.exchange(id, FirmwareClient.chunksAndEnd(image, chunkSize: chunkSize), client: &client) {
            $0.first(0x83) != nil
        }
        #expect(ok2)
        let acks = client.all(0x82)
        #expect(acks.count == image.count / chunkSize)
        #expect(acks.map(\.value) == (1...acks.count).map { UInt32($0 * chunkSize) })
        let done = try #require(client.first(0x83))
        #expect(done.body == [0] + FirmwareClient.u32(Int(crc)))
        #expect(client.all(0x8F).isEmpty)
        #expect(harness.accessoryEvents.contains(.firmwareUpdateFinished(sessionID: id, status: .ok, computedCRC: crc)))

        // The reboot follows rebootDelayMs later, on virtual time.
        let doneAt = harness.now
        #expect(!harness.accessoryEvents.contains(.reboot(newFirmwareVersion: "1.1.0")))
        let ok3 = harness.run(until: doneAt + .seconds(2)) { $0.accessoryEvents.contains(.reboot(newFirmwareVersion: "1.1.0")) }
        #expect(ok3)
        #expect(harness.now >= doneAt + .milliseconds(profile.rebootDelayMs) - .milliseconds(5))
        #expect(harness.now <= doneAt + .milliseconds(profile.rebootDelayMs + 5))
        #expect(harness.accessory.lifecycle == .rebooted(newFirmwareVersion: "1.1.0"))
        #expect(harness.accessory.nextDeadline == nil)

        // The owner disconnects it and starts one that declares the new version.
        harness.cut()
        var rebooted = try SimHarness(profile: profile.withFirmwareVersion("1.1.0"))
        let ok4 = rebooted.connect()
        #expect(ok4)
        #expect(rebooted.device.identity?.firmwareVersion == "1.1.0")
    }

    @Test("an image whose CRC-32 differs from BEGIN's gets DONE 1 and no reboot")
    func corruptedImage() throws {
        var (harness, id) = try updater()
        var image = testBytes(40_000, seed: 22)
        let announced = CRC32.checksum(image)
        image[12_345] ^= 0x40
        var client = FirmwareClient()
        let stream = FirmwareClient.begin(size: image.count, crc: announced, version: "2.0")
            + FirmwareClient.chunksAndEnd(image, chunkSize: 10_000)
        let ok5 = try harness.exchange(id, stream, client: &client) { $0.first(0x83) != nil }
        #expect(ok5)
        let done = try #require(client.first(0x83))
        #expect(done.body == [1] + FirmwareClient.u32(Int(CRC32.checksum(image))))
        harness.run(until: harness.now + .seconds(1)) { _ in false }
        #expect(harness.accessory.isRunning)
        #expect(!harness.accessoryEvents.contains { if case .reboot = $0 { true } else { false } })
    }

    @Test("a short image gets DONE 2, an out-of-order chunk DONE 3, and a new BEGIN starts over")
    func sizeAndOrder() throws {
        var (harness, id) = try updater()
        let image = testBytes(3_000, seed: 23)
        let crc = CRC32.checksum(image)
        var client = FirmwareClient()
        var stream = FirmwareClient.begin(size: image.count + 1, crc: crc, version: "3")
            + FirmwareClient.chunksAndEnd(image, chunkSize: 1_000)
        stream += FirmwareClient.begin(size: image.count, crc: crc, version: "3")
            + FirmwareClient.chunk(offset: 0, image[0..<1_000]) + FirmwareClient.chunk(offset: 2_000, image[2_000...])
            + FirmwareClient.chunk(offset: 1_000, image[1_000..<2_000]) + FirmwareClient.end
        let ok6 = try harness.exchange(id, stream, client: &client) { $0.all(0x83).count == 2 }
        #expect(ok6)
        #expect(client.all(0x83).map { $0.body.first } == [2, 3])
        // The out-of-order chunk is not taken: its ACK repeats the expected offset.
        #expect(client.all(0x82).suffix(3).map(\.value) == [1_000, 1_000, 2_000])
        #expect(client.all(0x81).count == 2)

        var retry = FirmwareClient()
        let good = FirmwareClient.begin(size: image.count, crc: crc, version: "3") + FirmwareClient.chunksAndEnd(image, chunkSize: 1_000)
        let ok7 = try harness.exchange(id, good, client: &retry) { $0.first(0x83) != nil }
        #expect(ok7)
        #expect(retry.first(0x83)?.body.first == 0)
    }

    @Test("a CHUNK before BEGIN gets ERROR")
    func chunkBeforeBegin() throws {
        var (harness, id) = try updater()
        var client = FirmwareClient()
        let ok8 = try harness.exchange(id, FirmwareClient.chunk(offset: 0, [1, 2, 3]), client: &client) { !$0.messages.isEmpty }
        #expect(ok8)
        let error = try #require(client.messages.first)
        #expect(error.type == 0x8F)
        #expect(error.body.first == 0x12)
        let text = String(decoding: error.body.dropFirst(), as: UTF8.self)
        #expect(text.contains("BEGIN"))
        #expect(harness.accessoryEvents.contains { event in
            if case .firmwareUpdateError(id, .outOfSequence, _) = event { true } else { false }
        })
    }

    @Test("malformed messages get ERROR with their code; the stream goes on after skippable ones")
    func malformedMessages() throws {
        var (harness, id) = try updater()
        let image = testBytes(100, seed: 24)
        var client = FirmwareClient()
        let stream = FirmwareClient.frame(0x81, [0, 0, 0, 1])                 // an accessory type: unknown
            + FirmwareClient.frame(0x01, [0, 0, 0, 1, 0, 0, 0, 1])             // BEGIN without a version
            + FirmwareClient.frame(0x01, [0, 0, 0, 1, 0, 0, 0, 1, 0xFF])       // version not UTF-8
            + FirmwareClient.frame(0x03, [])                                   // END before BEGIN
            + FirmwareClient.begin(size: image.count, crc: CRC32.checksum(image), version: "ok")
            + FirmwareClient.chunksAndEnd(image, chunkSize: 64)
        let ok9 = try harness.exchange(id, stream, client: &client) { $0.first(0x83) != nil }
        #expect(ok9)
        #expect(client.all(0x8F).map { $0.body.first } == [0x10, 0x13, 0x13, 0x12])
        #expect(client.first(0x83)?.body.first == 0)

        // A length over 1 MiB loses the framing: ERROR 0x11, then silence.
        var (lost, lostID) = try updater()
        var lostClient = FirmwareClient()
        let tooLong = [0x02] + FirmwareClient.u32((1 << 20) + 1) + FirmwareClient.begin(size: 0, crc: 0, version: "x")
        let ok10 = try lost.exchange(lostID, tooLong, client: &lostClient) { !$0.messages.isEmpty }
        #expect(ok10)
        lost.run(until: lost.now + .seconds(1)) { h in
            lostClient.feed(h.device.read(lostID))
            return false
        }
        #expect(lostClient.messages.map(\.type) == [0x8F])
        #expect(lostClient.messages.first?.body.first == 0x11)
    }

    @Test("messages split byte by byte still parse")
    func byteByByte() throws {
        var (harness, id) = try updater()
        let image = testBytes(300, seed: 25)
        let stream = FirmwareClient.begin(size: image.count, crc: CRC32.checksum(image), version: "4.0.1")
            + FirmwareClient.chunksAndEnd(image, chunkSize: 100)
        var client = FirmwareClient()
        for (index, byte) in stream.enumerated() {
            let ok11 = try harness.device.write(id, [byte], now: harness.now) == 1
            #expect(ok11)
            // Each byte reaches the accessory, and is read, on its own.
            let ok12 = harness.run(until: harness.now + .seconds(1)) { h in
                client.feed(h.device.read(id))
                return h.accessory.statistics(for: id)?.bytesIn == index + 1
            }
            #expect(ok12)
        }
        let ok13 = harness.run(until: harness.now + .seconds(1)) { h in
            client.feed(h.device.read(id))
            return client.first(0x83) != nil
        }
        #expect(ok13)
        #expect(client.messages.map(\.type) == [0x81, 0x82, 0x82, 0x82, 0x83])
        #expect(client.first(0x83)?.body.first == 0)
    }

    @Test("several messages in one write parse")
    func severalInOneWrite() throws {
        var (harness, id) = try updater()
        let image = testBytes(2_000, seed: 26)
        let stream = FirmwareClient.begin(size: image.count, crc: CRC32.checksum(image), version: "5")
            + FirmwareClient.chunksAndEnd(image, chunkSize: 100)
        let ok14 = try harness.device.write(id, stream, now: harness.now) == stream.count
        #expect(ok14)
        var client = FirmwareClient()
        let ok15 = harness.run(until: harness.now + .seconds(5)) { h in
            client.feed(h.device.read(id))
            return client.first(0x83) != nil
        }
        #expect(ok15)
        #expect(client.all(0x82).count == 20)
        #expect(client.first(0x83)?.body.first == 0)
    }
}
