//! Each member's wall clock measured against its peers', so that a leader commits a clock
//! floor (`Command::LeaderStart`) only with a clock a majority agrees with.
//!
//! A leader's clock floor raises the replicated epoch counter for every later leader: one
//! member whose clock ran a day ahead would leave every correct member a day behind the
//! counter. So before it commits the floor, a leader reads every other voter's clock (the
//! `Clock` RPC, or the simulated network) and judges its own: a peer's offset is
//! `peer_now − (sent + received) / 2`, uncertain by half the round trip; the peer agrees when
//! the offset is within [`ClockCheck::max_offset_ms`] (give or take that uncertainty). With
//! itself, a majority of the voters must agree, as CockroachDB's `--max-offset` asks; a leader
//! without one does not lead: it commits no floor, runs no engine, stops its heartbeats so
//! that a member with a good clock is elected, and says why (the log,
//! `palisade_clock_offset_ms`, `palisade cluster status`). Members measure every
//! [`PROBE_INTERVAL`], so a member whose clock is off stands for no election either.
//!
//! A counter already ahead of a correct clock (raised before, by a clock that was wrong) stops
//! nobody: a leader whose clock agrees issues above it without waiting for the clock beyond
//! the maximum offset (`engine::CounterAhead::Outvoted`).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use palisade_coordinator::metrics::Metrics;
use palisade_core::clock::WallClock;
use serde::{Deserialize, Serialize};

use super::membership::Introducer;
use super::{NodeId, RaftNode};

/// The default greatest offset between a leader's clock and its peers': CockroachDB's
/// `--max-offset` is 500 ms, and NTP keeps machines on one network within a few ms, so 500
/// ms is a hundred times what a healthy cluster sees, and still far below the ceiling's own
/// bound (`palisade_core::clock::MAX_CLOCK_WAIT_MS`, 5 s). A leader whose clock is behind by
/// up to it waits it out before its first grant (a clock floor stays linked to real time); a
/// clock further off is one an operator must hear about.
pub const DEFAULT_MAX_CLOCK_OFFSET_MS: u64 = 500;

/// How often a member reads its peers' clocks (a leader also reads them before it commits a
/// clock floor).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// How long a reading of the peers' clocks is believed: past it, the member has no verdict
/// (and a leader measures again before it commits a floor).
pub const VERDICT_TTL: Duration = Duration::from_secs(5);

/// How long one peer has to answer for its clock.
pub const READ_TIMEOUT: Duration = Duration::from_secs(1);

/// One peer's clock as this member measured it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerOffset {
    /// The peer.
    pub id: NodeId,
    /// The peer's clock minus this member's, ms (positive: the peer is ahead).
    pub offset_ms: i64,
    /// Half the round trip: the offset is known to within this.
    pub uncertainty_ms: u64,
}

/// What this member concluded about its clock from one round of readings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// A majority of the voters (this member included) agree with its clock.
    pub agrees: bool,
    /// This member's clock minus its peers', ms: the median of the offsets answered, negated
    /// (positive: this member is ahead); 0 when no peer answered.
    pub offset_ms: i64,
    /// The greatest offset allowed, ms.
    pub max_offset_ms: u64,
    /// The voters that agree, this member included.
    pub agreeing: Vec<NodeId>,
    /// How many agreeing voters make a majority.
    pub majority: usize,
    /// Every peer that answered.
    pub peers: Vec<PeerOffset>,
    /// So many voters answered that disagree that no majority can agree, whatever those that
    /// did not answer would say: this member's clock is wrong (or a majority's is). Only this
    /// stops a leader and its elections; a verdict short of answers only delays a leader's
    /// floor.
    pub refused: bool,
}

impl Verdict {
    /// Why this member's clock may not commit a floor (for logs and refusals).
    pub fn refusal(&self) -> String {
        format!(
            "this member's clock is {} ms off its peers' (median), beyond the maximum offset of \
             {} ms from a majority: {} of the voters agree with it, {} needed ({:?}); it commits \
             no clock floor and does not lead until its clock is right",
            self.offset_ms,
            self.max_offset_ms,
            self.agreeing.len(),
            self.majority,
            self.peers
        )
    }
}

