//! Whether this node can write its disk: checked once by a real write before it serves, and
//! by the free space at every `/readyz`.
//!
//! A node restarted on a full disk loaded its state, answered `/readyz` 200, then failed its
//! first commit (the high-water file could not be rewritten) and exited: a supervisor or a
//! load balancer trusting readiness kept sending it work and restarting it. Now a start that
//! cannot write [`PROBE_BYTES`] into the data directory is refused with the cause, and a
//! running node whose file system has less than [`MIN_FREE_BYTES`] left says not ready, and
//! why, before a commit fails.

use std::fs::{self, File};
use std::io::{self, Write as _};
use std::path::Path;

use palisade_coordinator::store::StoreError;

/// The least free space a ready node has, bytes: the lease log grows by 1 MiB of zeros at a
/// time (`log_store::PREALLOCATE_BYTES`), and the high-water file, the witness and the Raft
/// log's appends need a little more. Below it the next growth may fail.
pub const MIN_FREE_BYTES: u64 = 2 << 20;

/// What the start-up probe writes (and fsyncs, then removes), bytes: the same headroom.
pub const PROBE_BYTES: u64 = MIN_FREE_BYTES;

/// The probe's file, in the data directory (removed at once; a leftover is overwritten).
const PROBE_FILE: &str = ".palisade-disk-probe";

/// Writes and fsyncs [`PROBE_BYTES`] in `dir`, then removes them: the node starts only if its
/// disk takes a write as large as its next growth. A full disk is [`StoreError::DiskFull`].
pub fn probe(dir: &Path) -> Result<(), StoreError> {
    let path = dir.join(PROBE_FILE);
    let written = write_probe(&path);
    let removed = fs::remove_file(&path);
    written.map_err(|error| in_dir(dir, error))?;
    match removed {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(in_dir(dir, error)),
        _ => Ok(()),
    }
}

fn write_probe(path: &Path) -> io::Result<()> {
    let mut file = File::create(path)?;
    let chunk = vec![0u8; 64 << 10];
    let mut left = PROBE_BYTES;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        file.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    file.sync_data()
}

fn in_dir(dir: &Path, error: io::Error) -> StoreError {
    match StoreError::from_io(error) {
        StoreError::DiskFull(why) => StoreError::DiskFull(format!(
            "data directory {} cannot take {PROBE_BYTES} bytes: {why}",
            dir.display()
        )),
        other => other,
    }
}

/// Why `dir`'s file system keeps this node from being ready, if it does: less than
/// [`MIN_FREE_BYTES`] free (for this process's user), or no answer from it.
pub fn not_ready(dir: &Path) -> Option<String> {
    match nix::sys::statvfs::statvfs(dir) {
        Ok(stats) => {
            let free = stats
                .blocks_available()
                .saturating_mul(stats.fragment_size());
            (free < MIN_FREE_BYTES).then(|| {
                format!(
                    "the disk of {} is nearly full: {free} bytes free, a commit may need \
                     {MIN_FREE_BYTES}; free space (nothing acknowledged is lost)",
                    dir.display()
                )
            })
        }
        Err(error) => Some(format!(
            "the file system of {} does not answer: {error}",
            dir.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writable_directory_passes_the_probe_and_keeps_no_file() {
        let dir = tempfile::tempdir().unwrap();
        probe(dir.path()).unwrap();
        assert!(!dir.path().join(PROBE_FILE).exists());
        assert_eq!(not_ready(dir.path()), None, "a test machine has 2 MiB free");
    }

    #[test]
    fn a_directory_that_is_gone_is_not_ready() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        assert!(probe(&gone).is_err());
        assert!(not_ready(&gone).unwrap().contains("does not answer"));
    }
}
