//! `restore` and `resource-restore`: backups and restores with real processes (P6), checked by
//! the history checker — a coordinator (`palisade serve`) and a reference store (`palisade
//! resource serve`, strict) of the drill's own, the operator's commands (`palisade backup`,
//! `palisade restore`, `palisade resource restore`) and `cp -a`.
//!
//! `restore`, one lock across iterations, alternating two orders:
//! - `lost`: three more owners write after an online backup (taken once: every later `lost`
//!   restores the same backup again), the coordinator is killed and its machine lost (data
//!   directory and high-water file), `palisade restore --floor-from` the store into a new
//!   directory;
//! - `copy-back`: the stopped coordinator's directory is copied with `cp -a`, three more
//!   owners write, it is killed and the copy put back.
//!
//! `resource-restore`, alternating:
//! - `store`: the stopped store's directory is copied, three more owners write (raising the
//!   fence), the store is killed and the copy put back; every owner's write is refused until
//!   `palisade resource restore` applies the coordinator's floor;
//! - `store+coordinator`: the same, and the coordinator is lost too and restored first (with
//!   `--floor-from` the restored store), then the store from the restored coordinator.
//!
//! After each restore every earlier owner writes again (obsolete: each was superseded), and the
//! next owner acquires and writes. Every grant and write goes into the history: P1 (no epoch
//! granted twice, later grants above earlier ones — across restores) and P2 (no write below an
//! accepted epoch — across copy-backs of the store) are checked on it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use palisade_client::{AcquireOptions, Client};
use palisade_core::restore::RESTORE_MARGIN;
use palisade_core::LockName;
use palisade_history::{Entry, History, Mode, Op, Outcome, TokenKind};
use serde_json::Value;

use crate::env::Service;
use crate::target::Target;
use crate::ScenarioReport;

/// Owners that write between a backup (or copy) and the restore.
const OWNERS_BETWEEN: usize = 3;
/// The key every owner writes.
const KEY: &str = "balance";

/// Figures of a restore drill.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RestoreFigures {
    /// Iterations per order.
    pub orders: BTreeMap<String, usize>,
    /// Restores done (coordinator restores, copy-backs, store restores).
    pub restores: usize,
    /// Grants after a restore.
    pub grants_after_restore: usize,
    /// Epochs granted twice (always 0: P1 is checked on the history too).
    pub epochs_reused: usize,
    /// Writes by superseded owners after a restore, and of those accepted (0).
    pub obsolete_attempted: usize,
    /// Of `obsolete_attempted`, accepted.
    pub obsolete_accepted: usize,
    /// Writes refused because the store waited for its restore floor.
    pub refused_until_floor: usize,
    /// Restores after which the next owner wrote.
    pub progressed: usize,
    /// From the restore (`palisade restore` or `palisade resource restore` starting, or the copy
    /// put back) to the next owner's grant, ms.
    pub restore_to_grant_ms: Vec<u64>,
    /// From the restore to the next owner's first accepted write, ms, per restore (the store
    /// fetches a restored coordinator's new key at most once a second).
    pub restore_to_write_ms: Vec<u64>,
    /// Median of `restore_to_write_ms`.
    pub restore_to_write_p50_ms: u64,
    /// Largest jump of the epoch counter across one restore (the first restore from a
    /// backup jumps to the clock floor, ms × 2^20; later ones add at most 2^32 beyond it).
    pub epochs_consumed_max: u64,
    /// The last epoch issued.
    pub last_epoch: u64,
    /// How many more restores the epoch space (2^63, PostgreSQL's bigint) holds after the last
    /// epoch, each consuming at most [`RESTORE_MARGIN`] beyond the clock floor.
    pub restores_left: u64,
}

/// Which restore drill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The coordinator is restored.
    Coordinator,
    /// The store is restored (and in every other iteration the coordinator too).
    Resource,
    /// The coordinator's whole volume (data directory and high-water file) put back from a
    /// snapshot; nothing beside it survives, so only the clock floor can keep P1.
    Rollback,
}

