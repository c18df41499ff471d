//! Findings from what the coordinator and the boundaries reported. Pure.

use palisade_core::LockClass;

use crate::policy::{Boundary, Capability, Fallback, Policy};
use crate::{
    BoundaryReport, Finding, LiveLock, LockReport, PatternReport, Probe, Report, Severity,
};

/// The distinct boundaries a policy names, each with the patterns that name it, in file order.
pub fn boundaries(policy: &Policy) -> Vec<(Boundary, Vec<String>)> {
    let mut out: Vec<(Boundary, Vec<String>)> = Vec::new();
    for rule in &policy.rules {
        let Some(boundary) = &rule.boundary else {
            continue;
        };
        let pattern = rule.pattern.as_str().to_owned();
        match out.iter_mut().find(|(b, _)| b == boundary) {
            Some((_, patterns)) => patterns.push(pattern),
            None => out.push((boundary.clone(), vec![pattern])),
        }
    }
    out
}

/// The locks to ask boundary `index` of [`boundaries`] about: the live locks its rules decide,
/// and every live efficiency lock (a fence for one of those means its writes are fenced: the
/// lock is misclassified).
pub fn locks_to_ask(policy: &Policy, boundary: &Boundary, locks: &[LiveLock]) -> Vec<String> {
    locks
        .iter()
        .filter(|live| {
            let rule = policy.rule_for(&live.lock);
            let class = rule.map_or(live.class, |r| r.class);
            rule.and_then(|r| r.boundary.as_ref()) == Some(boundary)
                || (class == LockClass::Efficiency && !matches!(boundary, Boundary::Effects { .. }))
        })
        .map(|live| live.lock.clone())
        .collect()
}

fn finding(severity: Severity, code: &str, subject: &str, message: String) -> Finding {
    Finding {
        severity,
        code: code.to_owned(),
        subject: subject.to_owned(),
        message,
        proof: None,
    }
}

/// The report: `observed[i]` is what boundary `i` of [`boundaries`] said.
pub fn assess(
    policy: &Policy,
    policy_file: Option<String>,
    require_policy: bool,
    locks: &[LiveLock],
    observed: Vec<BoundaryReport>,
    now_ms: u64,
) -> Report {
    let mut findings = Vec::new();
    if policy_file.is_none() {
        findings.push(finding(
            Severity::Warning,
            "no_policy",
            "*",
            format!(
                "the coordinator runs without a policy file: every lock is critical and none \
                 names the boundary where its writes are fenced ({} held now; palisade serve \
                 --policy FILE)",
                locks.len()
            ),
        ));
    }
    let known = boundaries(policy);
    let patterns = policy
        .rules
        .iter()
        .map(|rule| {
            rule_findings(rule, &mut findings);
            pattern_report(policy, rule, locks)
        })
        .collect();
    for report in &observed {
        boundary_findings(report, &mut findings);
    }
    let lock_reports = locks
        .iter()
        .map(|live| lock_report(policy, &known, &observed, live, &mut findings))
        .collect();
    if policy_file.is_none() {
        // Nobody said where any lock is fenced: `no_policy` says that once, and a fresh
        // coordinator's console opens with no false alarm on each lock.
        findings.retain(|f| f.code != "no_boundary");
    }
    findings
        .sort_by(|a, b| (a.severity, &a.code, &a.subject).cmp(&(b.severity, &b.code, &b.subject)));
    Report {
        generated_at_ms: now_ms,
        policy_file,
        require_policy,
        default_class: policy.default_class,
        patterns,
        locks: lock_reports,
        boundaries: observed,
        findings,
    }
}

