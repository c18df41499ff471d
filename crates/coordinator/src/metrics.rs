//! Prometheus metrics of the coordinator, served at `GET /metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of an ownership transition.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    /// `critical` or `efficiency`.
    pub class: &'static str,
    /// `granted`, `released`, `expired` or `broken`.
    pub transition: &'static str,
}

/// Labels of a refused acquire.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// `held`, `wait_timed_out`, `too_many_waiters`, `invalid`, `policy_downgrade`,
    /// `policy_no_boundary`, `not_leader`, `unavailable`.
    pub reason: &'static str,
}

/// The `reason` label values of `palisade_acquires_refused_total`.
pub const REFUSAL_REASONS: [&str; 9] = [
    "held",
    "wait_timed_out",
    "too_many_waiters",
    "invalid",
    "policy_downgrade",
    "policy_no_boundary",
    "not_leader",
    "unavailable",
    "principal_limit",
];

/// Labels of a policy reload.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or `error`.
    pub result: &'static str,
}

/// Every metric of the coordinator. Cheap to update from any task.
pub struct Metrics {
    registry: Registry,
    /// Leases granted (immediately or to a waiter).
    pub leases_granted: Counter,
    /// Successful renewals.
    pub leases_renewed: Counter,
    /// Leases ended by release.
    pub leases_released: Counter,
    /// Leases ended by expiry.
    pub leases_expired: Counter,
    /// Leases an admin broke (`palisade lock break`; each is also a release).
    pub leases_broken: Counter,
    /// Renewals refused because the lease was unknown, released or expired.
    pub renewal_failures: Counter,
    /// Ownership transitions by lock class.
    pub transitions: Family<TransitionLabels, Counter>,
    /// Leases live now.
    pub leases_active: Gauge,
    /// Acquires waiting now.
    pub waiters: Gauge,
    /// Time from receiving an acquire to answering it with a grant, in seconds.
    pub acquire_latency: Histogram,
    /// Requests per durable commit (group-commit batch size).
    pub commit_batch_size: Histogram,
    /// Duration of one durable commit, in seconds.
    pub commit_duration: Histogram,
    /// fdatasync/fsync calls made by a single node's lease log.
    pub store_syncs: Counter,
    /// Commits that waited for the wall clock to pass the epoch counter (a clock stepped back,
    /// or a leader whose clock runs behind the previous leader's).
    pub clock_waits: Counter,
    /// Starts and commits that issued above an epoch counter ahead of the clock without
    /// waiting for the clock (an operator's `--resume-counter-ahead`, or a cluster leader
    /// whose clock a majority agrees with).
    pub clock_ceiling_waived: Counter,
    /// Cluster: this member's clock minus its peers' (the median of its latest readings), ms.
    pub clock_offset_ms: Gauge,
    /// Cluster: times this member found its clock beyond the maximum offset from a majority
    /// (it then commits no clock floor and does not lead).
    pub clock_refusals: Counter,
    /// CPU time (user + system) of this process, in seconds; read at every scrape.
    process_cpu: Counter<f64, std::sync::atomic::AtomicU64>,
    /// The CPU seconds already added to `process_cpu`.
    process_cpu_seen: std::sync::Mutex<f64>,
    /// Acquires refused, by reason.
    pub acquires_refused: Family<ReasonLabels, Counter>,
    /// The highest epoch this coordinator has granted since it started.
    pub epoch: Gauge,
    /// Rules in the lock policy in force.
    pub policy_rules: Gauge,
    /// Policy reloads (SIGHUP), by result.
    pub policy_reloads: Family<ResultLabels, Counter>,
    /// Cluster: this member's Raft term.
    pub raft_term: Gauge,
    /// Cluster: times the leader this member knows of changed (to another, or to none).
    pub raft_leader_changes: Counter,
    /// Cluster: 1 while this member leads.
    pub raft_is_leader: Gauge,
    /// Cluster: voters and learners in the membership.
    pub raft_members: Gauge,
    /// Cluster: this member's last log index.
    pub raft_last_log_index: Gauge,
    /// Cluster: this member's last applied index.
    pub raft_last_applied_index: Gauge,
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("palisade");
        let metrics = Self {
            leases_granted: Counter::default(),
            leases_renewed: Counter::default(),
            leases_released: Counter::default(),
            leases_expired: Counter::default(),
            leases_broken: Counter::default(),
            renewal_failures: Counter::default(),
            transitions: Family::default(),
            leases_active: Gauge::default(),
            waiters: Gauge::default(),
            acquire_latency: Histogram::new(exponential_buckets(0.000_05, 2.0, 20)),
            commit_batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            commit_duration: Histogram::new(exponential_buckets(0.000_05, 2.0, 18)),
            store_syncs: Counter::default(),
            clock_waits: Counter::default(),
            clock_ceiling_waived: Counter::default(),
            clock_offset_ms: Gauge::default(),
            clock_refusals: Counter::default(),
            process_cpu: Counter::default(),
            process_cpu_seen: std::sync::Mutex::new(0.0),
            acquires_refused: Family::default(),
            epoch: Gauge::default(),
            policy_rules: Gauge::default(),
            policy_reloads: Family::default(),
            raft_term: Gauge::default(),
            raft_leader_changes: Counter::default(),
            raft_is_leader: Gauge::default(),
            raft_members: Gauge::default(),
            raft_last_log_index: Gauge::default(),
            raft_last_applied_index: Gauge::default(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        metrics.register_leases(r);
        metrics.register_commits(r);
        metrics.register_policy(r);
        metrics.register_raft(r);
        // Every known label value is exported from the start (at 0), so a dashboard's rate()
        // has a series before the first event.
        for reason in REFUSAL_REASONS {
            metrics.refused_by(reason, 0);
        }
        for result in ["ok", "error"] {
            metrics
                .policy_reloads
                .get_or_create(&ResultLabels { result })
                .inc_by(0);
        }
        for class in ["critical", "efficiency"] {
            for transition in ["granted", "released", "expired", "broken"] {
                metrics
                    .transitions
                    .get_or_create(&TransitionLabels { class, transition })
                    .inc_by(0);
            }
        }
        Self {
            registry,
            ..metrics
        }
    }

    /// Leases, transitions and waiters.
    fn register_leases(&self, r: &mut Registry) {
        r.register(
            "leases_granted",
            "Leases granted",
            self.leases_granted.clone(),
        );
        r.register(
            "leases_renewed",
            "Lease renewals",
            self.leases_renewed.clone(),
        );
        r.register(
            "leases_released",
            "Leases released",
            self.leases_released.clone(),
        );
        r.register(
            "leases_expired",
            "Leases expired",
            self.leases_expired.clone(),
        );
        r.register(
            "leases_broken",
            "Leases an admin broke",
            self.leases_broken.clone(),
        );
        r.register(
            "renewal_failures",
            "Renewals of unknown, released or expired leases",
            self.renewal_failures.clone(),
        );
        r.register(
            "ownership_transitions",
            "Ownership transitions by lock class",
            self.transitions.clone(),
        );
        r.register("leases_active", "Live leases", self.leases_active.clone());
        r.register(
            "waiters",
            "Acquires waiting for a held lock",
            self.waiters.clone(),
        );
    }

    /// Acquire latency, commits, the clock, the process, refusals.
    fn register_commits(&self, r: &mut Registry) {
        r.register(
            "acquire_duration_seconds",
            "Time from receiving an acquire to granting it",
            self.acquire_latency.clone(),
        );
        r.register(
            "commit_batch_size",
            "Requests answered by one durable commit",
            self.commit_batch_size.clone(),
        );
        r.register(
            "commit_duration_seconds",
            "Duration of one durable commit (fsync included)",
            self.commit_duration.clone(),
        );
        r.register(
            "store_syncs",
            "fdatasync and fsync calls of a single node's lease log",
            self.store_syncs.clone(),
        );
        r.register(
            "clock_waits",
            "Commits that waited for the wall clock to pass the epoch counter",
            self.clock_waits.clone(),
        );
        r.register(
            "clock_ceiling_waived",
            "Starts and commits that issued above a counter ahead of the clock without waiting",
            self.clock_ceiling_waived.clone(),
        );
        r.register(
            "clock_offset_ms",
            "Cluster: this member's clock minus its peers' (median of the latest readings), ms",
            self.clock_offset_ms.clone(),
        );
        r.register(
            "clock_refusals",
            "Cluster: times this member found its clock beyond the maximum offset from a majority",
            self.clock_refusals.clone(),
        );
        r.register(
            "process_cpu_seconds",
            "CPU time (user and system) of the coordinator's process, in seconds",
            self.process_cpu.clone(),
        );
        r.register(
            "acquires_refused",
            "Acquires refused, by reason",
            self.acquires_refused.clone(),
        );
    }

    /// The epoch and the lock policy.
    fn register_policy(&self, r: &mut Registry) {
        r.register(
            "epoch",
            "The highest epoch granted since this coordinator started",
            self.epoch.clone(),
        );
        r.register(
            "policy_rules",
            "Rules in the lock policy in force",
            self.policy_rules.clone(),
        );
        r.register(
            "policy_reloads",
            "Lock policy reloads, by result (a failed reload keeps the policy in force)",
            self.policy_reloads.clone(),
        );
    }

    /// Cluster mode: Raft's term, leadership, members and indexes.
    fn register_raft(&self, r: &mut Registry) {
        r.register(
            "raft_term",
            "Cluster: this member's Raft term",
            self.raft_term.clone(),
        );
        r.register(
            "raft_leader_changes",
            "Cluster: times the leader this member knows of changed",
            self.raft_leader_changes.clone(),
        );
        r.register(
            "raft_is_leader",
            "Cluster: 1 while this member leads",
            self.raft_is_leader.clone(),
        );
        r.register(
            "raft_members",
            "Cluster: voters and learners in the membership",
            self.raft_members.clone(),
        );
        r.register(
            "raft_last_log_index",
            "Cluster: this member's last log index",
            self.raft_last_log_index.clone(),
        );
        r.register(
            "raft_last_applied_index",
            "Cluster: this member's last applied log index",
            self.raft_last_applied_index.clone(),
        );
    }

    fn refused_by(&self, reason: &'static str, n: u64) {
        self.acquires_refused
            .get_or_create(&ReasonLabels { reason })
            .inc_by(n);
    }

    /// Counts a refused acquire (`reason` is one of [`REFUSAL_REASONS`]).
    pub fn refused(&self, reason: &'static str) {
        self.refused_by(reason, 1);
    }

    /// The metrics in Prometheus text format.
    pub fn render(&self) -> String {
        if let Some(now) = process_cpu_seconds() {
            let mut seen = self.process_cpu_seen.lock().expect("not poisoned");
            if now > *seen {
                self.process_cpu.inc_by(now - *seen);
                *seen = now;
            }
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// This process's CPU time (user + system) in seconds, from `/proc/self/stat` (Linux).
pub fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) in parentheses; utime and stime
    // are fields 14 and 15, the 12th and 13th after it.
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split(' ').collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    Some(ticks as f64 / per_second as f64)
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
