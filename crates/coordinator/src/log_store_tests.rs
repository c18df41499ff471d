use std::fs::OpenOptions;
use std::os::unix::fs::FileExt as _;

use palisade_core::{Changes, Epoch, LockName};

use super::*;
use crate::store::RedbLeaseStore;
use crate::store_conformance::{lease, Harness};

/// The log in a temporary directory; a restart drops it and opens the file again.
struct Log(tempfile::TempDir);

impl Harness for Log {
    type Store = LogLeaseStore;
    async fn open(&mut self) -> LogLeaseStore {
        LogLeaseStore::open(&self.0.path().join("log")).unwrap()
    }
    async fn restart(&mut self, store: LogLeaseStore) -> LogLeaseStore {
        drop(store);
        self.open().await
    }
}

fn run(case: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(case);
}

mod conformance {
    use super::*;
    crate::lease_store_suite!(Log(tempfile::tempdir().unwrap()), run);
}

fn grant(lock: &str, epoch: u64) -> Changes {
    Changes {
        locks: vec![(LockName::new(lock).unwrap(), Some(lease(lock, epoch)))],
        last_epoch: Epoch(epoch),
        endings: Vec::new(),
    }
}

fn release(lock: &str, epoch: u64) -> Changes {
    Changes {
        locks: vec![(LockName::new(lock).unwrap(), None)],
        last_epoch: Epoch(epoch),
        endings: Vec::new(),
    }
}

/// Offsets of the records in `path` (by replaying their framing).
fn record_offsets(path: &Path) -> Vec<u64> {
    let bytes = std::fs::read(path).unwrap();
    let mut offsets = Vec::new();
    let mut at = HEADER_BYTES as usize;
    let mut sequence = 1;
    while let Some((_, next)) = record_at(&bytes, at, sequence) {
        offsets.push(at as u64);
        at = next;
        sequence += 1;
    }
    offsets.push(at as u64);
    offsets
}

fn write_at(path: &Path, at: u64, bytes: &[u8]) {
    let file = OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, at).unwrap();
}

/// P8: a commit torn by a crash (half its bytes on disk) was never acknowledged: the log loads
/// the commits before it, zeroes the remains, and appends after them.
#[test]
fn p8_a_torn_last_record_is_dropped_and_the_log_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    {
        let mut store = LogLeaseStore::open(&path).unwrap();
        store.commit(&grant("a", 1)).unwrap();
        store.commit(&grant("b", 2)).unwrap();
    }
    let offsets = record_offsets(&path);
    let (last, end) = (offsets[1], offsets[2]);
    // Tear the last record: keep its first half, lose the rest (zeros, as preallocated).
    let half = (last + end) / 2;
    write_at(&path, half, &vec![0u8; (end - half) as usize]);
    let mut store = LogLeaseStore::open(&path).unwrap();
    let state = store.load().unwrap();
    assert_eq!(state.last_epoch, Epoch(1));
    assert_eq!(state.leases, vec![lease("a", 1)]);
    // The remains are zeroed: the file holds nothing past the first record.
    let bytes = std::fs::read(&path).unwrap();
    assert!(bytes[last as usize..].iter().all(|&b| b == 0));
    store.commit(&grant("c", 3)).unwrap();
    drop(store);
    let state = LogLeaseStore::open(&path).unwrap().load().unwrap();
    assert_eq!(state.last_epoch, Epoch(3));
    assert_eq!(state.leases, vec![lease("a", 1), lease("c", 3)]);
}

/// P8: a torn write whose header did not reach the disk but whose later bytes did.
#[test]
fn p8_a_record_torn_in_its_header_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    {
        let mut store = LogLeaseStore::open(&path).unwrap();
        store.commit(&grant("a", 1)).unwrap();
        store.commit(&grant("b", 2)).unwrap();
    }
    let last = record_offsets(&path)[1];
    write_at(&path, last, &[0u8; 8]);
    let state = LogLeaseStore::open(&path).unwrap().load().unwrap();
    assert_eq!(state.last_epoch, Epoch(1));
}

/// P1/P8: a damaged record with committed records after it is not a torn write; reading the
/// log short would forget the later commits (and their epochs), so it is refused.
#[test]
fn p1_a_damaged_record_before_others_is_refused_not_read_short() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    {
        let mut store = LogLeaseStore::open(&path).unwrap();
        for epoch in 1..=5 {
            store.commit(&grant("a", epoch)).unwrap();
        }
    }
    let second = record_offsets(&path)[1];
    write_at(&path, second + RECORD_HEADER_BYTES + 3, b"X");
    let error = LogLeaseStore::open(&path).err().expect("refused");
    assert!(matches!(error, StoreError::Corrupt(_)), "{error}");
    assert!(error.to_string().contains("not read short"), "{error}");
    // Its header damaged instead: refused too.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    {
        let mut store = LogLeaseStore::open(&path).unwrap();
        for epoch in 1..=3 {
            store.commit(&grant("a", epoch)).unwrap();
        }
    }
    let second = record_offsets(&path)[1];
    write_at(&path, second + 5, &[0xff]);
    assert!(matches!(
        LogLeaseStore::open(&path),
        Err(StoreError::Corrupt(_))
    ));
}