/// Judges `me`'s clock from `peers`' offsets: a peer agrees when its offset is within
/// `max_offset_ms` of `me`'s (give or take its uncertainty); `me` agrees with itself when it is
/// a voter. No I/O: the rule, tested by itself.
pub fn judge(
    me: NodeId,
    voters: &BTreeSet<NodeId>,
    peers: &[PeerOffset],
    max_offset_ms: u64,
) -> Verdict {
    let majority = voters.len() / 2 + 1;
    let mut agreeing: Vec<NodeId> = voters.contains(&me).then_some(me).into_iter().collect();
    agreeing.extend(
        peers
            .iter()
            .filter(|peer| voters.contains(&peer.id) && peer.id != me)
            .filter(|peer| {
                peer.offset_ms.unsigned_abs() <= max_offset_ms.saturating_add(peer.uncertainty_ms)
            })
            .map(|peer| peer.id),
    );
    agreeing.sort_unstable();
    agreeing.dedup();
    let answered = peers
        .iter()
        .filter(|peer| voters.contains(&peer.id) && peer.id != me)
        .count();
    let silent = voters.len() - usize::from(voters.contains(&me)) - answered;
    let mut offsets: Vec<i64> = peers.iter().map(|peer| peer.offset_ms).collect();
    offsets.sort_unstable();
    let offset_ms = offsets.get(offsets.len() / 2).map_or(0, |median| -median);
    Verdict {
        agrees: agreeing.len() >= majority,
        refused: agreeing.len() + silent < majority,
        offset_ms,
        max_offset_ms,
        agreeing,
        majority,
        peers: peers.to_vec(),
    }
}

/// The latest verdict of a member's clock, shared by its supervisor (which acts on it) and
/// its status page and metrics (which show it).
pub struct ClockCheck {
    /// The greatest offset from a majority a leader's clock may have (`--max-clock-offset-ms`).
    pub max_offset_ms: u64,
    latest: Mutex<Option<(tokio::time::Instant, Verdict)>>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for ClockCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClockCheck")
            .field("max_offset_ms", &self.max_offset_ms)
            .field("latest", &self.latest)
            .finish_non_exhaustive()
    }
}

impl ClockCheck {
    /// No verdict yet; every verdict is shown in `metrics`.
    pub fn new(max_offset_ms: u64, metrics: Arc<Metrics>) -> Self {
        Self {
            max_offset_ms,
            latest: Mutex::new(None),
            metrics,
        }
    }

    /// The latest verdict younger than [`VERDICT_TTL`].
    pub fn fresh(&self) -> Option<Verdict> {
        let latest = self
            .latest
            .lock()
            .expect("the clock verdict is never poisoned");
        latest
            .as_ref()
            .filter(|(at, _)| at.elapsed() < VERDICT_TTL)
            .map(|(_, verdict)| verdict.clone())
    }

    /// True when a fresh verdict says this member's clock is beyond the maximum offset from
    /// a majority ([`Verdict::refused`]; no verdict: nothing known against it).
    pub fn refused(&self) -> bool {
        self.fresh().is_some_and(|verdict| verdict.refused)
    }

    /// Keeps `verdict`, shows it in the metrics and logs a change of mind.
    fn record(&self, verdict: Verdict) {
        // An offset is measured against peers that answered; with none, there is no
        // measurement, and the metric keeps the last one instead of claiming zero.
        if !verdict.peers.is_empty() {
            self.metrics.clock_offset_ms.set(verdict.offset_ms);
        }
        let mut latest = self
            .latest
            .lock()
            .expect("the clock verdict is never poisoned");
        let was_refused = latest.as_ref().is_some_and(|(_, v)| v.refused);
        if verdict.refused && !was_refused {
            self.metrics.clock_refusals.inc();
            tracing::warn!(offset_ms = verdict.offset_ms, "{}", verdict.refusal());
        } else if !verdict.refused && was_refused {
            tracing::info!(
                offset_ms = verdict.offset_ms,
                "this member's clock is within the maximum offset of a majority again"
            );
        }
        *latest = Some((tokio::time::Instant::now(), verdict));
    }

