//! `palisade audit [--probe]`: the coordinator's audit of its lock policy against the
//! boundaries (`GET /v1/audit`, `POST /v1/audit/probe`), for people or as JSON. Exits 8 when
//! a critical finding stands, so it can gate a deploy.

use std::time::Duration;

use palisade_audit::{Probe, Report, Severity};
use palisade_client::ClientError;
use serde_json::Value;

use crate::output::{millis, print_table};
use crate::EndpointArgs;

/// The audit asks every boundary (3 s each, concurrently) and probes some: allow for that.
const AUDIT_TIMEOUT: Duration = Duration::from_secs(30);

/// A critical finding stands.
#[derive(Debug, thiserror::Error)]
#[error("the audit found {0} critical finding(s)")]
pub struct CriticalFindings(pub usize);

pub async fn run(endpoint: EndpointArgs, probe: bool, json: bool) -> anyhow::Result<()> {
    let report = fetch(&endpoint, probe).await?;
    if json {
        crate::output::print_json(&serde_json::to_value(&report)?);
    } else {
        print(&report);
    }
    let critical = report
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Critical)
        .count();
    if critical > 0 {
        return Err(CriticalFindings(critical).into());
    }
    Ok(())
}

/// Asks each endpoint in turn; a follower's answer names the leader, which the probe needs.
async fn fetch(endpoint: &EndpointArgs, probe: bool) -> anyhow::Result<Report> {
    let client = endpoint.http(AUDIT_TIMEOUT)?;
    let mut errors = Vec::new();
    let mut queue: Vec<String> = endpoint.endpoint.clone();
    let mut tried = 0;
    while let Some(base) = (tried < queue.len()).then(|| queue[tried].clone()) {
        tried += 1;
        let url = format!(
            "{}/v1/audit{}",
            base.trim_end_matches('/'),
            if probe { "/probe" } else { "" }
        );
        let request = if probe {
            client.post(&url)
        } else {
            client.get(&url)
        };
        let reply = match request.send().await {
            Ok(reply) => reply,
            Err(error) => {
                errors.push(format!("{base}: {error}"));
                continue;
            }
        };
        let status = reply.status();
        if status.is_success() {
            return Ok(reply.json().await?);
        }
        let body: Value = reply.json().await.unwrap_or(Value::Null);
        let message = body["message"].as_str().unwrap_or("no message").to_owned();
        match status.as_u16() {
            401 => return Err(ClientError::Unauthenticated(message).into()),
            403 => return Err(ClientError::PermissionDenied(message).into()),
            503 => {
                if let Some(leader) = body["leader"].as_str() {
                    if !queue.iter().any(|q| q == leader) && queue.len() < 16 {
                        queue.push(leader.to_owned());
                    }
                }
                errors.push(format!("{base}: {message}"));
            }
            _ => anyhow::bail!("{base}: {status}: {message}"),
        }
    }
    Err(ClientError::Unavailable(errors.join("; ")).into())
}

fn print(report: &Report) {
    print_policy(report);
    print_locks(report);
    print_boundaries(report);
    print_findings(report);
}

fn print_policy(report: &Report) {
    match &report.policy_file {
        Some(file) => println!(
            "policy {file}: {} rule(s), default class {}{}",
            report.patterns.len(),
            report.default_class,
            if report.require_policy {
                ", --require-policy"
            } else {
                ""
            }
        ),
        None => println!("no policy file"),
    }
    if !report.patterns.is_empty() {
        println!();
        let rows: Vec<Vec<String>> = report
            .patterns
            .iter()
            .map(|p| {
                vec![
                    p.pattern.clone(),
                    p.class.to_string(),
                    p.boundary.clone().unwrap_or_else(|| "-".into()),
                    p.fallback.clone().unwrap_or_else(|| "-".into()),
                    p.live_locks.to_string(),
                ]
            })
            .collect();
        print_table(&["PATTERN", "CLASS", "BOUNDARY", "FALLBACK", "LIVE"], &rows);
    }
}

fn print_locks(report: &Report) {
    println!();
    if report.locks.is_empty() {
        println!("no lock is held");
    } else {
        let rows: Vec<Vec<String>> = report
            .locks
            .iter()
            .map(|l| {
                vec![
                    l.lock.clone(),
                    l.class.to_string(),
                    l.epoch.to_string(),
                    l.holder.clone(),
                    millis(l.remaining_ms),
                    l.fence.map_or("-".into(), |f| f.to_string()),
                    l.lag.map_or("-".into(), |f| f.to_string()),
                    l.stale_rejections.to_string(),
                ]
            })
            .collect();
        print_table(
            &[
                "LOCK",
                "CLASS",
                "EPOCH",
                "HOLDER",
                "LEFT",
                "FENCE",
                "LAG",
                "STALE REFUSED",
            ],
            &rows,
        );
    }
}

fn print_boundaries(report: &Report) {
    if !report.boundaries.is_empty() {
        println!();
        let rows: Vec<Vec<String>> = report
            .boundaries
            .iter()
            .map(|b| {
                let probe = b.probe.as_ref().map_or("-", Probe::result).to_owned();
                let restore = match (b.restore_required, b.restore_floor) {
                    (Some(true), _) => "REQUIRED".to_owned(),
                    (_, Some(floor)) if floor > 0 => format!("floor {floor}"),
                    _ => "-".into(),
                };
                vec![
                    b.target.clone(),
                    if b.reachable {
                        "yes".into()
                    } else {
                        "NO".into()
                    },
                    b.rejection_totals
                        .get("stale_epoch")
                        .map_or("-".into(), |n| n.to_string()),
                    restore,
                    probe,
                ]
            })
            .collect();
        print_table(
            &["BOUNDARY", "ANSWERS", "STALE REFUSED", "RESTORE", "PROBE"],
            &rows,
        );
        for b in &report.boundaries {
            if let Some(table) = &b.resolved_table {
                println!("  {} is table {table}", b.target);
            }
            if let Some(probe) = &b.probe {
                println!("  probe of {}: {}", b.target, probe.detail());
            }
        }
    }
}

fn print_findings(report: &Report) {
    println!();
    if report.findings.is_empty() {
        println!("no findings");
    }
    for finding in &report.findings {
        let severity = match finding.severity {
            Severity::Critical => "CRITICAL",
            Severity::Warning => "warning",
            Severity::Info => "info",
        };
        println!("{severity:<8}  {:<20}  {}", finding.code, finding.message);
        if let Some(proof) = &finding.proof {
            println!("{:<8}  {:<20}  shown by: {proof}", "", "");
        }
    }
}
