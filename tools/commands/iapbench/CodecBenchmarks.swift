import Glibc
import IAPWire

/// The benchmarks of `iapbench codec`: encoding and decoding of iAP2 link packets and the
/// scanner over a long mixed stream, each beside a memcpy of the same size.
enum CodecBenchmarks {
    static let largePayload = 65_525 // the largest payload a link packet can carry
    static let smallPayload = 16

    /// Builds every benchmark. Buffers are allocated here, once; the bodies allocate nothing.
    static func all(streamMegabytes: Int) throws -> [Benchmark] {
        var benchmarks: [Benchmark] = []

        // --- memcpy baselines ------------------------------------------------------------
        let largePacket = try LinkPacket.encode(control: .ack, sequence: 1, acknowledgement: 2, sessionID: 2,
                                                payload: pattern(largePayload))
        benchmarks.append(memcpyBenchmark(name: "memcpy 64 KiB (baseline)", group: "large", size: largePacket.count))

        // --- large packets: decode (scanner + header + both checksums), encode -----------------
        let packetsPerBatch = 16 // 1 MiB: stays in L2/L3 like a ring of USB slots would
        let largeStream = Array((0..<packetsPerBatch).map { _ in largePacket }.joined())
        benchmarks.append(scanBenchmark(name: "decode 64 KiB link packets", group: "large", stream: largeStream,
                                        frames: packetsPerBatch, chunk: largeStream.count))
        benchmarks.append(encodeBenchmark(name: "encode 64 KiB link packets (copy in)", group: "large", payloadSize: largePayload))
        benchmarks.append(finishBenchmark(name: "encode 64 KiB in place (zero-copy send)", group: "large", payloadSize: largePayload))

        // --- small packets ------------------------------------------------------------------
        let smallPacket = try LinkPacket.encode(control: .ack, sequence: 1, acknowledgement: 2, sessionID: 2, payload: pattern(smallPayload))
        let smallCount = 4_096
        let smallStream = Array((0..<smallCount).map { _ in smallPacket }.joined())
        benchmarks.append(memcpyBenchmark(name: "memcpy 26 B (baseline)", group: "small", size: smallPacket.count, repeats: smallCount))
        benchmarks.append(scanBenchmark(name: "decode 16 B-payload link packets", group: "small", stream: smallStream,
                                        frames: smallCount, chunk: smallStream.count))
        benchmarks.append(encodeBenchmark(name: "encode 16 B-payload link packets", group: "small", payloadSize: smallPayload, repeats: smallCount))
        benchmarks.append(finishBenchmark(name: "encode 16 B in place", group: "small", payloadSize: smallPayload, repeats: smallCount))

        // --- a long mixed stream through the scanner in USB-sized chunks --------------------
        let (mixed, mixedFrames) = try mixedStream(bytes: streamMegabytes << 20)
        benchmarks.append(memcpyBenchmark(name: "memcpy \(streamMegabytes) MiB (baseline)", group: "stream", size: mixed.count))
        benchmarks.append(scanBenchmark(name: "scan \(streamMegabytes) MiB mixed stream, 16 KiB chunks", group: "stream", stream: mixed,
                                        frames: mixedFrames, chunk: 16_384))
        return benchmarks
    }

    static func pattern(_ count: Int) -> [UInt8] {
        (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }
    }

    static func memcpyBenchmark(name: String, group: String, size: Int, repeats: Int = 1) -> Benchmark {
        let source = Box(pattern(size))
        let destination = Box([UInt8](repeating: 0, count: size))
        return Benchmark(name: name, group: group, bytesPerBatch: size * repeats, framesPerBatch: repeats) {
            source.value.withUnsafeBytes { from in
                destination.value.withUnsafeMutableBytes { to in
                    for _ in 0..<repeats {
                        to.copyMemory(from: from) // memmove of `size` bytes
                        blackHole(to.baseAddress)
                    }
                }
            }
        }
    }

