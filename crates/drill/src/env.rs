//! The processes of a drill: the coordinator, the stores (or the user's database), workers.

use std::io::{BufRead as _, BufReader as StdBufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;
use palisade_fence::FenceMode;
use palisade_fence_postgres::{GuardedTable, PostgresFence, RowLock};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{ChildStdin, ChildStdout};

use crate::target::drill_table_name;
use crate::worker::PausePoint;
use crate::{DrillConfig, ResourceSpec};

/// How long a drill waits for one worker event before it calls the worker hung.
pub const WORKER_EVENT_TIMEOUT: Duration = Duration::from_secs(30);

/// A service process whose address is read from its first "listening on" line; dropping it
/// kills it (SIGKILL) and reaps it.
pub(crate) struct Service {
    child: Child,
    pub(crate) address: String,
}

impl Service {
    pub(crate) fn start(binary: &Path, args: &[&str]) -> anyhow::Result<Self> {
        let mut child = Command::new(binary)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("start {} {}", binary.display(), args.join(" ")))?;
        let mut lines = StdBufReader::new(child.stderr.take().expect("piped")).lines();
        let address = loop {
            let line = lines
                .next()
                .context("the service exited before printing its address")??;
            if let Some((_, address)) = line.split_once(" listening on ") {
                break address.trim().to_owned();
            }
        };
        std::thread::spawn(move || lines.for_each(drop));
        Ok(Self { child, address })
    }
}

impl Service {
    /// SIGTERM, then waits (at most 10 s, then SIGKILL) for the process to exit: a clean stop.
    pub(crate) fn terminate(mut self) -> anyhow::Result<()> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id())?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
        for _ in 0..1_000 {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        anyhow::bail!("the service did not stop within 10 s of SIGTERM")
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Everything a drill runs against.
pub struct DrillEnv {
    pub config: DrillConfig,
    /// Unique id of this drill run (names locks and the PostgreSQL table).
    pub run: String,
    pub coordinator_url: String,
    /// Target of activated-mode scenarios (a store URL or the PostgreSQL URL).
    pub activated_target: String,
    /// Target of strict-mode scenarios.
    pub strict_target: String,
    /// The strict store's data file (embedded), for the bypass drill.
    pub strict_store_file: Option<PathBuf>,
    pub client: palisade_client::Client,
    pub http: reqwest::Client,
    /// The drill's PostgreSQL table (postgres only).
    pub table: Option<(PostgresFence, GuardedTable, String)>,
    _services: Vec<Service>,
    _dir: tempfile::TempDir,
}

impl DrillEnv {
    pub async fn start(config: &DrillConfig) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let run = format!(
            "{}_{}",
            std::process::id(),
            crate::clock::now_ns() % 1_000_000_007
        );
        let binary = &config.binary;
        let data = |name: &str| dir.path().join(name).display().to_string();
        let coordinator = Service::start(
            binary,
            &[
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                &data("coordinator"),
            ],
        )?;
        let coordinator_url = format!("http://{}", coordinator.address);
        let client = palisade_client::Client::connect(&[&coordinator_url]).await?;
        let mut services = vec![coordinator];
        let (activated_target, strict_target, strict_store_file, table) = match &config.resource {
            ResourceSpec::Embedded => {
                let (activated, strict) = start_stores(binary, &coordinator_url, dir.path())?;
                let urls = (
                    format!("http://{}", activated.address),
                    format!("http://{}", strict.address),
                );
                services.push(activated);
                services.push(strict);
                let file = dir.path().join("strict-store").join("fence.redb");
                (urls.0, urls.1, Some(file), None)
            }
            ResourceSpec::Postgres(url) => {
                let table = create_table(url, &coordinator_url, &run).await?;
                (url.clone(), url.clone(), None, Some(table))
            }
        };
        Ok(Self {
            config: config.clone(),
            run,
            coordinator_url,
            activated_target,
            strict_target,
            strict_store_file,
            client,
            http: reqwest::Client::new(),
            table,
            _services: services,
            _dir: dir,
        })
    }

    /// Stops every process, drops the drill's table and deletes the drill's rows from
    /// Palisade's own tables.
    pub async fn stop(self) {
        if let Some((fence, _, name)) = &self.table {
            if let Ok(client) = fence.pool().get().await {
                let _ = client
                    .batch_execute(&format!(
                        "BEGIN; SELECT palisade_drop_guard('{name}'); DROP TABLE {name}; COMMIT"
                    ))
                    .await;
                // The activated-mode scenarios write to Palisade's own tables.
                let pattern = format!("drill/%/{}/%", self.run);
                for table in ["palisade_kv", "palisade_fences", "palisade_ledger"] {
                    let sql = format!("DELETE FROM {table} WHERE lock LIKE $1");
                    if let Err(error) = client.execute(&sql, &[&pattern]).await {
                        tracing::warn!(%error, table, "could not delete the drill's rows");
                    }
                }
            }
        }
    }

    /// Starts a worker process.
    pub fn worker(&self, spec: WorkerSpec<'_>) -> anyhow::Result<WorkerProcess> {
        let mode = if spec.activated {
            "activated"
        } else {
            "strict"
        };
        let target = spec.target.unwrap_or(if spec.activated {
            &self.activated_target
        } else {
            &self.strict_target
        });
        let mut command = tokio::process::Command::new(&self.config.binary);
        command
            .arg("drill-worker")
            .args([
                "--coordinator",
                &self.coordinator_url,
                "--target",
                target,
                "--mode",
                mode,
            ])
            .args([
                "--run",
                &self.run,
                "--lock",
                spec.lock,
                "--keys",
                &spec.keys.join(","),
            ])
            .args([
                "--value",
                spec.value,
                "--ttl-ms",
                &self.config.ttl_ms.to_string(),
            ])
            .args([
                "--pause",
                match spec.pause {
                    PausePoint::None => "none",
                    PausePoint::AfterAcquire => "after-acquire",
                    PausePoint::BeforeWrite => "before-write",
                },
            ])
            .env("RUST_LOG", "error")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(token) = spec.token {
            command.args(["--token", token]);
        }
        if spec.activate {
            command.arg("--activate");
        }
        if spec.hold_before_write {
            command.arg("--hold-before-write");
        }
        WorkerProcess::spawn(command)
    }
}

