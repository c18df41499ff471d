//! The disk's ceiling: how many fdatasyncs per second the data directory takes.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::time::Duration;

/// How long the fdatasync rate is measured.
const FSYNC_PROBE: Duration = Duration::from_secs(2);
/// Rewrites one 4 KiB block and fdatasyncs it, repeatedly, for [`FSYNC_PROBE`]; returns
/// fdatasyncs per second. This is the ceiling of a service that syncs once per operation.
pub fn measure_fdatasync(dir: &Path) -> std::io::Result<f64> {
    let path = dir.join("fsync-probe");
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)?;
    let block = [0x5a_u8; 4096];
    // Allocate the block first, so the loop measures overwrite + fdatasync, not file growth.
    file.write_all_at(&block, 0)?;
    file.sync_all()?;
    let started = std::time::Instant::now();
    let mut count = 0u64;
    while started.elapsed() < FSYNC_PROBE {
        file.write_all_at(&block, 0)?;
        file.sync_data()?;
        count += 1;
    }
    let rate = count as f64 / started.elapsed().as_secs_f64();
    std::fs::remove_file(path)?;
    Ok(rate)
}
