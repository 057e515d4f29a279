internal import CDBus

/// Checks, before libdbus sees them, the names and values it would refuse: libdbus treats an
/// invalid argument as a programming error and aborts the process.
enum Validation {
    static func path(_ path: String) throws(BusError) {
        guard !path.contains("\0"), dbus_validate_path(path, nil) != 0 else { throw invalid("not a valid object path: \(path)") }
    }

    static func interface(_ name: String) throws(BusError) {
        guard !name.contains("\0"), dbus_validate_interface(name, nil) != 0 else { throw invalid("not a valid interface name: \(name)") }
    }

    static func member(_ name: String) throws(BusError) {
        guard !name.contains("\0"), dbus_validate_member(name, nil) != 0 else { throw invalid("not a valid method name: \(name)") }
    }

    static func busName(_ name: String) throws(BusError) {
        guard !name.contains("\0"), dbus_validate_bus_name(name, nil) != 0 else { throw invalid("not a valid bus name: \(name)") }
    }

    static func errorName(_ name: String) throws(BusError) {
        guard !name.contains("\0"), dbus_validate_error_name(name, nil) != 0 else { throw invalid("not a valid error name: \(name)") }
    }

    /// A value as a whole (its signature: nesting depth, dictionary entries only in arrays with
    /// basic keys) and in every part.
    static func value(_ value: BusValue) throws(BusError) {
        let signature = value.signature
        guard !signature.contains("\0"), dbus_signature_validate_single(signature, nil) != 0 else {
            throw invalid("not a valid D-Bus value (signature \(signature))")
        }
        try parts(value)
    }

    private static func parts(_ value: BusValue) throws(BusError) {
        switch value {
        case let .string(text):
            guard !text.contains("\0") else { throw invalid("a D-Bus string cannot contain NUL") }
        case let .objectPath(text):
            try path(text)
        case let .signature(text):
            guard !text.contains("\0"), dbus_signature_validate(text, nil) != 0 else { throw invalid("not a valid signature: \(text)") }
        case let .unixFD(descriptor):
            guard descriptor.value != nil else { throw invalid("the file descriptor was taken already") }
        case let .variant(inner):
            try Self.value(inner)
        case let .array(element, elements):
            for item in elements {
                guard item.signature == element else { throw invalid("an array of \(element) holds a \(item.signature)") }
                try parts(item)
            }
        case let .dictionaryEntry(key, item):
            try parts(key)
            try parts(item)
        case let .structure(fields):
            for field in fields { try parts(field) }
        default:
            break
        }
    }

    private static func invalid(_ message: String) -> BusError {
        BusError(name: BusError.invalidArgs, message: message)
    }
}

/// Values into and out of libdbus messages. Appending expects values ``Validation`` passed.
enum MessageCoding {
    static func append(_ values: [BusValue], to message: OpaquePointer) -> Bool {
        var iter = DBusMessageIter()
        dbus_message_iter_init_append(message, &iter)
        return values.allSatisfy { append($0, to: &iter) }
    }

    private static func type(_ character: Unicode.Scalar) -> Int32 { Int32(character.value) }

    private static func basic<Value>(_ value: Value, _ code: Unicode.Scalar, _ iter: UnsafeMutablePointer<DBusMessageIter>) -> Bool {
        withUnsafePointer(to: value) { dbus_message_iter_append_basic(iter, type(code), $0) != 0 }
    }

    private static func text(_ text: String, _ code: Unicode.Scalar, _ iter: UnsafeMutablePointer<DBusMessageIter>) -> Bool {
        text.withCString { characters in basic(characters, code, iter) }
    }

    private static func container(_ code: Unicode.Scalar, _ signature: String?, _ iter: UnsafeMutablePointer<DBusMessageIter>,
                                  _ body: (UnsafeMutablePointer<DBusMessageIter>) -> Bool) -> Bool {
        var inner = DBusMessageIter()
        guard dbus_message_iter_open_container(iter, type(code), signature, &inner) != 0 else { return false }
        guard body(&inner) else {
            dbus_message_iter_abandon_container(iter, &inner)
            return false
        }
        return dbus_message_iter_close_container(iter, &inner) != 0
    }

