//! Readiness tells the truth about the disk: a node on a file system with no room for its next
//! commit says not ready (and why) while it runs, and refuses to start, naming the cause,
//! instead of answering ready and failing its first acquire. Real processes on a tmpfs of
//! 8 MiB the test mounts (root only, as in CI; elsewhere the test says it did not run).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{ServerProcess, BINARY};

/// A tmpfs mounted for the test, unmounted when dropped.
struct SmallDisk {
    mount: PathBuf,
}

impl SmallDisk {
    fn mount(at: &Path, size: &str) -> Option<Self> {
        let uid = Command::new("id").arg("-u").output().unwrap().stdout;
        if String::from_utf8_lossy(&uid).trim() != "0" {
            eprintln!("not root: the full-disk readiness test needs a tmpfs mount; not run");
            return None;
        }
        std::fs::create_dir_all(at).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .unwrap();
        assert!(mounted.success(), "mount a tmpfs at {}", at.display());
        Some(Self {
            mount: at.to_path_buf(),
        })
    }

    fn free_bytes(&self) -> u64 {
        let stats = nix::sys::statvfs::statvfs(&self.mount).unwrap();
        stats.blocks_available() * stats.fragment_size()
    }

    /// Fills the file system until `leave` bytes (or fewer) are free.
    fn fill_leaving(&self, name: &str, leave: u64) {
        let size = self.free_bytes().saturating_sub(leave);
        let filler = vec![7u8; size as usize];
        // A full disk cuts the write short: what matters is what is left.
        let _ = std::fs::write(self.mount.join(name), filler);
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

fn acquire(server: &ServerProcess, lock: &str) -> u64 {
    let out = server.cli(&["lock", "acquire", lock, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let grant: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    grant["epoch"].as_str().unwrap().parse().unwrap()
}

#[test]
fn a_node_whose_disk_is_full_never_says_ready_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let Some(disk) = SmallDisk::mount(&dir.path().join("fs"), "8m") else {
        return;
    };
    let data = disk.mount.join("node").join("data");
    let mut server = ServerProcess::start(&data);
    let first = acquire(&server, "ready/a");
    assert_eq!(server.http("GET", "/readyz", None, "").0, 200);

    // Less than a commit may need: not ready, with the reason, while it runs.
    disk.fill_leaving("filler-1", 1 << 20);
    let (status, body) = server.http("GET", "/readyz", None, "");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("nearly full"), "{body}");
    server.terminate();

    // Full: the start is refused, naming the disk, before anything answers ready.
    disk.fill_leaving("filler-2", 0);
    let out = Command::new(BINARY)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("the disk is full"), "{stderr}");
    assert!(!stderr.contains("listening on"), "{stderr}");

    // Room again: it starts, is ready, and issues above what it issued before.
    std::fs::remove_file(disk.mount.join("filler-1")).unwrap();
    std::fs::remove_file(disk.mount.join("filler-2")).unwrap();
    let mut server = ServerProcess::start(&data);
    assert_eq!(server.http("GET", "/readyz", None, "").0, 200);
    assert!(acquire(&server, "ready/b") > first);
    server.terminate();
}
