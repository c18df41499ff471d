//! P6/P8: after a restart every lock's next write needs its floor at once. The adapter asks
//! the coordinator once per lock (the lock's other writers wait and then find it known) and
//! keeps at most `MAX_FLOOR_REQUESTS` requests in flight, against a real PostgreSQL.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use palisade_core::{Epoch, HolderId, LockName, Principal, TokenSigner, TokenVerifier};
use palisade_fence::{FenceMode, FloorSource, Outcome, Verifier, MAX_FLOOR_REQUESTS};
use palisade_fence_postgres::{GuardedTable, PostgresFence, RowLock};

/// A coordinator that takes its time: counts the floors asked and how many at once.
#[derive(Default)]
struct SlowFloors {
    asked: AtomicUsize,
    now: AtomicUsize,
    most: AtomicUsize,
}

impl FloorSource for SlowFloors {
    fn floor<'a>(
        &'a self,
        _lock: &'a LockName,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Epoch, String>> + Send + 'a>>
    {
        Box::pin(async move {
            self.asked.fetch_add(1, Ordering::SeqCst);
            let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(40)).await;
            self.now.fetch_sub(1, Ordering::SeqCst);
            Ok(Epoch(0))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn p8_the_herd_of_floor_requests_after_a_restart_is_one_per_lock_and_bounded() {
    const LOCKS: usize = 20;
    const ROWS: usize = 60;
    let signer = TokenSigner::from_secret_bytes(&[21; 32]);
    let verifier = Arc::new(Verifier::new(TokenVerifier::new([signer.verifying_key()])));
    let floors = Arc::new(SlowFloors::default());
    let fence = PostgresFence::connect(&common::postgres_url(), 24, FenceMode::Strict, verifier)
        .await
        .unwrap()
        .with_floors(floors.clone());
    let name = format!("herd_{}", std::process::id());
    let lock = |row: usize| LockName::new(format!("{name}/{}", row % LOCKS)).unwrap();
    let client = fence.pool().get().await.unwrap();
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {name};
             CREATE TABLE {name} (id bigint PRIMARY KEY, lock text NOT NULL,
                                  payload text NOT NULL, last_fence bigint NOT NULL DEFAULT 0);
             INSERT INTO {name} (id, lock, payload)
             SELECT g, '{name}/' || (g % {LOCKS}), '' FROM generate_series(0, {ROWS} - 1) g;
             DELETE FROM palisade_lock_floors WHERE lock LIKE '{name}/%';"
        ))
        .await
        .unwrap();
    drop(client);
    let table = GuardedTable::new(&name, "id", "payload", RowLock::Column("lock".into())).unwrap();
    table.install_guard(&fence, false).await.unwrap();
    table.require_token(&fence, true).await.unwrap();
    let holder = HolderId::new("herd").unwrap();
    let writes: Vec<_> = (0..ROWS)
        .map(|row| {
            let (fence, table, lock) = (fence.clone(), table.clone(), lock(row));
            let token = signer.sign(&lock, Epoch(5), &holder, &Principal::anonymous(), 0);
            tokio::spawn(async move {
                table
                    .update(&fence, &lock, &(row as i64), &token, &"after restart")
                    .await
            })
        })
        .collect();
    for write in writes {
        let outcome = write.await.unwrap().unwrap();
        assert!(matches!(outcome, Outcome::Accepted { .. }), "{outcome:?}");
    }
    assert_eq!(
        floors.asked.load(Ordering::SeqCst),
        LOCKS,
        "one request per lock"
    );
    let most = floors.most.load(Ordering::SeqCst);
    assert!(most <= MAX_FLOOR_REQUESTS, "{most} requests at once");
    let client = fence.pool().get().await.unwrap();
    client
        .batch_execute(&format!(
            "BEGIN; SELECT palisade_drop_guard('{name}'); DROP TABLE {name}; COMMIT"
        ))
        .await
        .unwrap();
}
