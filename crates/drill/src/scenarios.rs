//! The scenarios. Each iteration records a [`History`] and hands it to the report's checker.

use std::time::Duration;

use palisade_client::AcquireOptions;
use palisade_core::{Epoch, HolderId, LockName, TokenSigner};
use palisade_fence::conformance::alter_epoch;
use palisade_history::{Entry, History, Op, Outcome, TokenKind};
use serde_json::Value;

use crate::clock::now_ns;
use crate::env::{DrillEnv, WorkerSpec};
use crate::proxy::BufferingProxy;
use crate::target::Target;
use crate::worker::PausePoint;
use crate::{ResourceSpec, Scenario, ScenarioReport};

/// Runs one iteration; false when its history violates a property.
pub async fn run_iteration(
    env: &DrillEnv,
    scenario: Scenario,
    iteration: usize,
    report: &mut ScenarioReport,
) -> anyhow::Result<bool> {
    let mut history = History::default();
    let lock = format!("drill/{}/{}/{iteration}", scenario.name(), env.run);
    match scenario {
        Scenario::StaleProcess => {
            stale_process(env, &lock, iteration, &mut history, report).await?
        }
        Scenario::DelayedDelivery => delayed_delivery(env, &lock, &mut history).await?,
        Scenario::DuplicateToken => duplicate_token(env, &lock, &mut history).await?,
        Scenario::ForgedToken => forged_token(env, &lock, &mut history).await?,
        Scenario::Bypass => bypass(env, &lock, &mut history).await?,
        Scenario::CoordinatorFailover => {
            anyhow::bail!("coordinator-failover runs its own cluster (see `failover::run`)")
        }
        Scenario::Restore | Scenario::ResourceRestore | Scenario::Rollback => {
            anyhow::bail!("the restore drills run their own processes (see `restore::run`)")
        }
        Scenario::Effects => {
            anyhow::bail!("the effects drill runs its own processes (see `effects::run`)")
        }
    }
    Ok(report.absorb(&history, scenario.mode()))
}

fn keys(env: &DrillEnv) -> Vec<String> {
    (0..env.config.keys.max(1))
        .map(|k| format!("k{k}"))
        .collect()
}

fn outcome(code: &str) -> Outcome {
    match code {
        "accepted" => Outcome::Accepted,
        "replay" => Outcome::Replayed,
        error if error.starts_with("error") => Outcome::Unknown,
        reason => Outcome::Rejected {
            reason: reason.to_owned(),
        },
    }
}

fn entry(
    process: &str,
    lock: &str,
    op: Op,
    invoked: u64,
    completed: u64,
    outcome: Outcome,
) -> Entry {
    Entry {
        process: process.to_owned(),
        lock: lock.to_owned(),
        op,
        invoked,
        completed,
        outcome,
    }
}

/// Records a worker's events (grant, activation, writes) in the history.
fn record_worker(
    history: &mut History,
    process: &str,
    lock: &str,
    events: &[Value],
    epoch: u64,
    token: TokenKind,
) -> u64 {
    let mut epoch = epoch;
    for event in events {
        let (invoked, completed) = (
            event["invoked"].as_u64().unwrap_or(0),
            event["completed"].as_u64().unwrap_or(0),
        );
        let reported = || outcome(event["outcome"].as_str().unwrap_or(""));
        match event["event"].as_str() {
            Some("granted") => {
                epoch = event["epoch"].as_u64().unwrap_or(0);
                history.push(entry(
                    process,
                    lock,
                    Op::Acquire,
                    invoked,
                    completed,
                    Outcome::Granted { epoch },
                ));
            }
            Some("activate") => {
                let op = Op::Activate { epoch, token };
                history.push(entry(process, lock, op, invoked, completed, reported()));
            }
            Some("write") => {
                let op = Op::Write {
                    key: event["key"].as_str().unwrap_or("").to_owned(),
                    epoch,
                    seq: None,
                    value: event["value"].as_str().unwrap_or("").to_owned(),
                    token,
                };
                history.push(entry(process, lock, op, invoked, completed, reported()));
            }
            _ => {}
        }
    }
    epoch
}

