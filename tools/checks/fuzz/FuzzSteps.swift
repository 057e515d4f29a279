// The step format the state-machine fuzz targets share: each step is an op byte, then up to 64
// bytes of the input. The op's top two bits choose what the step does (0 raw bytes, 1 and 2 a
// well-formed packet built from the bytes, 3 time passes); its low six bits give the length - 1.

struct FuzzSteps: Sequence, IteratorProtocol {
    let input: [UInt8]
    var offset = 0

    init(_ input: [UInt8]) { self.input = input }

    mutating func next() -> (op: UInt8, chunk: [UInt8])? {
        guard offset < input.count else { return nil }
        let op = input[offset]
        offset += 1
        let length = Swift.min(Int(op & 0x3F) + 1, input.count - offset)
        defer { offset += length }
        return (op, Array(input[offset..<(offset + length)]))
    }
}
