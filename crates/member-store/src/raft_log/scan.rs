//! Reading a Raft log file as a stream: a window of buffered reads, appends read whole or not
//! at all (format 2), records one by one (format 1, read once to move it into format 2), and
//! the search for a whole append after one that does not check — by the appends' magic and
//! offset, never by hashing at every offset, so a damaged file is read in linear time.

use std::io;

use palisade_durable::{appends, records};

use super::{LogError, LogFile, MAX_ENTRY_BYTES};

/// Bytes read from the file at once (more when one record is larger).
const WINDOW_BYTES: usize = 1 << 20;

#[cfg(test)]
thread_local! {
    /// Bytes handed out by readers on this thread: the work a scan does, for the test that
    /// a damaged file is read in linear time.
    pub(super) static EXAMINED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts `n` bytes compared or hashed (tests only).
fn examined(n: usize) {
    #[cfg(test)]
    EXAMINED.with(|examined| examined.set(examined.get() + n as u64));
    #[cfg(not(test))]
    let _ = n;
}

/// Buffered reads of a log file, a window at a time.
pub(super) struct Reader<'a> {
    file: &'a dyn LogFile,
    len: u64,
    window: Vec<u8>,
    window_at: u64,
}

impl<'a> Reader<'a> {
    pub(super) fn new(file: &'a dyn LogFile) -> io::Result<Self> {
        Ok(Reader {
            len: file.len()?,
            file,
            window: Vec::new(),
            window_at: 0,
        })
    }

    /// The file's length.
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// The `n` bytes at `at`, or `None` when they run past the end of the file.
    pub(super) fn get(&mut self, at: u64, n: usize) -> io::Result<Option<&[u8]>> {
        let Some(end) = at.checked_add(n as u64).filter(|end| *end <= self.len) else {
            return Ok(None);
        };
        let window_end = self.window_at + self.window.len() as u64;
        if at < self.window_at || end > window_end {
            let size = (n.max(WINDOW_BYTES) as u64).min(self.len - at) as usize;
            self.window.resize(size, 0);
            self.file.read(at, &mut self.window)?;
            self.window_at = at;
        }
        let from = (at - self.window_at) as usize;
        Ok(Some(&self.window[from..from + n]))
    }
}

/// A record framed in a body that ends at `end`: its sequence number and its length with its
/// header (not checked: the append's checksum covers it).
fn frame_at(reader: &mut Reader, at: u64, end: u64) -> io::Result<Option<(u64, u64)>> {
    let Some(header) = reader.get(at, records::HEADER_BYTES)? else {
        return Ok(None);
    };
    let length = u64::from(u32::from_le_bytes(header[..4].try_into().expect("4 bytes")));
    let sequence = u64::from_le_bytes(header[4..12].try_into().expect("8 bytes"));
    let total = records::HEADER_BYTES as u64 + length;
    let fits = length > 0 && length <= MAX_ENTRY_BYTES && at + total <= end;
    Ok(fits.then_some((sequence, total)))
}

/// What a reader makes of a record's sequence number and payload (why not, when it cannot).
pub(super) type Parse<'a, T> = &'a mut dyn FnMut(u64, &[u8]) -> Result<T, String>;

/// An append read from the file.
pub(super) enum Append<T> {
    /// It checks: its first sequence number (a truncation's index when it has no records), what
    /// `parse` made of each record with where it is and its length, and where the next starts.
    Whole {
        first: u64,
        records: Vec<(T, u64, u64)>,
        next: u64,
    },
    /// It does not check (torn, or damaged) or there is none: nothing of it is taken.
    Broken,
    /// It checks but its records do not agree with its header or `parse`: written so, not
    /// torn.
    Inconsistent(String),
}

/// The append at `at`; `parse` reads each record's sequence number and payload.
pub(super) fn read_append<T>(
    reader: &mut Reader,
    at: u64,
    parse: Parse<T>,
) -> io::Result<Append<T>> {
    examined(appends::HEADER_BYTES);
    let header = match reader.get(at, appends::HEADER_BYTES)? {
        Some(bytes) => appends::parse(bytes, at),
        None => None,
    };
    let Some(header) = header else {
        return Ok(Append::Broken);
    };
    let body = at + appends::HEADER_BYTES as u64;
    let Some(end) = body
        .checked_add(header.body_bytes)
        .filter(|end| *end <= reader.len())
    else {
        return Ok(Append::Broken);
    };
    let mut check = header.body_check();
    let mut found = Vec::new();
    let mut problem = None;
    let mut position = body;
    while position < end {
        let Some((sequence, length)) = frame_at(reader, position, end)? else {
            problem.get_or_insert_with(|| format!("no record frames at byte {position}"));
            hash_rest(reader, &mut check, position, end)?;
            break;
        };
        let bytes = reader
            .get(position, length as usize)?
            .expect("inside the file");
        check.update(bytes);
        let expected = header.first + found.len() as u64;
        if problem.is_none() {
            let payload = &bytes[records::HEADER_BYTES..];
            match parse(sequence, payload) {
                Ok(_) if sequence != expected => {
                    problem = Some(format!("record {sequence} where {expected} comes next"));
                }
                Ok(value) => found.push((value, position, length)),
                Err(why) => problem = Some(why),
            }
        }
        position += length;
    }
    if !check.matches() {
        return Ok(Append::Broken);
    }
    if problem.is_none() && found.len() != header.records as usize {
        problem = Some(format!(
            "{} records where its header says {}",
            found.len(),
            header.records
        ));
    }
    Ok(match problem {
        Some(why) => Append::Inconsistent(why),
        None => Append::Whole {
            first: header.first,
            records: found,
            next: end,
        },
    })
}

