public import IAPWire

/// Decodes a whole capture (bytes of one stream) into reports, in stream order: what
/// `iapctl decode` prints.
public enum CaptureDecoder {
    /// Everything found in a capture.
    public struct Result: Sendable {
        /// One report per frame, per run of dropped bytes, and one for an incomplete tail.
        public var reports: [FrameReport] = []
        /// Valid frames found.
        public var frames = 0
        /// Bytes that belonged to no valid frame.
        public var droppedBytes = 0
        /// Bytes at the end that start a frame the capture does not complete.
        public var incompleteBytes = 0

        /// True when every byte belonged to a valid frame.
        public var isClean: Bool { droppedBytes == 0 && incompleteBytes == 0 }
    }

    /// Scans `bytes` as one stream and describes every frame and drop.
    public static func decode(_ bytes: [UInt8], kinds: FrameKinds = .all, transactionIDs: TransactionIDMode = .auto) -> Result {
        var scanner = FrameScanner(kinds: kinds)
        var inspector = FrameInspector(transactionIDMode: transactionIDs)
        var result = Result()
        scanner.scan(bytes.span.bytes, onFrame: { frame, span in
            result.reports.append(inspector.inspect(frame, in: span))
            result.frames += 1
        }, onDrop: { drop in
            result.reports.append(inspector.inspect(drop, stream: bytes))
            result.droppedBytes += drop.byteCount
        })
        result.incompleteBytes = scanner.pendingByteCount
        if scanner.pendingByteCount > 0 {
            let start = bytes.count - scanner.pendingByteCount
            let shown = bytes[start...].prefix(32)
            var details = ["bytes: " + HexInput.format(shown) + (shown.count < scanner.pendingByteCount ? " …" : "")]
            if case let .failure(error) = Result2.catching({ () throws(WireError) in
                if bytes[start] == 0xFF, start + 1 < bytes.count, bytes[start + 1] == 0x5A {
                    _ = try LinkPacket.decode(Array(bytes[start...]).span.bytes)
                } else {
                    _ = try IAP1Framing.decode(Array(bytes[start...]).span.bytes)
                }
            }) {
                details.insert(error.description, at: 0)
            }
            result.reports.append(FrameReport(
                summary: "incomplete: the input ends inside a frame (\(scanner.pendingByteCount) bytes)",
                details: details,
                json: .object([("kind", .string("incomplete")), ("offset", .int(start)), ("length", .int(scanner.pendingByteCount))]),
                isValid: false))
        }
        return result
    }
}

enum Result2 {
    static func catching(_ body: () throws(WireError) -> Void) -> Result<Void, WireError> {
        do {
            try body()
            return .success(())
        } catch {
            return .failure(error)
        }
    }
}