/// What a rule of the policy says about itself: critical with no boundary, a receiver that
/// cannot enforce with no fallback, duplicates accepted.
fn rule_findings(rule: &crate::policy::Rule, findings: &mut Vec<Finding>) {
    let subject = rule.pattern.as_str();
    if rule.class == LockClass::Critical && rule.boundary.is_none() {
        findings.push(finding(
            Severity::Critical,
            "no_boundary",
            subject,
            format!(
                "locks matching {subject} are critical but the policy names no boundary: \
                 nothing is known to reject their obsolete owners' writes"
            ),
        ));
    }
    if let Some(Boundary::Effects {
        capability: Capability::None,
        ..
    }) = &rule.boundary
    {
        if rule.fallback.is_none() {
            findings.push(finding(
                Severity::Critical,
                "no_fallback",
                subject,
                format!(
                    "the receiver of {subject} cannot enforce (capability none) and the \
                     rule declares no fallback: say review, compensate, or \
                     accept-duplicates with a reason"
                ),
            ));
        }
    }
    if rule.fallback == Some(Fallback::AcceptDuplicates) {
        findings.push(finding(
            Severity::Info,
            "accepts_duplicates",
            subject,
            format!(
                "duplicates are accepted for {subject}: {}",
                rule.reason.as_deref().unwrap_or("")
            ),
        ));
    }
}

fn pattern_report(
    policy: &Policy,
    rule: &crate::policy::Rule,
    locks: &[LiveLock],
) -> PatternReport {
    let subject = rule.pattern.as_str();
    PatternReport {
        pattern: subject.to_owned(),
        class: rule.class,
        boundary: rule.boundary.as_ref().map(Boundary::describe),
        fallback: rule.fallback.map(|f| {
            serde_json::to_value(f)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default()
        }),
        live_locks: locks
            .iter()
            .filter(|l| {
                policy
                    .rule_for(&l.lock)
                    .is_some_and(|r| std::ptr::eq(r, rule))
            })
            .count(),
    }
}

/// What a boundary's observation shows: unreachable, copied back, unguarded, its own problems,
/// its probe, effects in doubt.
fn boundary_findings(report: &BoundaryReport, findings: &mut Vec<Finding>) {
    let subject = report.target.as_str();
    if !report.reachable {
        findings.push(finding(
            Severity::Critical,
            "boundary_unreachable",
            subject,
            format!(
                "{subject} does not answer ({}): its fences cannot be checked",
                report.error.as_deref().unwrap_or("no answer")
            ),
        ));
    }
    if report.restore_required == Some(true) {
        findings.push(finding(
            Severity::Critical,
            "restore_required",
            subject,
            format!(
                "{subject} was copied back from an old state and refuses writes until it is \
                 repaired (docs/operations.md)"
            ),
        ));
    }
    if report.guard_installed == Some(false) {
        findings.push(finding(
            Severity::Critical,
            "guard_missing",
            subject,
            format!(
                "{subject} has no Palisade guard: plain SQL can overwrite rows without the \
                 fence (install it: `palisade resource guard --postgres URL --table T \
                 --lock NAME` or GuardedTable::install_guard)"
            ),
        ));
    }
    for problem in &report.problems {
        findings.push(Finding {
            proof: Some(problem.proof.clone()),
            ..finding(
                problem.severity,
                &problem.code,
                subject,
                format!("{subject}: {}", problem.message),
            )
        });
    }
    probe_and_effects_findings(report, subject, findings);
}

/// A probe that did not show a refusal, and effects waiting for a decision.
fn probe_and_effects_findings(report: &BoundaryReport, subject: &str, findings: &mut Vec<Finding>) {
    match &report.probe {
        Some(Probe::Accepted { detail }) => findings.push(finding(
            Severity::Critical,
            "probe_accepted",
            subject,
            format!("{subject} ACCEPTED an obsolete write: {detail}"),
        )),
        // A boundary that makes the probe fail has not shown that it fences: as bad as one
        // that accepts, for the audit's verdict (a liar would otherwise choose to fail).
        Some(Probe::Failed { detail }) => findings.push(finding(
            Severity::Critical,
            "probe_failed",
            subject,
            format!(
                "the probe of {subject} did not show that it refuses obsolete owners: \
                 {detail}"
            ),
        )),
        _ => {}
    }
    for (state, what) in [
        ("needs_review", "operations wait for a person's review"),
        ("unknown", "operations' outcomes are in doubt"),
    ] {
        if let Some(&count) = report.operations.get(state).filter(|&&n| n > 0) {
            findings.push(finding(
                Severity::Warning,
                "effects_in_doubt",
                subject,
                format!("{count} {what} at {subject} (palisade effects list --state {state})"),
            ));
        }
    }
}

