import IAPInspect
import Testing

@Suite("JSON numbers with a fraction")
struct JSONNumberTests {
    @Test func numbersAreNumbersAndNonFiniteIsNull() {
        #expect(JSONValue.number(0.107823452).serialized() == "0.107823452")
        #expect(JSONValue.number(2).serialized() == "2.0")
        #expect(JSONValue.number(1e-7).serialized() == "1e-07")
        #expect(JSONValue.number(.infinity).serialized() == "null")
        #expect(JSONValue.number(.nan).serialized() == "null")
        #expect(JSONValue.object([("seconds", .number(1.5))]).serialized() == #"{"seconds":1.5}"#)
        #expect(JSONValue.number(1.5) == .number(1.5))
        #expect(JSONValue.number(1) != .int(1))
    }
}
