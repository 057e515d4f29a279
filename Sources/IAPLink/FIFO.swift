/// A first-in first-out queue over one array: amortised O(1) push and pop, storage reused (no
/// allocation in steady state). Shared by the layers above the link that need one.
///
/// A popped element leaves the storage at once (its slot is emptied), so the caller holds the
/// only reference to it: an array popped from the queue can be appended to in place, without a
/// copy on write.
public struct FIFO<Element> {
    private var storage: [Element?] = []
    private var head = 0

    /// An empty queue.
    public init() {}

    /// Whether the queue is empty.
    public var isEmpty: Bool { head == storage.count }
    /// How many elements are queued.
    public var count: Int { storage.count - head }
    /// The oldest element.
    public var first: Element? { isEmpty ? nil : storage[head] }

    /// Adds an element at the back.
    public mutating func append(_ element: Element) { storage.append(element) }

    /// Removes and returns the oldest element.
    public mutating func popFirst() -> Element? {
        guard head < storage.count else { return nil }
        let element = storage[head]
        storage[head] = nil
        head += 1
        if head == storage.count {
            storage.removeAll(keepingCapacity: true)
            head = 0
        } else if head >= 64, head * 2 >= storage.count {
            storage.removeFirst(head)
            head = 0
        }
        return element
    }

    /// Runs `body` on the newest element in place (no copy of it); nil when the queue is empty.
    public mutating func withLast<Result>(_ body: (inout Element) throws -> Result) rethrows -> Result? {
        guard head < storage.count else { return nil }
        return try body(&storage[storage.count - 1]!)
    }

    /// Runs `body` on the oldest element in place (no copy of it); nil when the queue is empty.
    public mutating func withFirst<Result>(_ body: (inout Element) throws -> Result) rethrows -> Result? {
        guard head < storage.count else { return nil }
        return try body(&storage[head]!)
    }

    /// Empties the queue, keeping its storage.
    public mutating func removeAll() {
        storage.removeAll(keepingCapacity: true)
        head = 0
    }

    /// The elements in order.
    public var elements: [Element] { storage[head...].map { $0! } }
}

extension FIFO: Sendable where Element: Sendable {}

/// An array kept across turns so that filling and draining it each turn allocates nothing:
/// ``take()`` hands it out empty (with the storage of last time) and ``putBack(_:)`` empties it
/// and keeps its storage for the next turn.
public struct ReusableArray<Element> {
    private var storage: [Element] = []

    /// An empty array, with no storage yet.
    public init() {}

    /// The array, empty, with the storage it had.
    public mutating func take() -> [Element] {
        var array: [Element] = []
        swap(&array, &storage)
        return array
    }

    /// Gives the array back: it is emptied (in place, so its storage is kept) and taken over;
    /// `array` is left empty.
    public mutating func putBack(_ array: inout [Element]) {
        array.removeAll(keepingCapacity: true)
        swap(&array, &storage)
    }
}

extension ReusableArray: Sendable where Element: Sendable {}
