//! Metrics of the reference store, served at `GET /metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The `reason` label values of `palisade_resource_rejections_total`.
pub const REASONS: [&str; 7] = [
    "stale_epoch",
    "not_activated",
    "invalid_token",
    "replay",
    "replay_mismatch",
    "invalid_request",
    "missing_token",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// One of [`REASONS`].
    pub reason: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pub accepted: Counter,
    pub rejections: Family<ReasonLabels, Counter>,
    pub activations: Counter,
    pub storage_errors: Counter,
    pub write_duration: Histogram,
}

impl Metrics {
    pub fn new(
        effects: &palisade_effects::metrics::EffectsMetrics,
        keys: &crate::keys::KeyRing,
    ) -> Self {
        let mut registry = Registry::default();
        effects.register(registry.sub_registry_with_prefix("palisade_effects"));
        let metrics = Self {
            accepted: Counter::default(),
            rejections: Family::default(),
            activations: Counter::default(),
            storage_errors: Counter::default(),
            write_duration: Histogram::new(exponential_buckets(0.000_05, 2.0, 18)),
            registry: Registry::default(),
        };
        let r = registry.sub_registry_with_prefix("palisade_resource");
        r.register(
            "writes_accepted",
            "Fenced writes accepted",
            metrics.accepted.clone(),
        );
        r.register(
            "rejections",
            "Writes and activations refused, by reason (replay: applied before, nothing done)",
            metrics.rejections.clone(),
        );
        r.register(
            "trusted_key_changes",
            "Times the set of trusted coordinator keys changed (the first load counts one)",
            keys.key_changes.clone(),
        );
        r.register(
            "trusted_keys",
            "Coordinator keys trusted now",
            keys.trusted_keys.clone(),
        );
        r.register(
            "activations",
            "Successful activations",
            metrics.activations.clone(),
        );
        r.register(
            "storage_errors",
            "Storage failures",
            metrics.storage_errors.clone(),
        );
        r.register(
            "write_duration_seconds",
            "Time to answer a fenced write",
            metrics.write_duration.clone(),
        );
        // Every reason is exported from the start (at 0).
        for reason in REASONS {
            metrics
                .rejections
                .get_or_create(&ReasonLabels { reason })
                .inc_by(0);
        }
        Self {
            registry,
            ..metrics
        }
    }

    pub fn reject(&self, reason: &'static str) {
        self.rejections
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// Most rejections each of [`Recent`]'s two rings keeps.
pub const RECENT_REJECTIONS: usize = 256;

/// A refused write or activation, as `GET /v1/rejections` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RejectionRecord {
    /// When (ms since the epoch).
    pub at_ms: u64,
    /// The lock named in the path.
    pub lock: String,
    /// The key (absent for an activation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The epoch the token claimed (unverified: an invalid token claims anything).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[serde(with = "palisade_core::json::option_string")]
    pub epoch: Option<u64>,
    /// The fence that refused it (stale and not-activated rejections).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[serde(with = "palisade_core::json::option_string")]
    pub fence: Option<u64>,
    /// The rejection's code.
    pub reason: &'static str,
}

/// Most of one lock's refusals the ring of signed refusals keeps: a writer flooding one lock
/// with stale writes pushes out only that lock's older entries.
pub const RECENT_PER_LOCK: usize = 32;
/// Most refusals of unverified requests (a token that does not verify, a malformed request)
/// recorded per second; the rest are counted in the totals only.
pub const NOISE_PER_SECOND: u32 = 20;

/// The last rejections, for the audit and the console, kept in two rings (issue 26, item 11):
/// refusals of validly signed tokens (stale epochs, not activated, replay mismatches) — what
/// the audit and the console count — and refusals of requests whose token did not verify,
/// which anyone can send without credentials. Noise can never push out a signed refusal, and
/// it is rate-limited.
#[derive(Default)]
pub struct Recent {
    inner: std::sync::Mutex<Rings>,
}

#[derive(Default)]
struct Rings {
    signed: std::collections::VecDeque<RejectionRecord>,
    noise: std::collections::VecDeque<RejectionRecord>,
    /// The second (ms / 1000) of the noise counted in `noise_this_second`.
    noise_second: u64,
    noise_this_second: u32,
    /// Noise not recorded (over [`NOISE_PER_SECOND`]) since start.
    noise_dropped: u64,
}

/// Whether a rejection's token verified (only then is its reason worth keeping apart).
fn signed(reason: &str) -> bool {
    matches!(reason, "stale_epoch" | "not_activated" | "replay_mismatch")
}

impl Recent {
    pub fn push(&self, record: RejectionRecord) {
        let mut rings = self.inner.lock().expect("not poisoned");
        if signed(record.reason) {
            let same_lock = rings
                .signed
                .iter()
                .filter(|r| r.lock == record.lock)
                .count();
            if same_lock >= RECENT_PER_LOCK {
                let oldest = rings
                    .signed
                    .iter()
                    .position(|r| r.lock == record.lock)
                    .expect("counted above");
                rings.signed.remove(oldest);
            } else if rings.signed.len() == RECENT_REJECTIONS {
                rings.signed.pop_front();
            }
            rings.signed.push_back(record);
            return;
        }
        let second = record.at_ms / 1000;
        if second != rings.noise_second {
            rings.noise_second = second;
            rings.noise_this_second = 0;
        }
        if rings.noise_this_second >= NOISE_PER_SECOND {
            rings.noise_dropped += 1;
            return;
        }
        rings.noise_this_second += 1;
        if rings.noise.len() == RECENT_REJECTIONS {
            rings.noise.pop_front();
        }
        rings.noise.push_back(record);
    }

