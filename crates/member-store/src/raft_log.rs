//! The Raft log as an append-only file of appends: one write and one fdatasync per append,
//! however many entries it carries, framed so that it is read whole or not at all.
//!
//! ```text
//! header    16 bytes "palisade-raftlog", format version (u32 LE), 12 bytes reserved (zeros)
//! appends   palisade_durable::appends: [56-byte header: where it is, first index, records,
//!           length, checksum of the header, checksum of all of it][its records]
//! records   palisade_durable::records: [length][Raft log index][checksum][JSON of the entry]
//! ```
//!
//! A member keeps two such files and uses one at a time; which one is recorded in the store's
//! redb file, with the last purged log id. The appends of the file in use follow each other
//! without a gap and never go back in term, except that an append with no records is a
//! truncation: the entries from its index on are gone, and the next append starts there. What
//! a reader makes of a file:
//! - **an append that does not check with no whole append after it** (zeros, or the sectors a
//!   power cut kept of the last append — any subset of them, in any order — or nothing): the
//!   last append was cut by a power cut and never acknowledged (each append is fdatasynced
//!   before it is): dropped whole, and the file cut back to the append before it;
//! - **an append that does not check followed by one that does**: an append was fdatasynced
//!   after it, so it was damaged on the disk, not torn — the file is refused rather than read
//!   short, naming the byte, and the member does not start. So is an append that checks but
//!   whose records do not agree with it, an index out of sequence, a term going back;
//! - **records at or below the last purged id**: dropped at the next compaction. A purge
//!   records the new purged id in redb first (an immediate commit), so a crash before the
//!   compaction leaves records that are simply skipped.
//!
//! The file is read as a stream (a window of buffered reads; memory holds one entry at a time
//! and the index of the live ones), and the search for a whole append after a broken one
//! compares each offset's magic and offset before hashing anything: linear in the file's size.
//!
//! Compaction writes the live records into the other file, fsyncs it, and only then switches
//! the redb record to it (one immediate commit): a crash on either side of the switch leaves
//! one complete file in use. A file of format 1 (records without appends, an earlier version)
//! is read with that format's rules once and compacted into format 2 at the open.
//!
//! What this does not detect: a file cut short at an append boundary (`truncate -s`, a copy
//! cut short) reads as a log that ends earlier — the member then holds fewer entries than it
//! acknowledged, the class of a member whose volume was put back, which probation and the
//! census (`identity` rule 4) keep from voting a lagging member in. It assumes that a file
//! extended past its end reads zeros there (POSIX), so that an append truncated away never
//! comes back.

use std::collections::VecDeque;
use std::io;
use std::ops::Bound;
use std::sync::Arc;

use openraft::LogId;
use palisade_durable::records;

use super::NodeId;

mod scan;
pub mod staged;

use scan::{Append, Reader};

/// The first bytes of a Raft log file.
const MAGIC: &[u8; 16] = b"palisade-raftlog";
/// The format this build writes: records framed in appends.
pub const FORMAT_VERSION: u32 = 2;
/// The format of an earlier version (records without appends), read to move it into this one.
pub const FORMAT_VERSION_RECORDS: u32 = 1;
/// Bytes before the first append.
pub const HEADER_BYTES: u64 = 32;
/// Largest entry (its JSON) the log takes: a batch entry can hold thousands of lock changes.
pub const MAX_ENTRY_BYTES: u64 = 1 << 30;
/// A purge compacts the file once the purged records take more than this and more than the
/// live ones.
pub const COMPACT_AT_BYTES: u64 = 8 << 20;
/// A compaction writes the live records in appends of about this size: it holds one in memory.
pub const COMPACT_APPEND_BYTES: usize = 4 << 20;
/// A file the log writes: a real file, or a simulation's crashable one.
#[allow(clippy::len_without_is_empty)] // a file's length, not a collection's
pub trait LogFile: Send + Sync + std::fmt::Debug {
    /// Its length.
    fn len(&self) -> io::Result<u64>;
    /// Fills `out` from `offset`.
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()>;
    /// Writes `data` at `offset`.
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Cuts or extends it to `len`.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// fdatasync: what it holds now survives a power cut.
    fn sync_data(&self) -> io::Result<()>;
    /// Whether its calls may block a thread (a real disk: the store runs them on tokio's
    /// blocking pool). A simulated disk answers at once and says no: its calls run inline,
    /// in the order a seed gives them.
    fn blocks(&self) -> bool {
        true
    }
}

