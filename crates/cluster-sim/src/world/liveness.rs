//! Liveness: while a majority of the voters is up and can talk both ways, the cluster grants.
//!
//! Safety checks pass for a cluster that stops granting for good; a fault that leaves a
//! majority healthy but the cluster silent (a member waiting forever for a census, a clock
//! check no leader passes, an election nobody wins) is a failure of its own. The watchdog
//! samples the network every [`SAMPLE_MS`]; a stall is the time since the later of the last
//! grant and the moment a connected majority was last (re)formed, and one longer than
//! [`LIVENESS_BOUND_MS`] fails the run. It draws nothing from the seed and traces nothing, so
//! a run replays the same with it or without it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_cluster::NodeId;

use super::Shared;
use crate::network::Router;

/// The longest a connected, healthy majority may grant nothing, ms. It covers the slowest
/// legitimate path back to a grant: a leader isolated for up to 2 s is deposed only after its
/// followers' leader lease (up to 600 ms), its clients' answers time out (1.5 s) and their
/// retries back off; a restarted member's probation and a new leader's clock wait add less.
pub const LIVENESS_BOUND_MS: u64 = 8_000;

/// How often the watchdog looks, ms.
const SAMPLE_MS: u64 = 50;

/// The longest stall seen, and each stall past the bound (as violations, for people).
#[derive(Debug, Default)]
pub(crate) struct Stalls {
    /// The longest time a connected majority granted nothing, ms.
    pub(crate) longest_ms: u64,
    /// Each stall past [`LIVENESS_BOUND_MS`]: when it began and how long it lasted.
    pub(crate) violations: Vec<String>,
}

/// Watches until `shared.stop_clients`, or until `until_ms`.
pub(crate) async fn watch(
    shared: Arc<Shared>,
    router: Router,
    voters: Vec<NodeId>,
    until_ms: u64,
    stalls: Arc<Mutex<Stalls>>,
) {
    // Since when a connected majority has granted nothing (None: no connected majority).
    let mut since: Option<u64> = None;
    let mut reported = false;
    while !shared.stop_clients.load(Ordering::Relaxed) && shared.now_ms() < until_ms {
        tokio::time::sleep(Duration::from_millis(SAMPLE_MS)).await;
        let now = shared.now_ms();
        if !router.majority_connected(&voters) {
            since = None;
            reported = false;
            continue;
        }
        let last_grant = shared.last_grant_ms.load(Ordering::Relaxed);
        let from = since.map_or(now, |since| since.max(last_grant));
        if since != Some(from) {
            reported = false;
        }
        since = Some(from);
        let stalled = now - from;
        let mut stalls = stalls.lock().expect("not poisoned");
        stalls.longest_ms = stalls.longest_ms.max(stalled);
        if stalled > LIVENESS_BOUND_MS && !reported {
            reported = true;
            stalls.violations.push(format!(
                "liveness: a majority of the members was up and connected but nothing was \
                 granted for more than {LIVENESS_BOUND_MS} ms (from {from} ms)"
            ));
        }
    }
}
