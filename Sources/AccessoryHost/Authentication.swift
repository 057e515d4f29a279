public import IAPLink

extension Accessory {
    /// What the host's authentication policy concluded: verified, not verified with the reason
    /// (a recording policy lets such accessories in), or not checked; with the certificate's
    /// subject, issuer, serial number and validity period when it could be read.
    ///
    /// The policy is ``AccessoryManager/Configuration/authentication``: by default
    /// `AcceptingAuthentication` (not checked); IAPAuthentication's `VerifyingAuthentication`
    /// in record mode verifies, reports and accepts.
    /// The certificate's strings come from the accessory: escape them before showing them on a
    /// terminal.
    public var authentication: AuthenticationOutcome { identity.authentication }
}
