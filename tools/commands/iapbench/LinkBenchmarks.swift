import CLIKit
import IAPLink
import IAPWire

/// The benchmarks of `iapbench link`: two link state machines (device and accessory) wired in
/// memory without loss, moving data one way while acknowledgements flow back; beside the
/// codec alone (encode + scan of the same packets) measured in the same run.
enum LinkBenchmarks {
    struct CountingSink: LinkSink {
        var bytes = 0
        var packets = 0
        mutating func accept(sessionID: UInt8, payload: RawSpan) -> Bool {
            bytes &+= payload.byteCount
            packets &+= 1
            return true
        }
    }

    /// A connected pair of links.
    final class Wire {
        var device: IAP2Link
        var accessory: IAP2Link
        var deviceSink = CountingSink()
        var accessorySink = CountingSink()
        var now: Duration = .zero

        init(maxPacketLength: UInt16, window: UInt8) {
            var deviceConfiguration = LinkConfiguration.device
            deviceConfiguration.parameters.maxPacketLength = 65_535
            deviceConfiguration.parameters.maxOutstandingPackets = 127
            var accessoryConfiguration = LinkConfiguration.accessory
            accessoryConfiguration.parameters.maxPacketLength = maxPacketLength
            accessoryConfiguration.parameters.maxOutstandingPackets = window
            accessoryConfiguration.parameters.maxCumulativeAcks = window / 2
            device = IAP2Link(role: .device, configuration: deviceConfiguration, initialSequence: 0x40)
            accessory = IAP2Link(role: .accessory, configuration: accessoryConfiguration, initialSequence: 0x01)
            accessory.start(now: now)
            for _ in 0..<10 where device.state != .connected || accessory.state != .connected { exchange() }
        }

        func exchange() {
            for packet in accessory.takeOutput() { device.receive(packet, now: now, sink: &deviceSink) }
            for packet in device.takeOutput() { accessory.receive(packet, now: now, sink: &accessorySink) }
        }

        /// Sends `count` payloads from the device to the accessory, all acknowledged.
        func transfer(_ payload: [UInt8], count: Int) {
            var sent = 0
            while sent < count || device.inFlightCount > 0 {
                while sent < count, device.send(sessionID: 2, payload: payload, now: now) { sent += 1 }
                exchange()
                if device.inFlightCount > 0 && !device.hasOutput && !accessory.hasOutput {
                    now += .milliseconds(25) // let the cumulative-ACK timer fire
                    accessory.advance(to: now)
                    device.advance(to: now)
                }
            }
        }
    }

    /// A host endpoint and an accessory endpoint, identified, with one EA session that holds
    /// `queued` received chunks the host has not read. Each step the accessory sends one 64-byte
    /// packet, the host receives it (acknowledging every packet), reads its session's counters as
    /// `Connection.service` does after an input, and reads the oldest chunk, so the session keeps
    /// holding `queued`. Were a session copied out of its table and changed, the copy would take
    /// the whole queue with it, and a step would cost more the more is queued.
    final class QueuedSession {
        var host: IAP2Endpoint
        var accessory: IAP2Endpoint
        let now: LinkTime = .zero
        var id: UInt16 = 0
        let payload = [UInt8](repeating: 0x5A, count: 64)
        var observed = 0

