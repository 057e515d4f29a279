/// The version of AccessoryHost, its library and its tools, from this one place: `iapctl
/// --version`, `iapbench --version`, the man pages and `AccessoryManager.version` all read it.
///
/// A release changes ``string`` and ``releaseDate`` together with CHANGELOG.md's newest
/// version heading (`## [0.3.0] - 2026-12-07`); a test keeps the three in step.
package enum AccessoryHostVersion {
    /// The semantic version, e.g. `0.3.0`.
    package static let string = "0.3.0"
    /// The day ``string`` was released, `YYYY-MM-DD`.
    package static let releaseDate = "2026-12-07"
}
