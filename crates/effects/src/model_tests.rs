use super::*;

fn id() -> OpId {
    OpId::parse("invoice/7:charge").unwrap()
}

fn check<'a>(id: &'a OpId, epoch: u64, capability: Capability, now_ms: u64) -> BeginCheck<'a> {
    BeginCheck {
        id,
        epoch: Epoch(epoch),
        payload: b"amount=10",
        receiver: "payments",
        capability,
        attempt_timeout_ms: 1_000,
        now_ms,
    }
}

fn in_flight(capability: Capability, epoch: u64, now_ms: u64) -> Record {
    start_attempt(None, &check(&id(), epoch, capability, now_ms), "owner")
}

#[test]
fn p7_the_idempotency_key_depends_on_the_identity_alone() {
    let a = OpId::parse("invoice/7:charge").unwrap();
    assert_eq!(a.idempotency_key(), id().idempotency_key());
    assert_eq!(a.idempotency_key().len(), 44);
    assert_ne!(
        a.idempotency_key(),
        OpId::parse("invoice/7:refund").unwrap().idempotency_key()
    );
    assert_ne!(
        a.idempotency_key(),
        OpId::parse("invoice/70:charge").unwrap().idempotency_key()
    );
    // Every attempt of every owner carries the record's key.
    let record = in_flight(Capability::Idempotent, 3, 0);
    assert_eq!(record.key, a.idempotency_key());
}