impl LogFile for std::fs::File {
    fn len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, out, offset)
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, data, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        std::fs::File::set_len(self, len)
    }

    fn sync_data(&self) -> io::Result<()> {
        std::fs::File::sync_data(self)
    }
}

/// Why the log could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The file failed.
    #[error("raft log: {0}")]
    Io(#[from] io::Error),
    /// The file is not a log this build reads, or it is damaged: refused, never read short.
    #[error("raft log: {0}")]
    Damaged(String),
    /// An append that would not continue the log exactly (never written).
    #[error("{0}")]
    Refused(String),
}

/// Log ids and the JSON of their entries, in order.
pub type Entries = Vec<(LogId<NodeId>, Vec<u8>)>;

/// Records a compaction's new file as the one in use, durably (see [`RaftLog::compact`]).
pub type Switch<'a> = &'a mut dyn FnMut(usize) -> Result<(), LogError>;

/// Where a live entry's record is.
#[derive(Debug, Clone, Copy)]
struct Slot {
    log_id: LogId<NodeId>,
    at: u64,
    len: u64,
    /// The first record of its append: a truncation from it cuts the file at the append.
    opens_append: bool,
}

/// The log: the file in use and an index of its live records.
#[derive(Debug)]
pub struct RaftLog {
    files: [Arc<dyn LogFile>; 2],
    active: usize,
    /// Where the live entries are.
    index: Index,
    /// Where the next append goes.
    end: u64,
    purged: Option<LogId<NodeId>>,
    /// Why an earlier staged write failed (see [`staged`]).
    failed: Option<String>,
}

/// Where the live entries' records are in the file in use.
#[derive(Debug, Default)]
struct Index {
    /// The live entries, contiguous, oldest first.
    live: VecDeque<Slot>,
    /// Bytes of the live entries' records.
    live_bytes: u64,
    /// The index the next append in the file must start at (`None`: any), live or purged
    /// records before it; otherwise the append compacts first.
    next_in_file: Option<u64>,
}

/// What a replay keeps between appends.
#[derive(Default)]
struct Replay {
    /// The term of the last entry kept (0: not known, after a truncation into purged ones).
    last_term: u64,
    /// The last purged record read.
    last_dead: Option<LogId<NodeId>>,
}

impl RaftLog {
    /// Reads the log in `files[active]`, skipping what `purged` covers; an empty file is given
    /// a header. A torn last append is cut off; damage refuses the file. A file of format 1 is
    /// compacted into format 2 in the other file, recorded by `switch`.
    pub fn open(
        files: [Box<dyn LogFile>; 2],
        active: usize,
        purged: Option<LogId<NodeId>>,
        switch: Switch,
    ) -> Result<Self, LogError> {
        let [first, second] = files;
        let mut log = RaftLog {
            files: [Arc::from(first), Arc::from(second)],
            active: active.min(1),
            index: Index::default(),
            end: HEADER_BYTES,
            purged,
            failed: None,
        };
        if log.file().len()? == 0 {
            log.file().write(0, &header())?;
            log.file().sync_data()?;
            return Ok(log);
        }
        let mut head = [0u8; HEADER_BYTES as usize];
        log.file()
            .read(0, &mut head)
            .map_err(|_| LogError::Damaged("not a Palisade raft log".into()))?;
        let version = check_header(&head)?;
        let end = if version == FORMAT_VERSION {
            log.replay()?
        } else {
            log.replay_records()?
        };
        log.check_resumes_after_purge()?;
        log.cut_at(end)?;
        if version != FORMAT_VERSION {
            log.compact(switch)?;
            tracing::info!(
                entries = log.index.live.len(),
                "moved the raft log into format {FORMAT_VERSION} (appends read whole or not at all)"
            );
        }
        Ok(log)
    }

    fn file(&self) -> &dyn LogFile {
        self.files[self.active].as_ref()
    }

    /// Which of the two files is in use.
    pub fn active(&self) -> usize {
        self.active
    }

    /// Reads the appends of a file of format 2; where the whole ones end.
    fn replay(&mut self) -> Result<u64, LogError> {
        let file = self.files[self.active].as_ref();
        let mut reader = Reader::new(file)?;
        let mut replay = Replay::default();
        let mut at = HEADER_BYTES;
        while at < reader.len() {
            let mut parse = |sequence, json: &[u8]| match entry_log_id(json) {
                Ok(id) if id.index == sequence => Ok(id),
                Ok(id) => Err(format!("record {sequence} holds entry {id}")),
                Err(e) => Err(e.to_string()),
            };
            match scan::read_append(&mut reader, at, &mut parse)? {
                Append::Whole {
                    first,
                    records,
                    next,
                } => {
                    self.index
                        .take_append(self.purged, &mut replay, at, first, records)?;
                    at = next;
                }
                Append::Inconsistent(why) => return Err(scan::damaged(at, why)),
                Append::Broken => break,
            }
        }
        if at < reader.len() {
            if let Some((found, first)) = scan::later_append(&mut reader, at + 1)? {
                return Err(LogError::Damaged(format!(
                    "the append at byte {at} does not check, and a whole append (from entry \
                     {first}) follows it at byte {found}: the log is damaged (not a torn \
                     write), so it is not read short"
                )));
            }
        }
        self.end = at;
        Ok(at)
    }

