//! Metrics of the effects ledger and its reconciliation (docs/effects.md lists them):
//! operations by state, the review queue, the age of the oldest operation in doubt, and
//! reconciliation results. The ledger's host (`palisade resource serve`) and
//! `palisade effects reconcile --metrics-listen` register them.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::ledger::Stats;
use crate::runner::ReconcileReport;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// The effects metrics.
#[derive(Clone, Default)]
pub struct EffectsMetrics {
    operations: Family<StateLabels, Gauge>,
    review_queue: Gauge,
    oldest_in_doubt: Gauge<f64, AtomicU64>,
    reconciliations: Family<ResultLabels, Counter>,
}

impl EffectsMetrics {
    /// Registers the metrics in `registry` (give it the `palisade_effects` prefix).
    pub fn register(&self, registry: &mut Registry) {
        // Every result is exported from the start (at 0), so a dashboard's rate() has a series.
        for result in RESULTS {
            self.reconciliations
                .get_or_create(&ResultLabels { result })
                .inc_by(0);
        }
        registry.register(
            "operations",
            "Operations in the ledger, by state",
            self.operations.clone(),
        );
        registry.register(
            "review_queue",
            "Operations waiting for a person's verdict (needs_review)",
            self.review_queue.clone(),
        );
        registry.register(
            "oldest_in_doubt_age_seconds",
            "Age of the oldest operation in doubt (unknown, or in flight past its deadline); 0 \
             when none",
            self.oldest_in_doubt.clone(),
        );
        registry.register(
            "reconciliations",
            "Reconciliation outcomes: performed, not_performed, retried, refused, to_review, \
             left, resolved_<verdict>",
            self.reconciliations.clone(),
        );
    }

    /// Sets the gauges from the ledger's counts.
    pub fn set_stats(&self, stats: &Stats, now_ms: u64) {
        for (state, count) in &stats.by_state {
            self.operations
                .get_or_create(&StateLabels {
                    state: state.clone(),
                })
                .set(*count as i64);
        }
        self.review_queue.set(stats.review_queue() as i64);
        let age = stats
            .oldest_in_doubt_ms
            .map_or(0.0, |at| now_ms.saturating_sub(at) as f64 / 1_000.0);
        self.oldest_in_doubt.set(age);
    }

    /// Counts one reconciliation outcome.
    pub fn count(&self, result: &'static str) {
        self.reconciliations
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Counts a reconciler pass's outcomes (the results are [`RESULTS`]).
    pub fn count_report(&self, report: &ReconcileReport) {
        for (result, n) in [
            ("performed", report.performed),
            ("not_performed", report.not_performed),
            ("retried", report.retried),
            ("refused", report.refused),
            ("to_review", report.to_review),
            ("left", report.left),
        ] {
            self.reconciliations
                .get_or_create(&ResultLabels { result })
                .inc_by(n);
        }
    }
}

/// The `result` label values of `palisade_effects_reconciliations_total`.
pub const RESULTS: [&str; 6] = [
    "performed",
    "not_performed",
    "retried",
    "refused",
    "to_review",
    "left",
];