#[test]
fn operation_ids_are_validated() {
    assert!(OpId::parse("no-colon").is_err());
    assert!(OpId::parse("lock:").is_err());
    assert!(OpId::parse("lock:has space").is_err());
    assert!(OpId::parse(&format!("lock:{}", "x".repeat(201))).is_err());
    assert_eq!(OpId::parse("a/b:c:d").unwrap().op, "c:d");
    // Ids arriving as JSON (over HTTP) are validated too.
    let bad: Result<OpId, _> = serde_json::from_str(r#"{"lock":"a","op":"x\u0000y"}"#);
    assert!(bad.is_err());
    let good: OpId = serde_json::from_str(r#"{"lock":"a","op":"charge"}"#).unwrap();
    assert_eq!(good, OpId::parse("a:charge").unwrap());
}

#[test]
fn p7_a_stale_owner_cannot_begin_an_attempt() {
    let op = id();
    assert!(matches!(
        decide_begin(5, None, &check(&op, 4, Capability::Idempotent, 0)),
        BeginDecision::Reject(LedgerRejection::StaleEpoch { epoch: 4, fence: 5 })
    ));
    assert_eq!(
        decide_begin(5, None, &check(&op, 5, Capability::Idempotent, 0)),
        BeginDecision::Attempt { advance: false }
    );
    assert_eq!(
        decide_begin(5, None, &check(&op, 6, Capability::Idempotent, 0)),
        BeginDecision::Attempt { advance: true }
    );
    assert!(matches!(
        decide_begin(0, None, &check(&op, 0, Capability::Idempotent, 0)),
        BeginDecision::Reject(LedgerRejection::StaleEpoch { .. })
    ));
}

#[test]
fn p7_an_operation_id_names_one_payload_receiver_and_capability() {
    let op = id();
    let record = in_flight(Capability::Idempotent, 3, 0);
    let mut other = check(&op, 3, Capability::Idempotent, 0);
    other.payload = b"amount=11";
    assert!(matches!(
        decide_begin(3, Some(&record), &other),
        BeginDecision::Reject(LedgerRejection::Mismatch { ref what, .. }) if what == "payload"
    ));
    let mut other = check(&op, 3, Capability::Idempotent, 0);
    other.receiver = "mailer";
    assert!(matches!(
        decide_begin(3, Some(&record), &other),
        BeginDecision::Reject(LedgerRejection::Mismatch { ref what, .. }) if what == "receiver"
    ));
    assert!(matches!(
        decide_begin(3, Some(&record), &check(&op, 3, Capability::None, 0)),
        BeginDecision::Reject(LedgerRejection::Mismatch { ref what, .. }) if what == "capability"
    ));
}

#[test]
fn p7_an_attempt_in_doubt_is_retried_only_through_deduplication() {
    let op = id();
    // Idempotent: a newer owner retries at once, with the same key.
    let record = in_flight(Capability::Idempotent, 3, 0);
    assert_eq!(
        decide_begin(3, Some(&record), &check(&op, 4, Capability::Idempotent, 10)),
        BeginDecision::Attempt { advance: true }
    );
    // Lookup: wait for the deadline, then look up; never a blind retry.
    let record = in_flight(Capability::Lookup, 3, 0);
    assert_eq!(
        decide_begin(3, Some(&record), &check(&op, 4, Capability::Lookup, 10)),
        BeginDecision::Wait {
            until_ms: 1_000 + LOOKUP_MARGIN_MS
        }
    );
    assert_eq!(
        decide_begin(3, Some(&record), &check(&op, 4, Capability::Lookup, 3_000)),
        BeginDecision::Lookup
    );
    // None: wait for the deadline, then review; never a retry.
    let record = in_flight(Capability::None, 3, 0);
    assert!(matches!(
        decide_begin(3, Some(&record), &check(&op, 4, Capability::None, 10)),
        BeginDecision::Wait { .. }
    ));
    assert!(matches!(
        decide_begin(3, Some(&record), &check(&op, 4, Capability::None, 1_000)),
        BeginDecision::Review {
            move_to_review: true,
            ..
        }
    ));
}

#[test]
fn p7_final_operations_are_never_sent_again() {
    let op = id();
    for result in [
        SendResult::Performed {
            reference: Some("ch_1".into()),
        },
        SendResult::Refused {
            reason: "card declined".into(),
        },
    ] {
        let mut record = in_flight(Capability::Idempotent, 3, 0);
        assert_eq!(apply_finish(&mut record, 1, &result, 5), Applied::Recorded);
        assert!(record.state.is_final());
        assert_eq!(
            decide_begin(
                3,
                Some(&record),
                &check(&op, 9, Capability::Idempotent, 9_999)
            ),
            BeginDecision::Final
        );
    }
}

#[test]
fn p7_an_ambiguous_answer_is_unknown_or_review_by_capability() {
    let ambiguous = SendResult::Ambiguous {
        reason: "timeout".into(),
    };
    let mut record = in_flight(Capability::Lookup, 3, 0);
    apply_finish(&mut record, 1, &ambiguous, 5);
    assert_eq!(record.state, OpState::Unknown);
    let mut record = in_flight(Capability::None, 3, 0);
    apply_finish(&mut record, 1, &ambiguous, 5);
    assert_eq!(record.state, OpState::NeedsReview);
    // Evidence from the attempt itself still counts while nobody has decided.
    let performed = SendResult::Performed { reference: None };
    assert_eq!(
        apply_finish(&mut record, 1, &performed, 6),
        Applied::Recorded
    );
    assert_eq!(record.state, OpState::Succeeded);
}

#[test]
fn p7_an_old_attempts_answer_does_not_overwrite_a_newer_one() {
    let op = id();
    let mut record = in_flight(Capability::Idempotent, 3, 0);
    record = start_attempt(
        Some(record),
        &check(&op, 4, Capability::Idempotent, 1),
        "owner",
    );
    assert_eq!(record.attempt, 2);
    let answer = SendResult::Ambiguous {
        reason: "late".into(),
    };
    assert_eq!(
        apply_finish(&mut record, 1, &answer, 2),
        Applied::Superseded
    );
    assert_eq!(record.state, OpState::InFlight);
    assert_eq!(record.attempts.len(), 2);
}

#[test]
fn p7_not_performed_needs_a_lookup_receiver_past_the_deadline() {
    let mut record = in_flight(Capability::Lookup, 3, 0);
    assert!(apply_settle(&mut record, 1, &Settlement::NotPerformed, 2_999).is_err());
    assert_eq!(
        apply_settle(&mut record, 1, &Settlement::NotPerformed, 3_000),
        Ok(Applied::Recorded)
    );
    assert_eq!(record.state, OpState::Pending);
    let mut record = in_flight(Capability::None, 3, 0);
    assert!(apply_settle(&mut record, 1, &Settlement::NotPerformed, 5_000).is_err());
    assert_eq!(record.state, OpState::InFlight);
}

#[test]
fn p7_only_idempotent_receivers_are_reattempted_by_a_reconciler() {
    for capability in [Capability::Lookup, Capability::None] {
        let mut record = in_flight(capability, 3, 0);
        assert!(apply_reattempt(&mut record, 1, 5_000, 1_000).is_err());
        assert_eq!(record.attempt, 1);
    }
    let mut record = in_flight(Capability::Idempotent, 3, 0);
    assert_eq!(
        apply_reattempt(&mut record, 1, 10, 1_000),
        Ok(Applied::Recorded)
    );
    assert_eq!((record.attempt, record.epoch), (2, 3));
    assert_eq!(
        apply_reattempt(&mut record, 1, 10, 1_000),
        Ok(Applied::Superseded)
    );
}

#[test]
fn p7_a_person_resolves_review_items_with_who_and_why() {
    let review = |verdict, at_ms| Review {
        verdict,
        by: "alice".into(),
        why: "checked the provider's dashboard".into(),
        at_ms,
    };
    // Not in review, in flight before the deadline: refused.
    let mut record = in_flight(Capability::None, 3, 0);
    assert!(apply_resolve(&mut record, review(Verdict::Done, 10)).is_err());
    // Needs who and why.
    let mut blank = review(Verdict::Done, 2_000);
    blank.why = " ".into();
    assert!(apply_resolve(&mut record, blank).is_err());
    apply_resolve(&mut record, review(Verdict::NotDone, 2_000)).unwrap();
    assert_eq!(record.state, OpState::Pending);
    assert_eq!(record.review.as_ref().unwrap().by, "alice");
    // The person's retry is a new attempt; the verdict stays in the first attempt's log.
    let op = id();
    let record = start_attempt(
        Some(record),
        &check(&op, 4, Capability::None, 3_000),
        "owner",
    );
    assert_eq!(record.attempt, 2);
    assert!(record.review.is_none());
    assert!(record.attempts[0]
        .result
        .as_deref()
        .unwrap()
        .contains("alice"));
    for (verdict, state) in [
        (Verdict::Done, OpState::Reconciled),
        (Verdict::Compensated, OpState::Compensated),
        (Verdict::Abandon, OpState::Failed),
    ] {
        let mut record = in_flight(Capability::None, 3, 0);
        apply_finish(
            &mut record,
            1,
            &SendResult::Ambiguous {
                reason: "timeout".into(),
            },
            5,
        );
        apply_resolve(&mut record, review(verdict, 6)).unwrap();
        assert_eq!(record.state, state);
        // A late answer from the attempt no longer changes a person's verdict.
        let late = SendResult::Performed { reference: None };
        assert_eq!(apply_finish(&mut record, 1, &late, 7), Applied::Superseded);
    }
}

#[test]
fn texts_are_bounded() {
    let long = "é".repeat(MAX_TEXT_BYTES);
    let text = bounded_text(&long);
    assert!(text.len() <= MAX_TEXT_BYTES);
    assert!(long.starts_with(&text));
}
