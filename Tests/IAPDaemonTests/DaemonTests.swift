import AccessoryHost
import ByteRing
import AccessorySimulator
import Dispatch
import Foundation
import IAPDaemon
import IAPDaemonProtocol
import IAPTransport
import SystemCalls
import Testing
import TestSupport
import TestThreads

/// Issue 18: iapd shares one process's accessories with others over a Unix socket.
@Suite("iapd: accessories shared between processes over a Unix socket", .timeLimit(.minutes(3)))
struct DaemonTests {
    @Test("two clients on two protocols of one accessory at once, both byte-exact")
    func twoClientsTwoProtocols() async throws {
        let daemon = try await DaemonHarness.start()
        defer { daemon.stop() }
        let (first, accessoryA) = try await daemon.client()
        let (second, accessoryB) = try await daemon.client()
        defer { first.stop(); second.stop() }
        #expect(accessoryA.name == "Multi Sensor")
        #expect(accessoryA.protocolStrings.contains("com.example.telemetry"))
        #expect(first.daemonSocketInUse == daemon.socketPath)
        let echo1 = try await accessoryA.openSession(for: "com.example.echo")
        let echo2 = try await accessoryB.openSession(for: "com.example.telemetry")
        #expect(!echo1.usesNativeTransport)
        let payloadA = pattern(1 << 20, seed: 1), payloadB = pattern(1 << 20, seed: 2)
        async let backA = echo(payloadA, over: echo1)
        async let backB = echo(payloadB, over: echo2)
        let (receivedA, receivedB) = try await (backA, backB)
        #expect(receivedA == payloadA)
        #expect(receivedB == payloadB)
        #expect(daemon.current.sessionCount == 2)
        echo1.close()
        echo2.close()
    }

    @Test("a second client on a protocol in use is refused with the holder's pid and command line")
    func secondOpenerIsRefusedNamingTheHolder() async throws {
        let daemon = try await DaemonHarness.start()
        defer { daemon.stop() }
        let (first, accessoryA) = try await daemon.client()
        let (second, accessoryB) = try await daemon.client()
        defer { first.stop(); second.stop() }
        let held = try await accessoryA.openSession(for: "com.example.echo")
        do {
            _ = try await accessoryB.openSession(for: "com.example.echo")
            Issue.record("the second open succeeded")
        } catch let AccessoryError.protocolHeldElsewhere(name, holder) {
            #expect(name == "com.example.echo")
            #expect(holder.hasPrefix("pid \(getpid()) ("))
            #expect(holder.contains("AccessoryHostPackageTests"))
        }
        // Closed there, it opens here (the daemon waits for the close to finish).
        held.close()
        let now = try await accessoryB.openSession(for: "com.example.echo")
        #expect(try await echo([1, 2, 3], over: now) == [1, 2, 3])
    }

    @Test("a client that vanishes mid-transfer releases its session at once; the accessory keeps serving the others")
    func aVanishingClientReleasesItsSessions() async throws {
        let daemon = try await DaemonHarness.start()
        defer { daemon.stop() }
        let (survivor, accessory) = try await daemon.client()
        defer { survivor.stop() }
        let telemetry = try await accessory.openSession(for: "com.example.telemetry")
        // The vanishing client: a raw connection, a session opened, bytes written and left unread,
        // then every descriptor closed at once, as a killed process's are.
        try await runBlocking {
            var raw = try RawClient(path: daemon.socketPath)
            raw.send(.hello(version: DaemonProtocol.version, client: "doomed"))
            guard case let .welcome(_, _, accessories)? = try raw.next()?.0.reply, let record = accessories.first else {
                Issue.record("no welcome")
                return
            }
            raw.send(.open(accessory: record.id, protocolString: "com.example.echo"), id: 2)
            guard let (message, passed) = try raw.next(), case .opened = message.reply, passed.count == 2 else {
                Issue.record("no session")
                return
            }
            let memory = try SharedRingMemory.attach(descriptor: passed[1]).get()
            _ = close(passed[1])
            let channel = SharedRingChannel(memory: memory, socket: passed[0], role: .client, description: "doomed")
            #expect(channel.write(pattern(256 * 1024, seed: 3)[...]) == 256 * 1024)
            // The channel was never activated: dropping it closes the socket.
        }
        // The survivor goes on byte-exact meanwhile, and gets the released protocol.
        let payload = pattern(512 * 1024, seed: 4)
        #expect(try await echo(payload, over: telemetry) == payload)
        let echoSession = try await openEventually(accessory, "com.example.echo")
        #expect(try await echo([9, 8, 7], over: echoSession) == [9, 8, 7])
    }

