//! Unit tests of the cluster store (`storage.rs`).

use super::*;
use crate::raft_log;
use openraft::testing::{blank_ent, log_id};
use palisade_core::{HolderId, LeaseId, LockClass};
use redb::ReadableTableMetadata;

fn open_temp() -> (tempfile::TempDir, LogStore, StateMachine) {
    let dir = tempfile::tempdir().unwrap();
    let (log, sm) = open(&dir.path().join(palisade_coordinator::CLUSTER_STORE_FILE)).unwrap();
    (dir, log, sm)
}

fn blanks(range: std::ops::Range<u64>) -> Vec<Entry<TypeConfig>> {
    range.map(|i| blank_ent::<TypeConfig>(1, 1, i)).collect()
}

fn indexes(entries: &[Entry<TypeConfig>]) -> Vec<u64> {
    entries.iter().map(|e| e.log_id.index).collect()
}

fn apply_entry(index: u64, last_epoch: u64, grant: Option<u64>) -> Entry<TypeConfig> {
    let lock = LockName::new("a").unwrap();
    let locks = grant
        .map(|epoch| {
            let lease = Lease {
                id: LeaseId(u128::from(epoch)),
                principal: palisade_core::Principal::anonymous(),
                lock: lock.clone(),
                holder: HolderId::new("h").unwrap(),
                epoch: Epoch(epoch),
                ttl_ms: 1_000,
                class: LockClass::Critical,
                request_id: None,
                expires_at: 0,
                granted_unix_ms: 0,
                renewed_unix_ms: 0,
            };
            vec![(lock, Some(lease))]
        })
        .unwrap_or_default();
    Entry {
        log_id: log_id(1, 1, index),
        payload: EntryPayload::Normal(Command::Apply {
            last_epoch: Epoch(last_epoch),
            locks,
            ended: Vec::new(),
        }),
    }
}

#[tokio::test]
async fn p1_p8_a_log_read_never_returns_entries_without_the_ranges_start() {
    // Regression (seeds 777010, 900405, 900442): a deposed leader's replication task read
    // [25, 29) after its log was purged to 25 and got [26, 27, 28]; sent after
    // prev_log_id 24, the follower wrote a log with a hole and its Raft stopped.
    let (_dir, mut log, _sm) = open_temp();
    log.write_entries(blanks(0..10)).await.unwrap();
    let store = log.clone();
    log.log()
        .unwrap()
        .purge(log_id(1, 1, 4), &mut |file| store.switch_to(file))
        .unwrap();
    assert_eq!(
        indexes(&log.try_get_log_entries(5..8).await.unwrap()),
        [5, 6, 7]
    );
    assert!(log.try_get_log_entries(3..8).await.unwrap().is_empty());
    assert!(log.try_get_log_entries(4..5).await.unwrap().is_empty());
    assert_eq!(
        indexes(&log.try_get_log_entries(8..).await.unwrap()),
        [8, 9]
    );
    // A hole in the middle cannot be written (see below): the log file's records run without
    // a gap, or the file is refused (`raft_log_tests.rs`).
}

/// Every member keeps the same history of what it applies: grants, and how each lease ended
/// as the leader said (or `ended` for an entry of an earlier version); a renewal is none.
#[test]
fn the_applied_history_names_grants_and_how_each_lease_ended() {
    let lease = |epoch: u64| Lease {
        id: LeaseId(u128::from(epoch)),
        principal: palisade_core::Principal::anonymous(),
        lock: LockName::new("a").unwrap(),
        holder: HolderId::new(format!("h{epoch}")).unwrap(),
        epoch: Epoch(epoch),
        ttl_ms: 1_000,
        class: LockClass::Critical,
        request_id: None,
        expires_at: 0,
        granted_unix_ms: 0,
        renewed_unix_ms: 0,
    };
    let apply =
        |state: &mut SmState, epoch: u64, now: Option<Lease>, ended: Vec<palisade_core::Ended>| {
            let mut history = Vec::new();
            let command = Command::Apply {
                last_epoch: Epoch(epoch),
                locks: vec![(LockName::new("a").unwrap(), now)],
                ended,
            };
            apply_command(state, command, &mut Vec::new(), &mut history).unwrap();
            history
                .into_iter()
                .map(|t| (t.kind, t.lease.epoch.0, t.by))
                .collect::<Vec<_>>()
        };
    let ended = |epoch: u64, kind: &str, by: Option<&str>| palisade_core::Ended {
        lock: LockName::new("a").unwrap(),
        epoch: Epoch(epoch),
        kind: kind.into(),
        by: by.map(Into::into),
    };
    let mut state = SmState::default();
    assert_eq!(
        apply(&mut state, 1, Some(lease(1)), vec![]),
        [("granted".into(), 1, None)]
    );
    assert_eq!(
        apply(&mut state, 1, Some(lease(1)), vec![]),
        [],
        "a renewal"
    );
    assert_eq!(
        apply(
            &mut state,
            2,
            Some(lease(2)),
            vec![ended(1, "expired", None)]
        ),
        [("expired".into(), 1, None), ("granted".into(), 2, None)]
    );
    assert_eq!(
        apply(&mut state, 2, None, vec![ended(2, "broken", Some("ops"))]),
        [("broken".into(), 2, Some("ops".into()))]
    );
    apply(&mut state, 3, Some(lease(3)), vec![]);
    assert_eq!(
        apply(&mut state, 3, None, vec![]),
        [("ended".into(), 3, None)],
        "an entry of an earlier version does not say how"
    );
}