    private static func append(_ value: BusValue, to iter: UnsafeMutablePointer<DBusMessageIter>) -> Bool {
        switch value {
        case let .byte(number): basic(number, "y", iter)
        case let .bool(flag): basic(dbus_bool_t(flag ? 1 : 0), "b", iter)
        case let .int16(number): basic(number, "n", iter)
        case let .uint16(number): basic(number, "q", iter)
        case let .int32(number): basic(number, "i", iter)
        case let .uint32(number): basic(number, "u", iter)
        case let .int64(number): basic(number, "x", iter)
        case let .uint64(number): basic(number, "t", iter)
        case let .double(number): basic(number, "d", iter)
        case let .string(string): text(string, "s", iter)
        case let .objectPath(path): text(path, "o", iter)
        case let .signature(signature): text(signature, "g", iter)
        case let .unixFD(descriptor):
            // libdbus duplicates the descriptor into the message.
            descriptor.value.map { basic($0, "h", iter) } ?? false
        case let .variant(inner):
            container("v", inner.signature, iter) { append(inner, to: $0) }
        case let .array(element, elements):
            container("a", element, iter) { sub in elements.allSatisfy { append($0, to: sub) } }
        case let .dictionaryEntry(key, item):
            container("e", nil, iter) { append(key, to: $0) && append(item, to: $0) }
        case let .structure(fields):
            container("r", nil, iter) { sub in fields.allSatisfy { append($0, to: sub) } }
        }
    }

    /// Every argument of `message` (libdbus validated the message when it arrived).
    static func arguments(of message: OpaquePointer) -> [BusValue] {
        var iter = DBusMessageIter()
        guard dbus_message_iter_init(message, &iter) != 0 else { return [] }
        return sequence(&iter)
    }

    private static func sequence(_ iter: UnsafeMutablePointer<DBusMessageIter>) -> [BusValue] {
        var values: [BusValue] = []
        while dbus_message_iter_get_arg_type(iter) != 0 /* DBUS_TYPE_INVALID */ {
            if let value = read(iter) { values.append(value) }
            _ = dbus_message_iter_next(iter)
        }
        return values
    }

    private static func get<Value>(_ iter: UnsafeMutablePointer<DBusMessageIter>, _ initial: Value) -> Value {
        var value = initial
        withUnsafeMutablePointer(to: &value) { dbus_message_iter_get_basic(iter, $0) }
        return value
    }

    private static func string(_ iter: UnsafeMutablePointer<DBusMessageIter>) -> String {
        let characters: UnsafePointer<CChar>? = get(iter, nil)
        return characters.map { String(cString: $0) } ?? ""
    }

    private static func read(_ iter: UnsafeMutablePointer<DBusMessageIter>) -> BusValue? {
        let code = dbus_message_iter_get_arg_type(iter)
        switch UnicodeScalar(UInt8(truncatingIfNeeded: code)) {
        case "y": return .byte(get(iter, UInt8(0)))
        case "b": return .bool(get(iter, dbus_bool_t(0)) != 0)
        case "n": return .int16(get(iter, Int16(0)))
        case "q": return .uint16(get(iter, UInt16(0)))
        case "i": return .int32(get(iter, Int32(0)))
        case "u": return .uint32(get(iter, UInt32(0)))
        case "x": return .int64(get(iter, Int64(0)))
        case "t": return .uint64(get(iter, UInt64(0)))
        case "d": return .double(get(iter, Double(0)))
        case "s": return .string(string(iter))
        case "o": return .objectPath(string(iter))
        case "g": return .signature(string(iter))
        case "h":
            // libdbus hands out a duplicate, which is ours to close.
            let descriptor = get(iter, Int32(-1))
            return descriptor >= 0 ? .unixFD(BusFileDescriptor(owning: descriptor)) : nil
        case "v":
            var inner = DBusMessageIter()
            dbus_message_iter_recurse(iter, &inner)
            return read(&inner).map { .variant($0) }
        case "a":
            var element = ""
            if let signature = dbus_message_iter_get_signature(iter) {
                element = String(String(cString: signature).dropFirst())
                dbus_free(signature)
            }
            var inner = DBusMessageIter()
            dbus_message_iter_recurse(iter, &inner)
            return .array(element, sequence(&inner))
        case "e":
            var inner = DBusMessageIter()
            dbus_message_iter_recurse(iter, &inner)
            let fields = sequence(&inner)
            guard fields.count == 2 else { return nil }
            return .dictionaryEntry(fields[0], fields[1])
        case "r":
            var inner = DBusMessageIter()
            dbus_message_iter_recurse(iter, &inner)
            return .structure(sequence(&inner))
        default:
            return nil
        }
    }
}