/// Files that are not a log of this version are refused, never overwritten.
#[test]
fn a_foreign_or_newer_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    std::fs::write(&path, b"some other file that happens to be here").unwrap();
    let error = LogLeaseStore::open(&path).err().expect("refused");
    assert!(
        error.to_string().contains("not a Palisade lease log"),
        "{error}"
    );
    drop(LogLeaseStore::open(&dir.path().join("new")).unwrap());
    write_at(&dir.path().join("new"), 16, &2u32.to_le_bytes());
    let error = LogLeaseStore::open(&dir.path().join("new"))
        .err()
        .expect("refused");
    assert!(error.to_string().contains("format 2"), "{error}");
}

#[test]
fn a_second_process_cannot_open_the_same_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    let _first = LogLeaseStore::open(&path).unwrap();
    assert!(matches!(
        LogLeaseStore::open(&path),
        Err(StoreError::InUse(_))
    ));
}

/// P1/P8: past the compaction threshold the log is rewritten as one snapshot; the state and
/// the counter are the same before and after, the file is small again, and appends go on.
#[test]
fn p8_compaction_keeps_the_state_and_shrinks_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    let mut store = LogLeaseStore::open(&path).unwrap();
    store.compact_at(64 << 10);
    store.commit(&grant("kept", 1)).unwrap();
    let mut epoch = 1;
    let mut compacted = false;
    while epoch < 200_000 {
        epoch += 1;
        store.commit(&grant("churn", epoch)).unwrap();
        store.commit(&release("churn", epoch)).unwrap();
        if store.next_sequence == 2 {
            compacted = true;
            break;
        }
    }
    assert!(compacted, "no compaction after {epoch} epochs");
    assert!(std::fs::metadata(&path).unwrap().len() <= HEADER_BYTES + 2 * PREALLOCATE_BYTES);
    store.commit(&grant("after", epoch + 1)).unwrap();
    drop(store);
    let state = LogLeaseStore::open(&path).unwrap().load().unwrap();
    assert_eq!(state.last_epoch, Epoch(epoch + 1));
    assert_eq!(
        state.leases,
        vec![lease("after", epoch + 1), lease("kept", 1)]
    );
}

/// A compaction interrupted before its rename leaves the old log in force and a `.compact`
/// file, which the next open removes.
#[test]
fn p8_an_interrupted_compaction_leaves_the_old_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    {
        let mut store = LogLeaseStore::open(&path).unwrap();
        store.commit(&grant("a", 7)).unwrap();
    }
    std::fs::write(compact_path(&path), b"half a compaction").unwrap();
    let state = LogLeaseStore::open(&path).unwrap().load().unwrap();
    assert_eq!(state.last_epoch, Epoch(7));
    assert!(!compact_path(&path).exists());
}

/// P1/P8: a data directory of an earlier version (a redb store) is moved into the log at its
/// first open, counter and leases included, and the redb file is gone afterwards.
#[test]
fn p1_a_redb_store_of_an_earlier_version_is_moved_into_the_log() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut old = RedbLeaseStore::open(&dir.path().join(crate::LEGACY_STORE_FILE)).unwrap();
        old.commit(&grant("a", 41)).unwrap();
        old.commit(&grant("b", 42)).unwrap();
        old.commit(&release("b", 42)).unwrap();
    }
    assert!(exists_in(dir.path()));
    let store = open_in(dir.path()).unwrap();
    let state = store.load().unwrap();
    assert_eq!(state.last_epoch, Epoch(42));
    assert_eq!(state.leases, vec![lease("a", 41)]);
    assert!(!dir.path().join(crate::LEGACY_STORE_FILE).exists());
    assert!(dir.path().join(crate::STORE_FILE).exists());
    drop(store);
    // A migration cut short (the log not yet renamed into place) is done again from redb.
    let dir = tempfile::tempdir().unwrap();
    {
        let mut old = RedbLeaseStore::open(&dir.path().join(crate::LEGACY_STORE_FILE)).unwrap();
        old.commit(&grant("a", 9)).unwrap();
    }
    std::fs::write(dir.path().join("coordinator.log.migrating"), b"cut short").unwrap();
    assert_eq!(
        open_in(dir.path()).unwrap().load().unwrap().last_epoch,
        Epoch(9)
    );
}

