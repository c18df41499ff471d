//! The Raft log as an append-only file of checksummed records: one write and one fdatasync per
//! append, however many entries it carries.
//!
//! ```text
//! header    16 bytes "palisade-raftlog", format version (u32 LE), 12 bytes reserved (zeros)
//! records   palisade_durable::records: [length][Raft log index][checksum][JSON of the entry]
//! ```
//!
//! A member keeps two such files and uses one at a time; which one is recorded in the store's
//! redb file, with the last purged log id. The records of the file in use run without a gap
//! and never go back in term. What a reader makes of a damaged file:
//! - **a torn last record** (an append cut by a power cut; it was never acknowledged): dropped,
//!   and the file is cut back to the record before it;
//! - **a record that does not check followed by one that does** (damage in the middle), an
//!   index out of sequence, a term going back, an entry whose index is not its record's: the
//!   file is refused rather than read short, and the member does not start;
//! - **records at or below the last purged id**: dropped at the next compaction. A purge
//!   records the new purged id in redb first (an immediate commit), so a crash before the
//!   compaction leaves records that are simply skipped.
//!
//! Compaction writes the live records into the other file, fsyncs it, and only then switches
//! the redb record to it (one immediate commit): a crash on either side of the switch leaves
//! one complete file in use.
//!
//! What this does not detect: a file cut short at a record boundary (`truncate -s`, a copy cut
//! short) reads as a log that ends earlier — the member then holds fewer entries than it
//! acknowledged, the class of a member whose volume was put back, which probation and the
//! census (`identity` rule 4) keep from voting a lagging member in.

use std::collections::VecDeque;
use std::io;
use std::ops::Bound;

use openraft::LogId;
use palisade_durable::records;

use super::NodeId;

/// The first bytes of a Raft log file.
const MAGIC: &[u8; 16] = b"palisade-raftlog";
/// The format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes before the first record.
pub const HEADER_BYTES: u64 = 32;
/// Largest entry (its JSON) the log takes: a batch entry can hold thousands of lock changes.
pub const MAX_ENTRY_BYTES: u64 = 1 << 30;
/// Largest file the log reads at start.
pub const MAX_FILE_BYTES: u64 = 4 << 30;
/// A purge compacts the file once the purged records take more than this and more than the
/// live ones.
pub const COMPACT_AT_BYTES: u64 = 8 << 20;

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

/// Where a live entry's record is.
#[derive(Debug, Clone, Copy)]
struct Slot {
    log_id: LogId<NodeId>,
    at: u64,
    len: u64,
}

/// The log: the file in use and an index of its live records.
#[derive(Debug)]
pub struct RaftLog {
    files: [Box<dyn LogFile>; 2],
    active: usize,
    /// The live entries, contiguous, oldest first.
    live: VecDeque<Slot>,
    /// The last record in the file, live or purged: the next append must follow it.
    file_last: Option<u64>,
    /// Where the next record goes.
    end: u64,
    /// Bytes of purged records still in the file.
    dead: u64,
    purged: Option<LogId<NodeId>>,
}

impl RaftLog {
    /// Reads the log in `files[active]`, skipping what `purged` covers; an empty file is given
    /// a header. A torn last record is cut off; damage refuses the file.
    pub fn open(
        files: [Box<dyn LogFile>; 2],
        active: usize,
        purged: Option<LogId<NodeId>>,
    ) -> Result<Self, LogError> {
        let mut log = RaftLog {
            files,
            active: active.min(1),
            live: VecDeque::new(),
            file_last: None,
            end: HEADER_BYTES,
            dead: 0,
            purged,
        };
        let length = log.file().len()?;
        if length == 0 {
            log.file().write(0, &header())?;
            log.file().sync_data()?;
            return Ok(log);
        }
        if length > MAX_FILE_BYTES {
            return Err(LogError::Damaged(format!(
                "{length} bytes, more than a log holds"
            )));
        }
        let mut bytes = vec![0u8; length as usize];
        log.file().read(0, &mut bytes)?;
        check_header(&bytes)?;
        log.replay(&bytes)?;
        Ok(log)
    }

    fn file(&self) -> &dyn LogFile {
        self.files[self.active].as_ref()
    }

    /// Which of the two files is in use.
    pub fn active(&self) -> usize {
        self.active
    }

