/// Typo suggestions for unknown options, subcommands and choices.
enum EditDistance {
    /// The optimal-string-alignment distance between `a` and `b`: insertions, deletions,
    /// substitutions and transpositions of adjacent characters each cost 1.
    static func distance(_ a: String, _ b: String) -> Int {
        let x = Array(a)
        let y = Array(b)
        if x.isEmpty { return y.count }
        if y.isEmpty { return x.count }
        var previous2 = [Int](repeating: 0, count: y.count + 1)
        var previous = Array(0...y.count)
        var current = [Int](repeating: 0, count: y.count + 1)
        for i in 1...x.count {
            current[0] = i
            for j in 1...y.count {
                let cost = x[i - 1] == y[j - 1] ? 0 : 1
                var best = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
                if i > 1, j > 1, x[i - 1] == y[j - 2], x[i - 2] == y[j - 1] {
                    best = min(best, previous2[j - 2] + 1)
                }
                current[j] = best
            }
            previous2 = previous
            previous = current
        }
        return previous[y.count]
    }

    /// The candidate closest to `word`, if it is close enough to be a plausible typo: at most one
    /// edit per three characters of the longer word (at least one, at most three). Ties go to
    /// the candidate listed first.
    static func closest(to word: String, among candidates: [String]) -> String? {
        var best: (candidate: String, distance: Int)?
        for candidate in candidates {
            let d = distance(word, candidate)
            let limit = min(3, max(1, max(word.count, candidate.count) / 3))
            guard d <= limit else { continue }
            if best.map({ d < $0.distance }) ?? true {
                best = (candidate, d)
            }
        }
        return best?.candidate
    }
}

/// "Did you mean …?" for a tool's own errors (a protocol string, a profile name), with the
/// rule the parser uses for options and subcommands.
package enum Suggestion {
    /// The candidate closest to `word` when it is close enough to be a typo of it (at most one
    /// edit per three characters, at most three), else nil.
    package static func closest(to word: String, among candidates: [String]) -> String? {
        EditDistance.closest(to: word, among: candidates)
    }
}