/// One live lock against its rule and its boundary's fence.
fn lock_report(
    policy: &Policy,
    known: &[(Boundary, Vec<String>)],
    observed: &[BoundaryReport],
    live: &LiveLock,
    findings: &mut Vec<Finding>,
) -> LockReport {
    let rule = policy.rule_for(&live.lock);
    let class = rule.map_or(live.class, |r| r.class);
    let boundary = rule.and_then(|r| r.boundary.as_ref());
    let at = boundary.and_then(|b| known.iter().position(|(k, _)| k == b));
    let fence = at
        .and_then(|i| observed.get(i))
        .and_then(|report| report.fences.get(&live.lock).copied());
    lock_findings(live, class, boundary, fence, known, observed, findings);
    let stale_rejections = at.and_then(|i| observed.get(i)).map_or(0, |report| {
        report
            .recent_rejections
            .iter()
            .filter(|r| r["lock"] == live.lock.as_str() && r["reason"] == "stale_epoch")
            .count()
    });
    LockReport {
        lock: live.lock.clone(),
        class,
        epoch: live.epoch,
        holder: live.holder.clone(),
        remaining_ms: live.remaining_ms,
        granted_unix_ms: live.granted_unix_ms,
        waiters: live.waiters,
        pattern: rule.map(|r| r.pattern.as_str().to_owned()),
        boundary: boundary.map(Boundary::describe),
        fence,
        // A fence of 0 is a lock never written there: no lag to speak of (its "lag" would be
        // the whole epoch, a 19-digit number that says nothing).
        lag: fence
            .filter(|&f| f > 0 && f <= live.epoch)
            .map(|f| live.epoch - f),
        stale_rejections,
    }
}

/// An efficiency lock that a boundary fences anyway: its writes probably matter.
fn efficiency_findings(
    live: &LiveLock,
    known: &[(Boundary, Vec<String>)],
    observed: &[BoundaryReport],
    findings: &mut Vec<Finding>,
) {
    for (i, report) in observed.iter().enumerate() {
        if let Some(&fence) = report.fences.get(&live.lock).filter(|&&f| f > 0) {
            let target = known.get(i).map(|(b, _)| b.describe()).unwrap_or_default();
            findings.push(finding(
                Severity::Warning,
                "efficiency_fenced",
                &live.lock,
                format!(
                    "{} is classed efficiency but {target} fences its writes (fence \
                     {fence}): if those writes matter, class it critical",
                    live.lock
                ),
            ));
        }
    }
}

