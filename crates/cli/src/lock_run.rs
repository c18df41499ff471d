//! `palisade lock run NAME -- CMD ARGS…`: a command that runs only while this process holds
//! the lock, flock-style, for cron and shell jobs.
//!
//! The lease is kept alive while the command runs. The command gets the lease in its
//! environment (`PALISADE_LOCK`, `PALISADE_EPOCH`, `PALISADE_FENCE_TOKEN`, `PALISADE_LEASE_ID`)
//! to present to the resources it writes: the lease is permission, the fence is protection.
//! When the lease is lost (not renewed in time, or refused), the command's process group gets
//! SIGTERM, then SIGKILL after the grace period, and `lock run` exits with
//! [`LEASE_LOST_EXIT`]. Otherwise the lease is released when the command ends and `lock run`
//! exits with the command's code (128 + N for a command killed by signal N). SIGTERM, SIGINT
//! and SIGHUP sent to `lock run` are passed on to the command.

use std::process::ExitStatus;
use std::time::Duration;

use anyhow::Context as _;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use palisade_client::{AcquireOptions, LeaseHandle};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::EndpointArgs;

/// Exit code of `lock run` when the lease was lost while the command ran (EX_TEMPFAIL: the
/// job may be run again; it was stopped, and its writes after the loss are the fence's to
/// refuse).
pub const LEASE_LOST_EXIT: u8 = 75;

/// What `lock run` is told.
#[derive(clap::Args)]
pub struct RunArgs {
    /// The lock's name: 1–256 bytes of [A-Za-z0-9._/-].
    #[arg(value_parser = crate::parse_lock_name)]
    name: String,
    /// Lease TTL, 10ms to 1h: how long the command may outlive this process's last confirmed
    /// renewal before another owner can be granted the lock.
    #[arg(long, default_value = "10s", value_parser = crate::parse_ttl)]
    ttl: Duration,
    /// How long to wait for a held lock, at most 5m.
    #[arg(long, default_value = "0s", value_parser = crate::parse_wait)]
    wait: Duration,
    /// Holder id recorded in the lease (default: user@host:pid).
    #[arg(long, value_parser = crate::parse_holder)]
    holder: Option<String>,
    /// critical or efficiency [default: what the coordinator's lock policy says].
    #[arg(long, value_parser = ["critical", "efficiency"])]
    class: Option<String>,
    /// After SIGTERM (the lease lost, or a signal passed on), how long the command has before
    /// SIGKILL, at most 5m.
    #[arg(long, default_value = "10s", value_parser = crate::parse_wait)]
    grace: Duration,
    #[command(flatten)]
    endpoint: EndpointArgs,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// The exit code `lock run` ends with, and what to say (nothing when the command's own code
/// is passed on).
#[derive(Debug, thiserror::Error)]
#[error("{}", message.as_deref().unwrap_or("the command failed"))]
pub struct Exit {
    pub code: u8,
    pub message: Option<String>,
}

/// How the command ended.
enum Ended {
    /// By itself, or after a signal `lock run` passed on.
    Itself(ExitStatus),
    /// Stopped because the lease was lost.
    LeaseLost { reason: String },
}

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let mut options = AcquireOptions::new(args.name.clone());
    options.ttl = args.ttl;
    options.wait = args.wait;
    options.class = args
        .class
        .as_deref()
        .map(palisade_core::LockClass::parse)
        .transpose()?;
    if let Some(holder) = args.holder {
        options.holder = holder;
    }
    let client = args.endpoint.connect().await?;
    let mut lease = client.acquire(options).await?;
    let mut child = spawn(&args.command, &lease)?;
    let ended = supervise(&mut child, &mut lease, args.grace).await?;
    match ended {
        Ended::Itself(status) => {
            if let Err(error) = lease.release().await {
                tracing::warn!(%error, "the lease could not be released; it ends at its TTL");
            }
            match code_of(status) {
                0 => Ok(()),
                code => Err(Exit {
                    code,
                    message: None,
                }
                .into()),
            }
        }
        Ended::LeaseLost { reason } => Err(Exit {
            code: LEASE_LOST_EXIT,
            message: Some(format!(
                "the lease on {} was lost ({reason}); the command was stopped",
                args.name
            )),
        }
        .into()),
    }
}

/// Starts the command in a process group of its own (so a signal reaches every process of a
/// shell script), with the lease in its environment.
fn spawn(command: &[String], lease: &LeaseHandle) -> anyhow::Result<Child> {
    let (program, arguments) = command.split_first().context("no command to run")?;
    let grant = lease.grant();
    Command::new(program)
        .args(arguments)
        .env("PALISADE_LOCK", &grant.lock)
        .env("PALISADE_EPOCH", grant.epoch.to_string())
        .env("PALISADE_FENCE_TOKEN", &grant.token)
        .env("PALISADE_LEASE_ID", &grant.lease_id)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot run {program}"))
}

/// Waits for the command to end, stopping it when the lease is lost and passing on the
/// signals `lock run` receives.
async fn supervise(
    child: &mut Child,
    lease: &mut LeaseHandle,
    grace: Duration,
) -> anyhow::Result<Ended> {
    let group = Pid::from_raw(child.id().context("the command has no process id")? as i32);
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut hangup = signal(SignalKind::hangup())?;
    let passed_on = tokio::select! {
        status = child.wait() => return Ok(Ended::Itself(status?)),
        reason = lease.lost() => {
            tracing::error!(%reason, "the lease was lost: stopping the command");
            stop(child, group, Signal::SIGTERM, grace).await?;
            return Ok(Ended::LeaseLost { reason });
        }
        _ = terminate.recv() => Signal::SIGTERM,
        _ = interrupt.recv() => Signal::SIGINT,
        _ = hangup.recv() => Signal::SIGHUP,
    };
    tracing::info!(signal = %passed_on, "passing the signal on to the command");
    Ok(Ended::Itself(stop(child, group, passed_on, grace).await?))
}

/// Sends `first` to the command's process group, and SIGKILL when it has not ended after
/// `grace`.
async fn stop(
    child: &mut Child,
    group: Pid,
    first: Signal,
    grace: Duration,
) -> anyhow::Result<ExitStatus> {
    // ESRCH: the group has already gone; its exit status is still to be collected.
    let _ = killpg(group, first);
    if let Ok(status) = tokio::time::timeout(grace, child.wait()).await {
        return Ok(status?);
    }
    tracing::warn!(?grace, "the command outlived its grace period: SIGKILL");
    let _ = killpg(group, Signal::SIGKILL);
    Ok(child.wait().await?)
}

/// A shell's view of an exit status: the code, or 128 + the signal that ended it.
fn code_of(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(255),
        (None, None) => 1,
    }
}
