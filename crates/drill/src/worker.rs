//! A drill worker: a process of ours that acquires (or is handed a token), activates when the
//! mode asks, stops itself with SIGSTOP at a chosen point, and writes. It reports every step
//! as one JSON line on stdout, with times from the system-wide monotonic clock.

use std::io::Write as _;
use std::time::Duration;

use palisade_client::{AcquireOptions, Client};
use palisade_core::LockName;
use palisade_fence::FenceMode;
use serde_json::json;

use crate::clock::now_ns;
use crate::target::Target;

/// Where the worker stops itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PausePoint {
    /// Never.
    None,
    /// Right after the grant (and activation).
    AfterAcquire,
    /// After checking that its lease is still valid, immediately before writing — the window
    /// no lease check can close.
    BeforeWrite,
}

impl PausePoint {
    /// Parses `none`, `after-acquire` or `before-write`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "none" => Some(PausePoint::None),
            "after-acquire" => Some(PausePoint::AfterAcquire),
            "before-write" => Some(PausePoint::BeforeWrite),
            _ => None,
        }
    }
}

/// What a worker does.
#[derive(Debug, Clone)]
pub struct WorkerPlan {
    pub coordinator: String,
    pub target: String,
    pub mode: FenceMode,
    pub run: String,
    pub lock: String,
    pub keys: Vec<String>,
    pub value: String,
    pub ttl_ms: u64,
    /// Present this token instead of acquiring.
    pub token: Option<String>,
    pub activate: bool,
    pub pause: PausePoint,
    /// Report `ready` and wait for a line on stdin before writing.
    pub hold_before_write: bool,
}

fn report(event: serde_json::Value) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{event}");
    let _ = stdout.flush();
}

fn stop_self() {
    // A real SIGSTOP: the kernel stops every thread of this process until SIGCONT.
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
}

/// Runs the plan; errors are reported as an `error` event too.
pub async fn run(plan: WorkerPlan) -> anyhow::Result<()> {
    let lock = LockName::new(plan.lock.clone())?;
    let target = Target::connect(&plan.target, plan.mode, &plan.coordinator, &plan.run).await?;
    let (token, acquired_at) = match plan.token.clone() {
        Some(token) => (token, None),
        None => {
            let client = Client::connect(&[&plan.coordinator]).await?;
            let mut options = AcquireOptions::new(plan.lock.clone());
            options.ttl = Duration::from_millis(plan.ttl_ms);
            options.holder = format!("drill-worker-{}", std::process::id());
            let invoked = now_ns();
            let grant = client.acquire_once(&options).await?;
            let completed = now_ns();
            report(
                json!({"event": "granted", "epoch": grant.epoch, "lease_id": grant.lease_id,
                          "token": grant.token, "invoked": invoked, "completed": completed}),
            );
            (grant.token, Some(invoked))
        }
    };
    if plan.activate {
        let invoked = now_ns();
        let outcome = target.activate(&lock, &token).await;
        report(
            json!({"event": "activate", "outcome": outcome, "invoked": invoked, "completed": now_ns()}),
        );
    }
    if plan.pause == PausePoint::AfterAcquire {
        report(json!({"event": "pausing", "point": "after-acquire"}));
        stop_self();
    }
    if plan.pause == PausePoint::BeforeWrite {
        // The check every careful worker makes; it cannot see the pause that follows it.
        let valid = acquired_at.is_none_or(|at| now_ns() - at < plan.ttl_ms * 1_000_000);
        report(json!({"event": "pausing", "point": "before-write", "lease_valid": valid}));
        stop_self();
    }
    if plan.hold_before_write {
        report(json!({"event": "ready"}));
        let mut line = String::new();
        tokio::io::AsyncBufReadExt::read_line(
            &mut tokio::io::BufReader::new(tokio::io::stdin()),
            &mut line,
        )
        .await?;
    }
    for key in &plan.keys {
        let value = format!("{}@{key}", plan.value);
        report(json!({"event": "sending", "key": key}));
        let invoked = now_ns();
        let outcome = target.write(&lock, key, &token, &value).await;
        report(
            json!({"event": "write", "key": key, "value": value, "outcome": outcome,
                      "invoked": invoked, "completed": now_ns()}),
        );
    }
    report(json!({"event": "done"}));
    Ok(())
}