/// A live lock's findings: critical with no boundary, a fence ahead of or behind its epoch,
/// efficiency locks that a boundary fences.
fn lock_findings(
    live: &LiveLock,
    class: LockClass,
    boundary: Option<&Boundary>,
    fence: Option<u64>,
    known: &[(Boundary, Vec<String>)],
    observed: &[BoundaryReport],
    findings: &mut Vec<Finding>,
) {
    if class == LockClass::Critical && boundary.is_none() {
        findings.push(finding(
            Severity::Critical,
            "no_boundary",
            &live.lock,
            format!(
                "{} is held as critical (epoch {}) and the policy names no boundary for \
                 it",
                live.lock, live.epoch
            ),
        ));
    }
    let poisoned = observed
        .iter()
        .any(|report| report.poisoned_fences.contains(&live.lock));
    if let Some(fence) = fence.filter(|_| !poisoned) {
        if fence > live.epoch {
            findings.push(finding(
                Severity::Critical,
                "fence_ahead",
                &live.lock,
                format!(
                    "{} is fenced at {fence} by {} but the coordinator's epoch is {}: \
                     the coordinator was restored from an old backup, or someone else \
                     signs tokens. Its holder's writes are refused until the epoch \
                     passes {fence} (palisade restore --floor-from)",
                    live.lock,
                    boundary.map(Boundary::describe).unwrap_or_default(),
                    live.epoch
                ),
            ));
        } else if fence < live.epoch {
            // Epochs come from one counter for every lock, so the gap says nothing
            // about how many owners came and went; only that this holder has not
            // written (or activated) there yet.
            findings.push(finding(
                Severity::Info,
                "fence_lags",
                &live.lock,
                format!(
                    "{} is at epoch {} and its boundary's fence at {fence}: until the \
                     holder writes or activates there, an earlier owner's write above \
                     {fence} is still accepted (activated mode closes that window)",
                    live.lock, live.epoch
                ),
            ));
        }
    }
    if class == LockClass::Efficiency {
        efficiency_findings(live, known, observed, findings);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const POLICY: &str = r#"
default_class = "efficiency"
[[lock]]
pattern = "report/*"
class = "critical"
boundary = { kind = "resource", url = "http://127.0.0.1:1" }
[[lock]]
pattern = "bare/*"
class = "critical"
[[lock]]
pattern = "pay/*"
class = "critical"
boundary = { kind = "effects", url = "http://127.0.0.1:2", capability = "none" }
[[lock]]
pattern = "dup/*"
class = "critical"
boundary = { kind = "effects", url = "http://127.0.0.1:2", capability = "none" }
fallback = "accept-duplicates"
reason = "the receiver's duplicates are harmless counters"
"#;

    fn live(lock: &str, epoch: u64, class: LockClass) -> LiveLock {
        LiveLock {
            lock: lock.into(),
            epoch,
            holder: "w".into(),
            class,
            remaining_ms: 1_000,
            granted_unix_ms: 0,
            waiters: 0,
        }
    }

    fn codes(report: &Report) -> Vec<(Severity, &str, &str)> {
        report
            .findings
            .iter()
            .map(|f| (f.severity, f.code.as_str(), f.subject.as_str()))
            .collect()
    }

    fn reachable(fences: &[(&str, u64)]) -> BoundaryReport {
        BoundaryReport {
            reachable: true,
            fences: fences.iter().map(|(l, f)| ((*l).to_owned(), *f)).collect(),
            ..BoundaryReport::default()
        }
    }

    #[test]
    fn boundaries_are_listed_once_with_their_patterns() {
        let policy = Policy::parse(POLICY).unwrap();
        let list = boundaries(&policy);
        assert_eq!(list.len(), 2, "{list:?}");
        // pay/* and dup/* name the same ledger and receiver: one boundary, asked once.
        assert_eq!(list[1].1, vec!["pay/*".to_owned(), "dup/*".to_owned()]);
        // Another receiver at the same ledger is another boundary.
        let policy = Policy::parse(&POLICY.replace(
            ", capability = \"none\" }\nfallback",
            ", capability = \"none\", receiver = \"x\" }\nfallback",
        ))
        .unwrap();
        assert_eq!(boundaries(&policy).len(), 3);
    }

    #[test]
    fn each_planted_problem_is_found_and_ranked() {
        let policy = Policy::parse(POLICY).unwrap();
        let locks = [
            live("report/1", 5, LockClass::Critical),  // fence ahead
            live("report/2", 9, LockClass::Critical),  // lags: 9 over 5
            live("report/3", 3, LockClass::Critical),  // fine
            live("bare/1", 2, LockClass::Critical),    // no boundary
            live("cache/1", 4, LockClass::Efficiency), // fenced although efficiency
        ];
        let mut resource = reachable(&[
            ("report/1", 7),
            ("report/2", 5),
            ("report/3", 3),
            ("cache/1", 4),
        ]);
        resource.recent_rejections = vec![
            serde_json::json!({"lock": "report/3", "reason": "stale_epoch"}),
            serde_json::json!({"lock": "report/3", "reason": "invalid_token"}),
        ];
        resource.probe = Some(Probe::Accepted {
            detail: "epoch 1 after 2".into(),
        });
        let effects = BoundaryReport {
            reachable: false,
            error: Some("connection refused".into()),
            operations: BTreeMap::from([("needs_review".into(), 2)]),
            ..BoundaryReport::default()
        };
        let report = assess(
            &policy,
            Some("p.toml".into()),
            false,
            &locks,
            vec![resource, effects],
            1,
        );
        let found = codes(&report);
        for expect in [
            (Severity::Critical, "fence_ahead", "report/1"),
            (Severity::Critical, "no_boundary", "bare/*"),
            (Severity::Critical, "no_boundary", "bare/1"),
            (Severity::Critical, "no_fallback", "pay/*"),
            (Severity::Critical, "probe_accepted", ""),
            (Severity::Critical, "boundary_unreachable", ""),
            (Severity::Warning, "efficiency_fenced", "cache/1"),
            (Severity::Warning, "effects_in_doubt", ""),
            (Severity::Info, "fence_lags", "report/2"),
            (Severity::Info, "accepts_duplicates", "dup/*"),
        ] {
            assert!(
                found
                    .iter()
                    .any(|f| f.0 == expect.0 && f.1 == expect.1 && f.2 == expect.2),
                "{expect:?} not in {found:?}"
            );
        }
        // Nothing about the healthy lock, and critical findings come first.
        assert!(!found.iter().any(|f| f.2 == "report/3"), "{found:?}");
        let severities: Vec<Severity> = report.findings.iter().map(|f| f.severity).collect();
        let mut sorted = severities.clone();
        sorted.sort();
        assert_eq!(severities, sorted);
        assert!(report.has_critical());
        let healthy = report.locks.iter().find(|l| l.lock == "report/3").unwrap();
        assert_eq!(
            (healthy.fence, healthy.lag, healthy.stale_rejections),
            (Some(3), Some(0), 1)
        );
    }

    #[test]
    fn a_clean_setup_has_no_critical_finding() {
        let policy = Policy::parse(
            "default_class = \"efficiency\"\n[[lock]]\npattern = \"report/*\"\nclass = \"critical\"\nboundary = { kind = \"resource\", url = \"http://127.0.0.1:1\" }\n",
        )
        .unwrap();
        let locks = [
            live("report/1", 3, LockClass::Critical),
            live("cache/1", 2, LockClass::Efficiency),
        ];
        let mut resource = reachable(&[("report/1", 3), ("cache/1", 0)]);
        resource.probe = Some(Probe::Refused {
            detail: "409".into(),
        });
        let report = assess(
            &policy,
            Some("p.toml".into()),
            true,
            &locks,
            vec![resource],
            1,
        );
        assert!(report.findings.is_empty(), "{:?}", report.findings);
        assert!(!report.has_critical());
    }

    #[test]
    fn without_a_policy_one_warning_says_so_and_no_lock_is_a_false_alarm() {
        let report = assess(
            &Policy::none(),
            None,
            false,
            &[live("a", 1, LockClass::Critical)],
            vec![],
            1,
        );
        let found = codes(&report);
        assert_eq!(found, [(Severity::Warning, "no_policy", "*")]);
        assert!(report.findings[0].message.contains("1 held now"));
        assert!(!report.has_critical());
        // An efficiency lease needs no boundary.
        let report = assess(
            &Policy::none(),
            None,
            false,
            &[live("a", 1, LockClass::Efficiency)],
            vec![],
            1,
        );
        assert!(!report.has_critical());
    }

    #[test]
    fn locks_to_ask_cover_the_boundarys_locks_and_every_efficiency_lock() {
        let policy = Policy::parse(POLICY).unwrap();
        let locks = [
            live("report/1", 1, LockClass::Critical),
            live("bare/1", 1, LockClass::Critical),
            live("cache/1", 1, LockClass::Efficiency),
            live("pay/1", 1, LockClass::Critical),
        ];
        let list = boundaries(&policy);
        assert_eq!(
            locks_to_ask(&policy, &list[0].0, &locks),
            vec!["report/1", "cache/1"]
        );
        assert_eq!(locks_to_ask(&policy, &list[1].0, &locks), vec!["pay/1"]);
    }
}
