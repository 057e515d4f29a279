internal import IAPWire

// The device's authentication and identification of the accessory (certificate, challenge,
// response, IdentificationInformation), and the accessory's answer to a challenge.
extension Upper {
    /// Device: the accessory's certificate, examined by the policy; a challenge follows unless
    /// the policy refuses it.
    mutating func receivedCertificate(_ message: ControlMessage) {
        let certificate = message.parameter(0)?.data ?? []
        let examination = policy.examine(certificate: certificate)
        if let refusal = examination.refusal {
            authentication = AuthenticationOutcome(status: .notVerified(refusal), accepted: false, certificate: examination.summary)
            send(ControlMessage(id: .authenticationFailed))
            fail(.authenticationFailed(refusal.description))
            return
        }
        let length = examination.scheme?.challengeLength ?? policy.challengeLength(certificate: certificate)
        let challenge = Challenge.draw(length: length)
        send(ControlMessage(id: .requestAuthenticationChallengeResponse, parameters: [.blob(0, challenge)]))
        step = .awaitingResponse(certificate: certificate, challenge: challenge)
        deadline = now + answerTimeout
    }

    /// Device: the accessory's response to `challenge`, judged by the policy; identification
    /// follows an accepted one.
    mutating func receivedResponse(_ message: ControlMessage, certificate: [UInt8], challenge: [UInt8]) {
        let response = message.parameter(0)?.data ?? []
        let outcome = policy.outcome(certificate: certificate, challenge: challenge, response: response)
        authentication = outcome
        guard outcome.accepted else {
            send(ControlMessage(id: .authenticationFailed))
            fail(.authenticationFailed(outcome.failure?.description ?? "the challenge response did not verify"))
            return
        }
        authenticationPassed = true
        send(ControlMessage(id: .authenticationSucceeded))
        events.append(.authenticated(certificate: certificate, outcome: outcome))
        send(ControlMessage(id: .startIdentification))
        step = .awaitingIdentification
        deadline = now + answerTimeout
    }

    /// Device: IdentificationInformation, accepted or rejected (a rejected one may be corrected).
    mutating func receivedIdentification(_ message: ControlMessage) {
        // Identification follows an accepted authentication on this link, never a refused,
        // missing or unanswered one (whatever the owner does with the failure).
        guard authenticationPassed else {
            unhandledMessages += 1
            events.append(.unhandledMessage(message.id))
            return
        }
        switch AccessoryIdentity.validate(message, bluetoothAddress: peerBluetoothAddress) {
        case var .success(identity):
            if let wrong = identity.wronglyDirectedMessages { tolerate("message-lists", "\(wrong); accepted all the same") }
            let padded = AccessoryIdentity.stringParametersWithBytesAfterNUL(in: message)
            if !padded.isEmpty {
                tolerate("bytes-after-nul", "IdentificationInformation parameters \(padded.map(String.init).joined(separator: ", ")) carry bytes after "
                    + "their string's NUL; read up to the NUL, the rest ignored")
            }
            let unknown = Set(message.parameters.map(\.id).filter { MessageCatalogue.identificationParameters[$0] == nil }).sorted()
            if !unknown.isEmpty {
                tolerate("identification-parameters",
                         "IdentificationInformation carries parameters the host does not know (\(unknown.map(String.init).joined(separator: ", "))); ignored")
            }
            identity.authentication = authentication
            self.identity = identity
            identified = true
            send(ControlMessage(id: .identificationAccepted))
            step = .done
            deadline = nil
            events.append(.identified(identity))
        case let .failure(rejection):
            send(rejection.message)
            lastRejection = rejection
            events.append(.identificationRejected(rejection))
            deadline = now + answerTimeout // the accessory may send a corrected one
        }
    }

    /// Accessory: the device's challenge, signed by the coprocessor, answered at once or after
    /// ``challengeDelay``.
    mutating func answerChallenge(_ message: ControlMessage) {
        // A real accessory asks its coprocessor; without a signer, a stand-in.
        let challenge = message.parameter(0)?.data ?? []
        let response = signer?.sign(challenge: challenge) ?? standInResponse(to: challenge)
        let answer = ControlMessage(id: .authenticationResponse, parameters: [.blob(0, response)])
        if challengeDelay > .zero {
            delayedResponse = (answer, now + challengeDelay)
        } else {
            send(answer)
        }
    }
}