    /// Reads the records of a file of format 1 (an earlier version) by its rules: a record that
    /// does not check ends the log unless one that does follows it. Where they end.
    fn replay_records(&mut self) -> Result<u64, LogError> {
        let file = self.files[self.active].as_ref();
        let mut reader = Reader::new(file)?;
        let mut replay = Replay::default();
        let mut at = HEADER_BYTES;
        while let Some((sequence, json, len)) = scan::v1_record(&mut reader, at)? {
            let log_id = entry_log_id(json)?;
            if log_id.index != sequence {
                return Err(LogError::Damaged(format!(
                    "record {sequence} at byte {at} holds entry {log_id}"
                )));
            }
            self.index.take_append(
                self.purged,
                &mut replay,
                at,
                log_id.index,
                vec![(log_id, at, len)],
            )?;
            at += len;
        }
        if let Some((found, index)) = scan::v1_later_record(&mut reader, at, self.last_index())? {
            return Err(LogError::Damaged(format!(
                "the record at byte {at} does not check, and entry {index} follows it at byte \
                 {found}: the log is damaged (not a torn write), so it is not read short"
            )));
        }
        self.end = at;
        Ok(at)
    }

    /// The last record's index in the file, live or purged.
    fn last_index(&self) -> Option<u64> {
        self.index.next_in_file.and_then(|next| next.checked_sub(1))
    }

    fn check_resumes_after_purge(&self) -> Result<(), LogError> {
        if let Some(first) = self.index.live.front() {
            let want = self.purged.map_or(0, |p| p.index + 1);
            if first.log_id.index != want {
                return Err(LogError::Damaged(format!(
                    "the log resumes at entry {} after the purge, where entry {want} comes next",
                    first.log_id
                )));
            }
        }
        Ok(())
    }

    /// Cuts off what follows the whole appends (a torn last append, zeros), durably.
    fn cut_at(&mut self, end: u64) -> Result<(), LogError> {
        let length = self.file().len()?;
        if end < length {
            tracing::warn!(
                bytes = length - end,
                at = end,
                "the raft log ends in a torn write (an append that was never acknowledged); cut"
            );
            self.file().set_len(end)?;
            self.file().sync_data()?;
        }
        Ok(())
    }

    /// Bytes in the file that are not live records: purged and truncated records, headers.
    fn dead_bytes(&self) -> u64 {
        self.end - HEADER_BYTES - self.index.live_bytes
    }

    /// The last purged log id.
    pub fn purged(&self) -> Option<LogId<NodeId>> {
        self.purged
    }

    /// The last entry's id, or the last purged one when no entry is live.
    pub fn last(&self) -> Option<LogId<NodeId>> {
        self.index.live.back().map(|s| s.log_id).or(self.purged)
    }

    /// The index the next entry must have.
    pub fn next_index(&self) -> u64 {
        self.last().map_or(0, |last| last.index + 1)
    }

    /// Appends `entries` (log id and JSON, in order) as one append: one write and one
    /// fdatasync; returns only once they are durable. An entry that does not continue the log
    /// exactly is refused and nothing is written. An append that would not follow the file's
    /// last record (every entry purged by a snapshot) compacts first, recorded by `switch`.
    /// (The stages of [`staged`], run in one go.)
    pub fn append(
        &mut self,
        entries: &[(LogId<NodeId>, Vec<u8>)],
        switch: Switch,
    ) -> Result<(), LogError> {
        let Some(mut append) = self.plan_append(entries)? else {
            return Ok(());
        };
        if self.append_compacts_first(entries[0].0.index) {
            self.compact(switch)?;
            append = self.plan_append(entries)?.expect("the same entries");
        }
        append.write()?;
        self.publish_append(append);
        Ok(())
    }