        init(queued: Int) throws {
            var accessoryConfiguration = LinkConfiguration.accessory
            accessoryConfiguration.parameters.maxCumulativeAcks = 1
            host = IAP2Endpoint(device: .device, policy: AcceptingAuthentication(), sessionBufferLimit: 16 << 20,
                                initialSequence: 0x40, randomSeed: 1)
            let identity = AccessoryIdentity(
                name: "Queue Bench", modelIdentifier: "QB-1", manufacturer: "AccessoryHost", serialNumber: "QB0001",
                firmwareVersion: "1.0.0", hardwareVersion: "A", messagesSent: [0xEA03], messagesReceived: [0xEA00, 0xEA01],
                powerProvidingCapability: 0, maximumCurrentDrawnFromDevice: 0,
                protocols: [ExternalAccessoryProtocol(identifier: 1, name: "bench.queued")], supportedLanguages: ["en"])
            accessory = IAP2Endpoint(accessory: identity, configuration: accessoryConfiguration, sessionBufferLimit: 16 << 20,
                                     initialSequence: 0x01, randomSeed: 2)
            accessory.start(now: now)
            host.start(now: now)
            for _ in 0..<100 where host.identity == nil { exchange() }
            guard host.identity != nil else { throw ExitCode.software }
            id = try host.openSession(protocolName: "bench.queued", now: now)
            for _ in 0..<100 where accessory.sessions.isEmpty { exchange() }
            for _ in 0..<queued { send() }
            guard host.bytesAvailable(id) == queued * payload.count else { throw ExitCode.software }
        }

        /// Moves every frame both ways until neither side has output.
        func exchange() {
            var moved = true
            while moved {
                moved = false
                for frame in host.takeOutput() { accessory.receive(frame, now: now); moved = true }
                for frame in accessory.takeOutput() { host.receive(frame, now: now); moved = true }
            }
        }

        func send() {
            _ = try? accessory.write(id, payload, now: now)
            exchange()
        }

        /// One step at a constant depth of the queue.
        func step() {
            send()
            observed &+= host.bytesAvailable(id) &+ host.spaceAvailable(id) &+ host.bytesPending(id) &+ host.bytesAcknowledged(id)
            observed &+= host.read(id, maxBytes: payload.count).count
        }
    }

    static func all() throws -> [Benchmark] {
        var benchmarks: [Benchmark] = []
        for (name, group, size, count) in [("64 KiB", "link-large", 65_525, 64), ("64 B", "link-small", 64, 20_000)] {
            let payload = CodecBenchmarks.pattern(size)
            // Baseline: the codec alone on the same packets (encode, then scan and verify).
            let output = Box([UInt8]())
            output.value.reserveCapacity((size + 10) * min(count, 64))
            let scanner = Box(FrameScanner())
            benchmarks.append(Benchmark(name: "codec only: encode + scan \(name) packets (baseline)", group: group,
                                        bytesPerBatch: size * count, framesPerBatch: count) {
                var delivered = 0
                var remaining = count
                let source = payload
                while remaining > 0 {
                    let batch = min(remaining, 64)
                    output.value.removeAll(keepingCapacity: true)
                    for index in 0..<batch {
                        try? LinkPacket.encode(control: .ack, sequence: UInt8(truncatingIfNeeded: index), acknowledgement: 0,
                                               sessionID: 2, payload: source.span.bytes, into: &output.value)
                    }
                    let stream = output.value
                    scanner.value.scan(stream.span.bytes) { frame, _ in delivered &+= frame.payload.count }
                    remaining -= batch
                }
                blackHole(delivered)
            })
            let wire = Wire(maxPacketLength: size > 1_000 ? 65_535 : 1_024, window: 32)
            benchmarks.append(Benchmark(name: "link: \(name) payloads device → accessory, acked", group: group,
                                        bytesPerBatch: size * count, framesPerBatch: count) {
                wire.transfer(payload, count: count)
                blackHole(wire.accessorySink.bytes)
            })
        }
        // 0 copies of session state per packet: the cost of a packet is flat from 1 to 1,000
        // chunks queued in its session.
        for queued in [1, 1_000] {
            let session = try QueuedSession(queued: queued)
            let steps = 256
            let name = "endpoint: 64 B, \(queued == 1 ? "1 chunk queued (baseline)" : "1,000 chunks queued")"
            benchmarks.append(Benchmark(name: name, group: "queued", bytesPerBatch: 64 * steps, framesPerBatch: steps) {
                for _ in 0..<steps { session.step() }
                blackHole(session.observed)
            })
        }
        return benchmarks
    }
}
