import IAPInspect
import IAPWire
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The Wireshark dissector (`tools/clients/wireshark/iap.lua`) names messages, parameters, lingoes and
/// commands from a copy of IAPWire's catalogue between its `BEGIN CATALOGUE` and `END CATALOGUE`
/// lines. This suite keeps that copy identical to the catalogue: when it fails, run it with
/// `ACCESSORYHOST_UPDATE_WIRESHARK_CATALOGUE=1` to rewrite the block, and commit the result.
@Suite("Wireshark dissector catalogue")
struct WiresharkCatalogueTests {
    static let path = repositoryRoot + "/tools/clients/wireshark/iap.lua"
    static let begin = "-- BEGIN CATALOGUE"
    static let end = "-- END CATALOGUE"

    @Test("the dissector's catalogue is IAPWire's")
    func catalogueMatches() throws {
        let script = try #require(readText(Self.path), "tools/clients/wireshark/iap.lua is missing")
        let lines = script.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        let first = try #require(lines.firstIndex { $0.hasPrefix(Self.begin) }, "no BEGIN CATALOGUE line in iap.lua")
        let last = try #require(lines.firstIndex { $0.hasPrefix(Self.end) }, "no END CATALOGUE line in iap.lua")
        try #require(first < last)
        let current = lines[(first + 1)..<last].joined(separator: "\n")
        let generated = Self.generate()
        if current != generated, getenv("ACCESSORYHOST_UPDATE_WIRESHARK_CATALOGUE") != nil {
            let updated = (Array(lines[...first]) + [generated] + Array(lines[last...])).joined(separator: "\n")
            let file = try #require(fopen(Self.path, "w"))
            fputs(updated, file)
            fclose(file)
            return
        }
        #expect(current == generated,
                "tools/clients/wireshark/iap.lua's catalogue differs from IAPWire's; rerun with ACCESSORYHOST_UPDATE_WIRESHARK_CATALOGUE=1")
    }

    @Test("the generated catalogue holds every catalogued message, nested groups included")
    func generatedHoldsEverything() {
        let text = Self.generate()
        #expect(text.contains("[0x1D01] = { name = \"IdentificationInformation\", sender = \"accessory\""))
        #expect(text.contains("name = \"SupportedExternalAccessoryProtocol\", type = \"group\", params = {"))
        #expect(text.contains("[0x38] = \"StartIDPS\""))
        #expect(text.contains("{ 0xEA00, 0xEAFF, \"ExternalAccessory\" }"))
    }

    // MARK: Generation

    static func generate() -> String {
        var out = ["-- Generated from IAPWire's MessageCatalogue and IAP1Catalogue by Tests/IAPInspectTests/WiresharkCatalogueTests.swift;",
                   "-- do not edit by hand (ACCESSORYHOST_UPDATE_WIRESHARK_CATALOGUE=1 swift test --filter WiresharkCatalogue).",
                   "local MESSAGES = {"]
        for raw in 0...UInt16.max {
            guard let info = MessageCatalogue.info(for: MessageID(raw)) else { continue }
            var line = "    [0x\(hex4(raw))] = { name = \(quote(info.name)), sender = \(quote(info.sender.rawValue))"
            if info.parameters.isEmpty {
                out.append(line + " },")
            } else {
                line += ", params = {"
                out.append(line)
                out += parameters(info.parameters, indent: "        ")
                out.append("    } },")
            }
        }
        out.append("}")
        out.append("local FAMILIES = {")
        var run: (start: UInt16, end: UInt16, name: String)?
        for raw in 0...UInt16.max {
            let name = MessageCatalogue.family(of: MessageID(raw))
            if let current = run, name == current.name, raw == current.end &+ 1 {
                run = (current.start, raw, current.name)
                continue
            }
            if let current = run { out.append("    { 0x\(hex4(current.start)), 0x\(hex4(current.end)), \(quote(current.name)) },") }
            run = name.map { (raw, raw, $0) }
        }
        if let current = run { out.append("    { 0x\(hex4(current.start)), 0x\(hex4(current.end)), \(quote(current.name)) },") }
        out.append("}")
        out += table("LINGOES", IAP1Catalogue.lingoes.map { (UInt16($0.key), $0.value) }, width: 2)
        out += table("GENERAL_COMMANDS", IAP1Catalogue.generalCommands.map { (UInt16($0.key), $0.value) }, width: 2)
        out += table("USB_HOST_MODE_COMMANDS", IAP1Catalogue.usbHostModeCommands.map { (UInt16($0.key), $0.value) }, width: 2)
        out += table("ACK_STATUSES", IAP1Catalogue.ackStatuses.map { (UInt16($0.key), $0.value) }, width: 2)
        out += table("TOKENS", IAP1Catalogue.tokens.map { ($0.key, $0.value) }, width: 4)
        return out.joined(separator: "\n")
    }

    static func parameters(_ table: [UInt16: ParameterInfo], indent: String) -> [String] {
        var out: [String] = []
        for id in table.keys.sorted() {
            let info = table[id]!
            let head = "\(indent)[\(id)] = { name = \(quote(info.name)), type = "
            switch info.type {
            case let .group(subtable):
                if subtable.isEmpty {
                    out.append(head + "\"group\", params = {} },")
                } else {
                    out.append(head + "\"group\", params = {")
                    out += parameters(subtable, indent: indent + "    ")
                    out.append("\(indent)} },")
                }
            case let .enumeration(names):
                let values = names.keys.sorted().map { "[\($0)] = \(quote(names[$0]!))" }.joined(separator: ", ")
                out.append(head + "\"enum\", values = { \(values) } },")
            default:
                out.append(head + quote(typeName(info.type)) + " },")
            }
        }
        return out
    }

    static func typeName(_ type: ParameterType) -> String {
        switch type {
        case .flag: return "flag"
        case .utf8: return "utf8"
        case .uint8: return "uint8"
        case .uint16: return "uint16"
        case .uint32: return "uint32"
        case .uint64: return "uint64"
        case .bool: return "bool"
        case .enumeration: return "enum"
        case .messageIDList: return "ids"
        case .blob: return "blob"
        case .group: return "group"
        }
    }

    static func table(_ name: String, _ entries: [(UInt16, String)], width: Int) -> [String] {
        ["local \(name) = {"] + entries.sorted { $0.0 < $1.0 }.map { key, value in
            "    [0x\(width == 2 ? hex2(UInt8(key)) : hex4(key))] = \(quote(value)),"
        } + ["}"]
    }

    static func quote(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            default:
                if scalar.value < 0x20 || scalar.value > 0x7E { out += "\\\(scalar.value)" } else { out.unicodeScalars.append(scalar) }
            }
        }
        return out + "\""
    }

    static func hex2(_ value: UInt8) -> String {
        let digits = Array("0123456789ABCDEF")
        return String([digits[Int(value >> 4)], digits[Int(value & 0xF)]])
    }

    static func hex4(_ value: UInt16) -> String { hex2(UInt8(value >> 8)) + hex2(UInt8(value & 0xFF)) }
}
