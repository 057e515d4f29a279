public import IAPWire

/// An accessory's RequestAppLaunch (0xEA02): the application it asks the device to launch.
///
/// Accessories send it after identification (the FLIR ONE names `com.flir.one` right after
/// IdentificationAccepted, PROTOCOL.md §7.1). Its parameters are not confirmed by public
/// material beyond the first: parameter 0 is read as the application's bundle identifier when it
/// is text, parameter 1 as the launch-alert choice when it is one byte; every parameter is kept.
public struct AppLaunchRequest: Hashable, Sendable, CustomStringConvertible {
    /// The bundle identifier of the application asked for (parameter 0), empty when the
    /// accessory sent none or sent something that is not UTF-8 text.
    public var bundleIdentifier: String
    /// Parameter 1 when it is one byte (believed to say whether the device alerts the user
    /// before launching), nil otherwise.
    public var launchAlert: UInt8?
    /// Every parameter of the message, as it came.
    public var parameters: [Parameter]

    /// A request with these values.
    public init(bundleIdentifier: String, launchAlert: UInt8? = nil, parameters: [Parameter] = []) {
        self.bundleIdentifier = bundleIdentifier
        self.launchAlert = launchAlert
        self.parameters = parameters
    }

    /// Reads a RequestAppLaunch message; parameters it cannot read are left to ``parameters``.
    public init(_ message: ControlMessage) {
        bundleIdentifier = (try? message.parameter(0)?.string()) ?? ""
        launchAlert = try? message.parameter(1)?.uint8()
        parameters = message.parameters
    }

    /// The message an accessory sends for this request.
    public var message: ControlMessage {
        var parameters: [Parameter] = [.string(0, bundleIdentifier)]
        if let launchAlert { parameters.append(.uint8(1, launchAlert)) }
        return ControlMessage(id: .requestAppLaunch, parameters: parameters)
    }

    /// `com.flir.one`, or a note that the accessory named none.
    public var description: String { bundleIdentifier.isEmpty ? "(no application named)" : bundleIdentifier }
}
