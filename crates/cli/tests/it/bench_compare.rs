//! `palisade bench acquire --compare`: the same workload against a real Redis (AOF,
//! `appendfsync always`) and a real etcd, on loopback, in one run — so the ratios in
//! docs/performance.md can be reproduced. `scripts/test` installs both.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{free_port, BINARY};

struct Service(Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn program(name: &str) -> String {
    ["/usr/bin", "/usr/local/bin", "/usr/sbin"]
        .iter()
        .map(|dir| format!("{dir}/{name}"))
        .find(|path| Path::new(path).exists())
        .unwrap_or_else(|| panic!("no {name}: run ./scripts/test (it installs it)"))
}

fn start(command: &mut Command) -> Service {
    Service(
        command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts"),
    )
}

/// Waits (bounded) until something accepts connections on `port`.
fn listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn bench_compares_palisade_with_real_redis_and_etcd_in_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let redis_port = free_port();
    let _redis = start(Command::new(program("redis-server")).args([
        "--port",
        &redis_port.to_string(),
        "--bind",
        "127.0.0.1",
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--save",
        "",
        "--dir",
        dir.path().to_str().unwrap(),
    ]));
    let (client, peer) = (free_port(), free_port());
    let _etcd = start(Command::new(program("etcd")).args([
        "--name",
        "solo",
        "--data-dir",
        dir.path().join("etcd").to_str().unwrap(),
        "--listen-client-urls",
        &format!("http://127.0.0.1:{client}"),
        "--advertise-client-urls",
        &format!("http://127.0.0.1:{client}"),
        "--listen-peer-urls",
        &format!("http://127.0.0.1:{peer}"),
        "--initial-advertise-peer-urls",
        &format!("http://127.0.0.1:{peer}"),
        "--initial-cluster",
        &format!("solo=http://127.0.0.1:{peer}"),
    ]));
    listening(redis_port);
    listening(client);
    // Two clients on one lock: acquires contend, and hand-offs happen on every service.
    let out = Command::new(BINARY)
        .args(["bench", "acquire", "--clients", "2", "--locks", "1"])
        .args(["--duration", "1s", "--json", "--compare"])
        .arg(format!(
            "redis=redis://127.0.0.1:{redis_port},etcd=http://127.0.0.1:{client}"
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for name in ["palisade", "redis", "etcd"] {
        let one = &report[name];
        assert!(one["cycles"].as_u64().unwrap() > 0, "{name}: {one}");
        assert_eq!(one["errors"], 0, "{name}: {one}");
        assert!(one["handoffs"].as_u64().unwrap() > 0, "{name}: {one}");
    }
    assert_eq!(
        report["redis"]["endpoint"],
        format!("redis://127.0.0.1:{redis_port}")
    );
    for ratio in ["palisade_vs_redis", "palisade_vs_etcd"] {
        assert!(report[ratio].as_f64().unwrap() > 0.0, "{report}");
    }
    // The breakdown: one fsync per commit on the lease log, CPU per cycle measured.
    let palisade = &report["palisade"];
    assert_eq!(
        palisade["fsyncs_per_commit"].as_f64(),
        Some(1.0),
        "{palisade}"
    );
    assert!(palisade["total_cpu_us_per_cycle"].as_f64().unwrap() > 0.0);

    // Bad targets are refused before anything runs.
    for bad in [
        "consul=http://127.0.0.1:1",
        "redis=127.0.0.1:6379",
        "etcd=https://x:1",
    ] {
        let out = Command::new(BINARY)
            .args(["bench", "acquire", "--duration", "1s", "--compare", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
    }
}
