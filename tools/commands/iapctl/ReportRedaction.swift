// iapctl report: what is left out of the embedded trace without --full: the serial numbers
// and certificate bytes overwritten in place (lengths kept, checksums computed again), in one
// packet or in every part of a message spread over several.

import IAPInspect
import IAPWire

extension TraceAnalysis {
    /// Without --full: notes what ``redactions`` names in a message that came in parts, for
    /// ``applyPartRedactions(_:to:)`` once every block is written. A message that decoded has
    /// the rule's parameter overwritten; one that did not (it never came whole, a later packet
    /// ended it, or its parts do not make a message) has every byte after its header zeroed
    /// in every part, so nothing of it can leak.
    mutating func redactParts(_ partial: WireReading.Partial, message: ControlMessage?) {
        guard let rule = Self.redactions[partial.messageID.rawValue] else { return }
        let ordered = partial.ordered
        var ranges: [Range<Int>] = []
        var keepsText = rule.keepsText
        if message != nil {
            // Where the rule's parameter data lies in the joined message.
            let joined = partial.joined
            var offset = ControlMessage.headerSize
            while offset + Parameter.headerSize <= joined.count {
                let length = Int(joined[offset]) << 8 | Int(joined[offset + 1])
                let id = UInt16(joined[offset + 2]) << 8 | UInt16(joined[offset + 3])
                guard length >= Parameter.headerSize, offset + length <= joined.count else { break }
                if id == rule.parameter { ranges.append((offset + Parameter.headerSize)..<(offset + length)) }
                offset += length
            }
        } else {
            ranges = [ControlMessage.headerSize..<Int.max]
            keepsText = false
        }
        guard !ranges.isEmpty else { return }
        pendingPartRedactions.append((ordered.map { (block: $0.part.block, payload: $0.part.payload, count: $0.part.bytes.count, offset: $0.offset) },
                                      ranges, keepsText))
        redactedFrames += partial.parts.count
    }

    /// Applies the redactions of messages in parts once every block is in place.
    static func applyPartRedactions(_ redactions: [PartRedaction], to blocks: inout [[UInt8]]) {
        for (places, ranges, keepsText) in redactions {
            for place in places {
                let messageOffset = place.offset
                let part = messageOffset..<(messageOffset + place.count)
                var changed = false
                for range in ranges {
                    let overlap = range.clamped(to: part)
                    for index in overlap {
                        let position = place.payload + (index - messageOffset)
                        guard position < blocks[place.block].count else { continue }
                        if keepsText {
                            if blocks[place.block][position] != 0 { blocks[place.block][position] = UInt8(ascii: "X") }
                        } else {
                            blocks[place.block][position] = 0
                        }
                        changed = true
                    }
                }
                if changed {
                    // The payload's checksum follows the payload: recomputed over the whole payload of the packet.
                    Self.rechecksum(&blocks[place.block], payloadAt: place.payload)
                }
            }
        }
    }

    /// Overwrites, in the enhanced packet block `block`, the parameter ``redactions`` names in
    /// the control message of the iAP2 frame at `start..<end`: a string's bytes become `X` (its
    /// terminating NUL kept), a certificate's become zeros; the payload checksum is computed
    /// again. Lengths do not change, so the block stays valid. Returns whether it changed.
    static func redact(_ block: inout [UInt8], frameAt start: Int, end: Int, controlSession: UInt8?) -> Bool {
        let frame = Array(block[start..<end])
        guard frame.count > LinkPacketHeader.size, frame[0] == 0xFF, frame[1] == 0x5A,
              let header = try? LinkPacketHeader.decode(frame.span.bytes), header.packetLength == frame.count,
              header.payloadLength >= ControlMessage.headerSize, !header.control.contains(.syn) else { return false }
        let payload = start + LinkPacketHeader.size
        guard controlSession.map({ $0 == header.sessionID }) ?? true,
              block[payload] == 0x40, block[payload + 1] == 0x40 else { return false }
        let messageLength = Int(block[payload + 2]) << 8 | Int(block[payload + 3])
        let id = UInt16(block[payload + 4]) << 8 | UInt16(block[payload + 5])
        guard let rule = redactions[id], messageLength <= header.payloadLength else { return false }
        var offset = ControlMessage.headerSize
        var changed = false
        while offset + Parameter.headerSize <= messageLength {
            let length = Int(block[payload + offset]) << 8 | Int(block[payload + offset + 1])
            let parameter = UInt16(block[payload + offset + 2]) << 8 | UInt16(block[payload + offset + 3])
            guard length >= Parameter.headerSize, offset + length <= messageLength else { break }
            if parameter == rule.parameter {
                let data = (payload + offset + Parameter.headerSize)..<(payload + offset + length)
                for index in data {
                    if rule.keepsText {
                        if block[index] != 0 { block[index] = UInt8(ascii: "X") }
                    } else {
                        block[index] = 0
                    }
                }
                changed = true
            }
            offset += length
        }
        guard changed else { return false }
        let payloadRange = payload..<(payload + header.payloadLength)
        block[payloadRange.upperBound] = Checksum.of(Array(block[payloadRange]))
        return true
    }

    /// Computes again the payload checksum of the iAP2 packet whose payload starts at
    /// `payload` in `block` (its header is the 9 bytes before it).
    static func rechecksum(_ block: inout [UInt8], payloadAt payload: Int) {
        let header = payload - LinkPacketHeader.size
        guard header >= 0, payload <= block.count else { return }
        let packetLength = Int(block[header + 2]) << 8 | Int(block[header + 3])
        let end = header + packetLength - 1
        guard packetLength > LinkPacketHeader.size + 1, end < block.count, end >= payload else { return }
        block[end] = Checksum.of(Array(block[payload..<end]))
    }
}
