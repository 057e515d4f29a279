import AccessoryBench
import AccessoryHost
import AccessorySimulator
import CLIKit
import Dispatch
import IAPLink
import Synchronization
import Testing
import TestThreads

/// `iapctl bench`'s engine against the simulator in process: what it counts each way is what the
/// accessory counted (its sessions' bytes, its link's packets), in every mode.
@Suite("iapctl bench's engine", .ownThread)
struct BenchEngineTests {
    /// The statistics of every session the accessory closed, by protocol, and a count of closings.
    final class ClosedSessions: Sendable {
        let closed = Mutex<[String: SessionStatistics]>([:])
        let closings = DispatchSemaphore(value: 0)
    }

    /// The simulator's multi-sensor (echo, sink, a 1 MiB source, a second echo), a manager, and
    /// the statistics of every session the accessory closed.
    final class Rig: Sendable {
        let manager = AccessoryManager()
        let runner: SimulatorRunner
        let accessory: Accessory
        let log = ClosedSessions()

        init() throws {
            let manager = self.manager
            runner = try SimulatorRunner(profile: try #require(SimulatorProfile.builtIn(named: "multi-sensor")),
                                         attachment: .memory { manager.attach($0) })
            let log = self.log
            runner.start { event in
                if case let .sessionClosed(_, name, _, statistics) = event {
                    log.closed.withLock { $0[name] = statistics }
                    log.closings.signal()
                }
            }
            accessory = try blockingAwait { try #require(await manager.waitForAccessory(timeout: .seconds(20))) }
        }

        /// Runs `settings` on the protocols, closes the sessions, and waits until the accessory has
        /// closed them too.
        func run(_ settings: BenchSettings, on protocols: [String]) throws -> BenchResult {
            let sessions = try protocols.map { name in (name, try blockingAwait { try await self.accessory.openSession(for: name) }) }
            let result = BenchMeasurement.run(settings, accessory: accessory, sessions: sessions)
            // A source read for a time has its session closed at the deadline already.
            for (_, session) in sessions { _ = try? blockingAwait { try await session.close(timeout: .seconds(10)) } }
            for _ in protocols { #expect(log.closings.wait(timeout: .now() + 20) == .success, "the accessory closed the session") }
            return result
        }

        func stop() {
            manager.stop()
            runner.stop()
        }
    }

    static func settings(_ mode: BenchMode, seconds: Double? = nil, bytes: Int? = nil) -> BenchSettings {
        BenchSettings(mode: mode, seconds: seconds, bytes: bytes, writeSize: 16_384, warmup: 0, tick: 0.05, verify: true,
                      latencySize: 64, latencyCount: 50, startRequest: nil)
    }

    @Test("both and echo: every byte written came back and matched; the accessory read and wrote as many")
    func echoModes() throws {
        let rig = try Rig()
        defer { rig.stop() }
        for mode in [BenchMode.both, .echo] {
            let result = try rig.run(Self.settings(mode, bytes: 3 << 20), on: ["com.example.echo", "com.example.telemetry"])
            #expect(result.failure == nil)
            #expect(result.verified == true)
            let last = try #require(result.samples.last)
            #expect(last.written == 2 * (3 << 20))
            #expect(last.read == last.written)
            #expect(last.acknowledged == last.written, "acknowledged by the accessory at the end")
            for name in ["com.example.echo", "com.example.telemetry"] {
                let counted = try #require(rig.log.closed.withLock { $0[name] })
                // The round trips go on the first protocol's session, after the throughput.
                let expected = (3 << 20) + (name == "com.example.echo" ? 50 * 64 : 0)
                #expect(counted.bytesIn == expected, "\(mode) \(name): the accessory read what was written")
                #expect(counted.bytesOut == expected, "\(mode) \(name): and echoed it")
            }
            #expect(result.latency.count == 50)
            #expect(result.latency.percentile(0.5) > 0 && result.latency.percentile(0.5) <= result.latency.percentile(0.99))
            #expect(result.latency.percentile(0.99) <= result.latency.maximum)
        }
    }

    @Test("sink and source: the bytes counted each way are the accessory's, and the link's packets match its link's")
    func sinkAndSource() throws {
        let rig = try Rig()
        defer { rig.stop() }
        let sink = try rig.run(Self.settings(.sink, bytes: 2 << 20), on: ["com.example.sink"])
        #expect(sink.failure == nil)
        #expect(sink.samples.last?.acknowledged == 2 << 20)
        #expect(rig.log.closed.withLock { $0["com.example.sink"]?.bytesIn } == 2 << 20)
        #expect(sink.bytesIn == 0)
        // A number of bytes, not a time: on a loaded machine the source may take any time.
        let source = try rig.run(Self.settings(.source, bytes: 1 << 20), on: ["com.example.source"])
        #expect(source.failure == nil)
        #expect(source.samples.last?.read == 1 << 20, "the whole source")
        #expect(rig.log.closed.withLock { $0["com.example.source"]?.bytesOut } == 1 << 20)
        // Quiet now: every data packet one side sent, the other took.
        let host = try #require(rig.accessory.linkStatistics)
        let accessory = try #require(rig.runner.linkStatistics)
        #expect(host.dataPacketsSent == accessory.dataPacketsDelivered)
        #expect(accessory.dataPacketsSent == host.dataPacketsDelivered)
        #expect(host.payloadBytesSent == accessory.payloadBytesDelivered)
        #expect(host.sendWindow == 8 && host.sendPacketLength == 4_096, "the multi-sensor's limits, as the host sends by them")
        #expect(host.peakPacketsInFlight <= host.sendWindow && host.peakPacketsInFlight > 0)
        #expect(host.windowFullNanoseconds > 0, "2 MiB into a window of 8 packets waits for acknowledgements")
    }

    @Test("a histogram keeps every sample in its bucket: percentiles within a bucket's width of the samples")
    func histogram() {
        var histogram = LatencyHistogram()
        for value in 1...1_000 { histogram.add(Double(value) * 1_000) } // 1 µs … 1 ms
        #expect(histogram.count == 1_000)
        for (fraction, exact) in [(0.5, 500_000.0), (0.9, 900_000.0), (0.99, 990_000.0)] {
            let read = histogram.percentile(fraction)
            #expect(read >= exact && read <= exact * 1.022, "p\(Int(fraction * 100)): \(read) against \(exact)")
        }
        #expect(histogram.maximum == 1_000_000)
        #expect(histogram.percentile(1) == 1_000_000)
    }
}
