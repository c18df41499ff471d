//! Histories and their checker.
//!
//! A drill or a simulation records every operation as an [`Entry`]: who did it (process), on
//! which lock and key, with which epoch, what kind of token, when it was invoked and when it
//! completed (any clock that is monotonic within one history), and its outcome. [`check`]
//! verifies the safety properties on the history and names the first violating entries:
//!
//! - **P1** — grants of one lock strictly increase in real-time order (a grant that completed
//!   before another was invoked has a lower epoch), and no epoch is granted twice;
//! - **P2** — per key: an accepted write whose invocation followed the completion of another
//!   accepted write (or, in activated mode, of an activation) on the same key/lock has a higher
//!   epoch (strict, sequenced: higher pair) or, in activated mode, an epoch at least as high as
//!   every activation completed before it; the final value is one written by the highest
//!   accepted epoch;
//! - **P4** — no write or activation with a forged, altered, foreign or wrong-lock token is
//!   accepted;
//! - **P5** — no write that bypassed the guarded path succeeded.
//!
//! Concurrent operations (overlapping invocation–completion intervals) may take effect in
//! either order; the checker only forbids what no order could explain.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::{Deserialize, Serialize};

/// How a resource compares epochs, as far as the checker needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `epoch > fence`, one write per epoch and key.
    Strict,
    /// `epoch == fence` after activation; several writes per epoch.
    Activated,
    /// `(epoch, seq)` above the stored pair.
    Sequenced,
}

/// What a token was, as the drill made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenKind {
    /// Issued by the coordinator, untouched.
    Valid,
    /// Altered, signed by an unknown key, for another lock, or garbage.
    Forged,
}

/// An operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// An acquire at the coordinator.
    Acquire,
    /// An activation at the resource.
    Activate {
        /// The token's epoch.
        epoch: u64,
        /// What kind of token.
        token: TokenKind,
    },
    /// A fenced write.
    Write {
        /// The key.
        key: String,
        /// The token's epoch (as claimed).
        epoch: u64,
        /// The sequence number (sequenced mode).
        seq: Option<u64>,
        /// An id of the value written, to tell values apart.
        value: String,
        /// What kind of token.
        token: TokenKind,
    },
    /// A write that skips the guarded path (no token, or straight to the storage).
    Bypass {
        /// The key.
        key: String,
        /// How it bypassed.
        path: String,
    },
    /// A final read of a key.
    Read {
        /// The key.
        key: String,
    },
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Outcome {
    /// Acquire granted at this epoch.
    Granted {
        /// The epoch.
        epoch: u64,
    },
    /// Write applied, or activation done.
    Accepted,
    /// Sequenced replay: recorded outcome returned, nothing applied.
    Replayed,
    /// Refused; the reason as the resource named it.
    Rejected {
        /// e.g. `stale_epoch`, `invalid_token`.
        reason: String,
    },
    /// Read result: the value id and the epoch that wrote it (`None` if absent).
    Value {
        /// The value id.
        value: Option<String>,
        /// The epoch that wrote it.
        epoch: Option<u64>,
    },
    /// No answer (timeout, crash): the operation may or may not have taken effect.
    Unknown,
}

/// One operation in a history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Who (a process name, a simulated client).
    pub process: String,
    /// The lock.
    pub lock: String,
    /// What.
    pub op: Op,
    /// When it was invoked.
    pub invoked: u64,
    /// When it completed (≥ `invoked`).
    pub completed: u64,
    /// How.
    pub outcome: Outcome,
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}..{}] {} {} {} -> {}",
            self.invoked,
            self.completed,
            self.process,
            self.lock,
            serde_json::to_string(&self.op).unwrap_or_default(),
            serde_json::to_string(&self.outcome).unwrap_or_default()
        )
    }
}

/// A recorded history, in recording order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct History {
    /// The entries.
    pub entries: Vec<Entry>,
}

impl History {
    /// Appends an entry.
    pub fn push(&mut self, entry: Entry) {
        debug_assert!(
            entry.completed >= entry.invoked,
            "completion before invocation"
        );
        self.entries.push(entry);
    }
}

/// A property the history violates, with the entries that show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// `P1`, `P2`, `P4` or `P5`.
    pub property: &'static str,
    /// What is wrong.
    pub message: String,
    /// Indices of the offending entries, first the earlier one.
    pub entries: Vec<usize>,
}

impl Violation {
    /// The violation with the offending entries printed, for people.
    pub fn excerpt(&self, history: &History) -> String {
        let mut out = format!("{} violated: {}\n", self.property, self.message);
        for &index in &self.entries {
            out.push_str(&format!("  #{index} {}\n", history.entries[index]));
        }
        out
    }
}