/// The orchestrator acts as owner B: acquire (waiting for the lock), activate, write every key.
async fn owner_b(
    env: &DrillEnv,
    lock: &str,
    target: &Target,
    activate: bool,
    history: &mut History,
) -> anyhow::Result<(u64, String)> {
    let mut options = AcquireOptions::new(lock);
    options.ttl = Duration::from_secs(30);
    options.wait = Duration::from_millis(env.config.ttl_ms * 4 + 1_000);
    options.holder = "drill-owner-b".into();
    let invoked = now_ns();
    let grant = env.client.acquire_once(&options).await?;
    history.push(entry(
        "B",
        lock,
        Op::Acquire,
        invoked,
        now_ns(),
        Outcome::Granted { epoch: grant.epoch },
    ));
    let name = LockName::new(lock)?;
    if activate {
        let invoked = now_ns();
        let result = target.activate(&name, &grant.token).await;
        history.push(entry(
            "B",
            lock,
            Op::Activate {
                epoch: grant.epoch,
                token: TokenKind::Valid,
            },
            invoked,
            now_ns(),
            outcome(&result),
        ));
    }
    for key in keys(env) {
        let value = format!("B@{key}");
        let invoked = now_ns();
        let result = target.write(&name, &key, &grant.token, &value).await;
        let op = Op::Write {
            key,
            epoch: grant.epoch,
            seq: None,
            value,
            token: TokenKind::Valid,
        };
        history.push(entry("B", lock, op, invoked, now_ns(), outcome(&result)));
    }
    env.client.release(&grant.lease_id).await?;
    Ok((grant.epoch, grant.token))
}

async fn final_reads(
    env: &DrillEnv,
    lock: &str,
    target: &Target,
    history: &mut History,
) -> anyhow::Result<()> {
    let name = LockName::new(lock)?;
    for key in keys(env) {
        let at = now_ns();
        let (value, epoch) = target.read(&name, &key).await?;
        history.push(entry(
            "reader",
            lock,
            Op::Read { key },
            at,
            now_ns(),
            Outcome::Value { value, epoch },
        ));
    }
    Ok(())
}

async fn target(env: &DrillEnv, activated: bool) -> anyhow::Result<Target> {
    let (url, mode) = if activated {
        (&env.activated_target, palisade_fence::FenceMode::Activated)
    } else {
        (&env.strict_target, palisade_fence::FenceMode::Strict)
    };
    Target::connect(url, mode, &env.coordinator_url, &env.run).await
}

async fn stale_process(
    env: &DrillEnv,
    lock: &str,
    iteration: usize,
    history: &mut History,
    report: &mut ScenarioReport,
) -> anyhow::Result<()> {
    let pause = if iteration.is_multiple_of(2) {
        PausePoint::AfterAcquire
    } else {
        PausePoint::BeforeWrite
    };
    let keys = keys(env);
    let mut a = env.worker(WorkerSpec {
        lock,
        keys: &keys,
        value: "A",
        token: None,
        activated: true,
        activate: true,
        pause,
        hold_before_write: false,
        target: None,
    })?;
    let before = a.until("pausing").await?;
    let point = before
        .last()
        .and_then(|e| e["point"].as_str())
        .unwrap_or("?")
        .to_owned();
    a.wait_stopped().await?;
    *report.pause_points.entry(point).or_default() += 1;
    let epoch = record_worker(history, "A", lock, &before, 0, TokenKind::Valid);
    // A is stopped. Its lease expires; B acquires a newer epoch, activates and commits.
    let target = target(env, true).await?;
    let (b_epoch, _) = owner_b(env, lock, &target, true, history).await?;
    anyhow::ensure!(
        b_epoch > epoch,
        "P1: B got epoch {b_epoch} after A's {epoch}"
    );
    a.resume()?;
    let after = a.until("done").await?;
    record_worker(history, "A", lock, &after, epoch, TokenKind::Valid);
    final_reads(env, lock, &target, history).await
}