    @Test("the daemon restarts while clients wait: they see the accessory go, then come back")
    func daemonRestart() async throws {
        let daemon = try await DaemonHarness.start()
        defer { daemon.stop() }
        let (client, accessory) = try await daemon.client()
        defer { client.stop() }
        let session = try await accessory.openSession(for: "com.example.echo")
        let events = client.events
        daemon.stopServer()
        var iterator = events.makeAsyncIterator()
        guard case let .disconnected(gone, reason)? = await iterator.next() else {
            Issue.record("no disconnect")
            return
        }
        #expect(gone === accessory)
        #expect(reason.contains("iapd"))
        #expect(!accessory.isConnected)
        #expect(try await session.read() == nil)
        try daemon.startServer()
        guard case let .connected(back)? = await iterator.next() else {
            Issue.record("no reconnect")
            return
        }
        #expect(back.name == "Multi Sensor")
        #expect(back.connectionID != accessory.connectionID)
        let again = try await back.openSession(for: "com.example.echo")
        #expect(try await echo([5, 6], over: again) == [5, 6])
    }

    @Test("an accessory that stops acknowledging after about 1 MiB: through iapd as directly, the drain fails at the same count")
    func acknowledgementsEndToEnd() async throws {
        // A sink that stops reading after 100,000 bytes: its link still takes what its buffers
        // hold (about 1 MiB more), then acknowledges nothing.
        let profile = try SimulatorProfile.decode(Array("""
            { "identity": { "name": "Stuck", "model": "S1", "manufacturer": "Test", "serialNumber": "S-1",
                            "firmwareVersion": "1.0", "hardwareVersion": "A" },
              "protocols": [ { "name": "com.example.sink", "behaviour": "sink" } ],
              "faults": { "stopReadingAfterBytes": 100000 } }
            """.utf8))
        // 1.5 MiB: taken whole (directly by the 1 MiB session buffer beside what the accessory
        // takes; through iapd by the 4 MiB ring), and more than the accessory acknowledges.
        let payload = pattern(1_536 << 10, seed: 12)
        var counts: [Int] = []
        for throughDaemon in [false, true] {
            let how = throughDaemon ? "through iapd" : "directly"
            // A fresh accessory each time: the sink stays stuck once it stopped.
            let daemon = try await DaemonHarness.start(simulator: profile)
            defer { daemon.stop() }
            var client: AccessoryManager?
            defer { client?.stop() }
            let accessory: Accessory
            if throughDaemon {
                let (manager, remote) = try await daemon.client()
                client = manager
                accessory = remote
            } else {
                accessory = try #require(daemon.manager.connectedAccessories.first)
            }
            let session = try await accessory.openSession(for: "com.example.sink")
            try await session.write(payload)
            // 3 s without progress: long beside the accessory's pace even on a loaded machine, so
            // the count is where it stopped, not where a starved run happened to be.
            await #expect(throws: AccessoryError.self, "\(how): the drain succeeded") {
                try await session.drain(progressTimeout: .seconds(3))
            }
            let acknowledged = session.bytesAcknowledged
            #expect(100_000...(5 << 18) ~= acknowledged, "\(how): \(acknowledged) bytes acknowledged")
            #expect(acknowledged < payload.count, "\(how)")
            counts.append(acknowledged)
            session.close()
        }
        // Before protocol 3, iapd's count was what iapd had read: all 1.5 MiB.
        #expect(abs(counts[1] - counts[0]) <= 64 << 10, "directly \(counts[0]), through iapd \(counts[1])")
    }

    @Test("100 clients connected, then 1,000 open/close cycles: descriptors and memory stay flat")
    func manyClientsAndCycles() async throws {
        let daemon = try await DaemonHarness.start()
        defer { daemon.stop() }
        var clients: [AccessoryManager] = []
        defer { for client in clients { client.stop() } }
        var accessory: Accessory?
        for _ in 0..<100 {
            let (client, found) = try await daemon.client()
            clients.append(client)
            accessory = found
        }
        #expect(daemon.current.clientCount == 100)
        let target = try #require(accessory)
        var descriptors: [Int] = []
        for round in 0..<10 {
            for _ in 0..<100 {
                let session = try await openEventually(target, "com.example.echo")
                try await session.write([UInt8(round)])
                _ = try await session.read()
                session.close()
            }
            descriptors.append(openDescriptorCount())
        }
        // A leak would add a descriptor or two per cycle: 100 in every round. Other suites open
        // and close descriptors in parallel, so they show in some rounds only: the quietest round
        // after the first decides.
        let growth = zip(descriptors.dropFirst(), descriptors.dropFirst(2)).map { $1 - $0 }
        #expect(growth.min()! < 20, "descriptors by round: \(descriptors)")
        #expect(daemon.current.clientCount == 100)
    }

    @Test("malformed and hostile requests get an error and their client is dropped; other clients go on")
    func malformedRequests() async throws {
        let daemon = try await DaemonHarness.start()
        defer { daemon.stop() }
        let (client, accessory) = try await daemon.client()
        defer { client.stop() }
        let session = try await accessory.openSession(for: "com.example.echo")
        let hostile: [(String, [UInt8])] = [
            ("a 4 GiB length", [0xFF, 0xFF, 0xFF, 0xFF, 0x7B]),
            ("a length over the request limit", [0x00, 0x10, 0x00, 0x01]),
            ("not JSON", [0, 0, 0, 4, 0x6E, 0x6F, 0x70, 0x65]),
            ("JSON of no request", MessageFramer.encode(["hello": "world"])),
            ("open before hello", MessageFramer.encode(ClientMessage(id: 1, request: .open(accessory: 1, protocolString: "com.example.echo")))),
            ("a protocol string of 300 bytes", MessageFramer.encode(ClientMessage(id: 1, request: .hello(version: DaemonProtocol.version, client: "x")))
                + MessageFramer.encode(ClientMessage(id: 2, request: .open(accessory: 1, protocolString: String(repeating: "a", count: 300))))),
            ("a control character in the protocol", MessageFramer.encode(ClientMessage(id: 1, request: .hello(version: DaemonProtocol.version, client: "x")))
                + MessageFramer.encode(ClientMessage(id: 2, request: .open(accessory: 1, protocolString: "com.\u{1b}[2J")))),
            ("an accessory id of 0", MessageFramer.encode(ClientMessage(id: 1, request: .hello(version: DaemonProtocol.version, client: "x")))
                + MessageFramer.encode(ClientMessage(id: 2, request: .open(accessory: 0, protocolString: "com.example.echo")))),
            ("another protocol version", MessageFramer.encode(ClientMessage(id: 1, request: .hello(version: 99, client: "x")))),
        ]
        for (what, bytes) in hostile {
            let path = daemon.socketPath
            try await runBlocking {
                var raw = try RawClient(path: path)
                raw.send(bytes)
                var sawFailure = false
                while let (message, _) = try raw.next() {
                    if case let .failure(failure) = message.reply {
                        sawFailure = true
                        #expect(failure.code == .badRequest || failure.code == .version, "\(what): \(failure)")
                    }
                }
                #expect(sawFailure, "\(what): no error before the daemon closed the connection")
            }
        }
        // The well-behaved client was not affected.
        let payload = pattern(64 * 1024, seed: 6)
        #expect(try await echo(payload, over: session) == payload)
        #expect(daemon.current.clientCount == 1)
    }

    @Test("a client that sends requests and never reads the replies is dropped once they pass the bound; others go on")
    func unreadRepliesAreBounded() async throws {
        let daemon = try await DaemonHarness.start()
        defer { daemon.stop() }
        let (client, accessory) = try await daemon.client()
        defer { client.stop() }
        let session = try await accessory.openSession(for: "com.example.echo")
        let path = daemon.socketPath
        try await runBlocking {
            var raw = try RawClient(path: path)
            // 20,000 stats requests (about 1.5 KB of reply each, 30 MB in all against the 4 MiB
            // bound), written whole while nothing is read; the daemon must drop the client
            // rather than queue them.
            var requests = MessageFramer.encode(ClientMessage(id: 1, request: .hello(version: DaemonProtocol.version, client: "greedy")))
            for id in 2...20_001 { requests += MessageFramer.encode(ClientMessage(id: UInt32(id), request: .stats)) }
            var offset = 0
            while offset < requests.count {
                var ready = [pollfd(fd: raw.descriptor, events: Int16(POLLOUT), revents: 0)]
                guard case .success(let count) = SystemCall.poll(&ready, timeout: 20_000), count > 0 else {
                    Issue.record("the daemon took no request for 20 s")
                    return
                }
                let sent = requests[offset...].withUnsafeBytes { UnixSocket.send(raw.descriptor, $0) }
                guard case .success(let written) = sent else { break } // dropped: EPIPE or ECONNRESET
                offset += written
            }
            var replies = 0
            while true {
                do { guard try raw.next() != nil else { break } } catch { break } // dropped: the end, or a reset
                replies += 1
            }
            #expect(replies < 10_000, "the daemon answered \(replies) of 20,000 requests nobody read instead of dropping the client")
        }
        // The well-behaved client was not affected.
        let payload = pattern(64 * 1024, seed: 9)
        #expect(try await echo(payload, over: session) == payload)
        #expect(daemon.current.clientCount == 1)
    }

    @Test("opens queued behind a session the client holds count against its 64 sessions: one held and 63 waiting, the next is refused")
    func queuedOpensAreBounded() async throws {
        let daemon = try await DaemonHarness.start()
        defer { daemon.stop() }
        let (client, accessory) = try await daemon.client()
        defer { client.stop() }
        let accessoryID = accessory.connectionID
        let path = daemon.socketPath
        try await runBlocking {
            var raw = try RawClient(path: path)
            raw.send(.hello(version: DaemonProtocol.version, client: "queued-opens"), id: 1)
            raw.send(.open(accessory: accessoryID, protocolString: "com.example.echo"), id: 2)
            var held: [Int32] = []
            while held.isEmpty, let (message, passed) = try raw.next() {
                if case .opened = message.reply { held = passed }
                if case let .failure(failure) = message.reply { Issue.record("the first open failed: \(failure)") }
            }
            defer { for descriptor in held { _ = close(descriptor) } }
            try #require(held.count == 2)
            // The protocol is this client's: each open waits for it, until the client's 64 are used.
            for id in 3...66 { raw.send(.open(accessory: accessoryID, protocolString: "com.example.echo"), id: UInt32(id)) }
            var refused: (UInt32?, DaemonFailure.Code)?
            while refused == nil, let (message, _) = try raw.next() {
                if case let .failure(failure) = message.reply { refused = (message.id, failure.code) }
            }
            #expect(refused?.0 == 66, "refused: \(String(describing: refused))")
            #expect(refused?.1 == .tooManySessions)
        }
    }

    @Test("a slow reader holds the accessory off instead of filling the daemon's memory")
    func aSlowReaderIsHeldOff() async throws {
        let daemon = try await DaemonHarness.start()
        defer { daemon.stop() }
        let (client, accessory) = try await daemon.client()
        defer { client.stop() }
        let session = try await accessory.openSession(for: "com.example.echo")
        // 16 MiB written, read 4 KiB at a time: the daemon never takes more than its bounded
        // buffers (the session's socket, the bridge's buffer, the link's window) beyond what
        // was read, however far the writer would run ahead.
        let payload = pattern(16 << 20, seed: 7)
        let writer = Task { try await session.write(payload) }
        var received = 0
        var largestLead = 0
        for try await chunk in session.chunks(maxBytes: 4096) {
            received += chunk.count
            largestLead = max(largestLead, session.bytesAcknowledged - received)
            if received == payload.count { break }
        }
        try await writer.value
        #expect(received == payload.count)
        #expect(largestLead < 8 << 20, "the daemon took up to \(largestLead) bytes more than were read")
    }
}

