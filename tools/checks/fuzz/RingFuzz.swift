// libFuzzer target: iapd's end of a session's shared rings (SharedRingChannel, role daemon)
// against a client that does anything to the memory it shares: the input is a program of honest
// client writes and reads, daemon writes, reads and acknowledgements, and arbitrary stores to any
// header word (a lie by a little or by a lot). Checks: no crash and nothing read or written
// outside the ring (ASan and the mapping's bounds checks); the daemon never reports more readable
// or unsent bytes than a ring holds; every byte it reads before it caught a lie, and while the
// client left the data alone, is the byte the client wrote, in order.

import ByteRing
import Glibc
import IAPTransport
import SystemCalls

struct Program {
    var bytes: [UInt8]
    var at = 0
    mutating func next() -> UInt8? {
        guard at < bytes.count else { return nil }
        defer { at += 1 }
        return bytes[at]
    }
    mutating func word() -> UInt64 {
        var value: UInt64 = 0
        for _ in 0..<8 { value = value << 8 | UInt64(next() ?? 0) }
        return value
    }
}

let words: [SharedRingMemory.Word] = [.tail(0), .head(0), .tail(1), .head(1), .consumerWaiting(0), .producerWaiting(0),
                                      .consumerWaiting(1), .producerWaiting(1), .acknowledged, .acknowledgementWaiting]

@_cdecl("LLVMFuzzerTestOneInput")
public func ringFuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    var program = Program(bytes: Array(UnsafeBufferPointer(start: data, count: size)))
    guard case let .success((memory, descriptor)) = SharedRingMemory.create(capacity: 4096, name: "fuzz") else { fatalError("no memfd") }
    defer { _ = close(descriptor) }
    guard case let .success(clientMemory) = SharedRingMemory.attach(descriptor: descriptor),
          case let .success((mine, theirs)) = UnixSocket.pair() else { fatalError("no mapping or socket pair") }
    let daemon = SharedRingChannel(memory: memory, socket: mine, role: .daemon, description: "daemon")
    let client = SharedRingChannel(memory: clientMemory, socket: theirs, role: .client, description: "client")
    let capacity = memory.capacity
    var written = 0 // the client's stream: byte n is UInt8(truncatingIfNeeded: n)
    var read = 0
    var honest = true // no store to a word or to data has happened yet
    while let op = program.next() {
        switch op % 6 {
        case 0:
            let count = Int(program.next() ?? 0) * 64 + 1
            let chunk = (written..<(written + count)).map { UInt8(truncatingIfNeeded: $0) }
            written += client.write(chunk[...])
        case 1:
            while let taken = daemon.withReadableBytes({ span -> (consumed: Int, result: Int) in
                precondition(span.byteCount <= capacity, "a lent run longer than the ring")
                if honest {
                    span.withUnsafeBytes { raw in
                        for (offset, byte) in raw.enumerated() {
                            precondition(byte == UInt8(truncatingIfNeeded: read + offset), "a byte out of order from an honest client")
                        }
                    }
                }
                return (span.byteCount, span.byteCount)
            }), taken > 0 { read += taken }
        case 2:
            _ = daemon.write([UInt8](repeating: 0x5A, count: Int(program.next() ?? 0) * 32 + 1)[...])
        case 3:
            var sink = 0
            while let taken = client.withReadableBytes({ span -> (consumed: Int, result: Int) in (span.byteCount, span.byteCount) }), taken > 0 { sink += taken }
        case 4:
            daemon.publishAcknowledged(Int(program.word() % UInt64(8 * capacity)))
        default:
            let word = words[Int(program.next() ?? 0) % words.count]
            let value = program.word()
            // Half the lies are small steps from the truth, the others anything at all.
            clientMemory.store(word, value & 1 == 0 ? clientMemory.load(word) &+ (value >> 1) % UInt64(2 * capacity) &- UInt64(capacity) : value)
            honest = false
        }
        precondition((0...capacity).contains(daemon.readableByteCount), "more readable than the ring holds")
        precondition((0...capacity).contains(daemon.unsentByteCount), "more unsent than the ring holds")
    }
    return 0
}