    /// The records of `entries` back to back, with each one's id, offset and length; refused
    /// when one does not continue the log exactly.
    fn frame_entries(&self, entries: &[(LogId<NodeId>, Vec<u8>)]) -> Result<Framed, LogError> {
        let mut body = Vec::new();
        let mut slots = Vec::with_capacity(entries.len());
        let mut last_term = self.last().map_or(0, |l| l.leader_id.term);
        for (next, (log_id, json)) in (self.next_index()..).zip(entries) {
            // openraft appends only right after its last entry (conflicts are truncated
            // first). Anything else is a hole or an overwrite: refuse it before it is on
            // disk, since a log with a hole stops this member for good.
            if log_id.index != next || log_id.leader_id.term < last_term {
                return Err(LogError::Refused(format!(
                    "refused to append log entry {log_id} where entry {next} comes next: the log \
                     would have a gap, be overwritten or go back in term"
                )));
            }
            if json.len() as u64 > MAX_ENTRY_BYTES {
                return Err(LogError::Refused(format!(
                    "log entry {log_id} of {} bytes is larger than the log takes \
                     ({MAX_ENTRY_BYTES})",
                    json.len()
                )));
            }
            last_term = log_id.leader_id.term;
            let record = records::frame(log_id.index, json);
            slots.push((*log_id, body.len() as u64, record.len() as u64));
            body.extend_from_slice(&record);
        }
        Ok((body, slots))
    }

    /// Removes the entries from `index` on, durably: the file is cut where they start when
    /// their append starts with them, else a truncation (an append with no records) says so.
    pub fn truncate(&mut self, index: u64) -> Result<(), LogError> {
        match self.plan_truncate(index) {
            Some(cut) => cut.write(),
            None => Ok(()),
        }
    }

    /// Forgets the entries up to `purged` (which the caller has recorded durably first) and
    /// compacts when the purged records outweigh the live ones, or nothing is live.
    pub fn purge(&mut self, purged: LogId<NodeId>, switch: Switch) -> Result<(), LogError> {
        if self.forget_purged(purged) {
            self.compact(switch)?;
        }
        Ok(())
    }

    /// Writes the live records into the other file (in appends of about
    /// [`COMPACT_APPEND_BYTES`], each record checked as it is copied), fsyncs it, lets `switch`
    /// record it as the file in use (durably: a crash before leaves the old file in use,
    /// complete), then uses it and empties the old one.
    pub fn compact(&mut self, switch: Switch) -> Result<(), LogError> {
        let compacted = self.plan_compaction().copy()?;
        switch(compacted.file())?;
        // The old file is no longer read; emptied for its space (a crash may leave it whole).
        self.publish_compaction(compacted).set_len(0)?;
        Ok(())
    }

    /// The JSON of the entries in `range`: a run from the range's start without a gap, or
    /// nothing when its start is not live.
    pub fn read(&self, range: (Bound<u64>, Bound<u64>)) -> Result<Vec<Vec<u8>>, LogError> {
        let Some(first) = self.index.live.front() else {
            return Ok(Vec::new());
        };
        let base = first.log_id.index;
        let start = match range.0 {
            Bound::Included(s) => s,
            Bound::Excluded(s) => s.saturating_add(1),
            Bound::Unbounded => base,
        };
        if start < base {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for slot in self.index.live.iter().skip((start - base) as usize) {
            if !range_contains(&range, slot.log_id.index) {
                break;
            }
            let mut bytes = vec![0u8; slot.len as usize];
            self.file().read(slot.at, &mut bytes)?;
            let record = records::record_at(&bytes, 0, MAX_ENTRY_BYTES)
                .filter(|r| r.sequence == slot.log_id.index)
                .ok_or_else(|| no_longer_checks(slot))?;
            out.push(record.payload.to_vec());
        }
        Ok(out)
    }
}

impl Index {
    /// Takes a whole append read at `at`: a truncation, or records that continue the log.
    fn take_append(
        &mut self,
        purged: Option<LogId<NodeId>>,
        replay: &mut Replay,
        at: u64,
        first: u64,
        records: Vec<(LogId<NodeId>, u64, u64)>,
    ) -> Result<(), LogError> {
        let expected = self.next_in_file;
        if records.is_empty() {
            if expected.is_some_and(|next| first > next) {
                return Err(LogError::Damaged(format!(
                    "the truncation at byte {at} to entry {first} is past the end of the log \
                     (entry {} comes next)",
                    expected.map_or(0, |n| n)
                )));
            }
            self.drop_live_from(first);
            replay.last_term = match (self.live.back(), replay.last_dead) {
                (Some(slot), _) => slot.log_id.leader_id.term,
                (None, Some(dead)) if dead.index + 1 == first => dead.leader_id.term,
                _ => 0,
            };
            self.next_in_file = Some(first);
            return Ok(());
        }
        if expected.is_some_and(|next| next != first) {
            return Err(LogError::Damaged(format!(
                "the append at byte {at} holds entries from {first} where entry {} comes next",
                expected.map_or(0, |n| n)
            )));
        }
        for (i, (log_id, record_at, len)) in records.into_iter().enumerate() {
            if log_id.leader_id.term < replay.last_term {
                return Err(LogError::Damaged(format!(
                    "entry {log_id} at byte {record_at} goes back from term {}",
                    replay.last_term
                )));
            }
            replay.last_term = log_id.leader_id.term;
            self.next_in_file = Some(log_id.index + 1);
            if purged.is_some_and(|p| log_id.index <= p.index) {
                replay.last_dead = Some(log_id);
                continue;
            }
            self.push_live(Slot {
                log_id,
                at: record_at,
                len,
                opens_append: i == 0,
            });
        }
        Ok(())
    }

