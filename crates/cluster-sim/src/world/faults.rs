//! The fault driver's side of [`Cluster`]: crashes (with lost disks or older copies put back),
//! leader isolation, partitions, one-way cuts and lost majorities, and the operator's
//! procedures that answer them (remove, `--join`, add).

use std::sync::Arc;
use std::time::Duration;

use palisade_cluster::membership::Changes;
use palisade_cluster::{MembershipError, NodeId};

use super::{Cluster, RECOVERY_MS};
use crate::disk::Volume;

/// How long the driver, as an operator, lets a removal of a member whose store is gone for
/// good look for a leader before it checks whether a member's census waits for that member.
const LOST_AFTER_MS: u64 = 3_000;

impl Cluster {
    /// Injects faults until `until_ms`, each healed before the next.
    pub(crate) async fn drive_faults(&mut self, until_ms: u64) -> Result<(), String> {
        let ids = self.ids();
        // Crash every member in turn (a seeded order), so each one crashes and restarts.
        let mut crash_order = ids.clone();
        for i in (1..crash_order.len()).rev() {
            let j = self.shared.range(0, i as u64 + 1) as usize;
            crash_order.swap(i, j);
        }
        let mut next_victim = 0;
        for fault in 0.. {
            let gap = self.shared.range(100, 800);
            tokio::time::sleep(Duration::from_millis(gap)).await;
            let lasts = self.shared.range(200, 2_000);
            if self.shared.now_ms() + lasts >= until_ms {
                break;
            }
            self.maybe_copy_anyone();
            // Every other fault is a crash, so every member crashes in a run of a few seconds.
            let kind = if fault % 2 == 0 {
                0
            } else {
                self.shared.range(30, 100)
            };
            if kind >= 30 && self.clock_faults && self.shared.chance(50) {
                self.clock_fault(lasts).await;
            } else if kind < 30 {
                let victim = crash_order[next_victim % crash_order.len()];
                next_victim += 1;
                self.faults.members_crashed = (next_victim as u64).min(ids.len() as u64);
                self.crash_and_restart(victim, lasts).await?;
            } else {
                self.cut_network(kind, lasts, &ids).await;
            }
        }
        Ok(())
    }

