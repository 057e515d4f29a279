internal import CSharedMemory
internal import Glibc

/// The memory of one session shared by `iapd` and its client: a header page of 64-bit counters
/// and two byte rings, one per direction, in a `memfd` both processes map.
///
/// Layout (docs/DAEMON.md, "Session rings"), every counter a native-endian 64-bit word on a cache
/// line of its own:
///
/// | offset | word |
/// |---|---|
/// | 0 | magic (``magic``) |
/// | 8 | layout version (``layoutVersion``) |
/// | 16 | capacity of each ring, bytes (a power of two) |
/// | 64 + 256·r | ring r's tail: bytes its producer wrote, ever |
/// | 128 + 256·r | ring r's head: bytes its consumer took, ever |
/// | 192 + 256·r | ring r's consumer is waiting for bytes (0 or 1) |
/// | 256 + 256·r | ring r's producer is waiting for room (0 or 1) |
/// | 576 | bytes of ring 0 the accessory acknowledged (written by the daemon) |
/// | 640 | the client waits for acknowledgements (0 or 1) |
///
/// Ring 0 carries client → daemon (toward the accessory), ring 1 daemon → client. Ring r's data
/// is at `4096 + r·capacity`; byte n of the stream is at `n mod capacity`.
///
/// This type only maps the memory and moves words and bytes in and out of it; what the words
/// mean, and checking the ones the other process writes, is the channel's (`SharedRingChannel`).
/// Every access is bounds-checked against the mapping here, so a value read from the other
/// process can at worst fail a precondition of the caller's making, never reach outside the
/// mapping. The creator seals the file's size, so the other process cannot shrink it under the
/// mapping. One of the few types of the project that hold an unsafe pointer: the mapping lives
/// as long as the object.
package final class SharedRingMemory: @unchecked Sendable {
    // Sendability: `base`, `length` and `capacity` are set in `init` and never change; every
    // access to the mapping is an atomic word operation or a byte copy that the channel's
    // protocol orders (the producer writes bytes before it publishes the tail).

    /// `"IAPRING1"` read as a little-endian word.
    package static let magic: UInt64 = 0x3147_4E49_5250_4149
    /// The layout described above.
    package static let layoutVersion: UInt64 = 1
    /// Bytes before the first ring.
    package static let headerSize = 4096
    /// The smallest and largest ring capacity a mapping may declare.
    package static let capacityRange = 4096...(64 << 20)

    /// A 64-bit word of the header.
    package struct Word: Sendable, Hashable {
        /// Its byte offset in the header.
        package let offset: Int

        /// Ring `ring`'s tail (bytes written to it, ever).
        package static func tail(_ ring: Int) -> Word { Word(offset: 64 + 256 * ring) }
        /// Ring `ring`'s head (bytes taken from it, ever).
        package static func head(_ ring: Int) -> Word { Word(offset: 128 + 256 * ring) }
        /// Set by ring `ring`'s consumer when it found the ring empty and waits to be woken.
        package static func consumerWaiting(_ ring: Int) -> Word { Word(offset: 192 + 256 * ring) }
        /// Set by ring `ring`'s producer when it found the ring full and waits to be woken.
        package static func producerWaiting(_ ring: Int) -> Word { Word(offset: 256 + 256 * ring) }
        /// Bytes of ring 0 the accessory acknowledged.
        package static let acknowledged = Word(offset: 576)
        /// Set by the client when it waits for ``acknowledged`` to move.
        package static let acknowledgementWaiting = Word(offset: 640)
        static let magic = Word(offset: 0)
        static let version = Word(offset: 8)
        static let capacity = Word(offset: 16)
    }

    /// Why a mapping could not be made or used.
    package struct Failure: Error, Sendable, CustomStringConvertible {
        /// What went wrong, in a sentence.
        package let description: String
    }

    /// Bytes of each ring.
    package let capacity: Int
    private let base: UnsafeMutableRawPointer
    private let length: Int

    private init(base: UnsafeMutableRawPointer, length: Int, capacity: Int) {
        self.base = base
        self.length = length
        self.capacity = capacity
    }

    deinit { _ = munmap(base, length) }

    /// Makes the memory of a new session (`capacity` rounded up to a power of two within
    /// ``capacityRange``): a sealed memfd, mapped and initialised. The descriptor is the caller's
    /// to pass on and close; the mapping does not need it.
    package static func create(capacity requested: Int, name: String = "iapd-session") -> Result<(memory: SharedRingMemory, descriptor: Int32), Failure> {
        var capacity = capacityRange.lowerBound
        while capacity < min(requested, capacityRange.upperBound) { capacity <<= 1 }
        let descriptor = iap_memfd_create(name)
        guard descriptor >= 0 else { return .failure(Failure(description: "memfd_create failed: \(String(cString: strerror(errno)))")) }
        let length = headerSize + 2 * capacity
        guard ftruncate(descriptor, off_t(length)) == 0, iap_memfd_seal_size(descriptor) == 0 else {
            let reason = String(cString: strerror(errno))
            _ = close(descriptor)
            return .failure(Failure(description: "sizing the session's shared memory failed: \(reason)"))
        }
        switch map(descriptor: descriptor, length: length, capacity: capacity) {
        case let .failure(failure):
            _ = close(descriptor)
            return .failure(failure)
        case let .success(memory):
            memory.store(.capacity, UInt64(capacity))
            memory.store(.version, layoutVersion)
            memory.store(.magic, magic)
            return .success((memory, descriptor))
        }
    }

    /// Maps the memory another process made and passed over (`descriptor` stays the caller's):
    /// checks the file's size against the layout the header declares.
    package static func attach(descriptor: Int32) -> Result<SharedRingMemory, Failure> {
        var info = stat()
        guard fstat(descriptor, &info) == 0 else { return .failure(Failure(description: "fstat of the session's shared memory failed: \(String(cString: strerror(errno)))")) }
        let size = Int(info.st_size)
        guard size > headerSize else { return .failure(Failure(description: "the session's shared memory is \(size) bytes, too small for its header")) }
        guard case let .success(header) = map(descriptor: descriptor, length: headerSize, capacity: 0) else {
            return .failure(Failure(description: "mapping the session's shared memory failed: \(String(cString: strerror(errno)))"))
        }
        guard header.load(.magic) == magic, header.load(.version) == layoutVersion else {
            return .failure(Failure(description: "the session's shared memory has layout \(header.load(.version)), this library reads layout \(layoutVersion)"))
        }
        let declared = header.load(.capacity)
        guard declared <= UInt64(capacityRange.upperBound), capacityRange.contains(Int(declared)), declared.nonzeroBitCount == 1,
              size == headerSize + 2 * Int(declared) else {
            return .failure(Failure(description: "the session's shared memory declares rings of \(declared) bytes in a file of \(size)"))
        }
        return map(descriptor: descriptor, length: size, capacity: Int(declared))
    }

    private static func map(descriptor: Int32, length: Int, capacity: Int) -> Result<SharedRingMemory, Failure> {
        guard let mapped = mmap(nil, length, PROT_READ | PROT_WRITE, MAP_SHARED, descriptor, 0), mapped != MAP_FAILED else {
            return .failure(Failure(description: "mapping the session's shared memory failed: \(String(cString: strerror(errno)))"))
        }
        return .success(SharedRingMemory(base: mapped, length: length, capacity: capacity))
    }

    // MARK: Words

    private func pointer(_ word: Word) -> UnsafeMutablePointer<UInt64> {
        precondition(word.offset >= 0 && word.offset + 8 <= Self.headerSize && word.offset % 8 == 0, "not a header word")
        return (base + word.offset).assumingMemoryBound(to: UInt64.self)
    }

    /// The word's value now (sequentially consistent with every other word access).
    package func load(_ word: Word) -> UInt64 { iap_shared_load(pointer(word)) }

    /// Sets the word (sequentially consistent).
    package func store(_ word: Word, _ value: UInt64) { iap_shared_store(pointer(word), value) }

    /// Sets the word and returns what it was (sequentially consistent).
    package func exchange(_ word: Word, _ value: UInt64) -> UInt64 { iap_shared_exchange(pointer(word), value) }

    // MARK: Bytes

    private func address(ring: Int, offset: Int, count: Int) -> UnsafeMutableRawPointer {
        precondition((0...1).contains(ring) && offset >= 0 && count >= 0 && offset + count <= capacity, "outside the ring")
        return base + Self.headerSize + ring * capacity + offset
    }

    /// Lends `count` bytes of ring `ring` from `offset` (not wrapping) to `body`. The other
    /// process may write them meanwhile only if it breaks the protocol: the bytes are then
    /// garbage, never memory outside the ring.
    package func withBytes<Result>(ring: Int, offset: Int, count: Int, _ body: (RawSpan) throws -> Result) rethrows -> Result {
        let start = address(ring: ring, offset: offset, count: count)
        return try body(RawSpan(_unsafeBytes: UnsafeRawBufferPointer(start: start, count: count)))
    }

    /// Copies `bytes` into ring `ring` at `offset` (not wrapping).
    package func copy(_ bytes: UnsafeRawBufferPointer, ring: Int, offset: Int) {
        guard let source = bytes.baseAddress, bytes.count > 0 else { return }
        address(ring: ring, offset: offset, count: bytes.count).copyMemory(from: source, byteCount: bytes.count)
    }
}
