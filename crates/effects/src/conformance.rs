//! The conformance suite every [`Ledger`] passes (embedded, PostgreSQL, and the embedded one
//! reached over HTTP). An implementation's test file implements [`LedgerFactory`] and invokes
//! [`ledger_conformance_suite!`]. Each case names the property it checks.

use std::future::Future;
use std::sync::Arc;

use palisade_fence::conformance::Harness;
use palisade_fence::Verifier;

use crate::ledger::{Answer, Begin, BeginRequest, Ledger, ListFilter};
use crate::model::{Capability, LedgerRejection, OpId, OpState, SendResult, Settlement, Verdict};

/// Builds ledgers for the suite.
pub trait LedgerFactory: Sync {
    /// The ledger under test.
    type Ledger: Ledger + 'static;
    /// A ledger that trusts `verifier`. Storage may be shared between calls.
    fn make(&self, verifier: Arc<Verifier>) -> impl Future<Output = Self::Ledger> + Send;
}

/// Expands to one test per case for the factory expression `$factory`.
#[macro_export]
macro_rules! ledger_conformance_suite {
    ($factory:expr) => {
        $crate::ledger_conformance_suite!(@cases $factory;
            p7_attempts_are_recorded_before_send_and_stale_owners_refused,
            p4_bad_tokens_begin_nothing,
            p7_every_owner_and_retry_sends_the_same_key,
            p7_an_operation_id_names_one_payload,
            p7_answers_are_recorded_and_final_operations_never_resent,
            p7_an_old_attempts_answer_is_superseded,
            p7_lookup_receivers_wait_and_are_settled_by_lookup,
            p7_receivers_without_dedup_go_to_review_and_people_resolve,
            p7_only_idempotent_operations_are_reattempted,
            p7_a_superseded_owner_cannot_settle,
            oversized_and_malformed_requests_record_nothing,
            p3_concurrent_owners_get_distinct_attempts,
            list_and_stats_count_states,
        );
    };
    (@cases $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::conformance::$case(&$factory).await;
            }
        )*
    };
}

fn request(h: &Harness, id: &OpId, epoch: u64, capability: Capability) -> BeginRequest {
    BeginRequest {
        id: id.clone(),
        token: h.token(&id.lock, epoch),
        payload: b"amount=10".to_vec(),
        receiver: "payments".into(),
        capability,
        attempt_timeout_ms: 30_000,
    }
}

fn op(h: &Harness, case: &str, op: &str) -> OpId {
    OpId::new(h.lock(case), op).unwrap()
}

async fn begin<L: Ledger>(ledger: &L, request: BeginRequest) -> Begin {
    ledger.begin(request).await.expect("no storage failure")
}

fn sent(begin: &Begin) -> u32 {
    match begin {
        Begin::Send { attempt } => attempt.n,
        other => panic!("expected an attempt to send, got {other:?}"),
    }
}

async fn setup<F: LedgerFactory>(factory: &F) -> (Harness, F::Ledger) {
    let h = Harness::new();
    let ledger = factory.make(h.verifier.clone()).await;
    (h, ledger)
}

/// P7: a newer owner's first attempt raises the lock's ledger fence; an older owner can then
/// begin no attempt under the lock, for any operation, and nothing is recorded for it.
pub async fn p7_attempts_are_recorded_before_send_and_stale_owners_refused<F: LedgerFactory>(
    factory: &F,
) {
    let (h, ledger) = setup(factory).await;
    let a = op(&h, "stale", "a");
    let b = op(&h, "stale", "b");
    let c = op(&h, "stale", "c");
    assert_eq!(
        sent(&begin(&ledger, request(&h, &a, 5, Capability::Idempotent)).await),
        1
    );
    let record = ledger.get(&a).await.unwrap().expect("recorded before send");
    assert_eq!((record.state, record.epoch), (OpState::InFlight, 5));
    sent(&begin(&ledger, request(&h, &b, 6, Capability::Idempotent)).await);
    for stale in [&a, &c] {
        match begin(&ledger, request(&h, stale, 5, Capability::Idempotent)).await {
            Begin::Rejected {
                rejection: LedgerRejection::StaleEpoch { epoch: 5, fence: 6 },
            } => {}
            other => panic!("a stale owner began an attempt: {other:?}"),
        }
    }
    assert!(ledger.get(&c).await.unwrap().is_none());
    assert_eq!(ledger.get(&a).await.unwrap().unwrap().attempt, 1);
}

