//! Appends: a header that frames one write of many [`crate::records`], with the write's length
//! and one checksum over all of it, so that a reader takes a write whole or not at all.
//!
//! ```text
//! header    8 bytes  MAGIC: 0xFF "raftapp" (0xFF never occurs in UTF-8, so not in JSON)
//!           8 bytes  where this header is in its file (u64 LE): an append's bytes found
//!                    anywhere else do not read as one
//!           8 bytes  first record's sequence number (u64 LE); with no records, a mark the
//!                    file's reader gives a meaning to (the Raft log: a truncation)
//!           4 bytes  records (u32 LE)
//!           4 bytes  zeros
//!           8 bytes  bytes of records that follow (u64 LE)
//!           8 bytes  first 8 bytes of SHA-256 over the 40 bytes above: the header alone
//!           8 bytes  first 8 bytes of SHA-256 over the 40 bytes above and the records
//! records   the append's records, back to back
//! ```
//!
//! A power cut during an append may keep any subset of its sectors, in any order: a record in
//! the middle lost and a later one kept. Each record may still check on its own, but the
//! append's checksum does not, so the whole append reads as not written. The header checks on
//! its own too: a reader that finds one can trust the length it gives, and [`could_start`]
//! lets it look for the next append cheaply (magic and offset) before it hashes anything.

use sha2::{Digest as _, Sha256};

/// Bytes of an append's header.
pub const HEADER_BYTES: usize = 56;

/// The first bytes of every append.
pub const MAGIC: [u8; 8] = [0xFF, b'r', b'a', b'f', b't', b'a', b'p', b'p'];

/// Bytes the two checksums cover of the header (all its fields).
const FIELDS_BYTES: usize = 40;

/// An append's header, read back and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Where it is in its file.
    pub offset: u64,
    /// The first record's sequence number (or the file's mark, with no records).
    pub first: u64,
    /// Records in the append.
    pub records: u32,
    /// Bytes of records after the header.
    pub body_bytes: u64,
    fields: [u8; FIELDS_BYTES],
    checksum: [u8; 8],
}

/// The header of an append at `offset` of `records` records in `body` from `first` on.
pub fn frame(offset: u64, first: u64, records: u32, body: &[u8]) -> [u8; HEADER_BYTES] {
    let mut header = [0u8; HEADER_BYTES];
    header[..8].copy_from_slice(&MAGIC);
    header[8..16].copy_from_slice(&offset.to_le_bytes());
    header[16..24].copy_from_slice(&first.to_le_bytes());
    header[24..28].copy_from_slice(&records.to_le_bytes());
    header[32..40].copy_from_slice(&(body.len() as u64).to_le_bytes());
    let fields: [u8; FIELDS_BYTES] = header[..FIELDS_BYTES].try_into().expect("40 bytes");
    header[40..48].copy_from_slice(&digest(&[&fields]));
    header[48..56].copy_from_slice(&digest(&[&fields, body]));
    header
}

fn digest(parts: &[&[u8]]) -> [u8; 8] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize()[..8].try_into().expect("8 bytes")
}

/// Whether `bytes` may begin an append at `offset` — its magic and its offset, compared
/// without hashing: the cheap test a reader runs at every offset it searches.
pub fn could_start(bytes: &[u8], offset: u64) -> bool {
    bytes.len() >= 16
        && bytes[..8] == MAGIC
        && u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")) == offset
}

/// The header at the start of `bytes`, if one that checks for `offset` is there.
pub fn parse(bytes: &[u8], offset: u64) -> Option<Header> {
    let bytes = bytes.get(..HEADER_BYTES)?;
    if !could_start(bytes, offset) || bytes[28..32] != [0; 4] {
        return None;
    }
    let fields: [u8; FIELDS_BYTES] = bytes[..FIELDS_BYTES].try_into().expect("40 bytes");
    if digest(&[&fields]) != bytes[40..48] {
        return None;
    }
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    Some(Header {
        offset,
        first: u64_at(16),
        records: u32::from_le_bytes(bytes[24..28].try_into().expect("4 bytes")),
        body_bytes: u64_at(32),
        fields,
        checksum: bytes[48..56].try_into().expect("8 bytes"),
    })
}

impl Header {
    /// A check of the append's records, fed in order as they are read.
    pub fn body_check(&self) -> BodyCheck {
        let mut hasher = Sha256::new();
        hasher.update(self.fields);
        BodyCheck {
            hasher,
            expected: self.checksum,
        }
    }
}

/// The append's checksum, computed over its records as a reader streams them.
#[derive(Debug, Clone)]
pub struct BodyCheck {
    hasher: Sha256,
    expected: [u8; 8],
}

impl BodyCheck {
    /// Adds the next bytes of the records.
    pub fn update(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
    }

    /// Whether the records fed match the header's checksum: the append is whole.
    pub fn matches(self) -> bool {
        self.hasher.finalize()[..8] == self.expected
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(bytes: &[u8], offset: u64) -> bool {
        parse(bytes, offset).is_some_and(|header| {
            let body = &bytes[HEADER_BYTES..];
            let mut check = header.body_check();
            check.update(body);
            body.len() as u64 == header.body_bytes && check.matches()
        })
    }

    #[test]
    fn an_append_reads_back_and_any_flipped_bit_breaks_it() {
        let body = b"two records, say".to_vec();
        let mut bytes = frame(4096, 17, 2, &body).to_vec();
        bytes.extend_from_slice(&body);
        let header = parse(&bytes, 4096).unwrap();
        assert_eq!(
            (header.first, header.records, header.body_bytes),
            (17, 2, body.len() as u64)
        );
        assert!(whole(&bytes, 4096));
        assert!(
            !whole(&bytes, 4097),
            "the same bytes elsewhere are not an append"
        );
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x04;
            assert!(
                !whole(&damaged, 4096),
                "a flipped bit at {at} went unnoticed"
            );
        }
    }

    #[test]
    fn the_cheap_test_looks_at_the_magic_and_the_offset_only() {
        let header = frame(64, 0, 0, &[]);
        assert!(could_start(&header, 64));
        assert!(!could_start(&header, 65));
        assert!(!could_start(&header[..15], 64));
        let mut other = header;
        other[0] = b'{';
        assert!(!could_start(&other, 64));
        // A truncation mark: no records, still checked.
        assert_eq!(parse(&header, 64).unwrap().records, 0);
    }
}