#[test]
fn p4_p6_a_retired_key_stays_retired_and_a_restored_floor_raises_the_counter() {
    let mut state = SmState::default();
    let mut changed = Vec::new();
    let start = |key: &str, floor: u64| Command::LeaderStart {
        node: 2,
        key_id: key.into(),
        public_key: format!("pk-{key}"),
        floor: Epoch(floor),
    };
    apply_command(&mut state, start("k2", 0), &mut changed, &mut Vec::new()).unwrap();
    assert_eq!(state.header.key_owners.get("k2"), Some(&2));
    let retire = Command::RetireKey {
        key_id: "k2".into(),
    };
    apply_command(&mut state, retire, &mut changed, &mut Vec::new()).unwrap();
    assert!(!state.header.keys.contains_key("k2"));
    // Its member leads again with the same key: not published again.
    apply_command(&mut state, start("k2", 0), &mut changed, &mut Vec::new()).unwrap();
    assert!(!state.header.keys.contains_key("k2"));
    // A restored member's first entry raises the counter; a lower floor never lowers it.
    apply_command(
        &mut state,
        start("k3", 1 << 40),
        &mut changed,
        &mut Vec::new(),
    )
    .unwrap();
    assert_eq!(state.header.last_epoch, Epoch(1 << 40));
    apply_command(&mut state, start("k3", 5), &mut changed, &mut Vec::new()).unwrap();
    assert_eq!(state.header.last_epoch, Epoch(1 << 40));
}

#[tokio::test]
async fn p1_p8_append_refuses_a_gap_or_an_overwrite_and_writes_nothing() {
    let (_dir, log, _sm) = open_temp();
    assert!(
        log.write_entries(blanks(1..3)).await.is_err(),
        "a new log starts at 0"
    );
    log.write_entries(blanks(0..3)).await.unwrap();
    let gap = log.write_entries(blanks(4..6)).await.unwrap_err();
    assert!(gap.to_string().contains("gap"), "{gap}");
    assert!(
        log.write_entries(blanks(2..4)).await.is_err(),
        "an overwrite"
    );
    let with_hole = vec![blank_ent::<TypeConfig>(1, 1, 3), blank_ent(1, 1, 5)];
    assert!(
        log.write_entries(with_hole).await.is_err(),
        "a hole inside the batch"
    );
    log.write_entries(blanks(3..5)).await.unwrap();
    // After a purge of everything the log continues after the purged entry.
    let store = log.clone();
    log.log()
        .unwrap()
        .purge(log_id(1, 1, 4), &mut |file| store.switch_to(file))
        .unwrap();
    assert!(log.write_entries(blanks(6..7)).await.is_err());
    log.write_entries(blanks(5..7)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn p8_a_purge_waits_until_the_state_machine_has_applied_what_it_purges() {
    // openraft tells a follower installing a snapshot to purge the log the snapshot covers
    // while its state machine still installs it; a crash in between left the log purged
    // past last_applied. The purge must wait for the install.
    let (_dir, mut log, mut sm) = open_temp();
    log.write_entries(blanks(0..6)).await.unwrap();
    sm.apply(blanks(0..3)).await.unwrap();
    let mut purging = log.clone();
    let purge = tokio::spawn(async move { purging.purge(log_id(1, 1, 5)).await });
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert!(
        !purge.is_finished(),
        "the purge waits for the state machine"
    );
    assert_eq!(
        indexes(&log.try_get_log_entries(0..).await.unwrap()).len(),
        6
    );
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, None, "nothing purged yet");
    sm.apply(blanks(3..6)).await.unwrap();
    purge.await.unwrap().unwrap();
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 5)));
}