    /// Crashes `victim` for `lasts` ms (timing a failover when it was serving), then brings it
    /// back: its whole volume or an older copy put back, its disk lost (then re-added the
    /// documented way), or as it was.
    async fn crash_and_restart(&mut self, victim: NodeId, lasts: u64) -> Result<(), String> {
        let was_leading = self.serving_leader() == Some(victim);
        self.crash(victim).await;
        let crashed = self.shared.now_ms();
        if was_leading {
            // Failover: how long until another member serves.
            while self.shared.now_ms() < crashed + lasts {
                if self.serving_leader().is_some() {
                    self.failovers_ms.push(self.shared.now_ms() - crashed);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let left = (crashed + lasts).saturating_sub(self.shared.now_ms());
        tokio::time::sleep(Duration::from_millis(left)).await;
        if self.put_back_anytime(victim).await? {
            return Ok(());
        }
        if self.copy_back_on_crash {
            self.copy_or_put_back(victim).await?;
        } else if self.wipe_on_crash && self.shared.chance(50) && self.may_go_back(victim) {
            self.mark_behind(victim);
            // The member's data directory is lost: it restarts empty, with the same
            // flags. Its peers must refuse it; the operator then removes it and
            // adds it back with --join.
            let index = self.index(victim);
            self.members[index].disk = Volume::default();
            self.forget_copy(victim);
            self.faults.wipes += 1;
            self.shared.trace(&format!("wipe {victim}"));
            self.start(victim).await?;
            tokio::time::sleep(Duration::from_millis(self.shared.range(100, 600))).await;
            self.readd(victim).await?;
        } else {
            self.start(victim).await?;
        }
        Ok(())
    }

    /// A network fault of `kind` (30..100) among `ids` for `lasts` ms, then healed: the
    /// leader isolated, a minority partition, a one-way cut, or every member alone.
    async fn cut_network(&mut self, kind: u64, lasts: u64, ids: &[NodeId]) {
        let minority = (ids.len() - 1) / 2;
        match kind {
            30..55 => {
                // Leader isolation: the serving leader (or anyone) alone, both ways.
                let victim = self
                    .serving_leader()
                    .unwrap_or_else(|| self.shared.random_node());
                self.shared.trace(&format!("isolate leader {victim}"));
                self.router.isolate(&[victim], ids);
                self.faults.leader_isolations += 1;
                tokio::time::sleep(Duration::from_millis(lasts)).await;
                self.heal();
            }
            55..75 => {
                // A minority partition that may or may not hold the leader.
                let mut group = ids.to_vec();
                while group.len() > minority {
                    let i = self.shared.range(0, group.len() as u64) as usize;
                    group.remove(i);
                }
                self.shared.trace(&format!("partition {group:?}"));
                self.router.isolate(&group, ids);
                self.faults.minority_partitions += 1;
                tokio::time::sleep(Duration::from_millis(lasts)).await;
                self.heal();
            }
            75..90 => {
                // One-way cut: the leader's messages to one member are lost, not back.
                let leader = self
                    .serving_leader()
                    .unwrap_or_else(|| self.shared.random_node());
                let others: Vec<NodeId> = ids.iter().copied().filter(|i| *i != leader).collect();
                let to = others[self.shared.range(0, others.len() as u64) as usize];
                self.shared.trace(&format!("cut {leader} -> {to}"));
                self.router.cut(leader, to);
                self.faults.one_way_cuts += 1;
                tokio::time::sleep(Duration::from_millis(lasts)).await;
                self.heal();
            }
            _ => {
                // A majority lost: every member alone; nobody may decide until it heals.
                self.shared.trace("every member alone");
                for id in ids {
                    self.router.isolate(&[*id], ids);
                }
                self.faults.majority_losses += 1;
                tokio::time::sleep(Duration::from_millis(lasts)).await;
                self.heal();
            }
        }
    }

    /// The documented way back for a member that lost its data: `palisade cluster remove`,
    /// restart it with `--join` and an empty data directory, `palisade cluster add`.
    pub(super) async fn readd(&mut self, id: NodeId) -> Result<(), String> {
        if !self.founded_without(id) {
            // Lost before the cluster was founded — or before the founding reached any other
            // member (a founder that founded again after its wipe holds the only membership):
            // the founder introduces it anew (it has restarted already); there is nothing to
            // remove.
            self.shared.trace(&format!(
                "{id} lost its data before the cluster was founded"
            ));
            return Ok(());
        }
        self.stop(id).await;
        self.remove_lost(id).await?;
        let index = self.index(id);
        self.members[index].disk = Volume::default();
        self.forget_copy(id);
        self.start_as(id, true).await?;
        self.maybe_copy(id);
        self.add(id).await?;
        self.shared.trace(&format!("re-added {id}"));
        Ok(())
    }

    /// `palisade cluster remove ID` of `id`, whose store is gone for good (it is being
    /// re-added). A member on probation whose census waits for `id` may keep every election,
    /// the removal's included, from completing: when no leader took the removal within
    /// [`LOST_AFTER_MS`], the driver does what the operator is told to (`palisade cluster
    /// lost ID`, on each member that logs it waits for `id`), counts it, and tries again.
    async fn remove_lost(&mut self, id: NodeId) -> Result<(), String> {
        let what = format!("remove {id}");
        let remove = |changes: Arc<Changes>| async move {
            match changes.remove(id).await {
                // A retry after a timeout whose change did complete.
                Err(MembershipError::Unknown(_)) => Ok(()),
                other => other.map(|_| ()),
            }
        };
        if self
            .through_leader_for(&what, LOST_AFTER_MS, remove)
            .await
            .is_ok()
        {
            return Ok(());
        }
        for member in &self.members {
            let Some(running) = member.running.as_ref() else {
                continue;
            };
            if running.member.identity.waiting_for().contains(&id) {
                running.member.identity.declare_lost(id);
                self.faults.lost_declarations += 1;
                self.shared
                    .trace(&format!("{} told: node {id} is lost", member.id));
            }
        }
        self.through_leader(&what, remove).await
    }

    /// After `id` crashed: copy its disk (no copy yet), or put the older copy back (half of
    /// the later crashes) and start it — its witness refuses, and the operator wipes and
    /// re-adds it — or start it as it is.
    async fn copy_or_put_back(&mut self, id: NodeId) -> Result<(), String> {
        let index = self.index(id);
        match self.members[index].copy.take() {
            None => {
                self.members[index].copy = Some(self.members[index].disk.copy());
                self.members[index].copy_witness = self.members[index].witness.clone();
                self.shared.trace(&format!("copy {id}"));
            }
            Some(copy) if self.shared.chance(50) && self.may_go_back(id) => {
                self.mark_behind(id);
                self.members[index].disk = copy;
                self.faults.copy_backs += 1;
                if self.rollback_volumes {
                    // The whole volume: its witness goes back with the disk, nothing refuses.
                    self.members[index].witness = self.members[index].copy_witness.take();
                    self.shared.trace(&format!("put back the volume of {id}"));
                    return self.start(id).await;
                }
                self.shared.trace(&format!("put back the copy of {id}"));
                if !self.start_as(id, false).await? {
                    self.faults.copy_backs_refused += 1;
                    // The way back the refusal names: remove it, start it empty, add it.
                    self.readd(id).await?;
                    if self.members[index].running.is_none() {
                        self.members[index].disk = Volume::default();
                        self.start(id).await?;
                    }
                }
                return Ok(());
            }
            Some(copy) => self.members[index].copy = Some(copy),
        }
        self.start(id).await
    }

    /// True once a running member other than `id` holds a membership (the founder wrote the
    /// first entry, and it reached another member).
    fn founded_without(&self, id: NodeId) -> bool {
        self.members
            .iter()
            .filter(|m| m.id != id)
            .filter_map(|m| m.running.as_ref())
            .any(|r| {
                r.member
                    .raft
                    .metrics()
                    .borrow()
                    .membership_config
                    .nodes()
                    .next()
                    .is_some()
            })
    }

    /// `palisade cluster add` of `id` (running with `--join`), through the serving leader.
    pub(super) async fn add(&mut self, id: NodeId) -> Result<(), String> {
        let addr = self.config.members[&id].clone();
        self.through_leader(&format!("add {id}"), |changes| {
            let addr = addr.clone();
            async move { changes.add(id, &addr).await.map(|_| ()) }
        })
        .await
    }

    /// Runs a membership change on whichever member serves as leader, retrying for 10 s.
    async fn through_leader<F, Fut>(&self, what: &str, change: F) -> Result<(), String>
    where
        F: Fn(Arc<Changes>) -> Fut,
        Fut: std::future::Future<Output = Result<(), MembershipError>>,
    {
        self.through_leader_for(what, RECOVERY_MS, change).await
    }

    /// As [`Self::through_leader`], retrying for `budget_ms`.
    async fn through_leader_for<F, Fut>(
        &self,
        what: &str,
        budget_ms: u64,
        change: F,
    ) -> Result<(), String>
    where
        F: Fn(Arc<Changes>) -> Fut,
        Fut: std::future::Future<Output = Result<(), MembershipError>>,
    {
        let since = self.shared.now_ms();
        let mut last_error = String::from("no leader");
        while self.shared.now_ms() < since + budget_ms {
            if let Some(leader) = self.serving_leader() {
                let changes = self.members[self.index(leader)]
                    .running
                    .as_ref()
                    .expect("the leader is up")
                    .member
                    .changes
                    .clone();
                match change(changes).await {
                    Ok(()) => return Ok(()),
                    Err(error) => last_error = error.to_string(),
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!(
            "membership change `{what}` failed for {budget_ms} ms: {last_error}"
        ))
    }
}
