// libFuzzer target: what iapd reads from a client and a client reads from iapd: the message
// framer (4-byte length, JSON) and the decoding of requests and replies. Checks: no crash, hang
// or unbounded memory; a bad message is a DaemonProtocolError; a request that decodes and passes
// its checks encodes and decodes back to itself; the input fed in two pieces (cut where its first
// byte says) gives the same messages as fed whole.

import IAPDaemonProtocol

func frames(_ input: [UInt8], cut: Int, limit: Int) -> (requests: [ClientMessage], replies: Int, failed: Bool) {
    var framer = MessageFramer(limit: limit)
    var requests: [ClientMessage] = []
    var replies = 0
    do {
        for range in [0..<cut, cut..<input.count] {
            framer.append(input[range])
            while let payload = try framer.nextPayload() {
                precondition(payload.count <= limit, "a payload over the limit came through")
                if let request = try? MessageFramer.decode(ClientMessage.self, from: payload) { requests.append(request) }
                if (try? MessageFramer.decode(DaemonMessage.self, from: payload)) != nil { replies += 1 }
            }
        }
    } catch {
        return (requests, replies, true)
    }
    precondition(framer.bufferedCount <= limit + 4 + input.count, "the framer holds more than it was given")
    return (requests, replies, false)
}

@_cdecl("LLVMFuzzerTestOneInput")
public func daemonFuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    let cut = size > 0 ? Int(input[0]) % (size + 1) : 0
    let limit = DaemonProtocol.maximumRequestLength
    let whole = frames(input, cut: size, limit: limit)
    let split = frames(input, cut: cut, limit: limit)
    precondition(whole.requests == split.requests && whole.replies == split.replies && whole.failed == split.failed,
                 "feeding in two pieces changed the messages")
    for message in whole.requests where message.request.invalidity == nil {
        let again = try? MessageFramer.decode(ClientMessage.self, from: Array(MessageFramer.encode(message).dropFirst(4)))
        precondition(again == message, "a request did not survive encoding: \(message)")
    }
    return 0
}