/// What the checker counted on a history that holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Grants checked.
    pub grants: usize,
    /// Writes attempted.
    pub writes: usize,
    /// Writes accepted.
    pub accepted: usize,
    /// Writes that were stale when invoked (a newer epoch had been accepted or activated), or
    /// carried a bad token.
    pub stale_attempted: usize,
    /// Of those, accepted (0 when the history holds).
    pub stale_accepted: usize,
    /// Bypass attempts (all must fail).
    pub bypass_attempted: usize,
}

/// Checks P1, P2, P4 and P5 on `history` for a resource in `mode`.
pub fn check(history: &History, mode: Mode) -> Result<Summary, Violation> {
    let mut summary = Summary::default();
    check_grants(history, &mut summary)?;
    check_tokens_and_bypass(history, &mut summary)?;
    check_writes(history, mode, &mut summary)?;
    Ok(summary)
}

fn check_grants(history: &History, summary: &mut Summary) -> Result<(), Violation> {
    let mut seen: HashMap<u64, usize> = HashMap::new();
    let mut by_lock: BTreeMap<&str, Vec<(usize, &Entry, u64)>> = BTreeMap::new();
    for (index, entry) in history.entries.iter().enumerate() {
        if let (Op::Acquire, Outcome::Granted { epoch }) = (&entry.op, &entry.outcome) {
            summary.grants += 1;
            if let Some(&first) = seen.get(epoch) {
                return Err(Violation {
                    property: "P1",
                    message: format!("epoch {epoch} granted twice"),
                    entries: vec![first, index],
                });
            }
            seen.insert(*epoch, index);
            by_lock
                .entry(&entry.lock)
                .or_default()
                .push((index, entry, *epoch));
        }
    }
    for grants in by_lock.values() {
        for &(i, a, ea) in grants {
            for &(j, b, eb) in grants {
                if a.completed < b.invoked && eb <= ea {
                    return Err(Violation {
                        property: "P1",
                        message: format!("epoch {eb} granted after epoch {ea} of the same lock"),
                        entries: vec![i, j],
                    });
                }
            }
        }
    }
    Ok(())
}