/// Growing past the written zeros: a commit larger than what is left is written after new
/// zeros, in the same fdatasync, and reads back.
#[test]
fn p8_a_commit_larger_than_the_zeros_ahead_grows_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    let mut store = LogLeaseStore::open(&path).unwrap();
    let locks: Vec<_> = (0..8_000)
        .map(|i| {
            let name = format!("lock/{i:05}");
            (LockName::new(&name).unwrap(), Some(lease(&name, 9)))
        })
        .collect();
    store
        .commit(&Changes {
            locks,
            last_epoch: Epoch(9),
            endings: Vec::new(),
        })
        .unwrap();
    let length = std::fs::metadata(&path).unwrap().len();
    assert!(length > HEADER_BYTES + PREALLOCATE_BYTES);
    assert_eq!(
        header_grown_to(&path),
        length,
        "the header names the new length"
    );
    drop(store);
    let state = LogLeaseStore::open(&path).unwrap().load().unwrap();
    assert_eq!(state.leases.len(), 8_000);
}

/// P6: an offline backup reads the log without writing to it. A torn last record is skipped
/// (it was never acknowledged) and stays on disk as it is, for the coordinator to repair when it
/// next starts; a running coordinator's log is refused as in use.
#[test]
fn p6_an_offline_read_writes_nothing_and_skips_a_torn_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(crate::STORE_FILE);
    {
        let mut store = LogLeaseStore::open(&path).unwrap();
        store.commit(&grant("a", 1)).unwrap();
        store.commit(&grant("b", 2)).unwrap();
    }
    let end = *record_offsets(&path).last().unwrap();
    // Half of a third record: its length and sequence, then nothing.
    let mut torn = 100u32.to_le_bytes().to_vec();
    torn.extend_from_slice(&3u64.to_le_bytes());
    write_at(&path, end, &torn);
    std::fs::write(compact_path(&path), b"a compaction cut short").unwrap();
    let before = std::fs::read(&path).unwrap();
    let state = read_in(dir.path()).unwrap();
    assert_eq!(state.last_epoch, Epoch(2));
    assert_eq!(state.leases.len(), 2);
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the read wrote to the log"
    );
    assert!(compact_path(&path).exists(), "the read removed a file");
    // The coordinator's own open repairs it; while it holds the log, a read is refused.
    let store = LogLeaseStore::open(&path).unwrap();
    assert_ne!(std::fs::read(&path).unwrap(), before);
    assert!(matches!(read_in(dir.path()), Err(StoreError::InUse(_))));
    drop(store);
    assert_eq!(read_in(dir.path()).unwrap().last_epoch, Epoch(2));
}

/// P6: an offline backup of an earlier version's directory (a redb store) reads its counter
/// without moving it into a log: the directory is left exactly as it was.
#[test]
fn p6_an_offline_read_of_an_earlier_versions_store_does_not_migrate_it() {
    let dir = tempfile::tempdir().unwrap();
    let legacy = dir.path().join(crate::LEGACY_STORE_FILE);
    {
        let mut old = RedbLeaseStore::open(&legacy).unwrap();
        old.commit(&grant("a", 41)).unwrap();
        old.commit(&grant("b", 42)).unwrap();
    }
    let before = std::fs::read(&legacy).unwrap();
    let state = read_in(dir.path()).unwrap();
    assert_eq!(state.last_epoch, Epoch(42));
    assert_eq!(state.leases.len(), 2);
    assert_eq!(std::fs::read(&legacy).unwrap(), before);
    assert!(!dir.path().join(crate::STORE_FILE).exists());
    let entries = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(entries, 1, "the read left files behind");
    // While a process has it open, the read is refused.
    let open = RedbLeaseStore::open(&legacy).unwrap();
    assert!(matches!(read_in(dir.path()), Err(StoreError::InUse(_))));
    drop(open);
}

/// P1/P8: two records in a row damaged, a third intact after them: damage, not a torn write,
/// so the log is refused. Before, only the record right after the first bad one was looked
/// for, and both (with everything after them) were zeroed as if torn.
#[test]
fn p1_two_damaged_records_in_a_row_are_refused_not_zeroed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    {
        let mut store = LogLeaseStore::open(&path).unwrap();
        for epoch in 1..=6 {
            store.commit(&grant("a", epoch)).unwrap();
        }
    }
    let offsets = record_offsets(&path);
    write_at(&path, offsets[2] + RECORD_HEADER_BYTES + 3, b"X");
    write_at(&path, offsets[3] + RECORD_HEADER_BYTES + 3, b"Y");
    let before = std::fs::read(&path).unwrap();
    let error = LogLeaseStore::open(&path).err().expect("refused");
    assert!(error.to_string().contains("not read short"), "{error}");
    assert!(error.to_string().contains("record 5 follows"), "{error}");
    // Nothing was zeroed.
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

fn failing_sync(_: &Path) -> std::io::Result<()> {
    Err(std::io::Error::other(
        "injected: fsync of the directory failed",
    ))
}