@Suite("iapd's protocol versions and events", .timeLimit(.minutes(1)))
struct DaemonVersionTests {
    @Test("an app launch request and a transport failure reach clients; a client of protocol 2 is refused, both versions named")
    func eventsAndVersions() async throws {
        let daemon = try await DaemonHarness.start()
        defer { daemon.stop() }
        let (client, _) = try await daemon.client()
        defer { client.stop() }
        let events = client.events
        // A client of protocol 2 would read its sessions' bytes from their sockets: refused.
        try await runBlocking {
            var raw = try RawClient(path: daemon.socketPath)
            raw.send(.hello(version: 2, client: "old"))
            guard case let .failure(failure)? = try raw.next()?.0.reply else {
                Issue.record("a client of protocol 2 was not refused")
                return
            }
            #expect(failure.code == .version)
            #expect(failure.message.contains("protocol 3") && failure.message.contains("protocol 2"), "\(failure.message)")
            #expect(failure.message.contains("update the client"), "\(failure.message)")
            #expect(try raw.next() == nil ? true : false, "the daemon kept the refused client")
        }
        // An accessory that asks for an app as it connects, and a transport that ends before
        // anything on it was identified.
        let thermal = try SimulatorRunner(profile: try #require(SimulatorProfile.builtIn(named: "thermal-camera")),
                                          attachment: .memory { daemon.manager.attach($0) })
        thermal.start()
        defer { thermal.stop() }
        let (host, accessorySide) = MemoryTransport.pair(name: "doomed")
        daemon.manager.attach(host)
        var launch: String?
        var failure: String?
        for await event in events {
            switch event {
            case let .appLaunchRequested(accessory, request):
                #expect(accessory.name == "Thermal Camera")
                launch = request.bundleIdentifier
                // The doomed transport is active by now (attached before the thermal camera
                // was even identified): ending its other side fails it, with nothing identified.
                accessorySide.cancel()
            case let .failed(location, _):
                failure = location
            case .connected, .disconnected:
                break
            }
            if launch != nil, failure != nil { break }
        }
        #expect(launch == "com.example.thermal")
        #expect(failure == "doomed (host side)")
    }
}

/// Opens `protocolString`, retrying while a session just closed is still being released.
func openEventually(_ accessory: Accessory, _ protocolString: String) async throws -> AccessorySession {
    try await accessory.openSession(for: protocolString)
}

/// Runs `body`, which blocks (a raw client waiting on its socket), on a Dispatch queue of its
/// own, never on a thread of Swift's cooperative pool.
func runBlocking(_ body: @escaping @Sendable () throws -> Void) async throws {
    try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
        DispatchQueue(label: "test.raw-client").async {
            continuation.resume(with: Result { try body() })
        }
    }
}