async fn delayed_delivery(env: &DrillEnv, lock: &str, history: &mut History) -> anyhow::Result<()> {
    let upstream = upstream_address(&env.activated_target)?;
    let proxy = BufferingProxy::start(upstream, false).await?;
    let via_proxy =
        env.activated_target
            .replacen(&upstream.to_string(), &proxy.local_addr.to_string(), 1);
    let keys = keys(env);
    let mut a = env.worker(WorkerSpec {
        lock,
        keys: &keys[..1],
        value: "A",
        token: None,
        activated: true,
        activate: true,
        pause: PausePoint::None,
        hold_before_write: true,
        target: Some(&via_proxy),
    })?;
    let before = a.until("ready").await?;
    let epoch = record_worker(history, "A", lock, &before, 0, TokenKind::Valid);
    // From now on the proxy keeps everything A sends.
    proxy.hold();
    a.go().await?;
    a.until("sending").await?;
    for _ in 0..2_000 {
        if proxy.held_bytes() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    anyhow::ensure!(proxy.held_bytes() > 0, "A's write never reached the proxy");
    let target = target(env, true).await?;
    let (b_epoch, _) = owner_b(env, lock, &target, true, history).await?;
    anyhow::ensure!(
        b_epoch > epoch,
        "P1: B got epoch {b_epoch} after A's {epoch}"
    );
    let released_at = now_ns();
    proxy.release();
    let mut after = a.until("done").await?;
    // The resource cannot see A's write before the proxy delivers it: that is its invocation
    // as far as the resource is concerned, and it comes after B's commit.
    for event in &mut after {
        if event["event"] == "write" {
            event["invoked"] = released_at.into();
        }
    }
    record_worker(history, "A", lock, &after, epoch, TokenKind::Valid);
    final_reads(env, lock, &target, history).await
}

/// The loopback address in a target URL (`http://127.0.0.1:P` or `postgres://u@127.0.0.1:P/db`).
fn upstream_address(url: &str) -> anyhow::Result<std::net::SocketAddr> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    let host_port = rest.split(['/', '?']).next().unwrap_or(rest);
    let address: std::net::SocketAddr = host_port.parse().map_err(|_| {
        anyhow::anyhow!("delayed-delivery needs a numeric loopback host:port in {url:?}")
    })?;
    anyhow::ensure!(
        address.ip().is_loopback(),
        "the drill proxy only works on loopback"
    );
    Ok(address)
}

async fn duplicate_token(env: &DrillEnv, lock: &str, history: &mut History) -> anyhow::Result<()> {
    let mut options = AcquireOptions::new(lock);
    options.ttl = Duration::from_secs(30);
    let invoked = now_ns();
    let grant = env.client.acquire_once(&options).await?;
    history.push(entry(
        "owner",
        lock,
        Op::Acquire,
        invoked,
        now_ns(),
        Outcome::Granted { epoch: grant.epoch },
    ));
    let keys = keys(env);
    let one_key = &keys[..1];
    // Two processes present the same token at once, on the same key.
    let spec = |value: &'static str| WorkerSpec {
        lock,
        keys: one_key,
        value,
        token: Some(&grant.token),
        activated: false,
        activate: false,
        pause: PausePoint::None,
        hold_before_write: false,
        target: None,
    };
    let mut first = env.worker(spec("D1"))?;
    let mut second = env.worker(spec("D2"))?;
    let (one, two) = tokio::join!(first.until("done"), second.until("done"));
    record_worker(history, "D1", lock, &one?, grant.epoch, TokenKind::Valid);
    record_worker(history, "D2", lock, &two?, grant.epoch, TokenKind::Valid);
    env.client.release(&grant.lease_id).await?;
    // A newer owner writes; then the captured token is replayed.
    let target = target(env, false).await?;
    owner_b(env, lock, &target, false, history).await?;
    let mut replay = env.worker(spec("replayed"))?;
    let events = replay.until("done").await?;
    record_worker(
        history,
        "replay",
        lock,
        &events,
        grant.epoch,
        TokenKind::Valid,
    );
    final_reads(env, lock, &target, history).await
}

async fn forged_token(env: &DrillEnv, lock: &str, history: &mut History) -> anyhow::Result<()> {
    let mut options = AcquireOptions::new(lock);
    options.ttl = Duration::from_secs(30);
    let grant = env.client.acquire_once(&options).await?;
    let other_lock = format!("{lock}-other");
    let other = env
        .client
        .acquire_once(&AcquireOptions::new(other_lock))
        .await?;
    let stranger = TokenSigner::from_secret_bytes(&[0x66; 32]);
    let name = LockName::new(lock)?;
    let holder = HolderId::new("mallory")?;
    let forge = |epoch: u64| {
        stranger.sign(
            &name,
            Epoch(epoch),
            &holder,
            &palisade_core::Principal::anonymous(),
            0,
        )
    };
    let forged = [
        (alter_epoch(&grant.token), grant.epoch ^ 0x40),
        (forge(u64::MAX / 2), u64::MAX / 2),
        (forge(grant.epoch + 1), grant.epoch + 1),
        (other.token.clone(), other.epoch),
        ("pt1.AAAAAAAA".to_owned(), 0),
    ];
    let keys = keys(env);
    for (index, (token, epoch)) in forged.iter().enumerate() {
        let process = format!("forger{index}");
        let mut worker = env.worker(WorkerSpec {
            lock,
            keys: &keys[..1],
            value: "forged",
            token: Some(token),
            activated: false,
            activate: false,
            pause: PausePoint::None,
            hold_before_write: false,
            target: None,
        })?;
        let events = worker.until("done").await?;
        record_worker(history, &process, lock, &events, *epoch, TokenKind::Forged);
    }
    env.client.release(&grant.lease_id).await?;
    env.client.release(&other.lease_id).await?;
    // The fence did not move: the real next owner still writes.
    let target = target(env, false).await?;
    owner_b(env, lock, &target, false, history).await?;
    final_reads(env, lock, &target, history).await
}

