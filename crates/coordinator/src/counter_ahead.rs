//! The operator's word that a single node's clock is right and its epoch counter is ahead of
//! it (`palisade serve --resume-counter-ahead COUNTER`), kept in the data directory until the
//! clock passes the counter.
//!
//! A clock that ran ahead at a start or a commit (`faketime`, a VM resumed with a wrong clock,
//! NTP stepping a fast clock back) leaves the counter ahead of the correct clock, and the
//! engine refuses to start ([`crate::store::StoreError::CounterAhead`]): on one node nothing
//! can tell a counter raised by a wrong clock from a clock stepped back. The operator can. The
//! flag is recorded durably, so that every restart until the clock passes the counter serves
//! too ([`crate::engine::CounterAhead::Accepted`]); once the clock has passed it, the record is
//! removed at the next start and a stale flag left in a service file is ignored.
//!
//! What is weaker meanwhile, and only meanwhile: epochs rise from the counter (counter + 1)
//! instead of staying below the clock, so a copy of the data directory put back and started
//! before the clock passes the counter could issue epochs again — the clock floor no longer
//! covers epochs issued in that window. The high-water file and the boundaries' fences still
//! do.

use std::path::Path;

use palisade_core::{clock, Epoch};

use crate::store::StoreError;

/// The record's file inside the data directory: it belongs with the counter it accepts (a
/// copy of the directory carries both).
pub const FILE: &str = "counter-ahead";

/// The record's first word (its format).
const MAGIC: &str = "palisade-counter-ahead v1";

/// The counter the operator accepted ahead of the clock, if any still is: `flag` (this
/// start's `--resume-counter-ahead`) or the record in `data_dir`, whichever is greater. A flag
/// is recorded durably before it is used; a record (or flag) the clock has passed (`now_ms`)
/// is done with: removed, and `None`. A flag above `counter` (the greatest epoch this node may
/// have issued) is refused: it names no counter the refusal showed.
pub fn accepted(
    data_dir: &Path,
    flag: Option<Epoch>,
    counter: Epoch,
    now_ms: u64,
) -> Result<Option<Epoch>, StoreError> {
    if let Some(flag) = flag.filter(|flag| *flag > counter) {
        return Err(StoreError::Corrupt(format!(
            "--resume-counter-ahead {flag} is above this node's epoch counter {counter}: give \
             the counter its refusal named"
        )));
    }
    let path = data_dir.join(FILE);
    let recorded = read(&path)?;
    let Some(accepted) = recorded.max(flag) else {
        return Ok(None);
    };
    if clock::issuable(accepted.0, now_ms) {
        if recorded.is_some() {
            std::fs::remove_file(&path).map_err(StoreError::from_io)?;
        }
        tracing::info!(
            accepted = accepted.0,
            "the clock has passed the epoch counter accepted ahead of it: the acceptance is \
             done with (a --resume-counter-ahead flag can be dropped)"
        );
        return Ok(None);
    }
    if flag > recorded {
        palisade_durable::write_file(&path, format!("{MAGIC} {}\n", accepted.0).as_bytes())
            .map_err(StoreError::from_io)?;
        tracing::warn!(
            accepted = accepted.0,
            until = %clock::display_ms(clock::epoch_time_ms(accepted.0)),
            record = %path.display(),
            "the operator accepted the epoch counter ahead of this clock: recorded; every \
             start serves until the clock passes it"
        );
    }
    Ok(Some(accepted))
}

/// The record at `path` (`None` when there is none).
fn read(path: &Path) -> Result<Option<Epoch>, StoreError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(StoreError::from_io(error)),
    };
    text.trim()
        .strip_prefix(MAGIC)
        .and_then(|rest| rest.trim().parse().ok())
        .map(|counter| Some(Epoch(counter)))
        .ok_or_else(|| {
            StoreError::Corrupt(format!(
                "{} is not a counter-ahead record (\"{MAGIC} N\"): remove it, and give \
                 --resume-counter-ahead again if the refusal asks for it",
                path.display()
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;
    const DAY_MS: u64 = 86_400_000;

    #[test]
    fn p6_an_acceptance_is_recorded_until_the_clock_passes_its_counter() {
        let dir = tempfile::tempdir().unwrap();
        let counter = Epoch(clock::floor_at(NOW + DAY_MS) + 7);
        assert_eq!(accepted(dir.path(), None, counter, NOW).unwrap(), None);
        let flag = Some(counter);
        assert_eq!(accepted(dir.path(), flag, counter, NOW).unwrap(), flag);
        // Restarts without the flag keep it, until the clock passes the counter.
        assert_eq!(accepted(dir.path(), None, counter, NOW + 1).unwrap(), flag);
        let past = NOW + DAY_MS + 1;
        assert_eq!(accepted(dir.path(), None, counter, past).unwrap(), None);
        assert!(!dir.path().join(FILE).exists());
        // A stale flag left in a service file accepts nothing once the clock passed it.
        assert_eq!(accepted(dir.path(), flag, counter, past).unwrap(), None);
        assert!(!dir.path().join(FILE).exists());
    }

    #[test]
    fn p6_a_flag_above_the_counter_or_a_damaged_record_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let counter = Epoch(clock::floor_at(NOW + DAY_MS));
        let above = Some(Epoch(counter.0 + 1));
        assert!(accepted(dir.path(), above, counter, NOW).is_err());
        std::fs::write(dir.path().join(FILE), "something else").unwrap();
        let refused = accepted(dir.path(), None, counter, NOW).unwrap_err();
        assert!(refused.to_string().contains("counter-ahead"), "{refused}");
    }
}
