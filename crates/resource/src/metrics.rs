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

/// Most rejections [`Recent`] keeps.
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

/// The last [`RECENT_REJECTIONS`] rejections, for the audit and the console.
#[derive(Default)]
pub struct Recent {
    records: std::sync::Mutex<std::collections::VecDeque<RejectionRecord>>,
}

impl Recent {
    pub fn push(&self, record: RejectionRecord) {
        let mut records = self.records.lock().expect("not poisoned");
        if records.len() == RECENT_REJECTIONS {
            records.pop_front();
        }
        records.push_back(record);
    }

    /// Newest first; only `lock`'s when given.
    pub fn list(&self, lock: Option<&str>) -> Vec<RejectionRecord> {
        let records = self.records.lock().expect("not poisoned");
        records
            .iter()
            .rev()
            .filter(|r| lock.is_none_or(|lock| r.lock == lock))
            .cloned()
            .collect()
    }
}