async fn create_table(
    url: &str,
    coordinator: &str,
    run: &str,
) -> anyhow::Result<(PostgresFence, GuardedTable, String)> {
    let (verifier, floors) = crate::target::coordinator_keys(coordinator).await?;
    let fence = PostgresFence::connect(url, 4, FenceMode::Strict, verifier)
        .await?
        .with_floors(floors);
    let name = drill_table_name(run);
    let client = fence.pool().get().await?;
    // Each row names the lock that guards it (the drill's locks change every iteration); a
    // worker creates its lock's rows through the fence on first write.
    client
        .batch_execute(&format!(
            "CREATE TABLE {name} (id text PRIMARY KEY, lock text NOT NULL,
                                  payload text NOT NULL, last_fence bigint NOT NULL DEFAULT 0)"
        ))
        .await?;
    drop(client);
    let table = GuardedTable::new(&name, "id", "payload", RowLock::Column("lock".into()))?;
    table.install_guard(&fence, true).await?;
    Ok((fence, table, name))
}

/// What a worker should do.
pub struct WorkerSpec<'a> {
    pub lock: &'a str,
    pub keys: &'a [String],
    pub value: &'a str,
    pub token: Option<&'a str>,
    /// Activated-mode target (else strict).
    pub activated: bool,
    /// Activate after acquiring.
    pub activate: bool,
    pub pause: PausePoint,
    /// Wait for a `go` line on stdin before writing.
    pub hold_before_write: bool,
    /// Another target URL (a proxy), instead of the scenario's.
    pub target: Option<&'a str>,
}

/// A running worker and its event stream.
pub struct WorkerProcess {
    _child: tokio::process::Child,
    pub pid: u32,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
    stdin: Option<ChildStdin>,
}

impl WorkerProcess {
    /// Starts `command` (stdin and stdout piped, killed on drop) as a worker.
    pub(crate) fn spawn(mut command: tokio::process::Command) -> anyhow::Result<Self> {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().context("start a drill worker")?;
        let stdout = child.stdout.take().expect("piped");
        let stdin = child.stdin.take();
        let pid = child.id().context("the worker has a pid")?;
        Ok(WorkerProcess {
            _child: child,
            pid,
            lines: BufReader::new(stdout).lines(),
            stdin,
        })
    }

    /// SIGKILL, and waits until the process is gone.
    pub async fn kill9(&mut self) -> anyhow::Result<()> {
        self._child.start_kill()?;
        self._child.wait().await?;
        Ok(())
    }

    /// Waits (bounded) for the process to exit by itself.
    pub async fn wait_exit(&mut self) -> anyhow::Result<()> {
        tokio::time::timeout(WORKER_EVENT_TIMEOUT, self._child.wait())
            .await
            .context("the worker did not exit within 30 s")??;
        Ok(())
    }

    /// The next event, or an error if the worker exits or hangs.
    pub async fn next_event(&mut self) -> anyhow::Result<Value> {
        let line = tokio::time::timeout(WORKER_EVENT_TIMEOUT, self.lines.next_line())
            .await
            .context("the worker sent nothing for 30 s")??
            .context("the worker exited early")?;
        serde_json::from_str(&line).with_context(|| format!("worker said {line:?}"))
    }

    /// Events up to and including the first of kind `event`.
    pub async fn until(&mut self, event: &str) -> anyhow::Result<Vec<Value>> {
        let mut events = Vec::new();
        loop {
            let next = self.next_event().await?;
            let done = next["event"] == event;
            events.push(next);
            if done {
                return Ok(events);
            }
        }
    }

    /// Tells a worker started with `hold_before_write` to go on.
    pub async fn go(&mut self) -> anyhow::Result<()> {
        let stdin = self.stdin.as_mut().context("no stdin")?;
        stdin.write_all(b"go\n").await?;
        stdin.flush().await?;
        Ok(())
    }

    /// True once the kernel reports the process stopped (state `T`).
    pub fn is_stopped(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|stat| {
                stat.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().starts_with('T'))
            })
            .unwrap_or(false)
    }

    /// Waits (bounded) until the worker has stopped itself.
    pub async fn wait_stopped(&self) -> anyhow::Result<()> {
        for _ in 0..2_000 {
            if self.is_stopped() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        anyhow::bail!("worker {} did not stop", self.pid)
    }

    /// SIGCONT.
    pub fn resume(&self) -> anyhow::Result<()> {
        let pid = nix::unistd::Pid::from_raw(self.pid as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT)?;
        Ok(())
    }
}

/// Two reference stores trusting the coordinator at `coordinator_url`, in `dir`: one in
/// activated mode, one in strict mode.
fn start_stores(
    binary: &Path,
    coordinator_url: &str,
    dir: &Path,
) -> anyhow::Result<(Service, Service)> {
    let store = |mode: &str, name: &str| {
        Service::start(
            binary,
            &[
                "resource",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--mode",
                mode,
                "--coordinator",
                coordinator_url,
                "--data-dir",
                &dir.join(name).display().to_string(),
            ],
        )
    };
    Ok((
        store("activated", "activated-store")?,
        store("strict", "strict-store")?,
    ))
}
