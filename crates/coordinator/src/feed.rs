//! The recent ownership transitions, for the console's live feed (`GET /v1/transitions`).
//! Bounded: the last [`FEED_CAPACITY`] transitions. A single node records its engine's
//! transitions; a cluster member records those it applies (the leader's and every
//! follower's history alike, so a new leader's feed holds what the old one granted).

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;
use tokio::sync::broadcast;

use crate::engine::Transition;

/// Transitions kept.
pub const FEED_CAPACITY: usize = 256;

/// Audit probe leases remembered, to label their transitions.
pub const PROBES_REMEMBERED: usize = 256;

/// One transition as the feed shows it.
#[derive(Debug, Clone, Serialize)]
pub struct FeedEntry {
    /// Increases by one per entry; a reader asks for entries after the last it saw.
    pub seq: u64,
    /// When it was seen (ms since the Unix epoch).
    pub at_ms: u64,
    /// `granted`, `released`, `expired`, `broken` (an admin ended it: `palisade lock break`),
    /// or `missed` (the feed fell behind).
    pub kind: &'static str,
    /// The lock.
    pub lock: String,
    /// The lease's epoch (a decimal string in JSON, [`palisade_core::json`]).
    #[serde(with = "palisade_core::json::string")]
    pub epoch: u64,
    /// The lease's holder.
    pub holder: String,
    /// The lease's class.
    pub class: &'static str,
    /// Who broke the lease (`broken` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The audit's probe took this lease (`palisade audit --probe`), not a worker: the console
    /// hides it unless asked. Told only to readers of the feed, never to a boundary.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub probe: bool,
}

/// The feed.
#[derive(Debug)]
pub struct Feed {
    /// Random, per feed: a reader that sees another id reads from the start again.
    id: String,
    entries: Mutex<(u64, VecDeque<FeedEntry>)>,
    /// The audit probe's leases, as (lock, epoch), newest last.
    probes: Mutex<VecDeque<(String, u64)>>,
}

use palisade_core::clock::now_ms;

impl Default for Feed {
    fn default() -> Self {
        Self {
            id: format!("{:016x}", rand::random::<u64>()),
            entries: Mutex::default(),
            probes: Mutex::default(),
        }
    }
}

impl Feed {
    /// This feed's id: another after a restart, and on each member.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn push(&self, make: impl FnOnce(u64) -> FeedEntry) {
        let mut guard = self.entries.lock().expect("not poisoned");
        let (next, entries) = &mut *guard;
        *next += 1;
        if entries.len() == FEED_CAPACITY {
            entries.pop_front();
        }
        entries.push_back(make(*next));
    }

    /// Records a transition.
    pub fn record(&self, transition: &Transition) {
        let by = transition.by.as_ref().map(ToString::to_string);
        self.record_parts(transition.kind.as_str(), &transition.lease, by);
    }

    /// Records that `lease` was `kind` (`granted`, `released`, `expired`, `broken`; any other
    /// word is recorded as `ended`), by `by`.
    pub fn record_parts(&self, kind: &str, lease: &palisade_core::Lease, by: Option<String>) {
        let kind = match kind {
            "granted" => "granted",
            "released" => "released",
            "expired" => "expired",
            "broken" => "broken",
            _ => "ended",
        };
        self.push(|seq| FeedEntry {
            seq,
            at_ms: now_ms(),
            kind,
            lock: lease.lock.to_string(),
            epoch: lease.epoch.0,
            holder: lease.holder.to_string(),
            class: lease.class.as_str(),
            by,
            probe: false,
        });
    }

    /// Records `kind` for the feed falling `missed` transitions behind.
    pub fn record_missed(&self, missed: u64) {
        self.push(|seq| FeedEntry {
            seq,
            at_ms: now_ms(),
            kind: "missed",
            lock: String::new(),
            epoch: missed,
            holder: String::new(),
            class: "",
            by: None,
            probe: false,
        });
    }

    /// Remembers that the audit's probe took the lease of `lock` at `epoch`: its transitions
    /// are labelled `probe` when read.
    pub fn mark_probe(&self, lock: &str, epoch: u64) {
        let mut probes = self.probes.lock().expect("not poisoned");
        if probes.len() == PROBES_REMEMBERED {
            probes.pop_front();
        }
        probes.push_back((lock.to_owned(), epoch));
    }

    /// Entries after `after`, oldest first, that `visible` lets through.
    pub fn since(&self, after: u64, visible: impl Fn(&str) -> bool) -> (u64, Vec<FeedEntry>) {
        let probes = self.probes.lock().expect("not poisoned").clone();
        let guard = self.entries.lock().expect("not poisoned");
        let entries = guard
            .1
            .iter()
            .filter(|e| e.seq > after && (e.kind == "missed" || visible(&e.lock)))
            .cloned()
            .map(|mut e| {
                e.probe = probes.iter().any(|(l, n)| *l == e.lock && *n == e.epoch);
                e
            })
            .collect();
        (guard.0, entries)
    }

    /// Follows `transitions` until the channel closes or `shutdown`.
    pub async fn follow(
        self: std::sync::Arc<Self>,
        mut transitions: broadcast::Receiver<Transition>,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        loop {
            let received = tokio::select! {
                received = transitions.recv() => received,
                _ = shutdown.wait_for(|stop| *stop) => return,
            };
            match received {
                Ok(transition) => self.record(&transition),
                Err(broadcast::error::RecvError::Lagged(missed)) => self.record_missed(missed),
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}
