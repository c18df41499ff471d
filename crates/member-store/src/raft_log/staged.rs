//! The log's writes in stages, for a caller that keeps the log behind a lock its readers
//! share (the store: replication reads wait on it): each mutation is planned under the lock
//! (nothing written, nothing published), its I/O runs without the lock and off the async
//! runtime ([`PendingAppend::write`], [`PendingCompaction::copy`], [`PendingCut::write`]), and
//! what it wrote is published under the lock again.
//!
//! The caller runs one mutation at a time (the store's writer lock). A reader sees only
//! published records, and no staged write touches one: an append writes past the published
//! end, a compaction reads the file in use and writes the other one, a truncation drops the
//! records from the index before its cut. A stage that fails leaves the log failed
//! ([`RaftLog::fail`]): every later call returns that cause and the member's Raft stops with
//! it, instead of acting on an index that may no longer match the file.

use std::sync::Arc;

use openraft::LogId;
use palisade_durable::{appends, records};

use super::{
    header, no_longer_checks, LogError, LogFile, RaftLog, Reader, Slot, COMPACT_APPEND_BYTES,
    HEADER_BYTES, MAX_ENTRY_BYTES,
};
use crate::NodeId;

/// An append framed under the lock: written and fdatasynced by [`Self::write`] without it,
/// then published by [`RaftLog::publish_append`].
#[derive(Debug)]
pub struct PendingAppend {
    file: Arc<dyn LogFile>,
    at: u64,
    bytes: Vec<u8>,
    slots: Vec<(LogId<NodeId>, u64, u64)>,
}

impl PendingAppend {
    /// Writes the append where the log ends (one write) and fdatasyncs it.
    pub fn write(&self) -> Result<(), LogError> {
        self.file.write(self.at, &self.bytes)?;
        self.file.sync_data()?;
        Ok(())
    }
}

/// A compaction planned under the lock: the live records to copy into the other file.
#[derive(Debug)]
pub struct PendingCompaction {
    source: Arc<dyn LogFile>,
    target: Arc<dyn LogFile>,
    target_file: usize,
    live: Vec<Slot>,
}

/// A compaction's copy, fsynced, not yet in use: the caller records [`Self::file`] as the file
/// in use (durably), then [`RaftLog::publish_compaction`] switches to it.
#[derive(Debug)]
pub struct Compacted {
    file: usize,
    live: Vec<Slot>,
    end: u64,
}

impl Compacted {
    /// The file the live records are now in.
    pub fn file(&self) -> usize {
        self.file
    }
}

impl PendingCompaction {
    /// Writes the live records into the other file in appends of about
    /// [`COMPACT_APPEND_BYTES`] (each record checked as it is copied) and fsyncs it.
    pub fn copy(self) -> Result<Compacted, LogError> {
        let target = self.target.as_ref();
        target.set_len(0)?;
        target.write(0, &header())?;
        let mut reader = Reader::new(self.source.as_ref())?;
        let mut moved = Vec::with_capacity(self.live.len());
        let mut body = Vec::new();
        let mut at = HEADER_BYTES;
        let mut pending = 0;
        for (i, slot) in self.live.iter().enumerate() {
            let record = reader
                .get(slot.at, slot.len as usize)?
                .and_then(|bytes| records::record_at(bytes, 0, MAX_ENTRY_BYTES))
                .filter(|r| r.sequence == slot.log_id.index)
                .ok_or_else(|| no_longer_checks(slot))?;
            let offset = (appends::HEADER_BYTES + body.len()) as u64;
            moved.push(Slot {
                at: at + offset,
                opens_append: body.is_empty(),
                ..*slot
            });
            body.extend_from_slice(&records::frame(slot.log_id.index, record.payload));
            pending += 1;
            if body.len() >= COMPACT_APPEND_BYTES || i + 1 == self.live.len() {
                let first = slot.log_id.index + 1 - pending;
                let head = appends::frame(at, first, pending as u32, &body);
                target.write(at, &head)?;
                target.write(at + head.len() as u64, &body)?;
                at += (head.len() + body.len()) as u64;
                body.clear();
                pending = 0;
            }
        }
        target.sync_data()?;
        Ok(Compacted {
            file: self.target_file,
            live: moved,
            end: at,
        })
    }
}

/// A truncation already taken out of the index: the file's cut, or the mark that says so.
#[derive(Debug)]
pub enum PendingCut {
    /// The removed entries start an append: the file is cut where it starts.
    Cut {
        /// The file in use.
        file: Arc<dyn LogFile>,
        /// Its new length.
        at: u64,
    },
    /// They start inside an append: an append with no records says where they start.
    Mark {
        /// The file in use.
        file: Arc<dyn LogFile>,
        /// Where the log ends.
        at: u64,
        /// The truncation's append.
        mark: Vec<u8>,
    },
}

