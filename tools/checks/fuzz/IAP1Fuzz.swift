// libFuzzer target: the device endpoint after it switched to iAP1 (identification, authentication,
// data sessions) on arbitrary input. A simulated iAP1 accessory identifies first, so the fuzzer
// starts from an identified accessory with a data session open. Then each step delivers raw bytes,
// a well-formed General-lingo packet built from the input (command, transaction id, payload), or
// lets time pass. Checks: no crash; the device only sends well-formed iAP1 packets; what it holds
// for a session stays within its buffer limit plus the held packets; every packet it builds encodes.

import IAPLink
import IAPWire

@_cdecl("LLVMFuzzerTestOneInput")
public func iap1Fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    let limit = 4_096
    var device = IAPEndpoint(device: .device, sessionBufferLimit: limit, initialSequence: 0x40, randomSeed: 7)
    let identity = AccessoryIdentity(name: "Fuzz", modelIdentifier: "F1", manufacturer: "Acme", serialNumber: "1",
                                     firmwareVersion: "1.0.0", hardwareVersion: "1.0.0",
                                     protocols: [ExternalAccessoryProtocol(identifier: 1, name: "com.acme.a")])
    var accessory = IAP1Endpoint(accessory: identity, sessionBufferLimit: limit, maxIncomingPayload: 512, randomSeed: 8)
    var now: Duration = .zero
    accessory.start(now: now)
    device.start(now: now)
    for _ in 0..<200 {
        for packet in device.takeOutput() { accessory.receive(packet, now: now) }
        for packet in accessory.takeOutput() { device.receive(packet, now: now) }
        if device.identity != nil, !device.hasOutput, !accessory.hasOutput { break }
    }
    var session = try? device.openSession(protocolName: "com.acme.a", now: now)
    for packet in device.takeOutput() { accessory.receive(packet, now: now) }
    for packet in accessory.takeOutput() { device.receive(packet, now: now) }
    _ = device.takeEvents()
    var transactions = true
    for (op, chunk) in FuzzSteps(input) {
        switch op >> 6 {
        case 0: // raw bytes
            device.receive(chunk, now: now)
        case 1, 2: // a well-formed General-lingo packet: command, transaction id, payload from the chunk
            guard chunk.count >= 3 else { continue }
            let tid: UInt16? = op & 0x80 == 0 ? UInt16(chunk[1]) << 8 | UInt16(chunk[2]) : nil
            let packet = try? IAP1Packet(lingo: op & 0x01 == 0 ? 0 : chunk[1] & 0x0F, command: UInt16(chunk[0]), transactionID: tid,
                                         payload: Array(chunk.dropFirst(3))).encoded(sync: op & 0x02 == 0)
            device.receive(packet ?? [], now: now)
        default: // time passes, the application writes or reads
            now += .milliseconds(Int(chunk.first ?? 1) * 40)
            device.advance(to: now)
            if let id = session {
                if chunk.count > 1, chunk[1] & 1 == 0 { _ = try? device.write(id, chunk, now: now) } else { _ = device.read(id, maxBytes: 700) }
            } else {
                session = try? device.openSession(protocolName: "com.acme.a", now: now)
            }
        }
        if let iap1 = device.iap1 { transactions = iap1.transactionIDs }
        for packet in device.takeOutput() where packet != IAP2Detect.bytes {
            // Checked against the transaction-id setting now, or the one before: input that
            // switches the identification style between two packets of one step (IdentifyDeviceLingoes,
            // then StartIDPS) leaves a reply built under the old setting in the same output.
            let decoded = (try? IAP1Packet.decode(packet, transactionIDs: transactions))
                ?? (try? IAP1Packet.decode(packet, transactionIDs: !transactions))
                ?? (try? LinkPacket.decode(packet)).map { _ in IAP1Packet(lingo: 0, command: 0) }
            precondition(decoded != nil, "the device sent a malformed packet")
        }
        _ = device.takeEvents()
        if let iap1 = device.iap1 {
            precondition(iap1.encodeFailures == 0, "the device could not encode a packet it built")
            if let id = session {
                precondition(iap1.bytesAvailable(id) <= limit + 0xFFFF, "a session holds more than its limit and one packet")
                precondition(iap1.bytesHeld(id) <= IAP1Endpoint.maxHeldPackets * 0xFFFF, "a session holds more packets than allowed")
            }
        }
    }
    return 0
}