fn hash_rest(
    reader: &mut Reader,
    check: &mut appends::BodyCheck,
    mut from: u64,
    end: u64,
) -> io::Result<()> {
    while from < end {
        let n = (end - from).min(WINDOW_BYTES as u64) as usize;
        examined(n);
        check.update(reader.get(from, n)?.expect("inside the file"));
        from += n as u64;
    }
    Ok(())
}

/// The first append that checks at or after `from` (where, and its first sequence number). Each
/// offset costs a comparison of the magic and the offset; only a header that passes both is
/// hashed, and an append's records only when its header checks — so a damaged file is read
/// once, plus the records of appends whose headers check.
pub(super) fn later_append(reader: &mut Reader, from: u64) -> io::Result<Option<(u64, u64)>> {
    let header = appends::HEADER_BYTES;
    let mut at = from;
    while at + header as u64 <= reader.len() {
        let n = (reader.len() - at).min(WINDOW_BYTES as u64) as usize;
        let chunk = reader.get(at, n)?.expect("inside the file");
        let candidate = (0..=n - header).find(|&i| {
            chunk[i] == appends::MAGIC[0] && appends::could_start(&chunk[i..], at + i as u64)
        });
        examined(candidate.map_or(n - header + 1, |i| i + 1));
        let Some(i) = candidate else {
            at += (n - header + 1) as u64;
            continue;
        };
        let found = at + i as u64;
        match read_append(reader, found, &mut |_, _| Ok(()))? {
            Append::Whole { first, .. } => return Ok(Some((found, first))),
            Append::Inconsistent(_) => return Ok(Some((found, 0))),
            Append::Broken => at = found + 1,
        }
    }
    Ok(None)
}

/// The record of format 1 at `at` that checks: its sequence number, its payload and its
/// length with its header.
pub(super) fn v1_record<'r>(
    reader: &'r mut Reader,
    at: u64,
) -> io::Result<Option<(u64, &'r [u8], u64)>> {
    let length = match reader.get(at, records::HEADER_BYTES)? {
        Some(header) => u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize,
        None => return Ok(None),
    };
    let total = records::HEADER_BYTES + length;
    let Some(bytes) = reader.get(at, total)? else {
        return Ok(None);
    };
    examined(total);
    Ok(
        records::record_at(bytes, 0, MAX_ENTRY_BYTES)
            .map(|r| (r.sequence, r.payload, total as u64)),
    )
}

/// A record of format 1 that checks after `at` and continues past `last` (where, and its
/// sequence number). Only offsets whose stored sequence number could follow `last` there (above
/// it, by at most one per record header in between; below 2^48 when nothing was read) are
/// hashed: an entry's JSON never holds one (a sequence number's high bytes are zeros, and JSON
/// has no zero bytes), so this reads the file about once.
pub(super) fn v1_later_record(
    reader: &mut Reader,
    at: u64,
    last: Option<u64>,
) -> io::Result<Option<(u64, u64)>> {
    let header = records::HEADER_BYTES as u64;
    let base = last.map_or(0, |last| last + 1);
    let mut offset = at + 1;
    while offset + header <= reader.len() {
        let head = reader
            .get(offset, header as usize)?
            .expect("inside the file");
        let stored = u64::from_le_bytes(head[4..12].try_into().expect("8 bytes"));
        // With no record read yet, any index may come first: the high bytes must be zeros.
        let plausible = match last {
            Some(_) => stored >= base && stored <= base.saturating_add((offset - at) / header + 1),
            None => stored < 1 << 48,
        };
        if plausible {
            if let Some((sequence, _, _)) = v1_record(reader, offset)? {
                if sequence == stored {
                    return Ok(Some((offset, sequence)));
                }
            }
        }
        offset += 1;
    }
    Ok(None)
}

/// Whether `error` is a record or append that checks but does not decode: damage either way.
pub(super) fn damaged(at: u64, why: String) -> LogError {
    LogError::Damaged(format!("the append at byte {at} checks but {why}"))
}
