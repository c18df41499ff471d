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

async fn first_attempt(ledger: &LocalLedger<RedbStore>, h: &Harness, id: &OpId, epoch: u64) {
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
