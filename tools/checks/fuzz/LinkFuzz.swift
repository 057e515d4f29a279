// libFuzzer target: the device endpoint (link, control session, EA router) on arbitrary input.
// The input is split into steps: each step either delivers bytes (a fragment of the input, some
// of it patched into well-formed packets so the fuzzer gets past the checksums) or advances the
// clock. Checks: no crash; never more packets in flight than the negotiated window; everything
// the device transmits is a well-formed detect or link packet.

import IAPLink
import IAPWire

@_cdecl("LLVMFuzzerTestOneInput")
public func linkFuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    var device = IAP2Endpoint(initialSequence: 0x40, randomSeed: 7)
    var now: Duration = .zero
    // Start as a real accessory would, so the fuzzer explores the connected state too.
    device.receive(IAP2Detect.bytes, now: now)
    let syn = try? LinkPacket.encode(control: .syn, sequence: 1, acknowledgement: 0, sessionID: 0,
                                     payload: LinkConfiguration.accessory.parameters.encoded)
    device.receive(syn ?? [], now: now)
    let ack = try? LinkPacket.encode(control: .ack, sequence: 1, acknowledgement: 0x40, sessionID: 0)
    device.receive(ack ?? [], now: now)
    for (op, chunk) in FuzzSteps(input) {
        switch op >> 6 {
        case 0: // raw bytes
            device.receive(chunk, now: now)
        case 1, 2: // a well-formed packet around the bytes: control bits, seq, ack, session from the chunk
            guard chunk.count >= 4 else { continue }
            let packet = try? LinkPacket.encode(control: LinkControl(rawValue: chunk[0] & 0xF8), sequence: chunk[1],
                                                acknowledgement: chunk[2], sessionID: chunk[3] % 3, payload: Array(chunk.dropFirst(4)))
            device.receive(packet ?? [], now: now)
        default: // time passes
            now += .milliseconds(Int(chunk.first ?? 1) * 40)
            device.advance(to: now)
        }
        if let window = device.link.peerLimits?.maxOutstandingPackets {
            precondition(device.link.inFlightCount <= Int(window), "more packets in flight than the window")
        }
        for packet in device.takeOutput() where packet != IAP2Detect.bytes {
            precondition((try? LinkPacket.decode(packet)) != nil, "the device sent a malformed packet")
        }
        _ = device.takeEvents()
        if let id = device.sessions.first?.id { _ = device.read(id) }
    }
    return 0
}
