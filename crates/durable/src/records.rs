//! Checksummed records for append-only files: the framing both logs use (the single node's
//! lease log and a cluster member's Raft log).
//!
//! ```text
//! record    4 bytes  payload length (u32 LE), 1 ..= the file's maximum
//!           8 bytes  sequence number (u64 LE): one more than the record before it
//!           8 bytes  first 8 bytes of SHA-256 over the 12 bytes above and the payload
//!           payload
//! ```
//!
//! A record is read only when its length is in bounds and its checksum matches. Only the last
//! write of an append-only file can be torn, so a file's reader stops at the first record that
//! does not check and asks [`later_record`] whether a record that checks follows it: if one
//! does, the file is damaged (not torn) and must be refused rather than read short.

use sha2::{Digest as _, Sha256};

/// Bytes before a record's payload.
pub const HEADER_BYTES: usize = 20;

/// A record read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Its sequence number.
    pub sequence: u64,
    /// Its payload.
    pub payload: &'a [u8],
    /// Where the next record starts.
    pub next: usize,
}

/// `payload` framed as the record numbered `sequence`.
pub fn frame(sequence: u64, payload: &[u8]) -> Vec<u8> {
    let mut record = Vec::with_capacity(HEADER_BYTES + payload.len());
    record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    record.extend_from_slice(&sequence.to_le_bytes());
    record.extend_from_slice(&checksum(&record[..12], payload));
    record.extend_from_slice(payload);
    record
}

fn checksum(header: &[u8], payload: &[u8]) -> [u8; 8] {
    let digest = Sha256::new()
        .chain_update(header)
        .chain_update(payload)
        .finalize();
    digest[..8].try_into().expect("8 bytes")
}

/// The record at `at` whose payload is at most `max_payload` bytes, if one that checks is
/// there (`None`: the end of the records, zeros, or a record torn or damaged).
pub fn record_at(bytes: &[u8], at: usize, max_payload: u64) -> Option<Record<'_>> {
    let header = bytes.get(at..at.checked_add(HEADER_BYTES)?)?;
    let length = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    if length == 0 || length as u64 > max_payload {
        return None;
    }
    let sequence = u64::from_le_bytes(header[4..12].try_into().expect("8 bytes"));
    let start = at + HEADER_BYTES;
    let payload = bytes.get(start..start + length)?;
    (checksum(&header[..12], payload) == header[12..20]).then_some(Record {
        sequence,
        payload,
        next: start + length,
    })
}

/// A record that checks anywhere after `at` with a sequence number above `sequence` (where it
/// starts, and its sequence), `sequence` being the one expected at `at`: only the last record
/// can be torn, so one that follows a record that does not check — the next one, or any later
/// one when several in a row were damaged — means damage.
pub fn later_record(
    bytes: &[u8],
    at: usize,
    sequence: u64,
    max_payload: u64,
) -> Option<(usize, u64)> {
    let last = bytes.len().saturating_sub(HEADER_BYTES);
    (at + 1..=last).find_map(|offset| {
        let stored = u64::from_le_bytes(bytes[offset + 4..offset + 12].try_into().ok()?);
        // A later record's sequence is above this one's and at most one per record header.
        let most = sequence.saturating_add(((offset - at) / HEADER_BYTES) as u64 + 1);
        (stored > sequence
            && stored <= most
            && record_at(bytes, offset, max_payload).is_some_and(|r| r.sequence == stored))
        .then_some((offset, stored))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_any_damage_hides_it() {
        let record = frame(7, b"payload");
        let read = record_at(&record, 0, 100).unwrap();
        assert_eq!(
            (read.sequence, read.payload, read.next),
            (7, &b"payload"[..], record.len())
        );
        for at in 0..record.len() {
            let mut damaged = record.clone();
            damaged[at] ^= 1;
            assert!(
                record_at(&damaged, 0, 100)
                    .is_none_or(|r| r.sequence != 7 || r.payload != b"payload"),
                "a flipped bit at {at} went unnoticed"
            );
        }
        assert!(
            record_at(&record[..record.len() - 1], 0, 100).is_none(),
            "torn"
        );
        assert!(record_at(&record, 0, 6).is_none(), "above the maximum");
    }

    #[test]
    fn a_record_that_checks_after_a_damaged_one_is_found() {
        let mut bytes = frame(1, b"first");
        let second = bytes.len();
        bytes.extend(frame(2, b"second"));
        bytes.extend(frame(3, b"third"));
        bytes[second + HEADER_BYTES] ^= 1;
        assert!(record_at(&bytes, second, 100).is_none());
        let third = second + HEADER_BYTES + "second".len();
        assert_eq!(later_record(&bytes, second, 2, 100), Some((third, 3)));
        // A torn last record has nothing after it.
        let torn = &bytes[..second + 5];
        assert_eq!(later_record(torn, second, 2, 100), None);
    }
}
