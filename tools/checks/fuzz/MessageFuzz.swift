// libFuzzer target: the control-message parser, SYN parameters, iAP1 bodies and EA headers on
// arbitrary bytes. Checks: no crash; a message that parses re-encodes to exactly the input;
// groups are walked to the depth limit and no further; typed reads never trap.

import IAPWire

func walk(_ parameters: [Parameter]) {
    for parameter in parameters {
        _ = try? parameter.uint8()
        _ = try? parameter.uint16()
        _ = try? parameter.uint32()
        _ = try? parameter.uint64()
        _ = try? parameter.bool()
        _ = try? parameter.string()
        _ = try? parameter.uint16List()
        do {
            let group = try parameter.group()
            precondition(group.allSatisfy { $0.depth == parameter.depth + 1 }, "depth not tracked")
            precondition(parameter.depth + 1 <= Parameter.defaultMaxGroupDepth, "nested past the limit")
            walk(group)
        } catch {}
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func messageFuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    if let message = try? ControlMessage.decode(input) {
        precondition((try? message.encoded()) == input, "control message does not round-trip")
        walk(message.parameters)
    }
    if let (message, length) = try? ControlMessage.decode(prefixOf: input.span.bytes) {
        precondition(length <= input.count && length == message.encodedLength, "prefix length wrong")
    }
    if let parameters = try? LinkParameters.decode(input) {
        precondition(parameters.encoded == input, "SYN parameters do not round-trip")
        _ = parameters.violations()
    }
    for transactionIDs in [false, true] {
        if let packet = try? IAP1Packet.decode(body: input.span.bytes, transactionIDs: transactionIDs) {
            precondition(packet.bodyLength == input.count, "iAP1 body length wrong")
        }
    }
    _ = try? EASessionData.decode(input.span.bytes)
    _ = ExtendedAcknowledgement.missing(after: input.first ?? 0, received: input.dropFirst())
    return 0
}