    fn replay(&mut self, bytes: &[u8]) -> Result<(), LogError> {
        let mut at = HEADER_BYTES as usize;
        let mut last_term = 0;
        while let Some(record) = records::record_at(bytes, at, MAX_ENTRY_BYTES) {
            let log_id = entry_log_id(record.payload)?;
            let expected = self.file_last.map(|last| last + 1);
            if log_id.index != record.sequence || expected.is_some_and(|e| e != log_id.index) {
                return Err(LogError::Damaged(format!(
                    "record {} at byte {at} holds entry {log_id} where entry {} comes next",
                    record.sequence,
                    expected.map_or("any".into(), |e| e.to_string()),
                )));
            }
            if log_id.leader_id.term < last_term {
                return Err(LogError::Damaged(format!(
                    "entry {log_id} at byte {at} goes back from term {last_term}"
                )));
            }
            last_term = log_id.leader_id.term;
            self.file_last = Some(log_id.index);
            let slot = Slot {
                log_id,
                at: at as u64,
                len: (record.next - at) as u64,
            };
            if self.purged.is_some_and(|p| log_id.index <= p.index) {
                self.dead += slot.len;
            } else {
                self.live.push_back(slot);
            }
            at = record.next;
        }
        if let Some((found, index)) = later_record(bytes, at, self.file_last) {
            return Err(LogError::Damaged(format!(
                "the record at byte {at} does not check, and entry {index} follows it at byte \
                 {found}: the log is damaged (not a torn write), so it is not read short"
            )));
        }
        if let Some(first) = self.live.front() {
            let want = self.purged.map_or(0, |p| p.index + 1);
            if first.log_id.index != want {
                return Err(LogError::Damaged(format!(
                    "the log resumes at entry {} after the purge, where entry {want} comes next",
                    first.log_id
                )));
            }
        }
        if at < bytes.len() {
            tracing::warn!(
                bytes = bytes.len() - at,
                "the raft log ends in a torn write (an append that was never acknowledged); cut"
            );
            self.file().set_len(at as u64)?;
            self.file().sync_data()?;
        }
        self.end = at as u64;
        Ok(())
    }

    /// The last purged log id.
    pub fn purged(&self) -> Option<LogId<NodeId>> {
        self.purged
    }

    /// The last entry's id, or the last purged one when no entry is live.
    pub fn last(&self) -> Option<LogId<NodeId>> {
        self.live.back().map(|s| s.log_id).or(self.purged)
    }

    /// The index the next entry must have.
    pub fn next_index(&self) -> u64 {
        self.last().map_or(0, |last| last.index + 1)
    }