    /// Reads every other voter's clock (at most [`READ_TIMEOUT`] each), judges this member's,
    /// records and returns the verdict. Returns as soon as a majority agrees: a leader waits
    /// for no slow or dead peer once it has one.
    pub async fn measure(
        &self,
        raft: &RaftNode,
        introducer: &Arc<dyn Introducer>,
        clock: &Arc<dyn WallClock>,
    ) -> Verdict {
        let metrics = raft.metrics().borrow().clone();
        let me = metrics.id;
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let mut reading: FuturesUnordered<_> = voters
            .iter()
            .filter(|id| **id != me)
            .filter_map(|id| membership.get_node(id).map(|node| (*id, node.addr.clone())))
            .map(|(id, addr)| read_peer(introducer, clock, id, addr))
            .collect();
        let mut peers = Vec::new();
        let mut verdict = judge(me, &voters, &peers, self.max_offset_ms);
        while !verdict.agrees && !verdict.refused {
            match reading.next().await {
                Some(Some(peer)) => peers.push(peer),
                Some(None) => continue,
                None => break,
            }
            verdict = judge(me, &voters, &peers, self.max_offset_ms);
        }
        self.record(verdict.clone());
        verdict
    }
}

/// One peer's clock offset, or `None` when it did not answer in time.
async fn read_peer(
    introducer: &Arc<dyn Introducer>,
    clock: &Arc<dyn WallClock>,
    id: NodeId,
    addr: String,
) -> Option<PeerOffset> {
    let sent_at = tokio::time::Instant::now();
    let sent_ms = clock.now_ms();
    let peer_ms = tokio::time::timeout(READ_TIMEOUT, introducer.read_clock(id, &addr))
        .await
        .ok()?
        .ok()?;
    let received_ms = clock.now_ms();
    let round_trip_ms = u64::try_from(sent_at.elapsed().as_millis()).unwrap_or(u64::MAX);
    let midpoint_ms = sent_ms / 2 + received_ms / 2 + (sent_ms % 2 + received_ms % 2) / 2;
    let offset = i128::from(peer_ms) - i128::from(midpoint_ms);
    Some(PeerOffset {
        id,
        offset_ms: i64::try_from(offset).unwrap_or(if offset < 0 { i64::MIN } else { i64::MAX }),
        uncertainty_ms: round_trip_ms / 2,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(id: NodeId, offset_ms: i64) -> PeerOffset {
        PeerOffset {
            id,
            offset_ms,
            uncertainty_ms: 2,
        }
    }

    const DAY_MS: i64 = 86_400_000;

    #[test]
    fn p1_a_clock_a_majority_disagrees_with_may_not_commit_a_floor() {
        let voters: BTreeSet<NodeId> = [1, 2, 3].into();
        // Node 1 a day ahead: both peers are a day behind it.
        let ahead = judge(1, &voters, &[peer(2, -DAY_MS), peer(3, -DAY_MS)], 500);
        assert!(!ahead.agrees && ahead.refused);
        assert_eq!(ahead.offset_ms, DAY_MS);
        // One peer disagrees, one is silent: not refused yet (the silent one may agree).
        let undecided = judge(1, &voters, &[peer(2, -DAY_MS)], 500);
        assert!(!undecided.agrees && !undecided.refused);
        assert!(ahead.refusal().contains("beyond the maximum offset"));
        // Node 2, right: node 3 agrees, node 1 does not; 2 of 3 is a majority.
        let right = judge(2, &voters, &[peer(1, DAY_MS), peer(3, 10)], 500);
        assert!(right.agrees);
        assert_eq!(right.agreeing, vec![2, 3]);
        // Nobody answered: one of three is no majority, but nothing says the clock is wrong;
        // alone, a founder is its own majority.
        let silent = judge(2, &voters, &[], 500);
        assert!(!silent.agrees && !silent.refused);
        assert!(judge(1, &[1].into(), &[], 500).agrees);
    }

    #[test]
    fn p1_the_offset_bound_allows_the_uncertainty_and_no_more() {
        let voters: BTreeSet<NodeId> = [1, 2, 3].into();
        let at_the_bound = [peer(2, 502), peer(3, -502)];
        assert!(judge(1, &voters, &at_the_bound, 500).agrees);
        let beyond = [peer(2, 503), peer(3, -503)];
        assert!(!judge(1, &voters, &beyond, 500).agrees);
        // A learner's clock counts for nothing; a non-voter never agrees with itself.
        assert!(!judge(4, &voters, &[peer(1, 0)], 500).agrees);
    }
}
