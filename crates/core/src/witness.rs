//! Witness files, as data: a record kept *beside* a data directory (outside it, so a copy of the
//! directory does not carry it) that says how far that directory's store had durably got — a
//! cluster member's applied log index, a fenced store's highest epoch. A store found behind its
//! witness was copied back or restored from an older copy (P6): the caller refuses to serve
//! from it until the operator restores it properly.
//!
//! The witness is written only *after* the store made the mark durable, so a crash never
//! leaves the store behind its witness. This module holds the format and the judgement; the
//! file I/O belongs to the crates that keep a witness.

use std::path::{Path, PathBuf};

/// The file beside data directory `data_dir` named after it with `suffix` (`/var/lib/d` →
/// `/var/lib/d.witness`): outside the directory, so a copy of the directory does not carry it.
pub fn beside(data_dir: &Path, suffix: &str) -> PathBuf {
    let mut name = data_dir
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "palisade-data".into());
    name.push(suffix);
    match data_dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => parent.join(name),
        None => PathBuf::from(name),
    }
}

/// Longest time a witness lags behind its store while the store moves: every store that keeps
/// one (a cluster member, the embedded fenced store, the embedded effects ledger) writes it at
/// most this long after the mark it records became durable. A copy of the directory taken
/// within this window of the original's last change is not told apart from the original
/// (docs/operations.md).
pub const FOLLOW_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);

/// The first word of a witness file (the format).
pub const MAGIC: &str = "palisade-witness v1";

/// What a witness records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WitnessRecord {
    /// What kind of store (`member`, `fenced-store`): a witness of another kind is refused.
    pub kind: String,
    /// The store's random id (a new store, e.g. a wiped directory, has a new one).
    pub store: String,
    /// How far the store had durably got (it never goes down in a healthy store).
    pub mark: u64,
}

impl WitnessRecord {
    /// The file's text.
    pub fn render(&self) -> String {
        format!(
            "{MAGIC} kind={} store={} mark={}\n",
            self.kind, self.store, self.mark
        )
    }

    /// Parses a file's text; `None` when it is not a witness.
    pub fn parse(text: &str) -> Option<Self> {
        let mut words = text.trim().strip_prefix(MAGIC)?.split_whitespace();
        let kind = words.next()?.strip_prefix("kind=")?.to_owned();
        let store = words.next()?.strip_prefix("store=")?.to_owned();
        let mark = words.next()?.strip_prefix("mark=")?.parse().ok()?;
        if words.next().is_some() || kind.is_empty() || store.is_empty() {
            return None;
        }
        Some(Self { kind, store, mark })
    }
}

/// What a start makes of a store and its witness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The store is where the witness saw it: nothing to write.
    Current,
    /// The store is further on, or new (no witness, another store id): record it.
    Record,
    /// The same store is behind its witness: copied back or restored from an older copy.
    Behind {
        /// How far the witness saw the store get.
        seen: u64,
    },
    /// The witness is of another kind of store: a misplaced file, refused.
    OtherKind(String),
}

/// Judges `current` against the witness found (`None`: no file).
pub fn judge(witness: Option<&WitnessRecord>, current: &WitnessRecord) -> Verdict {
    match witness {
        None => Verdict::Record,
        Some(w) if w.kind != current.kind => Verdict::OtherKind(w.kind.clone()),
        Some(w) if w.store != current.store => Verdict::Record,
        Some(w) if w.mark > current.mark => Verdict::Behind { seen: w.mark },
        Some(w) if w.mark == current.mark => Verdict::Current,
        Some(_) => Verdict::Record,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(store: &str, mark: u64) -> WitnessRecord {
        WitnessRecord {
            kind: "member".into(),
            store: store.into(),
            mark,
        }
    }

    #[test]
    fn p6_a_store_behind_its_witness_is_told_apart_from_a_new_or_further_one() {
        let seen = record("a", 9);
        assert_eq!(judge(None, &record("a", 0)), Verdict::Record);
        assert_eq!(judge(Some(&seen), &record("a", 9)), Verdict::Current);
        assert_eq!(judge(Some(&seen), &record("a", 12)), Verdict::Record);
        assert_eq!(
            judge(Some(&seen), &record("a", 3)),
            Verdict::Behind { seen: 9 }
        );
        // A wiped directory holds a new store: followed from where it is.
        assert_eq!(judge(Some(&seen), &record("b", 0)), Verdict::Record);
        let other = WitnessRecord {
            kind: "fenced-store".into(),
            ..record("a", 9)
        };
        assert_eq!(
            judge(Some(&other), &record("a", 9)),
            Verdict::OtherKind("fenced-store".into())
        );
    }

    #[test]
    fn the_file_round_trips_and_anything_else_is_not_a_witness() {
        let seen = record("0a1b", 42);
        assert_eq!(WitnessRecord::parse(&seen.render()), Some(seen));
        for bad in [
            "",
            "42",
            "palisade-witness v1 kind=member store=a",
            "palisade-witness v1 kind=member store=a mark=x",
            "palisade-witness v1 kind= store=a mark=1",
            "palisade-witness v1 kind=member store=a mark=1 more",
            "palisade-witness v2 kind=member store=a mark=1",
        ] {
            assert_eq!(WitnessRecord::parse(bad), None, "{bad:?}");
        }
    }
}