fn check_tokens_and_bypass(history: &History, summary: &mut Summary) -> Result<(), Violation> {
    for (index, entry) in history.entries.iter().enumerate() {
        let accepted = matches!(entry.outcome, Outcome::Accepted | Outcome::Replayed);
        match &entry.op {
            Op::Write {
                token: TokenKind::Forged,
                ..
            }
            | Op::Activate {
                token: TokenKind::Forged,
                ..
            } => {
                summary.stale_attempted += usize::from(matches!(entry.op, Op::Write { .. }));
                if accepted {
                    summary.stale_accepted += 1;
                    return Err(Violation {
                        property: "P4",
                        message: "an operation with a forged or foreign token was accepted".into(),
                        entries: vec![index],
                    });
                }
            }
            Op::Bypass { path, .. } => {
                summary.bypass_attempted += 1;
                if accepted {
                    return Err(Violation {
                        property: "P5",
                        message: format!("a write bypassing the guard ({path}) succeeded"),
                        entries: vec![index],
                    });
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// A valid write or activation, with what the checker needs.
struct Step<'a> {
    index: usize,
    entry: &'a Entry,
    pair: (u64, u64),
    accepted: bool,
    value: Option<&'a str>,
    activation: bool,
}

fn check_writes(history: &History, mode: Mode, summary: &mut Summary) -> Result<(), Violation> {
    // Steps per (lock, key); activations apply to every key of their lock.
    let mut activations: BTreeMap<&str, Vec<Step<'_>>> = BTreeMap::new();
    let mut writes: BTreeMap<(&str, &str), Vec<Step<'_>>> = BTreeMap::new();
    for (index, entry) in history.entries.iter().enumerate() {
        let accepted = matches!(entry.outcome, Outcome::Accepted);
        match &entry.op {
            Op::Write {
                key,
                epoch,
                seq,
                value,
                token: TokenKind::Valid,
            } => {
                summary.writes += 1;
                summary.accepted += usize::from(accepted);
                writes.entry((&entry.lock, key)).or_default().push(Step {
                    index,
                    entry,
                    pair: (*epoch, seq.unwrap_or(0)),
                    accepted,
                    value: Some(value),
                    activation: false,
                });
            }
            Op::Activate {
                epoch,
                token: TokenKind::Valid,
            } if accepted => {
                activations.entry(&entry.lock).or_default().push(Step {
                    index,
                    entry,
                    pair: (*epoch, 0),
                    accepted,
                    value: None,
                    activation: true,
                });
            }
            _ => {}
        }
    }
    for ((lock, key), steps) in &writes {
        let fences = activations.get(lock).map(Vec::as_slice).unwrap_or(&[]);
        check_key(steps, fences, mode, summary)?;
        if mode == Mode::Activated {
            check_activated_before_accepted(history, lock, steps)?;
        }
        check_final_value(history, lock, key, steps)?;
    }
    Ok(())
}

/// Activated mode: a write is accepted only at the activated epoch, so every accepted write at
/// epoch E needs an activation of E on its lock that was invoked before the write completed
/// and not refused (an activation whose answer was lost may have applied). A resource that
/// accepted a higher, never-activated epoch lets an owner write before it fenced out the old
/// one.
fn check_activated_before_accepted(
    history: &History,
    lock: &str,
    steps: &[Step<'_>],
) -> Result<(), Violation> {
    for write in steps.iter().filter(|s| s.accepted) {
        let activated = history.entries.iter().any(|entry| {
            entry.lock == lock
                && entry.invoked < write.entry.completed
                && !matches!(entry.outcome, Outcome::Rejected { .. })
                && matches!(
                    entry.op,
                    Op::Activate { epoch, token: TokenKind::Valid } if epoch == write.pair.0
                )
        });
        if !activated {
            return Err(Violation {
                property: "P2",
                message: format!(
                    "a write at epoch {} was accepted but that epoch was never activated",
                    write.pair.0
                ),
                entries: vec![write.index],
            });
        }
    }
    Ok(())
}

fn check_key(
    steps: &[Step<'_>],
    activations: &[Step<'_>],
    mode: Mode,
    summary: &mut Summary,
) -> Result<(), Violation> {
    // Strict and sequenced modes give one result per epoch (pair), even to concurrent writers.
    if mode != Mode::Activated {
        let mut first_accept: HashMap<(u64, u64), usize> = HashMap::new();
        for write in steps.iter().filter(|s| s.accepted && !s.activation) {
            if let Some(&first) = first_accept.get(&write.pair) {
                return Err(Violation {
                    property: "P2",
                    message: format!("{:?} was accepted twice for one key", write.pair),
                    entries: vec![first, write.index],
                });
            }
            first_accept.insert(write.pair, write.index);
        }
    }
    for write in steps {
        // Everything that had completed before this write was invoked, and so bounds it.
        let earlier = steps
            .iter()
            .chain(activations)
            .filter(|s| s.accepted && s.entry.completed < write.entry.invoked);
        let mut stale_against = None;
        for before in earlier {
            let stale = match (mode, before.activation) {
                // An activation at a higher epoch makes every lower epoch stale.
                (Mode::Activated, true) => write.pair.0 < before.pair.0,
                // Several writes per epoch are fine in activated mode.
                (Mode::Activated, false) => write.pair.0 < before.pair.0,
                (Mode::Strict | Mode::Sequenced, _) => write.pair <= before.pair,
            };
            if stale {
                stale_against = Some(before);
                break;
            }
        }
        if let Some(before) = stale_against {
            summary.stale_attempted += 1;
            if write.accepted {
                summary.stale_accepted += 1;
                return Err(Violation {
                    property: "P2",
                    message: format!(
                        "a write at {:?} was accepted after {:?} had been {}",
                        write.pair,
                        before.pair,
                        if before.activation {
                            "activated"
                        } else {
                            "accepted"
                        }
                    ),
                    entries: vec![before.index, write.index],
                });
            }
        }
    }
    Ok(())
}

fn check_final_value(
    history: &History,
    lock: &str,
    key: &str,
    steps: &[Step<'_>],
) -> Result<(), Violation> {
    let Some((read_index, read)) = history
        .entries
        .iter()
        .enumerate()
        .rev()
        .find(|(_, e)| e.lock == lock && matches!(&e.op, Op::Read { key: k } if k == key))
    else {
        return Ok(());
    };
    let Outcome::Value { value, epoch } = &read.outcome else {
        return Ok(());
    };
    let highest = steps.iter().filter(|s| s.accepted).map(|s| s.pair).max();
    let Some(highest) = highest else {
        return Ok(()); // nothing accepted in this history (the key may hold older data)
    };
    let writers: Vec<&Step<'_>> = steps
        .iter()
        .filter(|s| s.accepted && s.pair == highest)
        .collect();
    let ok = *epoch == Some(highest.0) && writers.iter().any(|s| s.value == value.as_deref());
    if ok {
        return Ok(());
    }
    let mut entries: Vec<usize> = writers.iter().map(|s| s.index).collect();
    entries.push(read_index);
    Err(Violation {
        property: "P2",
        message: format!(
            "the final value {value:?} (epoch {epoch:?}) is not the one written by the highest \
             accepted epoch {}",
            highest.0
        ),
        entries,
    })
}

#[cfg(test)]
mod tests;