/// P4: a token from an untrusted key, for another lock, or altered begins nothing.
pub async fn p4_bad_tokens_begin_nothing<F: LedgerFactory>(factory: &F) {
    let (h, ledger) = setup(factory).await;
    let id = op(&h, "tokens", "x");
    let other = h.lock("tokens-other");
    let mut forged = request(&h, &id, 3, Capability::Idempotent);
    let bad_tokens = [
        h.stranger_token(&id.lock, 3),
        h.token(&other, 3),
        palisade_fence::conformance::alter_epoch(&h.token(&id.lock, 3)),
        "garbage".to_owned(),
    ];
    for token in bad_tokens {
        forged.token = token;
        match begin(&ledger, forged.clone()).await {
            Begin::Rejected {
                rejection: LedgerRejection::InvalidToken { .. },
            } => {}
            other => panic!("a bad token began an attempt: {other:?}"),
        }
    }
    assert!(ledger.get(&id).await.unwrap().is_none());
    // A finish with a token for another epoch is refused too.
    sent(&begin(&ledger, request(&h, &id, 3, Capability::Idempotent)).await);
    let answer = ledger
        .finish(
            &h.token(&id.lock, 4),
            &id,
            1,
            SendResult::Performed { reference: None },
        )
        .await
        .unwrap();
    assert!(matches!(answer, Answer::Rejected { .. }), "{answer:?}");
    assert_eq!(
        ledger.get(&id).await.unwrap().unwrap().state,
        OpState::InFlight
    );
}

