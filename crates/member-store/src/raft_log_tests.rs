//! The Raft log file alone, over an in-memory file whose crash loses what was not synced.

use std::sync::{Arc, Mutex};

use openraft::testing::log_id;

use super::*;
use palisade_durable::appends;

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

    fn boxed(&self) -> [Box<dyn LogFile>; 2] {
        [
            Box::new(self.files[0].clone()),
            Box::new(self.files[1].clone()),
        ]
    }

    fn open(&self) -> Result<RaftLog, LogError> {
        RaftLog::open(self.boxed(), self.active, self.purged, &mut no_switch())
    }

    fn crash(&self) {
        for file in &self.files {
            file.crash();
        }
    }
}

fn entry(term: u64, index: u64) -> (LogId<NodeId>, Vec<u8>) {
    padded(term, index, 40)
}

fn padded(term: u64, index: u64, pad: usize) -> (LogId<NodeId>, Vec<u8>) {
    let id = log_id(term, 1, index);
    let json = serde_json::json!({ "log_id": id, "payload": "Blank", "pad": "x".repeat(pad) });
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

/// The file as a power cut in the write of `append` (from `at` on, over `synced`) leaves it
/// when it keeps the sectors `kept` says (bit i: the i-th sector the write touches); `extended`:
/// the file's length reached the write's end even where its sectors were lost (zeros there).
fn torn(synced: &[u8], at: usize, append: &[u8], kept: u64, extended: bool) -> Vec<u8> {
    const SECTOR: usize = 512;
    let end = at + append.len();
    let first = at / SECTOR;
    let mut file = synced.to_vec();
    if extended {
        file.resize(end.max(file.len()), 0);
    }
    for sector in first..=(end - 1) / SECTOR {
        if kept & (1 << (sector - first)) == 0 {
            continue;
        }
        let (from, to) = ((sector * SECTOR).max(at), ((sector + 1) * SECTOR).min(end));
        if file.len() < to {
            file.resize(to, 0);
        }
        file[from..to].copy_from_slice(&append[from - at..to - at]);
    }
    file
}

#[test]
fn p8_any_subset_of_a_torn_appends_sectors_is_cut_back_to_the_append_before() {
    let files = Files::new();
    let mut log = files.open().unwrap();
    log.append(&entries(1, 0..3), &mut no_switch()).unwrap();
    let synced = files.files[0].bytes();
    // Ten records of about 300 bytes: 3,000 bytes over 7 sectors, the first shared with the
    // synced records.
    let batch: Vec<_> = (3..13).map(|i| padded(1, i, 220)).collect();
    log.append(&batch, &mut no_switch()).unwrap();
    let whole = files.files[0].bytes();
    let append = &whole[synced.len()..];
    let sectors = (whole.len() - 1) / 512 - synced.len() / 512 + 1;
    assert_eq!(sectors, 7);
    for kept in 0..(1u64 << sectors) - 1 {
        for extended in [false, true] {
            files.files[0].put(torn(&synced, synced.len(), append, kept, extended));
            let mut log = files
                .open()
                .unwrap_or_else(|e| panic!("sectors {kept:07b}: refused: {e}"));
            assert_eq!(indexes(&log, 0), vec![0, 1, 2], "sectors {kept:07b}");
            assert_eq!(files.files[0].bytes(), synced, "cut back: {kept:07b}");
            log.append(&entries(2, 3..4), &mut no_switch()).unwrap();
            assert_eq!(indexes(&files.open().unwrap(), 0), vec![0, 1, 2, 3]);
        }
    }
    // Every sector kept: the append is whole (on disk, never acknowledged: allowed in Raft).
    files.files[0].put(whole);
    assert_eq!(
        indexes(&files.open().unwrap(), 0),
        (0..13).collect::<Vec<_>>()
    );
}

#[test]
fn p8_a_torn_last_append_is_cut_whole_at_every_length() {
    let files = Files::new();
    let mut log = files.open().unwrap();
    log.append(&entries(1, 0..3), &mut no_switch()).unwrap();
    let whole = files.files[0].bytes();
    log.append(&entries(1, 3..5), &mut no_switch()).unwrap();
    let longer = files.files[0].bytes();
    for cut in whole.len() + 1..longer.len() {
        files.files[0].put(longer[..cut].to_vec());
        let mut log = files.open().unwrap();
        assert_eq!(
            indexes(&log, 0),
            vec![0, 1, 2],
            "cut at {cut}: none of it taken"
        );
        assert_eq!(files.files[0].bytes().len(), whole.len(), "cut at {cut}");
        log.append(&entries(2, 3..4), &mut no_switch()).unwrap();
        assert_eq!(indexes(&files.open().unwrap(), 0), vec![0, 1, 2, 3]);
    }
    // Zeros after the last append (a file grown ahead of its records) are cut too.
    let mut zeros = longer.clone();
    zeros.resize(longer.len() + 4096, 0);
    files.files[0].put(zeros);
    assert_eq!(indexes(&files.open().unwrap(), 0), vec![0, 1, 2, 3, 4]);
    assert_eq!(files.files[0].bytes(), longer);
}

/// Four appends of one entry and one of two; the offsets where each append starts.
fn five_appends(files: &Files) -> (Vec<u8>, Vec<usize>) {
    let mut log = files.open().unwrap();
    let mut starts = Vec::new();
    for i in 0..4 {
        starts.push(files.files[0].bytes().len());
        log.append(&entries(1, i..i + 1), &mut no_switch()).unwrap();
    }
    starts.push(files.files[0].bytes().len());
    log.append(&entries(1, 4..6), &mut no_switch()).unwrap();
    (files.files[0].bytes(), starts)
}

#[test]
fn p8_damage_in_an_append_followed_by_a_whole_one_refuses_the_file_naming_the_byte() {
    let files = Files::new();
    let (good, starts) = five_appends(&files);
    let header = appends::HEADER_BYTES;
    for (n, start) in starts[..4].iter().enumerate() {
        // The append's magic, offset, first index, its header's checksum, a record's header,
        // its JSON; and its whole first sector zeroed.
        for byte in [0, 9, 17, 41, 50, header + 2, header + 30] {
            let mut damaged = good.clone();
            damaged[start + byte] ^= 0x10;
            files.files[0].put(damaged);
            let error = files.open().unwrap_err().to_string();
            assert!(
                error.contains(&format!("the append at byte {start} does not check")),
                "append {n}, byte {byte}: {error}"
            );
        }
    }
    // Damage in the last append cannot be told from a torn write: it is cut.
    let mut last = good.clone();
    last[starts[4] + header + 30] ^= 0x10;
    files.files[0].put(last);
    assert_eq!(indexes(&files.open().unwrap(), 0), vec![0, 1, 2, 3]);
    // Another file, or another format.
    let mut foreign = good.clone();
    foreign[0] = b'x';
    files.files[0].put(foreign);
    let error = files.open().unwrap_err().to_string();
    assert!(error.contains("not a Palisade raft log"), "{error}");
    let mut newer = good;
    newer[16] = 3;
    files.files[0].put(newer);
    let error = files.open().unwrap_err().to_string();
    assert!(error.contains("format version 3"), "{error}");
}

#[test]
fn p8_an_append_that_checks_with_records_that_do_not_agree_is_refused() {
    let files = Files::new();
    let (good, starts) = five_appends(&files);
    // The second append rewritten, checksums and all, with a record out of sequence: written
    // so, not torn.
    let at = starts[1];
    let record = records::frame(7, &entry(1, 7).1);
    let mut bad = good[..at].to_vec();
    bad.extend_from_slice(&appends::frame(at as u64, 1, 1, &record));
    bad.extend_from_slice(&record);
    files.files[0].put(bad);
    let error = files.open().unwrap_err().to_string();
    assert!(
        error.contains(&format!("the append at byte {at} checks but")),
        "{error}"
    );
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
    // Entries of term 3 from a deposed leader, replaced by the new leader's entries of an
    // older term (Raft allows it: they were never committed).
    log.append(&[entry(1, 0), entry(1, 1), entry(1, 2)], &mut no_switch())
        .unwrap();
    log.append(&[entry(3, 3), entry(3, 4), entry(3, 5)], &mut no_switch())
        .unwrap();
    let before = files.files[0].bytes().len();
    // Inside an append: a truncation mark is appended.
    log.truncate(4).unwrap();
    assert_eq!(files.files[0].bytes().len(), before + appends::HEADER_BYTES);
    assert_eq!(log.last(), Some(log_id(3, 1, 3)));
    files.crash();
    let mut log = files.open().unwrap();
    assert_eq!(indexes(&log, 0), vec![0, 1, 2, 3]);
    // At an append's start: the file is cut there.
    log.truncate(3).unwrap();
    log.append(&[entry(2, 3), entry(2, 4)], &mut no_switch())
        .unwrap();
    files.crash();
    let log = files.open().unwrap();
    assert_eq!(indexes(&log, 0), vec![0, 1, 2, 3, 4]);
    assert_eq!(log.last(), Some(log_id(2, 1, 4)));
    // A mark, then entries below the truncated ones' term, read back across a crash.
    let mut log = files.open().unwrap();
    log.truncate(4).unwrap();
    log.append(&[entry(2, 4), entry(2, 5)], &mut no_switch())
        .unwrap();
    files.crash();
    assert_eq!(indexes(&files.open().unwrap(), 0), vec![0, 1, 2, 3, 4, 5]);
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
fn p8_a_compaction_copies_large_logs_in_several_appends() {
    let mut files = Files::new();
    let mut log = files.open().unwrap();
    // About 8 MiB of live records after the truncation: two appends in the compacted file.
    let big: Vec<_> = (0..90).map(|i| padded(1, i, 100_000)).collect();
    log.append(&big[..45], &mut no_switch()).unwrap();
    log.append(&big[45..], &mut no_switch()).unwrap();
    log.truncate(80).unwrap();
    let mut switched = None;
    log.compact(&mut |file| {
        switched = Some(file);
        Ok(())
    })
    .unwrap();
    assert_eq!(switched, Some(1));
    files.active = 1;
    files.crash();
    let log = files.open().unwrap();
    assert_eq!(indexes(&log, 0), (0..80).collect::<Vec<_>>());
    let appends = log.index.live.iter().filter(|s| s.opens_append).count();
    assert_eq!(appends, 2);
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

/// A log file of format 1 (records without appends) holding `entries`.
fn format_1(entries: &[(LogId<NodeId>, Vec<u8>)]) -> Vec<u8> {
    let mut bytes = header().to_vec();
    bytes[16..20].copy_from_slice(&FORMAT_VERSION_RECORDS.to_le_bytes());
    for (id, json) in entries {
        bytes.extend_from_slice(&records::frame(id.index, json));
    }
    bytes
}

#[test]
fn p8_a_log_of_format_1_is_read_and_moved_into_format_2_at_its_first_open() {
    let mut files = Files::new();
    let mut old = format_1(&entries(1, 0..6));
    let torn_from = old.len();
    old.extend_from_slice(&records::frame(6, &entry(1, 6).1)[..30]);
    files.files[0].put(old.clone());
    files.purged = Some(log_id(1, 1, 1));
    let mut switched = None;
    let log = RaftLog::open(files.boxed(), 0, files.purged, &mut |file| {
        switched = Some(file);
        Ok(())
    })
    .unwrap();
    assert_eq!(switched, Some(1), "moved into the other file");
    assert_eq!(indexes(&log, 2), vec![2, 3, 4, 5]);
    files.active = 1;
    files.crash();
    let mut log = files.open().unwrap();
    assert_eq!(indexes(&log, 2), vec![2, 3, 4, 5]);
    log.append(&entries(2, 6..8), &mut no_switch()).unwrap();
    assert_eq!(indexes(&files.open().unwrap(), 2), vec![2, 3, 4, 5, 6, 7]);
    // Until the switch is recorded, the file of format 1 is the one read: a crash before it
    // reads it again (its torn record cut at that open).
    files.active = 0;
    assert_eq!(files.files[0].bytes().len(), torn_from);
    // A damaged record of format 1 with one after it is refused, as it was.
    let mut damaged = old;
    damaged[HEADER_BYTES as usize + 25] ^= 1;
    files.files[0].put(damaged);
    let error = RaftLog::open(files.boxed(), 0, None, &mut |_| Ok(())).unwrap_err();
    assert!(error.to_string().contains("entry 1 follows it"), "{error}");
}

#[test]
fn p6_an_offline_read_visits_every_whole_append_of_either_format() {
    let files = Files::new();
    let mut log = files.open().unwrap();
    log.append(&entries(1, 0..3), &mut no_switch()).unwrap();
    log.append(&entries(1, 3..5), &mut no_switch()).unwrap();
    let mut bytes = files.files[0].bytes();
    bytes.truncate(bytes.len() - 10);
    let count = |file: &MemFile| {
        let mut seen = 0;
        visit_payloads(file, &mut |json| {
            entry_log_id(json).unwrap();
            seen += 1;
        })
        .unwrap();
        seen
    };
    files.files[0].put(bytes);
    assert_eq!(count(&files.files[0]), 3, "the torn append left out");
    files.files[0].put(format_1(&entries(1, 0..4)));
    assert_eq!(count(&files.files[0]), 4);
    files.files[0].put(Vec::new());
    assert_eq!(count(&files.files[0]), 0);
}

/// The work (bytes handed out by the readers) of opening a log of `appends` appends of 4
/// entries, each one's body damaged: every header checks, no append is whole after the first.
fn work_opening_a_damaged_log(appends: u64) -> (u64, u64) {
    let files = Files::new();
    let mut log = files.open().unwrap();
    let mut ends = Vec::new();
    for i in 0..appends {
        log.append(&entries(1, i * 4..i * 4 + 4), &mut no_switch())
            .unwrap();
        ends.push(files.files[0].bytes().len());
    }
    let mut bytes = files.files[0].bytes();
    // A byte of the last record of every append but the first.
    for end in &ends[1..] {
        bytes[end - 10] ^= 1;
    }
    let length = bytes.len() as u64;
    files.files[0].put(bytes);
    let before = scan::EXAMINED.with(std::cell::Cell::get);
    let log = files.open().unwrap();
    assert_eq!(
        indexes(&log, 0),
        vec![0, 1, 2, 3],
        "damage in the last append: torn"
    );
    (scan::EXAMINED.with(std::cell::Cell::get) - before, length)
}

#[test]
fn p8_opening_a_damaged_log_reads_each_byte_a_bounded_number_of_times() {
    // The old reader hashed from every offset after the damage (quadratic). The search for a
    // whole append compares magic and offset at each offset and hashes each body once.
    let (small, small_len) = work_opening_a_damaged_log(500);
    let (large, large_len) = work_opening_a_damaged_log(4_000);
    assert!(
        small <= 4 * small_len,
        "{small} bytes examined for {small_len}"
    );
    assert!(
        large <= 4 * large_len,
        "{large} bytes examined for {large_len}"
    );
    // Linear: eight times the file, about eight times the work.
    assert!(
        large * small_len * 5 <= small * large_len * 6,
        "{small} bytes for {small_len}, {large} for {large_len}"
    );
}
