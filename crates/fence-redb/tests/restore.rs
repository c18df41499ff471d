//! Restore safety at the embedded store (P6): a store copied back (or restored from an older
//! copy) is found behind its witness, accepts no write until a restore floor from the
//! coordinator is applied, and then refuses every token issued before the floor — the old
//! owners that its forgotten fences had fenced out — while the next owner writes.

use palisade_core::Epoch;
use palisade_fence::conformance::Harness;
use palisade_fence::{Activation, FenceError, FenceMode, FencedResource, Outcome, Write};
use palisade_fence_redb::{apply_restore_floor, RedbFence};

fn write<'a>(lock: &'a palisade_core::LockName, token: &'a str, value: &'a [u8]) -> Write<'a> {
    Write {
        lock,
        key: "row",
        token,
        seq: None,
        value,
    }
}

#[tokio::test]
async fn p6_a_copied_back_store_accepts_nothing_until_a_floor_then_refuses_every_older_token() {
    let harness = Harness::new();
    let lock = harness.lock("restore");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("store");
    std::fs::create_dir(&data).unwrap();
    let file = data.join("fence.redb");
    let witness = dir.path().join("store.witness");
    let open = || {
        RedbFence::open_with(
            &file,
            FenceMode::Strict,
            harness.verifier.clone(),
            Some(&witness),
        )
        .unwrap()
    };

    let store = open();
    let accepted = store
        .write(write(&lock, &harness.token(&lock, 5), b"five"))
        .await;
    assert!(matches!(accepted, Ok(Outcome::Accepted { .. })));
    drop(store);
    std::fs::copy(&file, dir.path().join("copy")).unwrap(); // the operator's copy
    let store = open();
    let accepted = store
        .write(write(&lock, &harness.token(&lock, 10), b"ten"))
        .await;
    assert!(matches!(accepted, Ok(Outcome::Accepted { .. })));
    assert_eq!(store.highest_fence().unwrap(), 10);
    drop(store); // a clean stop: the witness saw 10

    // Copied back: its fences say 5, so the owner of epoch 7 (fenced out by 10) would be
    // accepted. It is behind its witness: no write at all, reads still served.
    std::fs::copy(dir.path().join("copy"), &file).unwrap();
    let store = open();
    assert!(store
        .restore_required()
        .unwrap()
        .contains("palisade resource restore"));
    let refused = store
        .write(write(&lock, &harness.token(&lock, 7), b"seven"))
        .await;
    assert!(
        matches!(refused, Err(FenceError::RestoreRequired(_))),
        "{refused:?}"
    );
    let read = store.read(&lock, "row").await.unwrap().unwrap();
    assert_eq!(read.value, b"five");
    drop(store);

    // A floor below what the store accepted (a coordinator behind the store) is refused.
    let error = apply_restore_floor(&file, Some(&witness), 10, "{}").unwrap_err();
    assert!(error.to_string().contains("behind the store"), "{error}");
    // The coordinator's floor (its counter now: 12).
    let applied = apply_restore_floor(&file, Some(&witness), 12, "{}").unwrap();
    assert_eq!(
        (applied.highest_before, applied.witness_seen, applied.floor),
        (5, 10, 12)
    );
    let store = open();
    assert_eq!(store.restore_required(), None);
    for old in [7, 10, 12] {
        let outcome = store
            .write(write(&lock, &harness.token(&lock, old), b"old"))
            .await
            .unwrap();
        assert!(
            matches!(outcome, Outcome::Rejected(_)),
            "epoch {old}: {outcome:?}"
        );
    }
    let next = store
        .write(write(&lock, &harness.token(&lock, 13), b"next"))
        .await;
    assert!(matches!(next, Ok(Outcome::Accepted { .. })), "{next:?}");
    assert!(store.fence(&lock).await.unwrap() >= Epoch(13));
    assert_eq!(store.highest_fence().unwrap(), 13);
    drop(store);
    // Applying the same floor again is harmless; the floor never goes down.
    let again = apply_restore_floor(&file, Some(&witness), 14, "{}").unwrap();
    assert_eq!(again.floor, 14);
}

#[tokio::test]
async fn p6_an_activated_store_refuses_activations_at_or_below_its_floor() {
    let harness = Harness::new();
    let lock = harness.lock("restore-activated");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fence.redb");
    let witness = dir.path().join("store.witness");
    let open =
        |mode| RedbFence::open_with(&file, mode, harness.verifier.clone(), Some(&witness)).unwrap();
    let store = open(FenceMode::Activated);
    assert!(matches!(
        store.activate(&lock, &harness.token(&lock, 3)).await,
        Ok(Activation::Activated { .. })
    ));
    drop(store);
    apply_restore_floor(&file, Some(&witness), 20, "{}").unwrap();
    let store = open(FenceMode::Activated);
    for old in [3, 19, 20] {
        let activation = store.activate(&lock, &harness.token(&lock, old)).await;
        assert!(
            matches!(activation, Ok(Activation::Rejected(_))),
            "{old}: {activation:?}"
        );
    }
    assert_eq!(store.fence(&lock).await.unwrap(), Epoch(20));
    assert!(matches!(
        store.activate(&lock, &harness.token(&lock, 21)).await,
        Ok(Activation::Activated { .. })
    ));
}