/// P7: the key is the identity's: the same for a newer owner's retry of an attempt in doubt.
pub async fn p7_every_owner_and_retry_sends_the_same_key<F: LedgerFactory>(factory: &F) {
    let (h, ledger) = setup(factory).await;
    let id = op(&h, "key", "charge");
    let mut keys = Vec::new();
    for epoch in [3, 3, 4] {
        match begin(&ledger, request(&h, &id, epoch, Capability::Idempotent)).await {
            Begin::Send { attempt } => keys.push((attempt.n, attempt.key)),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(keys.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(keys.iter().all(|(_, key)| *key == id.idempotency_key()));
}

/// P7: an operation id reused for another payload is refused, and the record is unchanged.
pub async fn p7_an_operation_id_names_one_payload<F: LedgerFactory>(factory: &F) {
    let (h, ledger) = setup(factory).await;
    let id = op(&h, "payload", "charge");
    sent(&begin(&ledger, request(&h, &id, 3, Capability::Idempotent)).await);
    let mut other = request(&h, &id, 3, Capability::Idempotent);
    other.payload = b"amount=1000".to_vec();
    assert!(matches!(
        begin(&ledger, other).await,
        Begin::Rejected {
            rejection: LedgerRejection::Mismatch { .. }
        }
    ));
    let record = ledger.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (record.attempt, record.payload.as_slice()),
        (1, &b"amount=10"[..])
    );
}

/// P7, P8: answers are recorded; a final operation is never handed out again.
pub async fn p7_answers_are_recorded_and_final_operations_never_resent<F: LedgerFactory>(
    factory: &F,
) {
    let (h, ledger) = setup(factory).await;
    for (name, result, state) in [
        (
            "ok",
            SendResult::Performed {
                reference: Some("ch_1".into()),
            },
            OpState::Succeeded,
        ),
        (
            "no",
            SendResult::Refused {
                reason: "declined".into(),
            },
            OpState::Failed,
        ),
    ] {
        let id = op(&h, "answers", name);
        let n = sent(&begin(&ledger, request(&h, &id, 3, Capability::Idempotent)).await);
        let answer = ledger
            .finish(&h.token(&id.lock, 3), &id, n, result)
            .await
            .unwrap();
        assert_eq!(answer.record().unwrap().state, state);
        assert!(matches!(
            begin(&ledger, request(&h, &id, 9, Capability::Idempotent)).await,
            Begin::Final { .. }
        ));
        assert_eq!(ledger.get(&id).await.unwrap().unwrap().attempt, 1);
    }
    let id = op(&h, "answers", "ok");
    let record = ledger.get(&id).await.unwrap().unwrap();
    assert_eq!(record.reference.as_deref(), Some("ch_1"));
}

/// P7: the answer to an attempt that is no longer current changes nothing.
pub async fn p7_an_old_attempts_answer_is_superseded<F: LedgerFactory>(factory: &F) {
    let (h, ledger) = setup(factory).await;
    let id = op(&h, "superseded", "charge");
    sent(&begin(&ledger, request(&h, &id, 3, Capability::Idempotent)).await);
    assert_eq!(
        sent(&begin(&ledger, request(&h, &id, 4, Capability::Idempotent)).await),
        2
    );
    let answer = ledger
        .finish(
            &h.token(&id.lock, 3),
            &id,
            1,
            SendResult::Ambiguous {
                reason: "late".into(),
            },
        )
        .await
        .unwrap();
    assert!(matches!(answer, Answer::Superseded { .. }), "{answer:?}");
    let record = ledger.get(&id).await.unwrap().unwrap();
    assert_eq!((record.state, record.attempt), (OpState::InFlight, 2));
}

/// P7: a lookup receiver's attempt in doubt is never retried blind: a newer owner waits for
/// the deadline; a lookup that found the effect settles it; "not performed" is refused before
/// the deadline has passed.
pub async fn p7_lookup_receivers_wait_and_are_settled_by_lookup<F: LedgerFactory>(factory: &F) {
    let (h, ledger) = setup(factory).await;
    let id = op(&h, "lookup", "email");
    sent(&begin(&ledger, request(&h, &id, 3, Capability::Lookup)).await);
    assert!(matches!(
        begin(&ledger, request(&h, &id, 4, Capability::Lookup)).await,
        Begin::Wait { .. }
    ));
    let answer = ledger
        .settle(None, &id, 1, Settlement::NotPerformed)
        .await
        .unwrap();
    assert!(matches!(answer, Answer::Rejected { .. }), "{answer:?}");
    let performed = Settlement::Performed {
        reference: Some("msg-9".into()),
    };
    let answer = ledger
        .settle(Some(&h.token(&id.lock, 4)), &id, 1, performed)
        .await
        .unwrap();
    assert_eq!(answer.record().unwrap().state, OpState::Reconciled);
    assert!(matches!(
        begin(&ledger, request(&h, &id, 4, Capability::Lookup)).await,
        Begin::Final { .. }
    ));
}

/// P7: without deduplication or lookup, an attempt in doubt past its deadline goes to review,
/// never to a retry; a person's verdict is recorded with who and why, and `not-done` lets the
/// next run send it.
pub async fn p7_receivers_without_dedup_go_to_review_and_people_resolve<F: LedgerFactory>(
    factory: &F,
) {
    let (h, ledger) = setup(factory).await;
    let id = op(&h, "review", "sms");
    let mut short = request(&h, &id, 3, Capability::None);
    short.attempt_timeout_ms = 1;
    sent(&begin(&ledger, short).await);
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    match begin(&ledger, request(&h, &id, 4, Capability::None)).await {
        Begin::Review { record } => assert_eq!(record.state, OpState::NeedsReview),
        other => panic!("expected review, got {other:?}"),
    }
    let queue = ListFilter {
        states: vec![OpState::NeedsReview],
        lock: Some(id.lock.as_str().to_owned()),
        limit: None,
    };
    assert_eq!(ledger.list(&queue).await.unwrap().len(), 1);
    assert!(matches!(
        begin(&ledger, request(&h, &id, 4, Capability::None)).await,
        Begin::Review { .. }
    ));
    let blank = ledger.resolve(&id, Verdict::NotDone, "", "").await.unwrap();
    assert!(matches!(blank, Answer::Rejected { .. }));
    let answer = ledger
        .resolve(
            &id,
            Verdict::NotDone,
            "alice",
            "no SMS in the gateway's log",
        )
        .await
        .unwrap();
    let record = answer.record().unwrap();
    assert_eq!(record.state, OpState::Pending);
    assert_eq!(record.review.as_ref().unwrap().by, "alice");
    assert_eq!(
        sent(&begin(&ledger, request(&h, &id, 4, Capability::None)).await),
        2
    );
}

/// P7: a reconciler may hand out a new attempt only for an idempotent receiver.
pub async fn p7_only_idempotent_operations_are_reattempted<F: LedgerFactory>(factory: &F) {
    let (h, ledger) = setup(factory).await;
    for capability in [Capability::Lookup, Capability::None] {
        let id = op(&h, "reattempt", capability.as_str());
        sent(&begin(&ledger, request(&h, &id, 3, capability)).await);
        let answer = ledger.reattempt(&id, 1, 1_000).await.unwrap();
        assert!(matches!(answer, Answer::Rejected { .. }), "{answer:?}");
        assert_eq!(ledger.get(&id).await.unwrap().unwrap().attempt, 1);
    }
    let id = op(&h, "reattempt", "idempotent");
    sent(&begin(&ledger, request(&h, &id, 3, Capability::Idempotent)).await);
    let answer = ledger.reattempt(&id, 1, 1_000).await.unwrap();
    assert_eq!(answer.record().unwrap().attempt, 2);
    let again = ledger.reattempt(&id, 1, 1_000).await.unwrap();
    assert!(matches!(again, Answer::Superseded { .. }));
}

/// P3: owners racing on one operation get distinct attempt numbers, and the lock's fence ends
/// at the highest epoch that was handed an attempt.
pub async fn p3_concurrent_owners_get_distinct_attempts<F: LedgerFactory>(factory: &F) {
    let (h, ledger) = setup(factory).await;
    let ledger = Arc::new(ledger);
    let h = Arc::new(h);
    let id = op(&h, "race", "charge");
    let mut tasks = Vec::new();
    for epoch in 1..=8u64 {
        let (ledger, h, id) = (ledger.clone(), h.clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            let mut attempts = Vec::new();
            for _ in 0..4 {
                if let Begin::Send { attempt } =
                    begin(&*ledger, request(&h, &id, epoch, Capability::Idempotent)).await
                {
                    attempts.push((attempt.n, epoch));
                }
            }
            attempts
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    let mut numbers: Vec<u32> = all.iter().map(|(n, _)| *n).collect();
    numbers.sort_unstable();
    let expected: Vec<u32> = (1..=all.len() as u32).collect();
    assert_eq!(
        numbers, expected,
        "attempt numbers must be distinct and gapless"
    );
    // Attempt numbers rise with epochs: no older owner got an attempt after a newer one.
    all.sort_unstable();
    assert!(all.windows(2).all(|w| w[0].1 <= w[1].1), "{all:?}");
    let record = ledger.get(&id).await.unwrap().unwrap();
    assert_eq!(record.epoch, all.last().unwrap().1);
}

/// Stats count every state and list filters by state and lock.
pub async fn list_and_stats_count_states<F: LedgerFactory>(factory: &F) {
    let (h, ledger) = setup(factory).await;
    let a = op(&h, "stats", "a");
    let b = op(&h, "stats", "b");
    sent(&begin(&ledger, request(&h, &a, 3, Capability::Idempotent)).await);
    sent(&begin(&ledger, request(&h, &b, 3, Capability::Idempotent)).await);
    ledger
        .finish(
            &h.token(&a.lock, 3),
            &a,
            1,
            SendResult::Performed { reference: None },
        )
        .await
        .unwrap();
    let lock = Some(a.lock.as_str().to_owned());
    let flying = ListFilter {
        states: vec![OpState::InFlight],
        lock: lock.clone(),
        limit: None,
    };
    let listed = ledger.list(&flying).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, b);
    let everything = ListFilter {
        lock,
        limit: Some(1),
        ..ListFilter::default()
    };
    assert_eq!(ledger.list(&everything).await.unwrap().len(), 1);
    let stats = ledger.stats().await.unwrap();
    assert!(stats.by_state["succeeded"] >= 1 && stats.by_state["in_flight"] >= 1);
    assert_eq!(stats.by_state.len(), 8);
}

/// P7: a settlement under a token is taken only from the lock's current owner: a superseded
/// owner cannot mark an operation performed (which would lose it) or not performed.
pub async fn p7_a_superseded_owner_cannot_settle<F: LedgerFactory>(factory: &F) {
    let (h, ledger) = setup(factory).await;
    let a = op(&h, "settle", "a");
    let b = op(&h, "settle", "b");
    sent(&begin(&ledger, request(&h, &a, 3, Capability::Lookup)).await);
    sent(&begin(&ledger, request(&h, &b, 4, Capability::Lookup)).await);
    let performed = Settlement::Performed { reference: None };
    let old = h.token(&a.lock, 3);
    let answer = ledger
        .settle(Some(&old), &a, 1, performed.clone())
        .await
        .unwrap();
    assert!(
        matches!(
            answer,
            Answer::Rejected {
                rejection: LedgerRejection::StaleEpoch { .. }
            }
        ),
        "{answer:?}"
    );
    assert_eq!(
        ledger.get(&a).await.unwrap().unwrap().state,
        OpState::InFlight
    );
    let current = h.token(&a.lock, 4);
    let answer = ledger
        .settle(Some(&current), &a, 1, performed)
        .await
        .unwrap();
    assert_eq!(answer.record().unwrap().state, OpState::Reconciled);
}

/// Requests out of bounds record nothing: a payload over the limit, a bad timeout, a long
/// receiver name, and an answer about an operation that does not exist.
pub async fn oversized_and_malformed_requests_record_nothing<F: LedgerFactory>(factory: &F) {
    let (h, ledger) = setup(factory).await;
    let id = op(&h, "bounds", "x");
    let mut big = request(&h, &id, 3, Capability::Idempotent);
    big.payload = vec![b'x'; crate::model::MAX_PAYLOAD_BYTES + 1];
    let mut timeout = request(&h, &id, 3, Capability::Idempotent);
    timeout.attempt_timeout_ms = 0;
    let mut name = request(&h, &id, 3, Capability::Idempotent);
    name.receiver = "r".repeat(129);
    for bad in [big, timeout, name] {
        match begin(&ledger, bad).await {
            Begin::Rejected {
                rejection: LedgerRejection::Invalid { .. },
            } => {}
            other => panic!("{other:?}"),
        }
    }
    assert!(ledger.get(&id).await.unwrap().is_none());
    let answer = ledger
        .finish(
            &h.token(&id.lock, 3),
            &id,
            1,
            SendResult::Performed { reference: None },
        )
        .await
        .unwrap();
    assert!(matches!(
        answer,
        Answer::Rejected {
            rejection: LedgerRejection::NotFound { .. }
        }
    ));
}
