//! `--copy-anytime`: whole-volume copies of running members (disk and witness, as a VM or
//! disk snapshot takes them) at any instant — before a member's first vote, between a
//! `--join` start and its first append, during the founding elections, at random moments
//! later — each put back at a later crash of its member half of the time. Nothing on a copy
//! tells it from the real volume: identity rule 4 (probation and the census) is what keeps a
//! member put back from voting a lagging member in.

use std::time::Duration;

use palisade_cluster::NodeId;

use super::Cluster;
use crate::disk::Volume;

/// A copy of a member's whole volume, waiting to be put back.
pub(super) struct AnytimeCopy {
    volume: Volume,
    witness: Option<palisade_core::witness::WitnessRecord>,
    /// Its log was empty when it was taken.
    empty: bool,
}

/// In percent: how often a founding or `--join` start is copied at once, and how often a
/// fault of the driver comes with a copy of a random running member.
const COPY_AT_START_PERCENT: u64 = 50;
const COPY_PER_FAULT_PERCENT: u64 = 35;
/// The founding elections take a few hundred ms (a census round each member first): a copy
/// within them may hold a vote and no entry. Members are looked at every 1 to
/// `FOUNDING_LOOK_EVERY_MS` ms for that instant.
const FOUNDING_WINDOW_MS: u64 = 1_500;
const FOUNDING_LOOK_EVERY_MS: u64 = 20;
/// How often a crash of a member that has a copy puts it back, in percent.
const PUT_BACK_PERCENT: u64 = 50;

impl Cluster {
    /// With `--copy-anytime`, half of the time: copies member `id`, just started.
    pub(super) fn maybe_copy(&mut self, id: NodeId) {
        if self.copy_anytime && self.shared.chance(COPY_AT_START_PERCENT) {
            self.copy_volume(id);
        }
    }

    /// With `--copy-anytime`: during the founding elections, copies the first member seen
    /// holding a vote and no entry (the instant between its vote and the leader's first
    /// append lasts a few ms), or else a random member at the end of the window.
    pub(super) async fn copy_during_founding(&mut self) {
        if !self.copy_anytime {
            return;
        }
        let until = self.shared.now_ms() + FOUNDING_WINDOW_MS;
        while self.shared.now_ms() < until {
            let wait = self.shared.range(1, FOUNDING_LOOK_EVERY_MS);
            tokio::time::sleep(Duration::from_millis(wait)).await;
            let voted_without_entry = self.members.iter().find(|m| {
                m.running.as_ref().is_some_and(|r| {
                    let metrics = r.member.raft.metrics().borrow().clone();
                    metrics.last_log_index.is_none() && metrics.vote != openraft::Vote::default()
                })
            });
            if let Some(id) = voted_without_entry.map(|m| m.id) {
                self.copy_volume(id);
                return;
            }
        }
        let id = self.shared.random_node();
        self.copy_volume(id);
    }

    /// With `--copy-anytime`, at some of the driver's faults: copies a random member.
    pub(super) fn maybe_copy_anyone(&mut self) {
        if self.copy_anytime && self.shared.chance(COPY_PER_FAULT_PERCENT) {
            let id = self.shared.random_node();
            self.copy_volume(id);
        }
    }

    /// Copies running member `id`'s whole volume as it durably is now (what a snapshot of a
    /// running machine holds), replacing an older copy, and counts it by what the member had
    /// done: voted or not, appended or not.
    fn copy_volume(&mut self, id: NodeId) {
        let index = self.index(id);
        let member = &self.members[index];
        let Some(running) = member.running.as_ref() else {
            return;
        };
        let metrics = running.member.raft.metrics().borrow().clone();
        let empty = metrics.last_log_index.is_none();
        let voted = metrics.vote != openraft::Vote::default();
        let counts = &mut self.faults.anytime;
        let kind = match (empty, voted, member.joined) {
            (true, false, false) => {
                counts.before_first_vote += 1;
                "before its first vote"
            }
            (true, false, true) => {
                counts.before_first_append += 1;
                "before its first append (--join)"
            }
            (true, true, _) => {
                counts.voted_without_entry += 1;
                "voted, no entry"
            }
            (false, _, _) => {
                counts.with_log += 1;
                "with a log"
            }
        };
        let copy = AnytimeCopy {
            volume: member.disk.copy(),
            witness: member.witness.clone(),
            empty,
        };
        self.members[index].anytime = Some(copy);
        self.shared
            .trace(&format!("copy the volume of {id} ({kind})"));
    }

    /// At a crash of `id` (down now): half of the time, puts its copy back — disk and
    /// witness — and starts it. True when it did.
    pub(super) async fn put_back_anytime(&mut self, id: NodeId) -> Result<bool, String> {
        let index = self.index(id);
        if !self.copy_anytime || self.members[index].anytime.is_none() {
            return Ok(false);
        }
        if !self.shared.chance(PUT_BACK_PERCENT) || !self.may_go_back(id) {
            return Ok(false);
        }
        self.mark_behind(id);
        let copy = self.members[index].anytime.take().expect("checked");
        self.members[index].disk = copy.volume;
        self.members[index].witness = copy.witness;
        self.faults.anytime.put_back += 1;
        if copy.empty {
            self.faults.anytime.put_back_empty += 1;
        }
        self.shared.trace(&format!(
            "put back the volume of {id}{}",
            if copy.empty { " (empty log)" } else { "" }
        ));
        self.start(id).await?;
        Ok(true)
    }

    /// True when `id`'s volume may go back (put back, or wiped): a majority of the members
    /// other than it holds the cluster's history, so it can learn what it lost from them
    /// (identity rule 4: probation and the census keep it from voting a lagging member in
    /// meanwhile). Otherwise the put-back is held, and counted: a majority gone back together
    /// has lost acknowledged entries for good, which only an operator's restore from a member
    /// or a backup can answer (`palisade restore --cluster`), not the cluster by itself.
    pub(super) fn may_go_back(&mut self, id: NodeId) -> bool {
        for member in &mut self.members {
            let caught_up = member.behind.is_some_and(|behind| {
                member.running.as_ref().is_some_and(|r| {
                    let metrics = r.member.raft.metrics().borrow().clone();
                    metrics.last_log_index.is_some_and(|last| last >= behind)
                })
            });
            if caught_up {
                member.behind = None;
            }
        }
        let holding = self
            .members
            .iter()
            .filter(|m| m.id != id && m.behind.is_none())
            .count();
        let may = holding > self.members.len() / 2;
        if !may {
            self.faults.put_backs_held += 1;
            self.shared.trace(&format!(
                "keep the volume of {id}: fewer than a majority of the others hold the history"
            ));
        }
        may
    }

    /// `id`'s volume goes back (put back, or wiped): it may lack what the running members
    /// hold now.
    pub(super) fn mark_behind(&mut self, id: NodeId) {
        let history = self
            .members
            .iter()
            .filter_map(|m| m.running.as_ref())
            .filter_map(|r| r.member.raft.metrics().borrow().last_log_index)
            .max();
        let index = self.index(id);
        self.members[index].behind = Some(history.unwrap_or(0));
    }

    /// `id`'s store is replaced (wiped, re-added): a copy of the old one is dropped.
    pub(super) fn forget_copy(&mut self, id: NodeId) {
        let index = self.index(id);
        self.members[index].anytime = None;
    }
}