struct Process {
    args: Vec<String>,
    service: Option<Service>,
}

impl Process {
    fn start(&mut self, binary: &Path) -> anyhow::Result<()> {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.service = Some(Service::start(binary, &args)?);
        Ok(())
    }

    fn kill9(&mut self) {
        self.service = None;
    }

    /// SIGTERM, and waits for the process to exit.
    fn stop(&mut self) -> anyhow::Result<()> {
        if let Some(service) = self.service.take() {
            service.terminate()?;
        }
        Ok(())
    }
}

struct Drill<'a> {
    binary: &'a Path,
    dir: PathBuf,
    coordinator_url: String,
    coordinator_dir: PathBuf,
    coordinator: Process,
    store_url: String,
    /// The store, as writers reach it (one HTTP client for the whole drill).
    store_target: Target,
    store_dir: PathBuf,
    store: Process,
    lock: LockName,
    origin: Instant,
    history: History,
    /// Every owner so far: (process name, epoch, token).
    owners: Vec<(String, u64, String)>,
    figures: RestoreFigures,
}

fn free_address() -> anyhow::Result<String> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .to_string())
}

fn cp_a(from: &Path, to: &Path) -> anyhow::Result<()> {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()?;
    anyhow::ensure!(
        status.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
    Ok(())
}

fn remove_dir(path: &Path) -> anyhow::Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

impl Drill<'_> {
    fn now(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }

    /// Runs `palisade ARGS --json`; its JSON.
    async fn command(&self, args: &[&str]) -> anyhow::Result<Value> {
        let output = tokio::process::Command::new(self.binary)
            .args(args)
            .arg("--json")
            .env("RUST_LOG", "error")
            .output()
            .await?;
        anyhow::ensure!(
            output.status.success(),
            "palisade {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(serde_json::from_slice(&output.stdout)?)
    }

    async fn client(&self) -> anyhow::Result<Client> {
        Ok(Client::connect(&[self.coordinator_url.as_str()]).await?)
    }

    /// The next owner: acquire (recorded), release at once (its token stays valid for writes
    /// until a newer epoch reaches the store).
    async fn next_owner(&mut self) -> anyhow::Result<(String, u64, String)> {
        let client = self.client().await?;
        let name = format!("owner{}", self.owners.len());
        let mut options = AcquireOptions::new(self.lock.as_str());
        options.ttl = Duration::from_secs(10);
        options.wait = Duration::from_secs(10);
        options.holder = name.clone();
        let invoked = self.now();
        let grant = client.acquire_once(&options).await?;
        self.history.push(Entry {
            process: name.clone(),
            lock: self.lock.to_string(),
            op: Op::Acquire,
            invoked,
            completed: self.now(),
            outcome: Outcome::Granted { epoch: grant.epoch },
        });
        let _ = client.release(&grant.lease_id).await;
        let owner = (name, grant.epoch, grant.token);
        self.owners.push(owner.clone());
        Ok(owner)
    }

    /// A write by `owner` (recorded); its outcome code.
    async fn write(&mut self, owner: &(String, u64, String)) -> anyhow::Result<String> {
        let value = format!("{}@{}", owner.0, self.history.entries.len());
        let invoked = self.now();
        let code = self
            .store_target
            .write(&self.lock, KEY, &owner.2, &value)
            .await;
        let outcome = match code.as_str() {
            "accepted" => Outcome::Accepted,
            error if error.starts_with("error") => Outcome::Unknown,
            reason => Outcome::Rejected {
                reason: reason.to_owned(),
            },
        };
        self.history.push(Entry {
            process: owner.0.clone(),
            lock: self.lock.to_string(),
            op: Op::Write {
                key: KEY.into(),
                epoch: owner.1,
                seq: None,
                value,
                token: TokenKind::Valid,
            },
            invoked,
            completed: self.now(),
            outcome,
        });
        Ok(code)
    }

    /// Owners that write one after the other (each write must be accepted).
    async fn owners_write(&mut self, count: usize) -> anyhow::Result<()> {
        for _ in 0..count {
            let owner = self.next_owner().await?;
            let code = self.write(&owner).await?;
            anyhow::ensure!(code == "accepted", "the current owner was refused: {code}");
        }
        Ok(())
    }

    /// Every superseded owner writes again: each must be refused.
    async fn obsolete_owners_write(&mut self) -> anyhow::Result<()> {
        for owner in self.owners.clone() {
            let code = self.write(&owner).await?;
            self.figures.obsolete_attempted += 1;
            self.figures.obsolete_accepted += usize::from(code == "accepted");
        }
        Ok(())
    }

    /// The next owner after a restore that began at `began`: acquires and writes.
    async fn progress_after(&mut self, began: Instant, last_before: u64) -> anyhow::Result<()> {
        let owner = self.next_owner().await?;
        self.figures
            .restore_to_grant_ms
            .push(began.elapsed().as_millis() as u64);
        self.figures.grants_after_restore += 1;
        self.figures.epochs_consumed_max = self
            .figures
            .epochs_consumed_max
            .max(owner.1.saturating_sub(last_before));
        let code = self.write(&owner).await?;
        anyhow::ensure!(
            code == "accepted",
            "the owner after the restore was refused: {code}"
        );
        self.figures
            .restore_to_write_ms
            .push(began.elapsed().as_millis() as u64);
        self.figures.progressed += 1;
        Ok(())
    }

    fn last_epoch(&self) -> u64 {
        self.owners.iter().map(|o| o.1).max().unwrap_or(0)
    }

    fn high_water(dir: &Path) -> PathBuf {
        palisade_core::witness::beside(dir, ".high-water")
    }

    /// The coordinator is lost and restored from `backup` into a new directory, with the
    /// store's highest fence as a floor.
    async fn restore_coordinator(&mut self, backup: &Path, iteration: usize) -> anyhow::Result<()> {
        self.coordinator.kill9();
        remove_dir(&self.coordinator_dir)?;
        let _ = std::fs::remove_file(Self::high_water(&self.coordinator_dir));
        let restored = self.dir.join(format!("coordinator-{iteration}"));
        let (backup, restored_arg) = (backup.display().to_string(), restored.display().to_string());
        self.command(&[
            "restore",
            "--from",
            &backup,
            "--data-dir",
            &restored_arg,
            "--floor-from",
            &self.store_url.clone(),
        ])
        .await?;
        self.coordinator_dir = restored;
        self.coordinator.args = coordinator_args(&self.coordinator_url, &self.coordinator_dir);
        self.coordinator.start(self.binary)?;
        self.figures.restores += 1;
        Ok(())
    }

    async fn coordinator_iteration(&mut self, iteration: usize) -> anyhow::Result<()> {
        let last_before;
        let began;
        if iteration.is_multiple_of(2) {
            *self.figures.orders.entry("lost".into()).or_default() += 1;
            // One backup for every lost machine: restoring twice from the same backup must be
            // as safe as once.
            let backup = self.dir.join("backup-lost");
            if !backup.exists() {
                let (out, url) = (backup.display().to_string(), self.coordinator_url.clone());
                self.command(&["backup", "--out", &out, "--endpoint", &url])
                    .await?;
            }
            self.owners_write(OWNERS_BETWEEN).await?;
            last_before = self.last_epoch();
            began = Instant::now();
            self.restore_coordinator(&backup, iteration).await?;
        } else {
            *self.figures.orders.entry("copy-back".into()).or_default() += 1;
            self.coordinator.kill9();
            let copy = self.dir.join(format!("copy-{iteration}"));
            cp_a(&self.coordinator_dir, &copy)?;
            self.coordinator.start(self.binary)?;
            self.owners_write(OWNERS_BETWEEN).await?;
            self.coordinator.kill9();
            last_before = self.last_epoch();
            began = Instant::now();
            remove_dir(&self.coordinator_dir)?;
            cp_a(&copy, &self.coordinator_dir)?;
            self.coordinator.start(self.binary)?;
            self.figures.restores += 1;
        }
        self.progress_after(began, last_before).await?;
        self.obsolete_owners_write().await
    }

    /// The coordinator's volume (the folder holding its data directory and high-water file)
    /// is snapshotted while stopped, owners write, the coordinator stops (cleanly or kill -9,
    /// alternating), and the snapshot is put back whole. Every snapshot is taken once and put
    /// back twice, so a volume restored twice from the same snapshot is drilled too.
    async fn rollback_iteration(&mut self, iteration: usize) -> anyhow::Result<()> {
        let volume = self
            .coordinator_dir
            .parent()
            .context("the coordinator's volume")?
            .to_owned();
        let snapshot = self.dir.join(format!("snapshot-{}", iteration / 2));
        let clean = iteration.is_multiple_of(2);
        *self
            .figures
            .orders
            .entry(if clean { "after-stop" } else { "after-kill-9" }.into())
            .or_default() += 1;
        if !snapshot.exists() {
            self.coordinator.stop()?;
            cp_a(&volume, &snapshot)?;
            self.coordinator.start(self.binary)?;
        }
        self.owners_write(OWNERS_BETWEEN).await?;
        if clean {
            self.coordinator.stop()?;
        } else {
            self.coordinator.kill9();
        }
        let last_before = self.last_epoch();
        let began = Instant::now();
        remove_dir(&volume)?;
        cp_a(&snapshot, &volume)?;
        self.coordinator.start(self.binary)?;
        self.figures.restores += 1;
        self.progress_after(began, last_before).await?;
        self.obsolete_owners_write().await
    }

    async fn resource_iteration(&mut self, iteration: usize) -> anyhow::Result<()> {
        let both = iteration % 2 == 1;
        let order = if both { "store+coordinator" } else { "store" };
        *self.figures.orders.entry(order.into()).or_default() += 1;
        let backup = self.dir.join(format!("backup-{iteration}"));
        if both {
            let (out, url) = (backup.display().to_string(), self.coordinator_url.clone());
            self.command(&["backup", "--out", &out, "--endpoint", &url])
                .await?;
        }
        self.store.kill9();
        let copy = self.dir.join(format!("store-copy-{iteration}"));
        cp_a(&self.store_dir, &copy)?;
        self.store.start(self.binary)?;
        self.owners_write(OWNERS_BETWEEN).await?;
        // The store goes back to its copy: the fences of the last owners are forgotten.
        self.store.kill9();
        remove_dir(&self.store_dir)?;
        cp_a(&copy, &self.store_dir)?;
        self.store.start(self.binary)?;
        let last_before = self.last_epoch();
        if both {
            self.restore_coordinator(&backup, iteration).await?;
        }
        // Until the floor is applied nobody writes, not even the last owner.
        for owner in self.owners.clone() {
            let code = self.write(&owner).await?;
            anyhow::ensure!(
                code == "restore_required",
                "a store behind its witness answered {code}"
            );
            self.figures.refused_until_floor += 1;
        }
        self.store.kill9();
        let began = Instant::now();
        let (store_dir, url) = (
            self.store_dir.display().to_string(),
            self.coordinator_url.clone(),
        );
        self.command(&[
            "resource",
            "restore",
            "--data-dir",
            &store_dir,
            "--endpoint",
            &url,
        ])
        .await?;
        self.store.start(self.binary)?;
        self.figures.restores += 1;
        self.progress_after(began, last_before).await?;
        self.obsolete_owners_write().await
    }
}

fn coordinator_args(url: &str, dir: &Path) -> Vec<String> {
    let listen = url.trim_start_matches("http://");
    ["serve", "--listen", listen, "--data-dir"]
        .into_iter()
        .map(str::to_owned)
        .chain([dir.display().to_string()])
        .collect()
}

/// Runs `iterations` restores of `kind` and checks the history.
pub async fn run(
    binary: &Path,
    kind: Kind,
    iterations: usize,
    progress: bool,
    report: &mut ScenarioReport,
) -> anyhow::Result<RestoreFigures> {
    let dir = tempfile::tempdir()?;
    let mut drill = Drill::new(binary, dir.path()).await?;
    drill.coordinator.start(binary)?;
    drill.store.start(binary)?;
    drill
        .owners_write(1)
        .await
        .context("the first owner's write")?;
    let outcome = drill.iterate(kind, iterations, progress).await;
    report.absorb(&drill.history, Mode::Strict);
    // A step that failed because a property broke (an epoch granted again, then refused at
    // the store) is reported as that violation, which the history names; otherwise as an error.
    if report.passed {
        outcome?;
    }
    report.iterations = iterations;
    Ok(drill.figures())
}

impl<'a> Drill<'a> {
    /// A coordinator and a strict reference store in `dir`, on free loopback ports, not
    /// started yet.
    async fn new(binary: &'a Path, dir: &Path) -> anyhow::Result<Self> {
        let coordinator_url = format!("http://{}", free_address()?);
        // In a volume of its own: the rollback drill puts back the folder holding the data
        // directory *and* its high-water file.
        let coordinator_dir = dir.join("volume").join("coordinator");
        std::fs::create_dir_all(dir.join("volume"))?;
        let store_address = free_address()?;
        let store_dir = dir.join("store");
        let store_args = [
            "resource",
            "serve",
            "--listen",
            &store_address,
            "--mode",
            "strict",
            "--coordinator",
            &coordinator_url,
            "--data-dir",
            &store_dir.display().to_string(),
        ]
        .map(str::to_owned)
        .to_vec();
        Ok(Drill {
            binary,
            dir: dir.to_owned(),
            coordinator: Process {
                args: coordinator_args(&coordinator_url, &coordinator_dir),
                service: None,
            },
            coordinator_url,
            coordinator_dir,
            store_url: format!("http://{store_address}"),
            store_target: Target::connect(
                &format!("http://{store_address}"),
                palisade_fence::FenceMode::Strict,
                "",
                "",
            )
            .await?,
            store_dir,
            store: Process {
                args: store_args,
                service: None,
            },
            lock: LockName::new(format!(
                "drill/restore/{}",
                crate::clock::now_ns() % 1_000_000_007
            ))?,
            origin: Instant::now(),
            history: History::default(),
            owners: Vec::new(),
            figures: RestoreFigures::default(),
        })
    }

    /// `iterations` restores of `kind`, up to the first that fails.
    async fn iterate(
        &mut self,
        kind: Kind,
        iterations: usize,
        progress: bool,
    ) -> anyhow::Result<()> {
        let name = match kind {
            Kind::Coordinator => "restore",
            Kind::Resource => "resource-restore",
            Kind::Rollback => "rollback",
        };
        let mut outcome = Ok(());
        for iteration in 0..iterations {
            if progress {
                eprint!("\r{name}: restore {}/{iterations}   ", iteration + 1);
            }
            let step = match kind {
                Kind::Coordinator => self.coordinator_iteration(iteration).await,
                Kind::Resource => self.resource_iteration(iteration).await,
                Kind::Rollback => self.rollback_iteration(iteration).await,
            };
            if let Err(error) = step {
                outcome = Err(error);
                break;
            }
        }
        if progress {
            eprintln!();
        }
        outcome
    }

    /// The drill's figures, with the epochs granted reused, the median time from a restore to
    /// the next owner's write, and the restores left before the epochs run out.
    fn figures(self) -> RestoreFigures {
        let mut figures = self.figures;
        let mut epochs: Vec<u64> = self.owners.iter().map(|o| o.1).collect();
        let granted = epochs.len();
        epochs.sort_unstable();
        epochs.dedup();
        figures.epochs_reused = granted - epochs.len();
        let mut sorted = figures.restore_to_write_ms.clone();
        sorted.sort_unstable();
        figures.restore_to_write_p50_ms = sorted.get(sorted.len() / 2).copied().unwrap_or(0);
        figures.last_epoch = epochs.last().copied().unwrap_or(0);
        figures.restores_left =
            (i64::MAX as u64).saturating_sub(figures.last_epoch) / RESTORE_MARGIN;
        figures
    }
}