    /// Unverified refusals not recorded since start (over the rate limit).
    pub fn noise_dropped(&self) -> u64 {
        self.inner.lock().expect("not poisoned").noise_dropped
    }

    /// Newest first; only `lock`'s when given.
    /// Signed refusals come first, then noise, so a reader that takes the first N
    /// never loses a signed refusal to noise.
    pub fn list(&self, lock: Option<&str>) -> Vec<RejectionRecord> {
        let rings = self.inner.lock().expect("not poisoned");
        let newest_first = |ring: &std::collections::VecDeque<RejectionRecord>| {
            ring.iter()
                .rev()
                .filter(|r| lock.is_none_or(|lock| r.lock == lock))
                .cloned()
                .collect::<Vec<_>>()
        };
        let mut records = newest_first(&rings.signed);
        records.extend(newest_first(&rings.noise));
        records
    }
}

#[cfg(test)]
mod recent_tests {
    use super::*;

    fn record(at_ms: u64, lock: &str, reason: &'static str) -> RejectionRecord {
        RejectionRecord {
            at_ms,
            lock: lock.into(),
            key: None,
            epoch: Some(1),
            fence: None,
            reason,
        }
    }

    /// Issue 26, item 11: 300 writes with a garbage token (no credentials needed) cannot push
    /// a stale-epoch refusal out of what the audit and the console read, and are rate-limited.
    #[test]
    fn p5_noise_without_credentials_never_flushes_a_signed_refusal() {
        let recent = Recent::default();
        recent.push(record(1_000, "report/7", "stale_epoch"));
        for i in 0..300 {
            recent.push(record(1_000 + i % 900, "report/7", "invalid_token"));
        }
        let listed = recent.list(None);
        assert_eq!(
            listed[0].reason, "stale_epoch",
            "signed refusals come first"
        );
        assert_eq!(
            listed
                .iter()
                .filter(|r| r.reason == "invalid_token")
                .count(),
            NOISE_PER_SECOND as usize,
            "one second's worth of noise"
        );
        assert_eq!(recent.noise_dropped(), 300 - u64::from(NOISE_PER_SECOND));
        // The next second records noise again.
        recent.push(record(2_000, "x", "invalid_token"));
        assert_eq!(recent.noise_dropped(), 300 - u64::from(NOISE_PER_SECOND));
    }

    /// A writer flooding one lock with stale writes evicts only that lock's older entries.
    #[test]
    fn p5_a_flood_of_one_locks_stale_writes_keeps_the_other_locks_refusals() {
        let recent = Recent::default();
        recent.push(record(1, "billing/1", "stale_epoch"));
        for i in 0..1_000 {
            recent.push(record(2 + i, "mallory/1", "stale_epoch"));
        }
        let listed = recent.list(None);
        assert_eq!(listed.len(), RECENT_PER_LOCK + 1);
        assert_eq!(recent.list(Some("billing/1")).len(), 1);
        assert_eq!(listed[0].at_ms, 1_001, "newest first");
        // Many locks: the ring stays bounded.
        for i in 0..1_000 {
            recent.push(record(5_000 + i, &format!("l/{i}"), "stale_epoch"));
        }
        assert_eq!(recent.list(None).len(), RECENT_REJECTIONS);
    }
}
