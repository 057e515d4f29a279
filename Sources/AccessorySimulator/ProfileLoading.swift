import FoundationEssentials

/// Why a simulator profile could not be used: the file, the field (a JSON path such as
/// `protocols[2].sourceBytes`), and what is wrong with what to do about it.
public struct SimulatorProfileError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The profile file, when the profile came from one.
    public var file: String?
    /// The JSON path of the offending field; nil when the file as a whole is the problem.
    public var field: String?
    /// What is wrong and how to fix it.
    public var problem: String

    /// Creates an error.
    public init(file: String? = nil, field: String?, problem: String) {
        self.file = file
        self.field = field
        self.problem = problem
    }

    /// One line for a person: `file: field 'path': problem`.
    public var description: String {
        var text = file.map { "\($0): " } ?? "simulator profile: "
        if let field { text += "field '\(field)' " }
        return text + problem
    }
}

extension SimulatorProfile {
    /// Profiles are a few hundred bytes; anything much larger is not a profile.
    static let maxFileSize = 1 << 20

    /// Reads and checks a JSON profile file.
    ///
    /// - Throws: ``SimulatorProfileError`` naming the file and, when one is at fault, the field.
    public static func load(path: String) throws(SimulatorProfileError) -> SimulatorProfile {
        let data: Data
        do {
            data = try Data(contentsOf: URL(filePath: path))
        } catch {
            throw SimulatorProfileError(file: path, field: nil, problem: readProblem(error))
        }
        guard data.count <= maxFileSize else {
            throw SimulatorProfileError(file: path, field: nil,
                                        problem: "is \(data.count) bytes, too large for a profile; check that the path names a profile JSON file")
        }
        do {
            return try decode([UInt8](data)).resolvingFiles(relativeTo: path)
        } catch {
            var located = error
            located.file = path
            throw located
        }
    }

    /// Decodes and checks a JSON profile.
    ///
    /// - Throws: ``SimulatorProfileError`` naming the field at fault (its `file` is nil).
    public static func decode(_ data: [UInt8]) throws(SimulatorProfileError) -> SimulatorProfile {
        let profile: SimulatorProfile
        do {
            profile = try JSONDecoder().decode(SimulatorProfile.self, from: Data(data))
        } catch let error as SimulatorProfileError {
            throw error
        } catch let error as DecodingError {
            throw SimulatorProfileError(error)
        } catch {
            throw SimulatorProfileError(field: nil, problem: "cannot be decoded (\(error)); check that it is a profile JSON file")
        }
        try profile.validate()
        return profile
    }

    private static func readProblem(_ error: any Error) -> String {
        switch (error as? CocoaError)?.code {
        case .fileReadNoSuchFile?, .fileNoSuchFile?:
            return "no such file; check the path (the shipped profiles are in tools/data/profiles/; built-in names are "
                + builtInNames.joined(separator: ", ") + ")"
        case .fileReadNoPermission?:
            return "cannot be read: permission denied; make the file readable for this user"
        default:
            return "cannot be read (\(error)); check that the path names a readable profile JSON file"
        }
    }
}

extension SimulatorProfileError {
    /// Translates what the JSON decoder found into a field and a fix.
    init(_ error: DecodingError) {
        switch error {
        case let .keyNotFound(key, context):
            self.init(field: fieldPath(context.codingPath + [key]), problem: "is missing; add it (it is required)")
        case let .typeMismatch(type, context):
            self.init(field: fieldPath(context.codingPath), problem: "has the wrong type; give \(describe(type))")
        case let .valueNotFound(type, context):
            self.init(field: fieldPath(context.codingPath),
                      problem: "is null; give \(describe(type)), or leave the field out if it is optional")
        case let .dataCorrupted(context) where context.codingPath.isEmpty:
            let detail = (context.underlyingError.map { "\($0)" } ?? context.debugDescription)
            self.init(field: nil, problem: "is not valid JSON (\(detail)); fix the syntax")
        case let .dataCorrupted(context):
            self.init(field: fieldPath(context.codingPath), problem: "has a value that does not fit (\(context.debugDescription))")
        @unknown default:
            self.init(field: nil, problem: "cannot be decoded (\(error))")
        }
    }
}

/// A person's word for the JSON a Swift type decodes from.
private func describe(_ type: Any.Type) -> String {
    switch type {
    case is String.Type: return "text in double quotes"
    case is Int.Type, is UInt64.Type: return "a whole number"
    case is Double.Type: return "a number"
    case is [String: Any].Type: return "an object { … }"
    case is [Any].Type: return "a list [ … ]"
    default:
        let name = String(describing: type)
        return name.hasPrefix("Array") ? "a list [ … ]" : "a value of type \(name)"
    }
}

/// A JSON path such as `protocols[2].sourceBytes`.
func fieldPath(_ path: [any CodingKey]) -> String {
    var text = ""
    for key in path {
        if let index = key.intValue {
            text += "[\(index)]"
        } else {
            text += text.isEmpty ? key.stringValue : "." + key.stringValue
        }
    }
    return text
}

/// Any key of a JSON object.
private struct AnyKey: CodingKey {
    var stringValue: String
    var intValue: Int? { nil }
    init(stringValue: String) { self.stringValue = stringValue }
    init?(intValue: Int) { nil }
}

/// Refuses keys of the object being decoded that `known` does not list, naming the valid ones.
func rejectUnknownFields<Keys: CodingKey & CaseIterable>(in decoder: any Decoder, known: Keys.Type) throws {
    let container = try decoder.container(keyedBy: AnyKey.self)
    let names = Keys.allCases.map(\.stringValue)
    for key in container.allKeys.sorted(by: { $0.stringValue < $1.stringValue }) where !names.contains(key.stringValue) {
        throw SimulatorProfileError(field: fieldPath(decoder.codingPath + [key]),
                                    problem: "is not a known field; the fields here are " + names.joined(separator: ", "))
    }
}
