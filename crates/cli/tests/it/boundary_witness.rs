//! P1 across the one fault the clock floor and the high-water file cannot see together: a
//! single node's whole volume (data directory and high-water file) put back *and* its clock
//! stepped back while it was stopped. Without witnesses it issues epochs below ones it issued
//! before; with a policy naming the boundary, its start asks the boundary for its highest
//! fence and issues above it (waiting out the clock, 2 s here; a clock further back than the
//! engine waits is refused, as the clock contract says). Real processes; the clock is moved with libfaketime (Debian
//! `faketime`, which `scripts/test` installs), the monotonic clock left real.

use std::path::Path;

use serde_json::Value;

use crate::common::{cp_a, free_port, ResourceProcess, ServerProcess};

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

fn grant(server: &ServerProcess, lock: &str) -> (u64, String) {
    let out = server.cli(&["lock", "acquire", lock, "--ttl", "1m", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let grant: Value = serde_json::from_slice(&out.stdout).unwrap();
    let epoch = grant["epoch"].as_str().unwrap().parse().unwrap();
    (epoch, grant["token"].as_str().unwrap().to_owned())
}

/// The volume (data directory and its high-water sibling, if it had one yet) as it was
/// copied.
fn put_back(copy: &Path, data: &Path) {
    for suffix in ["", ".high-water"] {
        let (from, to) = (
            format!("{}{suffix}", copy.display()),
            format!("{}{suffix}", data.display()),
        );
        let _ = std::fs::remove_dir_all(&to);
        let _ = std::fs::remove_file(&to);
        if Path::new(&from).exists() {
            cp_a(Path::new(&from), Path::new(&to));
        }
    }
}

/// libfaketime's absolute start (`@Y-m-d H:M:S`, UTC, the clock running on from it) for a
/// wall clock `seconds_before` the time `epoch`'s counter was floored at.
fn faked_time(epoch: u64, seconds_before: u64) -> String {
    let seconds = palisade_core::clock::epoch_time_ms(epoch) / 1_000 - seconds_before;
    let out = std::process::Command::new("date")
        .args(["-u", "-d", &format!("@{seconds}"), "+@%Y-%m-%d %H:%M:%S"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn p1_a_volume_put_back_with_the_clock_stepped_back_starts_above_the_boundarys_fence() {
    if !Path::new(LIBFAKETIME).exists() {
        eprintln!("libfaketime is not installed (Debian faketime): not run");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (data, copy) = (dir.path().join("data"), dir.path().join("copy"));
    let listen = format!("127.0.0.1:{}", free_port());
    let serve = ["serve", "--listen", listen.as_str()];
    let mut coordinator = ServerProcess::start_with(&serve, &data);
    coordinator.terminate();
    put_back(&data, &copy); // the volume snapshot: copy ← data
    let mut coordinator = ServerProcess::start_with(&serve, &data);
    let store = ResourceProcess::start(&dir.path().join("store"), "strict", &coordinator.url);
    let (issued, token) = grant(&coordinator, "witness/a");
    let put = store.cli(&["put", "witness/a", "k", "v", "--token", &token]);
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    coordinator.terminate();

    // The volume put back and the clock stepped back to 2 s before that grant (within what a
    // start waits out, so the node serves): the fault, as it was.
    let at = faked_time(issued, 2);
    let stepped_back = [
        ("LD_PRELOAD", LIBFAKETIME),
        ("FAKETIME", at.as_str()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ("TZ", "UTC"),
    ];
    put_back(&copy, &data);
    let mut blind = ServerProcess::start_with_env(&serve, &stepped_back, &data);
    let (reissued, _) = grant(&blind, "witness/b");
    assert!(reissued < issued, "the fault: {reissued} is below {issued}");
    blind.terminate();

    // The same, with a policy naming the store: the start asks it and issues above its fence.
    put_back(&copy, &data);
    let policy = dir.path().join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "[[lock]]\npattern = \"witness/*\"\nclass = \"critical\"\n\
             boundary = {{ kind = \"resource\", url = \"{}\" }}\n",
            store.url
        ),
    )
    .unwrap();
    let policy = policy.display().to_string();
    let with_policy = [&serve[..], &["--policy", policy.as_str()]].concat();
    let mut witnessed = ServerProcess::start_with_env(&with_policy, &stepped_back, &data);
    let (next, _) = grant(&witnessed, "witness/c");
    assert!(
        next > issued,
        "P1: {next} must be above {issued}, which the store saw"
    );
    witnessed.terminate();
}
