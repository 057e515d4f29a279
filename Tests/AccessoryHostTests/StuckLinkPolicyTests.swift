@testable import AccessoryHost
import IAPLink
import Testing

/// The decision to reset a device whose accessory never brings its link up, in virtual time.
@Suite struct StuckLinkPolicyTests {
    @Test func aLinkThatComesUpInTimeIsNeverReset() {
        var policy = StuckLinkPolicy(bound: .seconds(2), start: .zero)
        policy.linkStateChanged(.negotiating, now: .milliseconds(100))
        policy.linkStateChanged(.connected, now: .milliseconds(150))
        #expect(policy.deadline == nil && policy.linkCameUp)
        #expect(policy.decide(now: .seconds(60)) == .wait)
    }

    @Test func noSYNWithinTheBoundAsksForOneResetThenGivesUp() {
        var policy = StuckLinkPolicy(bound: .seconds(2), start: .seconds(1))
        #expect(policy.deadline == .seconds(3))
        #expect(policy.decide(now: .milliseconds(2_999)) == .wait)
        guard case let .reset(reason) = policy.decide(now: .seconds(3)) else { Issue.record("a reset at the bound"); return }
        #expect(reason.contains("within 2 s") && reason.contains("resetting the USB device once"))
        #expect(policy.deadline == nil, "no deadline while the reset runs")
        #expect(policy.decide(now: .seconds(30)) == .wait)
        policy.resetFinished(now: .seconds(4))
        #expect(policy.deadline == .seconds(6))
        guard case let .giveUp(reason) = policy.decide(now: .seconds(6)) else { Issue.record("giving up after the reset"); return }
        #expect(reason.contains("even after a USB reset") && reason.contains("unplug"))
        #expect(policy.deadline == nil && policy.gaveUp && !policy.linkCameUp)
        // Never a second reset, whatever happens next.
        policy.resetFinished(now: .seconds(7))
        policy.linkStateChanged(.negotiating, now: .seconds(7))
        #expect(policy.decide(now: .seconds(100)) == .wait)
    }

    @Test func aSYNLeftUnansweredIsStuckFromTheNegotiationOn() {
        var policy = StuckLinkPolicy(bound: .seconds(2), start: .zero)
        // A detect that came late is not held against the accessory: the bound runs from its SYN.
        policy.linkStateChanged(.negotiating, now: .milliseconds(1_900))
        #expect(policy.decide(now: .seconds(2)) == .wait)
        #expect(policy.deadline == .milliseconds(3_900))
        guard case .reset = policy.decide(now: .milliseconds(3_900)) else { Issue.record("a reset"); return }
    }

    @Test func theLinkComingUpAfterTheResetEndsTheEpisode() {
        var policy = StuckLinkPolicy(bound: .seconds(2), start: .zero)
        guard case .reset = policy.decide(now: .seconds(2)) else { Issue.record("a reset"); return }
        policy.resetFinished(now: .milliseconds(2_300))
        policy.linkStateChanged(.negotiating, now: .milliseconds(2_400))
        policy.linkStateChanged(.connected, now: .milliseconds(2_450))
        #expect(policy.linkCameUp && policy.didReset && policy.resetFinishedAt == .milliseconds(2_300))
        #expect(policy.decide(now: .seconds(60)) == .wait)
    }
}
