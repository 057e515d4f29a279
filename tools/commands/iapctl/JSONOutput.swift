import AccessoryHost
import IAPInspect

/// iapctl's `--json` output: one object per line, each with `schemaVersion` first, the
/// accessory always the same object under `accessory`. docs/json-schema.json describes every
/// line; the CLI checks (tools/checks/cli/json.sh) validate every command's output against it.
enum JSONOutput {
    /// Raised when a field changes meaning or disappears (additions keep it).
    static let schemaVersion = 1

    /// A top-level line: `schemaVersion`, then `fields`.
    static func line(_ fields: [(String, JSONValue)]) -> String {
        JSONValue.object([("schemaVersion", .int(schemaVersion))] + fields).serialized() + "\n"
    }

    /// `value`'s members after `schemaVersion` (decode's frame reports).
    static func line(_ value: JSONValue) -> String {
        guard case let .object(fields) = value else { return line([("value", value)]) }
        return line(fields)
    }

    /// `{"schemaVersion":1,"accessory":{…}}`: list and wait.
    static func accessoryLine(_ accessory: Accessory) -> String {
        line([("accessory", json(accessory))])
    }
}

/// A duration as seconds, for JSON numbers.
func seconds(_ duration: Duration) -> Double {
    let (whole, fraction) = duration.components
    return Double(whole) + Double(fraction) / 1e18
}
