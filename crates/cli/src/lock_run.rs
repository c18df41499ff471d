//! `palisade lock run NAME -- CMD ARGS…`: a command that runs only while this process holds
//! the lock, flock-style, for cron and shell jobs.
//!
//! The lease is kept alive while the command runs. The command gets the lease in its
//! environment (`PALISADE_LOCK`, `PALISADE_EPOCH`, `PALISADE_FENCE_TOKEN`, `PALISADE_LEASE_ID`)
//! to present to the resources it writes: the lease is permission, the fence is protection.
//! The bearer secret `lock run` authenticates with (`PALISADE_AUTH_TOKEN`, or the older
//! `PALISADE_TOKEN`) is taken out of the command's environment unless `--pass-auth-token`:
//! the job gets its lease, not the right to take or break others'.
//!
//! The command must be gone before the lock can change hands, which is when the lease's
//! validity ends (the send time of the last confirmed renewal plus the TTL: the coordinator
//! grants the lock again no earlier). So when no renewal has been confirmed `--grace` before
//! that end, the command's process group gets SIGTERM, and SIGKILL when the validity ends;
//! a lease the coordinator refused (it may be another's already) gets both at once. `lock run`
//! then exits with [`LEASE_LOST_EXIT`]. Otherwise the lease is released when the command ends
//! and `lock run` exits with the command's code (128 + N for a command killed by signal N).
//! SIGTERM, SIGINT and SIGHUP sent to `lock run` are passed on to the command, SIGKILL
//! following after the grace period. With `--json`, the last line on stdout is one JSON object
//! saying whose exit code it is (`exit_code_by`: `command`, or `palisade` for a lease lost):
//! a command may exit 75 or 3 itself.

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
    /// How long before the lease's validity ends the command gets SIGTERM when no renewal was
    /// confirmed (SIGKILL follows when the validity ends), and how long a signal passed on
    /// gives it before SIGKILL; less than half of --ttl [default: a quarter of --ttl].
    #[arg(long, value_parser = crate::parse_wait)]
    grace: Option<Duration>,
    /// Leave the bearer secret (PALISADE_AUTH_TOKEN, PALISADE_TOKEN) in the command's
    /// environment.
    #[arg(long)]
    pass_auth_token: bool,
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
    /// Stopped because the lease was lost or about to be, with how it ended.
    LeaseLost { reason: String, status: ExitStatus },
}

/// The grace period: as given, less than half of the TTL (renewals come every third of it,
/// so a longer one would stop a command whose lease is being renewed), or a quarter of it.
fn grace_of(ttl: Duration, grace: Option<Duration>) -> anyhow::Result<Duration> {
    match grace {
        None => Ok(ttl / 4),
        Some(grace) if grace < ttl / 2 => Ok(grace),
        // Bad usage (exit 2), said before anything is acquired.
        Some(grace) => Err(Exit {
            code: 2,
            message: Some(format!(
                "--grace {grace:?} is not less than half of --ttl {ttl:?}: the command gets \
                 SIGTERM --grace before the lease's validity ends and SIGKILL when it ends, \
                 and renewals come every third of the TTL; give a longer --ttl or a shorter \
                 --grace"
            )),
        }
        .into()),
    }
}

/// Runs `lock run`; with `json`, its last line on stdout (one JSON object) says whose exit
/// code it ends with.
pub async fn run(args: RunArgs, json: bool) -> anyhow::Result<()> {
    let grace = grace_of(args.ttl, args.grace)?;
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
    let mut child = spawn(&args.command, &lease, args.pass_auth_token)?;
    let ended = supervise(&mut child, &mut lease, grace).await?;
    let grant = lease.grant().clone();
    let (code, message, reason) = match ended {
        Ended::Itself(status) => {
            if let Err(error) = lease.release().await {
                tracing::warn!(%error, "the lease could not be released; it ends at its TTL");
            }
            (code_of(status), None, None)
        }
        Ended::LeaseLost { reason, status } => {
            let message = format!(
                "the lease on {} was lost ({reason}); the command was stopped",
                args.name
            );
            tracing::debug!(command_exit = code_of(status), "stopped");
            (
                LEASE_LOST_EXIT,
                Some(message),
                Some((reason, code_of(status))),
            )
        }
    };
    if json {
        // Whose code it is: a command may exit 75 or 3 itself.
        let (by, command_code) = match &reason {
            Some((_, stopped)) => ("palisade", *stopped),
            None => ("command", code),
        };
        crate::output::print_json_line(&serde_json::json!({
            "lock": grant.lock,
            "epoch": palisade_core::json::value(palisade_core::Epoch(grant.epoch)),
            "lease_id": grant.lease_id,
            "exit_code": code,
            "exit_code_by": by,
            "command_exit_code": command_code,
            "lease_lost": reason.as_ref().map(|(why, _)| why),
        }));
    }
    match code {
        0 => Ok(()),
        code => Err(Exit { code, message }.into()),
    }
}

/// Starts the command in a process group of its own (so a signal reaches every process of a
/// shell script), with the lease in its environment and, unless `pass_auth`, without the
/// bearer secret.
fn spawn(command: &[String], lease: &LeaseHandle, pass_auth: bool) -> anyhow::Result<Child> {
    let (program, arguments) = command.split_first().context("no command to run")?;
    let grant = lease.grant();
    let mut command = Command::new(program);
    if !pass_auth {
        command
            .env_remove(palisade_cli_common::credentials::AUTH_TOKEN_ENV)
            .env_remove(palisade_cli_common::credentials::OLD_TOKEN_ENV);
    }
    command
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
        (reason, valid_until) = lease.ending(grace) => {
            tracing::error!(%reason, "the lease is ending: stopping the command");
            let status = stop_by(child, group, valid_until).await?;
            return Ok(Ended::LeaseLost { reason, status });
        }
        _ = terminate.recv() => Signal::SIGTERM,
        _ = interrupt.recv() => Signal::SIGINT,
        _ = hangup.recv() => Signal::SIGHUP,
    };
    tracing::info!(signal = %passed_on, "passing the signal on to the command");
    Ok(Ended::Itself(stop(child, group, passed_on, grace).await?))
}

/// Sends SIGTERM to the command's process group, and SIGKILL at `deadline` (the lease's
/// validity's end) when it has not ended by then.
async fn stop_by(
    child: &mut Child,
    group: Pid,
    deadline: tokio::time::Instant,
) -> anyhow::Result<ExitStatus> {
    stop(
        child,
        group,
        Signal::SIGTERM,
        deadline.saturating_duration_since(tokio::time::Instant::now()),
    )
    .await
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