async fn bypass(env: &DrillEnv, lock: &str, history: &mut History) -> anyhow::Result<()> {
    let key = "k0".to_string();
    let attempts = match &env.config.resource {
        ResourceSpec::Embedded => bypass_store(env, lock).await?,
        ResourceSpec::Postgres(_) => bypass_table(env, lock, &key).await?,
    };
    for (path, succeeded, at) in attempts {
        let outcome = if succeeded {
            Outcome::Accepted
        } else {
            Outcome::Rejected {
                reason: "refused".into(),
            }
        };
        history.push(entry(
            "bypass",
            lock,
            Op::Bypass {
                key: key.clone(),
                path: path.into(),
            },
            at,
            at,
            outcome,
        ));
    }
    Ok(())
}

/// A bypass attempt: its path, whether it was accepted, when it was answered (ns).
type Attempt = (&'static str, bool, u64);

/// Writes to the reference store that skip the fence.
async fn bypass_store(env: &DrillEnv, lock: &str) -> anyhow::Result<Vec<Attempt>> {
    let base = &env.strict_target;
    let segment = palisade_client::encode_path_segment(lock);
    let url = format!("{base}/v1/kv/{segment}/k0");
    let no_token = env.http.put(&url).body("bypass").send().await?;
    let no_token = (
        "PUT without a token",
        no_token.status().is_success(),
        now_ns(),
    );
    let bad_header = env
        .http
        .put(&url)
        .header("Palisade-Token", "admin")
        .body("bypass")
        .send()
        .await?;
    let bad_header = (
        "PUT with a non-token header",
        bad_header.status().is_success(),
        now_ns(),
    );
    let activate = format!("{base}/v1/fences/{segment}/activate");
    let activation = env.http.post(&activate).send().await?;
    let activation = (
        "activate without a token",
        activation.status().is_success(),
        now_ns(),
    );
    // The store's file is locked by the running store: no second writer can open it.
    let file = env.strict_store_file.clone().expect("embedded store file");
    let opened = redb::Database::create(&file).is_ok();
    let opened = ("open the store's file directly", opened, now_ns());
    Ok(vec![no_token, bad_header, activation, opened])
}

/// Plain SQL on the guarded table that skips the fence (after one fenced insert, so that
/// every statement has a row to hit).
async fn bypass_table(env: &DrillEnv, lock: &str, key: &str) -> anyhow::Result<Vec<Attempt>> {
    let (fence, guarded, table) = env.table.as_ref().expect("the drill table");
    let grant = env.client.acquire_once(&AcquireOptions::new(lock)).await?;
    let name = LockName::new(lock)?;
    let id = crate::target::row_id(&name, key);
    let created = guarded
        .insert(fence, &name, &id, &grant.token, &"owner")
        .await?;
    env.client.release(&grant.lease_id).await?;
    anyhow::ensure!(
        matches!(created, palisade_fence::Outcome::Accepted { .. }),
        "the owner's fenced insert was refused: {created:?}"
    );
    let client = fence.pool().get().await?;
    let mut attempts = Vec::new();
    for (path, sql) in [
        (
            "plain UPDATE",
            format!("UPDATE {table} SET payload = 'bypass'"),
        ),
        (
            "UPDATE lowering the fence",
            format!("UPDATE {table} SET payload = 'bypass', last_fence = 0"),
        ),
        (
            "UPDATE moving a row to another lock",
            format!("UPDATE {table} SET lock = 'other', last_fence = last_fence + 1"),
        ),
        (
            "INSERT outside the fenced path",
            format!("INSERT INTO {table} (id, lock, payload) VALUES ('x', 'x', 'bypass')"),
        ),
        (
            "DELETE outside the fenced path",
            format!("DELETE FROM {table}"),
        ),
        ("TRUNCATE", format!("TRUNCATE {table}")),
        (
            "UPDATE with the triggers in replica mode",
            format!(
                "BEGIN; SET LOCAL session_replication_role = replica; \
                 UPDATE {table} SET payload = 'bypass', last_fence = 0; COMMIT"
            ),
        ),
    ] {
        let succeeded = client.batch_execute(&sql).await.is_ok();
        // A failed transaction block stays open until it is rolled back.
        client.batch_execute("ROLLBACK").await.ok();
        attempts.push((path, succeeded, now_ns()));
    }
    Ok(attempts)
}