    /// Appends `entries` (log id and JSON, in order) with one write and one fdatasync; returns
    /// only once they are durable. An entry that does not continue the log exactly is refused
    /// and nothing is written. `switch` records a compaction's new file (see [`Self::compact`]):
    /// an append that would not follow the file's last record (every entry purged by a
    /// snapshot) compacts first.
    pub fn append(
        &mut self,
        entries: &[(LogId<NodeId>, Vec<u8>)],
        switch: &mut dyn FnMut(usize) -> Result<(), LogError>,
    ) -> Result<(), LogError> {
        let Some((first, _)) = entries.first() else {
            return Ok(());
        };
        let mut buffer = Vec::new();
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
            slots.push((*log_id, buffer.len() as u64, record.len() as u64));
            buffer.extend_from_slice(&record);
        }
        if self.file_last.is_some_and(|last| last + 1 != first.index) {
            self.compact(switch)?;
        }
        let at = self.end;
        self.file().write(at, &buffer)?;
        self.file().sync_data()?;
        for (log_id, offset, len) in slots {
            self.live.push_back(Slot {
                log_id,
                at: at + offset,
                len,
            });
            self.file_last = Some(log_id.index);
        }
        self.end = at + buffer.len() as u64;
        Ok(())
    }

    /// Removes the entries from `index` on, durably.
    pub fn truncate(&mut self, index: u64) -> Result<(), LogError> {
        let Some(position) = self.live.iter().position(|s| s.log_id.index >= index) else {
            return Ok(());
        };
        let at = self.live[position].at;
        self.file().set_len(at)?;
        self.file().sync_data()?;
        let first_removed = self.live[position].log_id.index;
        self.live.truncate(position);
        self.end = at;
        self.file_last = match self.live.back() {
            Some(last) => Some(last.log_id.index),
            // What is left before `at` is purged records, if any: the last one is right
            // before the first removed (the file has no gap).
            None => (self.dead > 0).then(|| first_removed - 1),
        };
        Ok(())
    }

    /// Forgets the entries up to `purged` (which the caller has recorded durably first) and
    /// compacts when the purged records outweigh the live ones, or nothing is live.
    pub fn purge(
        &mut self,
        purged: LogId<NodeId>,
        switch: &mut dyn FnMut(usize) -> Result<(), LogError>,
    ) -> Result<(), LogError> {
        while self
            .live
            .front()
            .is_some_and(|s| s.log_id.index <= purged.index)
        {
            let slot = self.live.pop_front().expect("checked");
            self.dead += slot.len;
        }
        if self.purged.is_none_or(|p| p.index < purged.index) {
            self.purged = Some(purged);
        }
        let live_bytes = self.end - HEADER_BYTES - self.dead;
        if self.dead > 0
            && (self.live.is_empty() || (self.dead > COMPACT_AT_BYTES && self.dead > live_bytes))
        {
            self.compact(switch)?;
        }
        Ok(())
    }

    /// Writes the live records into the other file, fsyncs it, lets `switch` record it as the
    /// file in use (durably: a crash before leaves the old file in use, complete), then uses it
    /// and empties the old one.
    pub fn compact(
        &mut self,
        switch: &mut dyn FnMut(usize) -> Result<(), LogError>,
    ) -> Result<(), LogError> {
        let other = 1 - self.active;
        let start = self.live.front().map_or(self.end, |s| s.at);
        let mut live = vec![0u8; (self.end - start) as usize];
        self.file().read(start, &mut live)?;
        let target = self.files[other].as_ref();
        target.set_len(0)?;
        target.write(0, &header())?;
        target.write(HEADER_BYTES, &live)?;
        target.sync_data()?;
        switch(other)?;
        let old = self.active;
        self.active = other;
        for slot in &mut self.live {
            slot.at = slot.at - start + HEADER_BYTES;
        }
        self.end = HEADER_BYTES + live.len() as u64;
        self.dead = 0;
        self.file_last = self.live.back().map(|s| s.log_id.index);
        // The old file is no longer read; emptied for its space (a crash may leave it whole).
        self.files[old].set_len(0)?;
        Ok(())
    }

    /// The JSON of the entries in `range`: a run from the range's start without a gap, or
    /// nothing when its start is not live.
    pub fn read(&self, range: (Bound<u64>, Bound<u64>)) -> Result<Vec<Vec<u8>>, LogError> {
        let Some(first) = self.live.front() else {
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
        for slot in self.live.iter().skip((start - base) as usize) {
            if !range_contains(&range, slot.log_id.index) {
                break;
            }
            let mut bytes = vec![0u8; slot.len as usize];
            self.file().read(slot.at, &mut bytes)?;
            let record = records::record_at(&bytes, 0, MAX_ENTRY_BYTES)
                .filter(|r| r.sequence == slot.log_id.index)
                .ok_or_else(|| {
                    LogError::Damaged(format!(
                        "entry {} at byte {} no longer checks",
                        slot.log_id, slot.at
                    ))
                })?;
            out.push(record.payload.to_vec());
        }
        Ok(out)
    }
}

/// A record that checks anywhere after `at` and continues past `last` (where, and its index):
/// only the last append can be torn, so a record after one that does not check means damage.
/// Every offset is tried, since the damaged record's length cannot be trusted.
fn later_record(bytes: &[u8], at: usize, last: Option<u64>) -> Option<(usize, u64)> {
    let end = bytes.len().saturating_sub(records::HEADER_BYTES);
    (at + 1..=end).find_map(|offset| {
        records::record_at(bytes, offset, MAX_ENTRY_BYTES)
            .filter(|r| last.is_none_or(|last| r.sequence > last))
            .map(|r| (offset, r.sequence))
    })
}

/// The payloads of the records of the log file `bytes` that check, from the first on, read
/// without writing anything (an offline backup): a torn or damaged tail is left out.
pub fn payloads(bytes: &[u8]) -> Result<Vec<&[u8]>, LogError> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    check_header(bytes)?;
    let mut at = HEADER_BYTES as usize;
    let mut found = Vec::new();
    while let Some(record) = records::record_at(bytes, at, MAX_ENTRY_BYTES) {
        found.push(record.payload);
        at = record.next;
    }
    Ok(found)
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

fn check_header(bytes: &[u8]) -> Result<(), LogError> {
    if bytes.len() < HEADER_BYTES as usize || &bytes[..16] != MAGIC {
        return Err(LogError::Damaged("not a Palisade raft log".into()));
    }
    let version = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(LogError::Damaged(format!(
            "format version {version}; this build reads version {FORMAT_VERSION}"
        )));
    }
    Ok(())
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
