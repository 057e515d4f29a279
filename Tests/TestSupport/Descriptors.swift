import Glibc

/// What an open descriptor refers to, as the kernel names it in `/proc/self/fd`:
/// `socket:[inode]`, `pipe:[inode]`, or a path; `nil` when `descriptor` is not open.
///
/// A leak test that counts the process's descriptors fails whenever another suite, running in
/// parallel, holds more of them at the end than at the start. Each socket and each pipe has an
/// inode of its own (a pipe's two ends share one), never reused while it is open, so its name
/// tells it apart from everything else the process opens: a test can record the names of the descriptors it cares about and
/// ask later whether any of them is still open.
public func descriptorIdentity(_ descriptor: Int32) -> String? {
    readLink("/proc/self/fd/\(descriptor)")
}

/// How many descriptors the process holds now (the one reading the list included). Other suites
/// running in parallel change it: a leak test compares it over rounds, and the quietest round
/// decides, or checks by ``descriptorIdentity(_:)`` where it can.
public func openDescriptorCount() -> Int {
    guard let directory = opendir("/proc/self/fd") else { return -1 }
    defer { closedir(directory) }
    var count = 0
    while readdir(directory) != nil { count += 1 }
    return count
}

/// The ``descriptorIdentity(_:)`` of every descriptor the process holds now.
public func openDescriptorIdentities() -> Set<String> {
    guard let directory = opendir("/proc/self/fd") else { return [] }
    defer { closedir(directory) }
    var names: Set<String> = []
    while let entry = readdir(directory) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { bytes in
            String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
        }
        guard let descriptor = Int32(name), let identity = descriptorIdentity(descriptor) else { continue }
        names.insert(identity)
    }
    return names
}

private func readLink(_ path: String) -> String? {
    var buffer = [CChar](repeating: 0, count: 4096)
    let count = readlink(path, &buffer, buffer.count - 1)
    guard count > 0 else { return nil }
    return String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