    static func scanBenchmark(name: String, group: String, stream: [UInt8], frames: Int, chunk: Int) -> Benchmark {
        let scanner = Box(FrameScanner())
        let input = Box(stream)
        return Benchmark(name: name, group: group, bytesPerBatch: stream.count, framesPerBatch: frames) {
            var sink = 0
            let stream = input.value
            let bytes = stream.span.bytes
            var offset = 0
            while offset < bytes.byteCount {
                let end = min(bytes.byteCount, offset + chunk)
                scanner.value.scan(bytes.extracting(offset..<end)) { frame, span in
                    if case let .iap2(header) = frame.kind {
                        sink &+= Int(header.sequence) &+ frame.payload.count &+ span.byteCount
                    } else {
                        sink &+= 1
                    }
                }
                offset = end
            }
            blackHole(sink)
        }
    }

    static func encodeBenchmark(name: String, group: String, payloadSize: Int, repeats: Int = 1) -> Benchmark {
        let payload = Box(pattern(payloadSize))
        let output = Box([UInt8]())
        output.value.reserveCapacity((payloadSize + 10) * repeats)
        return Benchmark(name: name, group: group, bytesPerBatch: payloadSize * repeats, framesPerBatch: repeats) {
            output.value.removeAll(keepingCapacity: true)
            let source = payload.value
            let span = source.span.bytes
            for index in 0..<repeats {
                try? LinkPacket.encode(control: .ack, sequence: UInt8(truncatingIfNeeded: index), acknowledgement: 1,
                                       sessionID: 2, payload: span, into: &output.value)
            }
            blackHole(output.value.count)
        }
    }

    static func finishBenchmark(name: String, group: String, payloadSize: Int, repeats: Int = 1) -> Benchmark {
        let slot = Box([UInt8](repeating: 0xA5, count: payloadSize + 10))
        return Benchmark(name: name, group: group, bytesPerBatch: payloadSize * repeats, framesPerBatch: repeats) {
            var total = 0
            // Take the buffer out of the box so it is uniquely referenced (no copy on write).
            var buffer: [UInt8] = []
            swap(&buffer, &slot.value)
            do {
                var span = buffer.mutableSpan
                var raw = span.mutableBytes
                for index in 0..<repeats {
                    total &+= (try? LinkPacket.finish(in: &raw, control: .ack, sequence: UInt8(truncatingIfNeeded: index),
                                                      acknowledgement: 1, sessionID: 2, payloadLength: payloadSize)) ?? 0
                }
            }
            swap(&buffer, &slot.value)
            blackHole(total)
        }
    }

    /// A stream like a busy link: mostly EA data packets of many sizes, control packets, bare
    /// ACKs, the odd iAP1 packet and detect, so the scanner's every path runs.
    static func mixedStream(bytes target: Int) throws -> ([UInt8], Int) {
        var stream: [UInt8] = []
        stream.reserveCapacity(target + 70_000)
        var frames = 0
        var state: UInt64 = 0x1234_5678
        let sizes = [0, 6, 16, 100, 502, 1_014, 4_086, 16_374, 65_525]
        let payloadSource = pattern(65_525)
        while stream.count < target {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            let pick = Int(state >> 33) % 20
            if pick == 0 {
                stream += try IAP1Packet(lingo: 0, command: 0x43, transactionID: 1, payload: Array(payloadSource.prefix(40))).encoded()
            } else if pick == 1 {
                stream += IAP2Detect.bytes
            } else {
                let size = sizes[Int(state >> 40) % sizes.count]
                try LinkPacket.encode(control: .ack, sequence: UInt8(truncatingIfNeeded: frames), acknowledgement: 0, sessionID: 2,
                                      payload: payloadSource.span.bytes.extracting(0..<size), into: &stream)
            }
            frames += 1
        }
        return (stream, frames)
    }
}

/// A reference cell so benchmark closures can mutate captured buffers without copying them.
final class Box<T> {
    var value: T
    init(_ value: T) { self.value = value }
}
