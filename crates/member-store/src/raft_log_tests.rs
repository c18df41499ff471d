//! The Raft log file alone, over an in-memory file whose crash loses what was not synced.

use std::sync::{Arc, Mutex};

use openraft::testing::log_id;

use super::*;

#[derive(Debug, Default)]
struct Bytes {
    data: Vec<u8>,
    durable: Vec<u8>,
    writes: u64,
    syncs: u64,
}

/// A file in memory; clones share it.
#[derive(Debug, Clone, Default)]
struct MemFile(Arc<Mutex<Bytes>>);

impl MemFile {
    fn crash(&self) {
        let mut bytes = self.0.lock().unwrap();
        bytes.data = bytes.durable.clone();
    }

    fn counts(&self) -> (u64, u64) {
        let bytes = self.0.lock().unwrap();
        (bytes.writes, bytes.syncs)
    }

    fn bytes(&self) -> Vec<u8> {
        self.0.lock().unwrap().data.clone()
    }

    fn put(&self, data: Vec<u8>) {
        let mut bytes = self.0.lock().unwrap();
        bytes.data = data.clone();
        bytes.durable = data;
    }
}

impl LogFile for MemFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.lock().unwrap().data.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let bytes = self.0.lock().unwrap();
        let at = offset as usize;
        let found = bytes
            .data
            .get(at..at + out.len())
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "past the end"))?;
        out.copy_from_slice(found);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut bytes = self.0.lock().unwrap();
        let end = offset as usize + data.len();
        if bytes.data.len() < end {
            bytes.data.resize(end, 0);
        }
        bytes.data[offset as usize..end].copy_from_slice(data);
        bytes.writes += 1;
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.lock().unwrap().data.resize(len as usize, 0);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut bytes = self.0.lock().unwrap();
        bytes.durable = bytes.data.clone();
        bytes.syncs += 1;
        Ok(())
    }
}

/// Two files, and which one the "store" records as in use.
struct Files {
    files: [MemFile; 2],
    active: usize,
    purged: Option<LogId<NodeId>>,
}

impl Files {
    fn new() -> Self {
        Files {
            files: [MemFile::default(), MemFile::default()],
            active: 0,
            purged: None,
        }
    }

    fn open(&self) -> Result<RaftLog, LogError> {
        RaftLog::open(
            [
                Box::new(self.files[0].clone()),
                Box::new(self.files[1].clone()),
            ],
            self.active,
            self.purged,
        )
    }

    fn crash(&self) {
        for file in &self.files {
            file.crash();
        }
    }
}

fn entry(term: u64, index: u64) -> (LogId<NodeId>, Vec<u8>) {
    let id = log_id(term, 1, index);
    let json = serde_json::json!({ "log_id": id, "payload": "Blank", "pad": "x".repeat(40) });
    (id, serde_json::to_vec(&json).unwrap())
}

fn entries(term: u64, indexes: std::ops::Range<u64>) -> Vec<(LogId<NodeId>, Vec<u8>)> {
    indexes.map(|i| entry(term, i)).collect()
}

fn no_switch() -> impl FnMut(usize) -> Result<(), LogError> {
    |file| panic!("no compaction expected (to file {file})")
}

fn indexes(log: &RaftLog, from: u64) -> Vec<u64> {
    log.read((Bound::Included(from), Bound::Unbounded))
        .unwrap()
        .iter()
        .map(|json| entry_log_id(json).unwrap().index)
        .collect()
}

