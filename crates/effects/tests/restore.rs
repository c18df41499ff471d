//! The embedded ledger copied back (P6 for the ledger, which guards P7): a ledger found behind
//! its witness would have forgotten attempts that were sent, so it serves reads and records
//! nothing until an operator has reconciled by hand.

use std::sync::Arc;
use std::time::Duration;

use palisade_effects::{Begin, BeginRequest, Capability, Ledger, LedgerError, LocalLedger, OpId};
use palisade_effects::{Record, RedbStore};
use palisade_fence::conformance::Harness;

fn request(h: &Harness, id: &OpId, epoch: u64) -> BeginRequest {
    BeginRequest {
        id: id.clone(),
        token: h.token(&id.lock, epoch),
        payload: b"x".to_vec(),
        receiver: "mail".into(),
        capability: Capability::None,
        attempt_timeout_ms: 1_000,
    }
}

fn open(dir: &std::path::Path, h: &Harness) -> LocalLedger<RedbStore> {
    let store = RedbStore::open_with(
        &dir.join("data").join("effects.redb"),
        Some(&dir.join("data.effects-witness")),
    )
    .unwrap();
    LocalLedger::new(store, h.verifier.clone())
}

async fn first_attempt(ledger: &impl Ledger, h: &Harness, id: &OpId, epoch: u64) {
    match ledger.begin(request(h, id, epoch)).await.unwrap() {
        Begin::Send { .. } => {}
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn p6_p7_a_ledger_copied_back_records_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let h = Arc::new(Harness::new());
    let lock = h.lock("ledger-restore");
    let a = OpId::new(lock.clone(), "a").unwrap();
    let b = OpId::new(lock, "b").unwrap();
    let ledger = open(dir.path(), &h);
    first_attempt(&ledger, &h, &a, 3).await;
    drop(ledger);
    let copy = dir.path().join("copy.redb");
    std::fs::copy(dir.path().join("data/effects.redb"), &copy).unwrap();
    // After the copy: operation b is attempted (and, with this receiver, may have been sent).
    let ledger = open(dir.path(), &h);
    first_attempt(&ledger, &h, &b, 3).await;
    tokio::time::sleep(palisade_effects_witness_interval() * 3).await;
    drop(ledger);
    std::fs::copy(&copy, dir.path().join("data/effects.redb")).unwrap();
    let ledger = open(dir.path(), &h);
    assert!(ledger.store().restore_required().is_some());
    // b would be sent again by its next owner: the ledger refuses to record anything.
    let refused = ledger.begin(request(&h, &b, 4)).await;
    assert!(
        matches!(refused, Err(LedgerError::RestoreRequired(_))),
        "{refused:?}"
    );
    // Reads still work, for the people reconciling.
    let record: Option<Record> = ledger.get(&a).await.unwrap();
    assert!(record.is_some());
    assert!(ledger.get(&b).await.unwrap().is_none());
}

#[tokio::test]
async fn a_ledger_that_moved_on_or_is_new_opens_normally() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let h = Harness::new();
    let id = OpId::new(h.lock("ledger-new"), "a").unwrap();
    let ledger = open(dir.path(), &h);
    first_attempt(&ledger, &h, &id, 3).await;
    tokio::time::sleep(palisade_effects_witness_interval() * 3).await;
    drop(ledger);
    // Reopened where it was: current.
    let ledger = open(dir.path(), &h);
    assert!(ledger.store().restore_required().is_none());
    drop(ledger);
    // A wiped directory holds a new ledger (another id): followed from where it is.
    std::fs::remove_file(dir.path().join("data/effects.redb")).unwrap();
    let ledger = open(dir.path(), &h);
    assert!(ledger.store().restore_required().is_none());
}

fn palisade_effects_witness_interval() -> Duration {
    palisade_effects::WITNESS_INTERVAL
}

/// P6/P7 on PostgreSQL: the ledger's fences go back with its database (here the fence row is
/// lowered by the owner with its trigger off, and the floors table is emptied, as a restore
/// leaves them). A ledger that learns floors from the coordinator refuses the superseded
/// owner anyway, with no operator step; one that has no coordinator to ask records it: the
/// hole the floors close.
#[tokio::test]
async fn p6_p7_a_postgres_ledger_that_went_back_refuses_a_superseded_owner() {
    use palisade_effects::PostgresStore;
    use palisade_fence::StaticFloors;

    let url = std::env::var("PALISADE_TEST_POSTGRES_URL").expect(
        "PALISADE_TEST_POSTGRES_URL is not set: run ./scripts/test, which starts a throwaway \
         PostgreSQL on loopback and sets it",
    );
    let h = Arc::new(Harness::new());
    let lock = h.lock(&format!("ledger-put-back-{}", std::process::id()));
    let floors = Arc::new(StaticFloors::new());
    let store = PostgresStore::connect(&url).await.unwrap();
    let ledger = LocalLedger::new(
        store.clone().with_floors(floors.clone()),
        h.verifier.clone(),
    );
    let op = |name: &str| OpId::new(lock.clone(), name).unwrap();
    first_attempt(&ledger, &h, &op("a"), 5).await;
    // Owner 5 is superseded by owner 7, who begins; then the database goes back.
    floors.set(&lock, palisade_core::Epoch(7));
    first_attempt(&ledger, &h, &op("b"), 7).await;
    let (owner, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    owner
        .batch_execute(&format!(
            "BEGIN;
             ALTER TABLE palisade_effect_fences DISABLE TRIGGER palisade_effect_fence_up;
             UPDATE palisade_effect_fences SET epoch = 5 WHERE lock = '{lock}';
             ALTER TABLE palisade_effect_fences ENABLE TRIGGER palisade_effect_fence_up;
             DELETE FROM palisade_lock_floors WHERE lock = '{lock}';
             COMMIT;"
        ))
        .await
        .unwrap();

    let asked = floors.asked();
    match ledger.begin(request(&h, &op("c"), 5)).await.unwrap() {
        Begin::Rejected { .. } => {}
        other => panic!("the superseded owner was let in: {other:?}"),
    }
    assert!(floors.asked() > asked, "the floor was learned again");
    first_attempt(&ledger, &h, &op("d"), 7).await; // the current owner goes on

    // Without a floor source the same database lets owner 6 in: only its own fence weighs.
    owner
        .batch_execute(&format!(
            "BEGIN;
             ALTER TABLE palisade_effect_fences DISABLE TRIGGER palisade_effect_fence_up;
             UPDATE palisade_effect_fences SET epoch = 5 WHERE lock = '{lock}';
             ALTER TABLE palisade_effect_fences ENABLE TRIGGER palisade_effect_fence_up;
             COMMIT;"
        ))
        .await
        .unwrap();
    let blind = LocalLedger::new(store, h.verifier.clone());
    first_attempt(&blind, &h, &op("e"), 6).await;
}