#[tokio::test(start_paused = true)]
async fn p8_a_purge_past_the_logs_end_moves_where_a_census_hears_it_ends() {
    // A follower installs a snapshot that reaches past its log, then purges the log to the
    // snapshot's last entry: its log now ends there (seed 7009589, `identity` rule 4).
    let (_dir, mut log, mut sm) = open_temp();
    log.write_entries(blanks(0..3)).await.unwrap();
    sm.apply(blanks(0..9)).await.unwrap();
    log.get_log_state().await.unwrap();
    assert_eq!(sm.identity().last_log(), Some(log_id(1, 1, 2)));
    log.purge(log_id(1, 1, 8)).await.unwrap();
    assert_eq!(sm.identity().last_log(), Some(log_id(1, 1, 8)));
}

#[tokio::test(start_paused = true)]
async fn p8_a_purge_past_anything_applied_fails_instead_of_purging() {
    let (_dir, mut log, mut sm) = open_temp();
    log.write_entries(blanks(0..4)).await.unwrap();
    sm.apply(blanks(0..1)).await.unwrap();
    let error = log.purge(log_id(1, 1, 3)).await.unwrap_err();
    assert!(error.to_string().contains("refused to purge"), "{error}");
    assert_eq!(
        indexes(&log.try_get_log_entries(0..).await.unwrap()),
        [0, 1, 2, 3]
    );
}

#[tokio::test]
async fn p1_the_state_machine_refuses_a_counter_going_back_and_keeps_its_state() {
    let (_dir, _log, mut sm) = open_temp();
    sm.apply(vec![apply_entry(0, 5, Some(5))]).await.unwrap();
    let error = sm.apply(vec![apply_entry(1, 4, None)]).await.unwrap_err();
    assert!(
        error.to_string().contains("below the applied counter"),
        "{error}"
    );
    let error = sm
        .apply(vec![apply_entry(1, 6, Some(7))])
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("above its own counter"),
        "{error}"
    );
    let state = sm.shared();
    let state = state.lock().unwrap();
    assert_eq!(state.header.last_epoch, Epoch(5));
    assert_eq!(state.header.last_applied, Some(log_id(1, 1, 0)));
}

#[tokio::test(start_paused = true)]
async fn p8_the_log_and_the_state_machine_reopen_after_a_purge_and_a_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(palisade_coordinator::CLUSTER_STORE_FILE);
    {
        let (mut log, mut sm) = open(&path).unwrap();
        log.write_entries(blanks(0..8)).await.unwrap();
        sm.apply(blanks(0..8)).await.unwrap();
        // Everything purged: compacted into the other file, recorded in the store.
        log.purge(log_id(1, 1, 7)).await.unwrap();
        log.write_entries(blanks(8..10)).await.unwrap();
    }
    let (mut log, _sm) = open(&path).unwrap();
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 7)));
    assert_eq!(state.last_log_id, Some(log_id(1, 1, 9)));
    assert_eq!(
        indexes(&log.try_get_log_entries(8..).await.unwrap()),
        [8, 9]
    );
    let [first, second] = log_paths(&path);
    assert_eq!(
        std::fs::metadata(first).unwrap().len(),
        0,
        "the old file emptied"
    );
    assert!(std::fs::metadata(second).unwrap().len() > raft_log::HEADER_BYTES);
}

#[tokio::test]
async fn p8_a_store_from_before_the_log_file_has_its_entries_moved_into_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(palisade_coordinator::CLUSTER_STORE_FILE);
    {
        // The store as an earlier version left it: entries in the `raft_log` table.
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut table = txn.open_table(LOG).unwrap();
            for entry in blanks(3..7) {
                table
                    .insert(entry.log_id.index, to_json(&entry).as_slice())
                    .unwrap();
            }
            let mut meta = txn.open_table(RAFT_META).unwrap();
            meta.insert("last_purged", to_json(&Some(log_id(1, 1, 2))).as_slice())
                .unwrap();
        }
        txn.commit().unwrap();
    }
    for _ in 0..2 {
        let (mut log, _sm) = open(&path).unwrap();
        assert_eq!(
            indexes(&log.try_get_log_entries(3..).await.unwrap()),
            [3, 4, 5, 6]
        );
        assert_eq!(
            log.log().unwrap().active(),
            1,
            "moved into the file not in use"
        );
        drop(log);
    }
    let db = Database::open(&path).unwrap();
    let txn = db.begin_read().unwrap();
    assert!(
        ReadableTableMetadata::is_empty(&txn.open_table(LOG).unwrap()).unwrap(),
        "the table emptied"
    );
}