#[test]
fn p8_an_append_is_one_write_and_one_fdatasync_and_survives_a_crash() {
    let files = Files::new();
    let mut log = files.open().unwrap();
    log.append(&entries(1, 0..5), &mut no_switch()).unwrap();
    let before = files.files[0].counts();
    log.append(&entries(1, 5..21), &mut no_switch()).unwrap();
    let after = files.files[0].counts();
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (1, 1),
        "16 entries: one write, one sync"
    );
    files.crash();
    let log = files.open().unwrap();
    assert_eq!(indexes(&log, 0), (0..21).collect::<Vec<_>>());
    assert_eq!(log.last(), Some(log_id(1, 1, 20)));
    assert_eq!(
        log.read((Bound::Included(18), Bound::Excluded(20)))
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn p8_a_torn_last_append_is_cut_and_the_rest_read() {
    let files = Files::new();
    let mut log = files.open().unwrap();
    log.append(&entries(1, 0..3), &mut no_switch()).unwrap();
    let whole = files.files[0].bytes();
    log.append(&entries(1, 3..5), &mut no_switch()).unwrap();
    let longer = files.files[0].bytes();
    let third = whole.len() + records::frame(3, &entry(1, 3).1).len();
    // Every cut inside the last append (two records): the entries whose records are whole —
    // an entry on disk but never acknowledged is allowed in Raft — and the file cut back to
    // them, so that the next append follows.
    for cut in whole.len() + 1..longer.len() {
        files.files[0].put(longer[..cut].to_vec());
        let mut log = files.open().unwrap();
        let (kept, length) = if cut >= third {
            (vec![0, 1, 2, 3], third)
        } else {
            (vec![0, 1, 2], whole.len())
        };
        assert_eq!(indexes(&log, 0), kept, "cut at {cut}");
        assert_eq!(files.files[0].bytes().len(), length, "cut at {cut}");
        let next = log.next_index();
        log.append(&entries(2, next..next + 1), &mut no_switch())
            .unwrap();
        assert_eq!(
            indexes(&files.open().unwrap(), 0),
            (0..=next).collect::<Vec<_>>()
        );
    }
}

#[test]
fn p8_a_damaged_record_before_others_refuses_the_file() {
    let files = Files::new();
    let mut log = files.open().unwrap();
    for i in 0..4 {
        log.append(&entries(1, i..i + 1), &mut no_switch()).unwrap();
    }
    let good = files.files[0].bytes();
    let record = (good.len() - HEADER_BYTES as usize) / 4;
    for at in [0, 1, 2] {
        for byte in [0, 4, 12, records::HEADER_BYTES + 3] {
            let mut damaged = good.clone();
            damaged[HEADER_BYTES as usize + at * record + byte] ^= 0x10;
            files.files[0].put(damaged);
            let error = files.open().unwrap_err();
            assert!(
                matches!(error, LogError::Damaged(_)),
                "record {at}, byte {byte}: {error}"
            );
        }
    }
    // Another file, or another format.
    let mut foreign = good.clone();
    foreign[0] = b'x';
    files.files[0].put(foreign);
    assert!(files
        .open()
        .unwrap_err()
        .to_string()
        .contains("not a Palisade raft log"));
    let mut newer = good;
    newer[16] = 2;
    files.files[0].put(newer);
    assert!(files
        .open()
        .unwrap_err()
        .to_string()
        .contains("format version 2"));
}

#[test]
fn p1_an_append_that_does_not_continue_the_log_writes_nothing() {
    let files = Files::new();
    let mut log = files.open().unwrap();
    log.append(&entries(2, 0..3), &mut no_switch()).unwrap();
    let before = files.files[0].bytes();
    for bad in [
        entries(2, 4..5),               // a gap
        entries(2, 2..3),               // an overwrite
        entries(1, 3..4),               // a term going back
        vec![entry(2, 3), entry(2, 5)], // a gap inside the batch
    ] {
        let error = log.append(&bad, &mut no_switch()).unwrap_err();
        assert!(matches!(error, LogError::Refused(_)), "{error}");
        assert_eq!(files.files[0].bytes(), before, "nothing written");
    }
    assert_eq!(indexes(&files.open().unwrap(), 0), vec![0, 1, 2]);
}

#[test]
fn p8_a_truncation_is_durable_and_the_log_continues_after_it() {
    let files = Files::new();
    let mut log = files.open().unwrap();
    log.append(&entries(1, 0..6), &mut no_switch()).unwrap();
    log.truncate(3).unwrap();
    assert_eq!(log.last(), Some(log_id(1, 1, 2)));
    log.append(&entries(2, 3..5), &mut no_switch()).unwrap();
    files.crash();
    let log = files.open().unwrap();
    assert_eq!(indexes(&log, 0), vec![0, 1, 2, 3, 4]);
    assert_eq!(log.last(), Some(log_id(2, 1, 4)));
}

#[test]
fn p8_a_purge_compacts_into_the_other_file_and_a_crash_either_side_of_the_switch_keeps_the_log() {
    let mut files = Files::new();
    let mut log = files.open().unwrap();
    log.append(&entries(1, 0..10), &mut no_switch()).unwrap();
    // Below the threshold the purged records stay, skipped at the next open.
    log.purge(log_id(1, 1, 3), &mut no_switch()).unwrap();
    files.purged = Some(log_id(1, 1, 3));
    assert_eq!(
        indexes(&files.open().unwrap(), 4),
        (4..10).collect::<Vec<_>>()
    );
    assert!(
        indexes(&files.open().unwrap(), 2).is_empty(),
        "a purged start reads nothing"
    );

    // Everything purged (a snapshot installed past the log): compacted at once. A crash
    // before the switch is recorded leaves the old file in use, complete.
    let switched = Arc::new(Mutex::new(None));
    let recorded = switched.clone();
    let mut switch = move |file| {
        *recorded.lock().unwrap() = Some(file);
        Ok(())
    };
    log.purge(log_id(1, 1, 20), &mut switch).unwrap();
    assert_eq!(*switched.lock().unwrap(), Some(1));
    files.purged = Some(log_id(1, 1, 20));
    // Not yet recorded: file 0 (emptied after the switch in memory, but a crash may keep it).
    assert!(files.open().is_ok());
    files.active = 1;
    let mut log = files.open().unwrap();
    assert_eq!(log.last(), Some(log_id(1, 1, 20)));
    log.append(&entries(2, 21..24), &mut no_switch()).unwrap();
    files.crash();
    assert_eq!(indexes(&files.open().unwrap(), 21), vec![21, 22, 23]);
}

#[test]
fn p8_an_append_after_a_purge_past_the_file_compacts_first() {
    // A crash between recording a purge past the last entry and compacting leaves purged
    // records in the file; the next append at the purged index + 1 must not follow them
    // with a gap.
    let mut files = Files::new();
    let mut log = files.open().unwrap();
    log.append(&entries(1, 0..5), &mut no_switch()).unwrap();
    files.purged = Some(log_id(1, 1, 50));
    let mut log = files.open().unwrap();
    assert_eq!(log.next_index(), 51);
    let mut switched = None;
    log.append(&entries(3, 51..53), &mut |file| {
        switched = Some(file);
        Ok(())
    })
    .unwrap();
    assert_eq!(switched, Some(1));
    files.active = 1;
    assert_eq!(indexes(&files.open().unwrap(), 51), vec![51, 52]);
}

#[test]
fn p8_a_log_that_resumes_past_the_purge_with_a_hole_is_refused() {
    let mut files = Files::new();
    let mut log = files.open().unwrap();
    log.append(&entries(1, 0..5), &mut no_switch()).unwrap();
    files.purged = Some(log_id(1, 1, 1));
    assert!(files.open().is_ok());
    // The file starts after the purged id + 1: entries in between are missing.
    let mut other = Files::new();
    other.purged = Some(log_id(1, 1, 5));
    let mut log = other.open().unwrap();
    log.append(&entries(1, 6..8), &mut no_switch()).unwrap();
    other.purged = Some(log_id(1, 1, 3));
    assert!(matches!(other.open().unwrap_err(), LogError::Damaged(_)));
}