    fn push_live(&mut self, slot: Slot) {
        self.live_bytes += slot.len;
        self.live.push_back(slot);
    }

    /// Forgets the live entries from `index` on (their records stay in the file, dead).
    fn drop_live_from(&mut self, index: u64) {
        while self.live.back().is_some_and(|s| s.log_id.index >= index) {
            let slot = self.live.pop_back().expect("checked");
            self.live_bytes -= slot.len;
        }
    }
}

/// Records of entries framed for one append: the bytes, and each entry's id, offset, length.
type Framed = (Vec<u8>, Vec<(LogId<NodeId>, u64, u64)>);

fn no_longer_checks(slot: &Slot) -> LogError {
    LogError::Damaged(format!(
        "entry {} at byte {} no longer checks",
        slot.log_id, slot.at
    ))
}

/// Calls `visit` with the payload of every record of the log file `file` that is read whole,
/// from the first on, without writing anything (an offline backup): a torn or damaged tail is
/// left out. Records a truncation removed are visited too.
pub fn visit_payloads(file: &dyn LogFile, visit: &mut dyn FnMut(&[u8])) -> Result<(), LogError> {
    let mut reader = Reader::new(file)?;
    if reader.len() == 0 {
        return Ok(());
    }
    let version = match reader.get(0, HEADER_BYTES as usize)? {
        Some(head) => check_header(head)?,
        None => return Err(LogError::Damaged("not a Palisade raft log".into())),
    };
    let mut at = HEADER_BYTES;
    if version == FORMAT_VERSION_RECORDS {
        while let Some((_, payload, len)) = scan::v1_record(&mut reader, at)? {
            visit(payload);
            at += len;
        }
        return Ok(());
    }
    let mut copy = |_, payload: &[u8]| Ok(payload.to_vec());
    while let Append::Whole { records, next, .. } = scan::read_append(&mut reader, at, &mut copy)? {
        for (payload, _, _) in records {
            visit(&payload);
        }
        at = next;
    }
    Ok(())
}

fn range_contains(range: &(Bound<u64>, Bound<u64>), index: u64) -> bool {
    match range.1 {
        Bound::Included(end) => index <= end,
        Bound::Excluded(end) => index < end,
        Bound::Unbounded => true,
    }
}

fn header() -> [u8; HEADER_BYTES as usize] {
    let mut header = [0u8; HEADER_BYTES as usize];
    header[..16].copy_from_slice(MAGIC);
    header[16..20].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header
}

/// The format version of the file whose first bytes are `bytes`.
fn check_header(bytes: &[u8]) -> Result<u32, LogError> {
    if bytes.len() < HEADER_BYTES as usize || &bytes[..16] != MAGIC {
        return Err(LogError::Damaged("not a Palisade raft log".into()));
    }
    let version = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION && version != FORMAT_VERSION_RECORDS {
        return Err(LogError::Damaged(format!(
            "format version {version}; this build reads versions {FORMAT_VERSION_RECORDS} and \
             {FORMAT_VERSION}"
        )));
    }
    Ok(version)
}

/// The log id of the entry whose JSON is `json`.
fn entry_log_id(json: &[u8]) -> Result<LogId<NodeId>, LogError> {
    #[derive(serde::Deserialize)]
    struct Head {
        log_id: LogId<NodeId>,
    }
    serde_json::from_slice::<Head>(json)
        .map(|head| head.log_id)
        .map_err(|e| LogError::Damaged(format!("an entry that checks does not decode: {e}")))
}

#[cfg(test)]
#[path = "raft_log_tests.rs"]
mod tests;
