//! The end of a run: every member back and the network whole, a leader serving again, and the
//! members converged on one state.

use std::time::Duration;

use palisade_cluster::storage::{self, SmState};

use palisade_core::{AcquireRequest, HolderId, LockClass, LockName, RequestId};

use super::{call, Answer, Cluster, RECOVERY_MS, TTL_MS};

impl Cluster {
    /// After the faults: every member up, the network whole; waits until a leader serves an
    /// acquire. Returns the time that took, ms.
    pub(crate) async fn recover(&mut self) -> Result<u64, String> {
        self.router.heal();
        for id in self.ids() {
            self.start(id).await?;
        }
        let healed = self.shared.now_ms();
        let probe = AcquireRequest {
            lock: LockName::new("sim/probe").expect("valid"),
            holder: HolderId::new("probe").expect("valid"),
            principal: palisade_core::Principal::anonymous(),
            ttl_ms: TTL_MS,
            wait_ms: 0,
            class: LockClass::Critical,
            request_id: Some(RequestId::new("probe").expect("valid")),
        };
        let mut served = false;
        while self.shared.now_ms() < healed + RECOVERY_MS {
            let node = self
                .serving_leader()
                .unwrap_or_else(|| self.shared.random_node());
            let request = probe.clone();
            if let Answer::Ok(lease) =
                call(
                    &self.shared,
                    node,
                    |g| async move { g.acquire(request).await },
                )
                .await
            {
                self.shared.trace(&format!("probe granted {}", lease.epoch));
                served = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if !served {
            return Err(format!(
                "no member served an acquire within {RECOVERY_MS} ms of healing"
            ));
        }
        Ok(self.shared.now_ms() - healed)
    }

    /// Waits until every member applied the same state (after the clients stopped).
    pub(crate) async fn settle(&self) -> Result<(), String> {
        let since = self.shared.now_ms();
        while self.shared.now_ms() < since + RECOVERY_MS {
            if self.converged().is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.converged()
    }

    /// Every member applied the same entries and holds the same state.
    fn converged(&self) -> Result<(), String> {
        let mut views = Vec::new();
        for m in &self.members {
            let running = m.running.as_ref().ok_or("a member is down")?;
            let applied = running.member.raft.metrics().borrow().last_applied;
            let state = running.member.state.lock().expect("not poisoned").clone();
            views.push((m.id, applied, state));
        }
        let (first_id, first_applied, first) = &views[0];
        for (id, applied, state) in &views[1..] {
            if applied != first_applied || !same_state(state, first) {
                return Err(format!(
                    "node {id} applied {applied:?} and node {first_id} applied {first_applied:?}: \
                     their states differ"
                ));
            }
        }
        Ok(())
    }

    /// Members whose Raft stopped by itself (a fatal storage or protocol error): each is a
    /// member lost until an operator wipes and re-adds it, so each is a violation.
    pub(crate) fn stopped_rafts(&self) -> Vec<String> {
        self.members
            .iter()
            .filter_map(|m| {
                let running = m.running.as_ref()?;
                let state = running.member.raft.metrics().borrow().running_state.clone();
                let fatal = state.err()?;
                Some(format!("member {}'s Raft stopped: {fatal}", m.id))
            })
            .collect()
    }

    /// The applied state's header of every member that is up and whose Raft runs.
    fn headers(&self) -> impl Iterator<Item = storage::SmHeader> + '_ {
        self.members
            .iter()
            .filter_map(|m| m.running.as_ref())
            .filter(|r| r.member.raft.metrics().borrow().running_state.is_ok())
            .map(|r| r.member.state.lock().expect("not poisoned").header.clone())
    }

    /// The lowest epoch counter among the members (they agree once converged).
    pub(crate) fn last_epoch(&self) -> u64 {
        self.headers().map(|h| h.last_epoch.0).min().unwrap_or(0)
    }

    /// Leader terms started (`LeaderStart` entries applied), as the member that saw most.
    pub(crate) fn leader_starts(&self) -> u64 {
        self.headers().map(|h| h.leader_starts).max().unwrap_or(0)
    }

    /// fsyncs of every disk.
    pub(crate) fn syncs(&self) -> u64 {
        self.members.iter().map(|m| m.disk.syncs()).sum()
    }

    pub(crate) fn messages(&self) -> crate::network::NetStats {
        self.router.stats()
    }

    /// Stops every member.
    pub(crate) async fn shutdown(&mut self) {
        for m in &mut self.members {
            if let Some(running) = m.running.take() {
                running.stop().await;
            }
        }
    }
}

fn same_state(a: &SmState, b: &SmState) -> bool {
    a.header.last_epoch == b.header.last_epoch
        && a.header.keys == b.header.keys
        && a.leases == b.leases
}