/// P8: a compaction whose rename happened but could not be made durable leaves the store
/// refusing every later commit (which log a crash would leave is unknown), never appending to
/// the unlinked old file. Everything committed before is in the log found at the next open.
/// Before, commits went on into the old, unlinked file and were acknowledged, then lost.
#[test]
fn p8_a_compaction_that_cannot_sync_its_directory_stops_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    let mut store = LogLeaseStore::open(&path).unwrap();
    store.compact_at(64 << 10);
    store.sync_dir = failing_sync;
    store.commit(&grant("kept", 1)).unwrap();
    let mut epoch = 1;
    while store.failed.is_none() && epoch < 200_000 {
        epoch += 1;
        store.commit(&grant("churn", epoch)).unwrap();
    }
    assert!(store.failed.is_some(), "no compaction after {epoch} epochs");
    let refused = store.commit(&grant("after", epoch + 1)).unwrap_err();
    assert!(refused.to_string().contains("compaction"), "{refused}");
    drop(store);
    let state = LogLeaseStore::open(&path).unwrap().load().unwrap();
    assert_eq!(state.last_epoch, Epoch(epoch));
    assert_eq!(state.leases, vec![lease("churn", epoch), lease("kept", 1)]);
}

/// A full disk is named as such, never as corruption.
#[test]
fn a_full_disk_is_reported_as_full() {
    let full = StoreError::from_io(std::io::Error::from_raw_os_error(28));
    assert!(matches!(full, StoreError::DiskFull(_)), "{full}");
    assert!(full.to_string().contains("disk is full"), "{full}");
    let quota = StoreError::from_io(std::io::Error::from_raw_os_error(122));
    assert!(matches!(quota, StoreError::DiskFull(_)), "{quota}");
    let other = StoreError::from_io(std::io::Error::from_raw_os_error(5));
    assert!(matches!(other, StoreError::Io(_)), "{other}");
}

/// The grown-to length `path`'s header names.
fn header_grown_to(path: &Path) -> u64 {
    let bytes = std::fs::read(path).unwrap();
    let at = GROWN_TO_AT as usize;
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// Cuts `path` to `length` bytes (`truncate -s`).
fn cut_to(path: &Path, length: u64) {
    let file = OpenOptions::new().write(true).open(path).unwrap();
    file.set_len(length).unwrap();
}

/// P8: a log cut short (`truncate -s`, a copy that stopped early) is refused at every offset,
/// by the coordinator and by an offline backup alike: a cut at a record's boundary looks like
/// a log that simply ends there, and 210 acknowledged held leases were dropped silently.
/// Only a torn write, which never shortens the file, is read short.
#[test]
fn p8_a_log_cut_short_is_refused_at_every_offset() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    {
        let mut store = LogLeaseStore::open(&path).unwrap();
        for i in 1..=210 {
            store.commit(&grant(&format!("lock/{i}"), i)).unwrap();
        }
    }
    let offsets = record_offsets(&path);
    let length = std::fs::metadata(&path).unwrap().len();
    assert_eq!(header_grown_to(&path), length);
    let end = *offsets.last().unwrap();
    let cuts = [
        HEADER_BYTES,
        offsets[1],
        (offsets[1] + offsets[2]) / 2,
        offsets[105],
        offsets[209],
        end,
        end + 1,
        length - 1,
    ];
    for cut in cuts {
        let copy = dir.path().join(format!("cut-{cut}"));
        std::fs::copy(&path, &copy).unwrap();
        cut_to(&copy, cut);
        for refused in [
            LogLeaseStore::open(&copy).map(drop),
            LogLeaseStore::read(&copy).map(drop),
        ] {
            let error = refused.expect_err("a log cut short is refused").to_string();
            assert!(error.contains("cut short"), "cut at {cut}: {error}");
        }
    }
    let state = LogLeaseStore::open(&path).unwrap().load().unwrap();
    assert_eq!(state.leases.len(), 210, "the whole file still opens");
}

/// P8: a log written before the grown-to mark existed (zeros in its header) opens, and its
/// length is named at that open, so a cut made afterwards is refused.
#[test]
fn p8_a_log_from_before_the_mark_is_named_at_its_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    {
        let mut store = LogLeaseStore::open(&path).unwrap();
        store.commit(&grant("a", 1)).unwrap();
    }
    write_at(&path, GROWN_TO_AT, &[0u8; 8]);
    let length = std::fs::metadata(&path).unwrap().len();
    let state = LogLeaseStore::open(&path).unwrap().load().unwrap();
    assert_eq!(state.leases, vec![lease("a", 1)]);
    assert_eq!(header_grown_to(&path), length);
    cut_to(&path, length - 1);
    assert!(LogLeaseStore::open(&path).is_err());
}
