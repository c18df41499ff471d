//! kill -9 of the coordinator under concurrent acquire/release churn, repeated. After each
//! restart: every acknowledged acquire and release is still in effect (P8), and every epoch
//! issued is above every epoch acknowledged before the crash (P1).

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::ServerProcess;
use palisade_client::{AcquireOptions, Client};

/// Workers, one lock each, so each lock's history is sequential and checkable.
const WORKERS: usize = 16;
const CRASHES: usize = 3;
const CHURN: Duration = Duration::from_millis(700);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Acquire,
    Release,
}

/// What one worker knows of its lock when the server dies.
#[derive(Debug, Default, Clone)]
struct Known {
    /// The last acknowledged step with its epoch (which names the lease: one grant, one
    /// epoch).
    acked: Option<(Step, u64)>,
    /// A step sent but not answered when the server died (its outcome is unknown).
    in_flight: Option<Step>,
}

async fn churn(client: Client, lock: String, known: Arc<Mutex<Known>>) {
    let mut options = AcquireOptions::new(lock);
    options.ttl = Duration::from_secs(60);
    loop {
        known.lock().unwrap().in_flight = Some(Step::Acquire);
        let Ok(grant) = client.acquire_once(&options).await else {
            return;
        };
        *known.lock().unwrap() = Known {
            acked: Some((Step::Acquire, grant.epoch)),
            in_flight: Some(Step::Release),
        };
        if client.release(&grant.lease_id).await.is_err() {
            return;
        }
        *known.lock().unwrap() = Known {
            acked: Some((Step::Release, grant.epoch)),
            in_flight: None,
        };
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_p8_kill_9_under_churn_loses_nothing_acknowledged_and_reissues_no_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let mut highest_acked = 0;
    let mut total_acked_cycles = 0;
    // (The probe lock and the clean-up releases also take epochs; that is fine: P1 asks only
    // that every later epoch be above every earlier acknowledged one.)
    for round in 0..CRASHES {
        let mut server = ServerProcess::start(&dir.path().join("data"));
        // Each round uses locks of its own, so every worker starts on a free lock whatever the
        // previous crash left held (lease ids are not listed: they are capabilities).
        let knowns: Vec<Arc<Mutex<Known>>> = (0..WORKERS).map(|_| Arc::default()).collect();
        let mut workers = Vec::new();
        let started_at_epoch = highest_acked;
        for (index, known) in knowns.iter().enumerate() {
            let client = Client::connect(&[&server.url]).await.unwrap();
            let lock = format!("churn/{round}/{index}");
            workers.push(tokio::spawn(churn(client, lock, known.clone())));
        }
        tokio::time::sleep(CHURN).await;
        server.kill9();
        for worker in workers {
            worker.await.unwrap();
        }

        let server = ServerProcess::start(&dir.path().join("data"));
        let client = Client::connect(&[&server.url]).await.unwrap();
        for (index, known) in knowns.iter().enumerate() {
            let known = known.lock().unwrap().clone();
            let info = client
                .describe(&format!("churn/{round}/{index}"))
                .await
                .unwrap();
            let Some((step, epoch)) = known.acked else {
                continue;
            };
            highest_acked = highest_acked.max(epoch);
            total_acked_cycles += 1;
            match (step, known.in_flight) {
                // P8: an acknowledged acquire with nothing after it is still held, same lease.
                (Step::Acquire, None) => {
                    assert!(info.held && info.epoch == epoch, "lock {index}: {info:?}")
                }
                // A release in flight: held by that lease, or free.
                (Step::Acquire, Some(_)) => {
                    assert!(!info.held || info.epoch == epoch, "lock {index}: {info:?}")
                }
                // P8: an acknowledged release is not undone; a new grant has a higher epoch.
                (Step::Release, _) => {
                    assert!(!info.held || info.epoch > epoch, "lock {index}: {info:?}")
                }
            }
        }
        // P1: every epoch issued after the restart is above every acknowledged one.
        let mut options = AcquireOptions::new("churn/probe");
        options.ttl = Duration::from_secs(1);
        let probe = client.acquire_once(&options).await.unwrap();
        assert!(
            probe.epoch > highest_acked,
            "epoch {} after {highest_acked}",
            probe.epoch
        );
        client.release(&probe.lease_id).await.unwrap();
        eprintln!(
            "crash: epochs {started_at_epoch}..={highest_acked} acknowledged, probe {}",
            probe.epoch
        );
        drop(server);
    }
    assert!(
        total_acked_cycles >= WORKERS,
        "the churn acknowledged too little to check"
    );
}