impl PendingCut {
    /// Cuts the file or writes the mark, and fdatasyncs it.
    pub fn write(&self) -> Result<(), LogError> {
        match self {
            PendingCut::Cut { file, at } => file.set_len(*at)?,
            PendingCut::Mark { file, at, mark } => file.write(*at, mark)?,
        }
        match self {
            PendingCut::Cut { file, .. } | PendingCut::Mark { file, .. } => file.sync_data()?,
        }
        Ok(())
    }
}

impl RaftLog {
    /// Whether a real disk is behind the log (its I/O may block a thread; see
    /// [`LogFile::blocks`]).
    pub fn blocks(&self) -> bool {
        self.file().blocks()
    }

    /// The cause of an earlier failed stage, if one failed.
    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Marks the log failed with `cause`: its index may no longer match the file.
    pub fn fail(&mut self, cause: &str) {
        if self.failed.is_none() {
            self.failed = Some(cause.to_owned());
        }
    }

    /// True when an append starting at `first` must compact first: it would not follow the
    /// file's last record (every entry was purged by a snapshot).
    pub fn append_compacts_first(&self, first: u64) -> bool {
        self.index.next_in_file.is_some_and(|next| next != first)
    }

    /// Frames `entries` as one append at the log's end, refusing (nothing written) an entry
    /// that does not continue the log exactly; `None` for no entries.
    pub fn plan_append(
        &self,
        entries: &[(LogId<NodeId>, Vec<u8>)],
    ) -> Result<Option<PendingAppend>, LogError> {
        let Some((first, _)) = entries.first() else {
            return Ok(None);
        };
        let (body, slots) = self.frame_entries(entries)?;
        let at = self.end;
        let mut bytes = appends::frame(at, first.index, slots.len() as u32, &body).to_vec();
        bytes.extend_from_slice(&body);
        Ok(Some(PendingAppend {
            file: self.files[self.active].clone(),
            at,
            bytes,
            slots,
        }))
    }

    /// Makes a written append's entries readable.
    pub fn publish_append(&mut self, append: PendingAppend) {
        let base = append.at + appends::HEADER_BYTES as u64;
        for (i, (log_id, offset, len)) in append.slots.into_iter().enumerate() {
            self.index.push_live(Slot {
                log_id,
                at: base + offset,
                len,
                opens_append: i == 0,
            });
            self.index.next_in_file = Some(log_id.index + 1);
        }
        self.end = append.at + append.bytes.len() as u64;
    }

    /// What a compaction copies: the live records, from the file in use into the other one.
    pub fn plan_compaction(&self) -> PendingCompaction {
        let other = 1 - self.active;
        PendingCompaction {
            source: self.files[self.active].clone(),
            target: self.files[other].clone(),
            target_file: other,
            live: self.index.live.iter().copied().collect(),
        }
    }

    /// Uses the compacted file (recorded durably as the one in use by the caller); returns the
    /// old one, no longer read, for the caller to empty for its space.
    pub fn publish_compaction(&mut self, compacted: Compacted) -> Arc<dyn LogFile> {
        let old = self.active;
        self.active = compacted.file;
        self.index.live = compacted.live.into();
        self.index.live_bytes = self.index.live.iter().map(|s| s.len).sum();
        self.end = compacted.end;
        self.index.next_in_file = self.index.live.back().map(|s| s.log_id.index + 1);
        self.files[old].clone()
    }

    /// Takes the entries from `index` on out of the index and says how the file forgets them
    /// (`None`: none are live). The caller writes the cut before the next append.
    pub fn plan_truncate(&mut self, index: u64) -> Option<PendingCut> {
        let position = self
            .index
            .live
            .iter()
            .position(|s| s.log_id.index >= index)?;
        let slot = self.index.live[position];
        let file = self.files[self.active].clone();
        let cut = if slot.opens_append {
            let at = slot.at - appends::HEADER_BYTES as u64;
            self.end = at;
            PendingCut::Cut { file, at }
        } else {
            let at = self.end;
            let mark = appends::frame(at, slot.log_id.index, 0, &[]).to_vec();
            self.end = at + mark.len() as u64;
            PendingCut::Mark { file, at, mark }
        };
        self.index.drop_live_from(slot.log_id.index);
        // The append that held the first removed entry started at it or before it, right
        // after the entry before it.
        self.index.next_in_file = Some(slot.log_id.index);
        Some(cut)
    }

    /// Forgets the entries up to `purged` (which the caller has recorded durably first);
    /// true when a compaction is due: the purged records outweigh the live ones, or nothing
    /// is live.
    pub fn forget_purged(&mut self, purged: LogId<NodeId>) -> bool {
        while self
            .index
            .live
            .front()
            .is_some_and(|s| s.log_id.index <= purged.index)
        {
            let slot = self.index.live.pop_front().expect("checked");
            self.index.live_bytes -= slot.len;
        }
        if self.purged.is_none_or(|p| p.index < purged.index) {
            self.purged = Some(purged);
        }
        let dead = self.dead_bytes();
        dead > 0
            && (self.index.live.is_empty()
                || (dead > super::COMPACT_AT_BYTES && dead > self.index.live_bytes))
    }
}
