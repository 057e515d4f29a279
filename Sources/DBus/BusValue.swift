internal import Glibc
internal import Synchronization

/// One D-Bus value, typed as on the wire: what a method call carries and a reply returns.
///
/// Containers say their element types where the values cannot (an empty array still has one):
/// ``array(_:_:)`` takes the element signature, e.g. `"{sv}"` for a dictionary of variants
/// (``dictionary(_:)`` builds that one). Values are checked before they are sent (``signature``,
/// strings without NUL, valid object paths): a value libdbus would refuse is a ``BusError``, not
/// a crash.
package indirect enum BusValue: Sendable, Equatable, CustomStringConvertible {
    /// `y`
    case byte(UInt8)
    /// `b`
    case bool(Bool)
    /// `n`
    case int16(Int16)
    /// `q`
    case uint16(UInt16)
    /// `i`
    case int32(Int32)
    /// `u`
    case uint32(UInt32)
    /// `x`
    case int64(Int64)
    /// `t`
    case uint64(UInt64)
    /// `d`
    case double(Double)
    /// `s`: UTF-8 without NUL characters.
    case string(String)
    /// `o`: an object path such as `/org/bluez/hci0`.
    case objectPath(String)
    /// `g`: a type signature such as `a{sv}`.
    case signature(String)
    /// `h`: a file descriptor, passed over the bus's Unix socket (``BusFileDescriptor``).
    case unixFD(BusFileDescriptor)
    /// `v`: any one value with its type.
    case variant(BusValue)
    /// `a…`: values of one type, named by its signature (`"s"`, `"{sv}"`, `"(ii)"`…).
    case array(String, [BusValue])
    /// `{…}`: one entry of a dictionary (only inside an array): a basic key and a value.
    case dictionaryEntry(BusValue, BusValue)
    /// `(…)`: a structure.
    case structure([BusValue])

    /// A dictionary of strings to variants (`a{sv}`), entries sorted by key: the options and
    /// property maps of most D-Bus APIs.
    package static func dictionary(_ entries: [String: BusValue]) -> BusValue {
        .array("{sv}", entries.sorted { $0.key < $1.key }.map { .dictionaryEntry(.string($0.key), .variant($0.value)) })
    }

    /// The value's D-Bus signature, e.g. `a{sv}`.
    package var signature: String {
        switch self {
        case .byte: "y"
        case .bool: "b"
        case .int16: "n"
        case .uint16: "q"
        case .int32: "i"
        case .uint32: "u"
        case .int64: "x"
        case .uint64: "t"
        case .double: "d"
        case .string: "s"
        case .objectPath: "o"
        case .signature: "g"
        case .unixFD: "h"
        case .variant: "v"
        case let .array(element, _): "a" + element
        case let .dictionaryEntry(key, value): "{" + key.signature + value.signature + "}"
        case let .structure(fields): "(" + fields.map(\.signature).joined() + ")"
        }
    }

    /// The string of a `s`, `o` or `g` value (looking through a variant); nil otherwise.
    package var string: String? {
        switch self {
        case let .string(text), let .objectPath(text), let .signature(text): text
        case let .variant(inner): inner.string
        default: nil
        }
    }

    /// The value of a `b` (looking through a variant); nil otherwise.
    package var bool: Bool? {
        switch self {
        case let .bool(value): value
        case let .variant(inner): inner.bool
        default: nil
        }
    }

    /// Any unsigned or signed integer that fits (looking through a variant); nil otherwise.
    package var integer: Int? {
        switch self {
        case let .byte(value): Int(value)
        case let .int16(value): Int(value)
        case let .uint16(value): Int(value)
        case let .int32(value): Int(value)
        case let .uint32(value): Int(value)
        case let .int64(value): Int(value)
        case let .uint64(value): Int(exactly: value)
        case let .variant(inner): inner.integer
        default: nil
        }
    }

    /// The elements of an array (looking through a variant); nil otherwise.
    package var elements: [BusValue]? {
        switch self {
        case let .array(_, elements): elements
        case let .variant(inner): inner.elements
        default: nil
        }
    }

    /// A dictionary with string or object-path keys (`a{sv}`, `a{oa{sa{sv}}}`…) as a Swift
    /// dictionary; variants are unwrapped. Nil for anything else. A repeated key keeps its last
    /// value.
    package var dictionary: [String: BusValue]? {
        guard let elements else { return nil }
        var result: [String: BusValue] = [:]
        for element in elements {
            guard case let .dictionaryEntry(key, value) = element, let name = key.string else { return nil }
            if case let .variant(inner) = value { result[name] = inner } else { result[name] = value }
        }
        return result
    }

    /// A short rendering for logs and test failures, e.g. `s "hello"`.
    package var description: String {
        switch self {
        case let .string(text): "\"\(text)\""
        case let .objectPath(path): path
        case let .variant(inner): "<\(inner)>"
        case let .array(_, elements): "[" + elements.map(\.description).joined(separator: ", ") + "]"
        case let .dictionaryEntry(key, value): "\(key): \(value)"
        case let .structure(fields): "(" + fields.map(\.description).joined(separator: ", ") + ")"
        case let .unixFD(descriptor): "fd \(descriptor)"
        case let .bool(value): "\(value)"
        case let .double(value): "\(value)"
        case let .signature(text): "g \(text)"
        default: integer.map(String.init) ?? signature
        }
    }
}

/// A file descriptor in a D-Bus message (`h`), owned: closed when the last reference goes, unless
/// taken with ``take()``.
///
/// Received descriptors are the receiver's (libdbus duplicates them out of the message); a
/// descriptor sent is duplicated into the message, so the sender keeps its own.
package final class BusFileDescriptor: Sendable, Equatable, CustomStringConvertible {
    private let descriptor: Mutex<Int32?>

    /// Takes ownership of `descriptor`.
    package init(owning descriptor: Int32) {
        self.descriptor = Mutex(descriptor)
    }

    deinit {
        if let descriptor = descriptor.withLock({ $0 }) { _ = Glibc.close(descriptor) }
    }

    /// The descriptor, still owned here (nil once taken).
    package var value: Int32? { descriptor.withLock { $0 } }

    /// The descriptor, now the caller's to close; nil when already taken.
    package func take() -> Int32? {
        descriptor.withLock { current in
            defer { current = nil }
            return current
        }
    }

    /// The same object.
    package static func == (lhs: BusFileDescriptor, rhs: BusFileDescriptor) -> Bool { lhs === rhs }

    /// The number, or "taken".
    package var description: String { value.map(String.init) ?? "taken" }
}