#[tokio::test]
async fn p6_an_apply_is_durable_only_once_synced_and_the_durable_mark_follows() {
    // The witness follows the durable mark: it must never be ahead of the disk.
    let (_dir, log, mut sm) = open_temp();
    log.write_entries(blanks(0..3)).await.unwrap();
    sm.apply(blanks(0..3)).await.unwrap();
    let durable = sm.durable_applied_watch();
    assert_eq!(
        *durable.borrow(),
        None,
        "an append no longer makes the applies durable"
    );
    let sync = sm.syncer();
    sync.sync().unwrap();
    assert_eq!(*durable.borrow(), Some(log_id(1, 1, 2)));
    sync.sync().unwrap(); // nothing to do
    assert_eq!(*durable.borrow(), Some(log_id(1, 1, 2)));
}

#[tokio::test]
async fn p6_an_offline_backup_counts_the_grants_in_the_log_the_state_machine_has_not_made_durable()
{
    // After a kill -9 the state machine on disk may lag the log by up to 200 ms of applies:
    // the counter a backup reads must not.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(palisade_coordinator::CLUSTER_STORE_FILE);
    {
        let (log, mut sm) = open(&path).unwrap();
        log.write_entries(vec![apply_entry(0, 5, Some(5))])
            .await
            .unwrap();
        sm.apply(vec![apply_entry(0, 5, Some(5))]).await.unwrap();
        sm.syncer().sync().unwrap();
        // Appended (durable in the log), applied but not synced, or not applied at all.
        log.write_entries(vec![apply_entry(1, 9, Some(9))])
            .await
            .unwrap();
    }
    assert_eq!(read_counter(&path).unwrap(), Epoch(9));
    // A torn tail is left out, and nothing is written.
    let [first, _] = log_paths(&path);
    let mut bytes = std::fs::read(&first).unwrap();
    bytes.extend_from_slice(&[7; 9]);
    std::fs::write(&first, &bytes).unwrap();
    assert_eq!(read_counter(&path).unwrap(), Epoch(9));
    assert_eq!(
        std::fs::read(&first).unwrap(),
        bytes,
        "read without writing"
    );
}

#[tokio::test]
async fn p8_a_store_whose_log_file_was_lost_refuses_to_open() {
    // cluster.redb copied (or restored) without its log files: the member would start with
    // its vote and state but none of the entries it acknowledged.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(palisade_coordinator::CLUSTER_STORE_FILE);
    {
        let (log, _sm) = open(&path).unwrap();
        log.write_entries(blanks(0..3)).await.unwrap();
    }
    let [first, _] = log_paths(&path);
    let kept = std::fs::read(&first).unwrap();
    for remove in [true, false] {
        if remove {
            std::fs::remove_file(&first).unwrap();
        } else {
            std::fs::write(&first, b"").unwrap();
        }
        let Err(error) = open(&path) else {
            panic!("opened without its log");
        };
        assert!(
            matches!(error, ClusterError::DataDirectory(ref why) if why.contains("missing or empty")),
            "{error}"
        );
        std::fs::write(&first, &kept).unwrap();
        assert!(open(&path).is_ok(), "the whole directory put back opens");
    }
}

#[tokio::test]
async fn p8_a_panic_holding_the_raft_log_fails_later_calls_with_their_cause() {
    let (_dir, mut log, _sm) = open_temp();
    log.write_entries(blanks(0..3)).await.unwrap();
    // A panic while the lock is held (a bug in a storage call) poisons it.
    let shared = log.log.clone();
    let _ = std::thread::spawn(move || {
        let _held = shared.lock().unwrap();
        panic!("a bug in a storage call");
    })
    .join();
    // Every later call fails with the cause, as openraft's storage error (the member's Raft
    // stops and its supervisor exits with it); none panics in turn.
    let error = log.get_log_state().await.unwrap_err().to_string();
    assert!(error.contains("a panic in an earlier call"), "{error}");
    assert!(log.try_get_log_entries(0..3).await.is_err());
    assert!(log.write_entries(blanks(3..4)).await.is_err());
    assert!(log.truncate(log_id(1, 1, 1)).await.is_err());
}

/// A log file on a real file whose fsyncs wait while the test holds them, and whose writes
/// fail while it says so: a disk that stalls, a disk that fails.
#[derive(Debug)]
struct GatedFile {
    file: std::fs::File,
    gate: Arc<Gate>,
}

#[derive(Debug, Default)]
struct Gate {
    /// (fsyncs held, an fsync is waiting)
    held: Mutex<(bool, bool)>,
    changed: std::sync::Condvar,
    fail_writes: std::sync::atomic::AtomicBool,
}

impl Gate {
    fn hold(&self, hold: bool) {
        self.held.lock().unwrap().0 = hold;
        self.changed.notify_all();
    }

