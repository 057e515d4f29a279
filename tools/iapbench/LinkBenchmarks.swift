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
        return benchmarks
    }
}
