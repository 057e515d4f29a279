internal import Glibc

/// Users, groups and processes as the system names them: what a permission error names, and
/// what the daemon checks a client against.
package enum UserDatabase {
    /// The name of group `gid`, or nil when it has none.
    package static func groupName(of gid: UInt32) -> String? {
        var group = Glibc.group()
        var result: UnsafeMutablePointer<Glibc.group>?
        var buffer = [CChar](repeating: 0, count: 16 * 1024)
        let status = getgrgid_r(gid, &group, &buffer, buffer.count, &result)
        guard status == 0, result != nil, let name = group.gr_name else { return nil }
        return String(cString: name)
    }

    /// The id of the group named `name`, or nil when there is none.
    package static func groupID(named name: String) -> UInt32? {
        var group = Glibc.group()
        var result: UnsafeMutablePointer<Glibc.group>?
        var buffer = [CChar](repeating: 0, count: 16 * 1024)
        let status = getgrnam_r(name, &group, &buffer, buffer.count, &result)
        guard status == 0, result != nil else { return nil }
        return group.gr_gid
    }

    /// Whether user `uid` (with primary group `gid`) belongs to group `member`: as its primary
    /// group, or as a supplementary one in the group database.
    package static func user(_ uid: UInt32, primaryGroup gid: UInt32, isIn member: UInt32) -> Bool {
        if gid == member { return true }
        var password = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 16 * 1024)
        guard getpwuid_r(uid, &password, &buffer, buffer.count, &result) == 0, result != nil, let name = password.pw_name else {
            return false
        }
        var count: Int32 = 64
        var groups = [gid_t](repeating: 0, count: Int(count))
        if getgrouplist(name, gid, &groups, &count) < 0 {
            groups = [gid_t](repeating: 0, count: Int(count))
            guard getgrouplist(name, gid, &groups, &count) >= 0 else { return false }
        }
        return groups.prefix(Int(count)).contains(member)
    }

    /// The command line of process `pid` (its arguments joined by spaces, at most `limit`
    /// bytes), or empty when it cannot be read (gone, or hidden by `hidepid`).
    package static func commandLine(of pid: Int32, limit: Int = 512) -> String {
        guard case .success(let descriptor) = SystemCall.open("/proc/\(pid)/cmdline", O_RDONLY | O_CLOEXEC) else { return "" }
        defer { _ = close(descriptor) }
        var bytes = [UInt8](repeating: 0, count: limit)
        let count = bytes.withUnsafeMutableBytes { raw -> Int in
            guard case .success(let count) = SystemCall.read(descriptor, into: raw) else { return 0 }
            return count
        }
        var arguments = bytes.prefix(count).split(separator: 0, omittingEmptySubsequences: true).map { String(decoding: $0, as: UTF8.self) }
        if let first = arguments.first, let slash = first.lastIndex(of: "/") {
            arguments[0] = String(first[first.index(after: slash)...]) // the program's name, not where it lives
        }
        return arguments.joined(separator: " ")
    }
}