    /// Waits (at most 10 s) until an fsync waits at the gate.
    fn until_waiting(&self) {
        let (held, timeout) = self
            .changed
            .wait_timeout_while(
                self.held.lock().unwrap(),
                std::time::Duration::from_secs(10),
                |(_, waiting)| !*waiting,
            )
            .unwrap();
        assert!(!timeout.timed_out() && held.1, "no fsync reached the gate");
    }
}

impl raft_log::LogFile for GatedFile {
    fn len(&self) -> std::io::Result<u64> {
        raft_log::LogFile::len(&self.file)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        raft_log::LogFile::read(&self.file, offset, out)
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        if self
            .gate
            .fail_writes
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(std::io::Error::other("EIO from the test's disk"));
        }
        raft_log::LogFile::write(&self.file, offset, data)
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        raft_log::LogFile::set_len(&self.file, len)
    }

    fn sync_data(&self) -> std::io::Result<()> {
        let mut held = self.gate.held.lock().unwrap();
        held.1 = true;
        self.gate.changed.notify_all();
        while held.0 {
            held = self.gate.changed.wait(held).unwrap();
        }
        held.1 = false;
        drop(held);
        self.file.sync_data()
    }
}

/// A store on an in-memory redb and two gated log files in a temporary directory.
fn open_gated() -> (tempfile::TempDir, Arc<Gate>, LogStore) {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let file = |n: usize| -> Box<dyn raft_log::LogFile> {
        Box::new(GatedFile {
            file: std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(dir.path().join(format!("log.{n}")))
                .unwrap(),
            gate: gate.clone(),
        })
    };
    let files = [file(0), file(1)];
    let (log, _sm) = open_backend(redb::backends::InMemoryBackend::new(), files).unwrap();
    (dir, gate, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replication_read_is_answered_while_an_appends_fsync_hangs() {
    let (_dir, gate, log) = open_gated();
    log.write_entries(blanks(0..3)).await.unwrap();
    gate.hold(true);
    let appending = tokio::spawn({
        let log = log.clone();
        async move { log.write_entries(blanks(3..5)).await }
    });
    gate.until_waiting();
    // Read on a thread of its own: a read that waited for the fsync would block it, and the
    // test would say so after 10 s instead of hanging.
    let (tx, rx) = std::sync::mpsc::channel();
    let mut reader = log.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let _ = tx.send(runtime.block_on(reader.try_get_log_entries(0..10)));
    });
    let read = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("a read waited for an append's fsync")
        .unwrap();
    assert_eq!(
        indexes(&read),
        vec![0, 1, 2],
        "only what is durable is read"
    );
    gate.hold(false);
    appending.await.unwrap().unwrap();
    let mut reader = log.clone();
    assert_eq!(
        indexes(&reader.try_get_log_entries(0..10).await.unwrap()),
        vec![0, 1, 2, 3, 4]
    );
}

#[tokio::test]
async fn p8_a_failed_log_write_stops_the_store_with_its_cause_and_nothing_panics() {
    let (_dir, gate, mut log) = open_gated();
    log.write_entries(blanks(0..3)).await.unwrap();
    gate.fail_writes
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let error = log.write_entries(blanks(3..4)).await.unwrap_err();
    assert!(
        error.to_string().contains("EIO from the test's disk"),
        "{error}"
    );
    // The disk answers again, but the index may be ahead of the file: every later call fails
    // with the first cause (the member's Raft stops), and none is answered from the index.
    gate.fail_writes
        .store(false, std::sync::atomic::Ordering::SeqCst);
    for error in [
        log.write_entries(blanks(3..4)).await.unwrap_err(),
        log.try_get_log_entries(0..3).await.unwrap_err(),
        log.get_log_state().await.unwrap_err(),
        log.save_vote(&Vote::new(2, 1)).await.unwrap_err(),
    ] {
        let error = error.to_string();
        assert!(
            error.contains("an earlier write of the raft log failed"),
            "{error}"
        );
        assert!(error.contains("EIO from the test's disk"), "{error}");
    }
}

#[test]
fn a_panic_holding_the_applied_state_leaves_it_readable() {
    let state = Arc::new(Mutex::new(SmState {
        header: SmHeader::default(),
        leases: BTreeMap::new(),
    }));
    let shared = state.clone();
    let _ = std::thread::spawn(move || {
        let _held = shared.lock().unwrap();
        panic!("a bug while the applied state is locked");
    })
    .join();
    assert!(state.is_poisoned());
    // Every change replaces whole values: the state is as the last change left it.
    assert_eq!(lock_state(&state).header.last_applied, None);
}
