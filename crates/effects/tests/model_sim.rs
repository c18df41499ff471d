//! A deterministic, seeded simulation of the ledger's rules (P7): owners of rising and stale
//! epochs, owners that crash before sending or pause after their deadline check, a network
//! that delays, loses answers and holds requests for seconds, receivers of each capability, a
//! reconciler, and a person who resolves review items. The rules are the real ones
//! (`palisade_effects::model`); time and the network are simulated.
//!
//! Checked on every seed: no operation is performed twice by the receiver, no superseded owner
//! is handed an attempt, a final operation never changes, and once the system quiesces every
//! operation ends final and performed exactly once.
//!
//! `PALISADE_EFFECTS_SIM_SEEDS=N PALISADE_EFFECTS_SIM_FROM=S` runs other seeds.

use std::collections::BTreeMap;

use palisade_core::{Epoch, LockName};
use palisade_effects::model::{
    apply_finish, apply_reattempt, apply_resolve, apply_settle, decide_begin, lookup_after,
    start_attempt, Applied, BeginCheck, BeginDecision, Capability, OpId, OpState, Record, Review,
    SendResult, Settlement, Verdict,
};

const OPS: usize = 3;
const ATTEMPT_TIMEOUT: u64 = 1_000;
/// An owner waits this long for an answer before it records the outcome as ambiguous.
const ANSWER_TIMEOUT: u64 = 600;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A request on its way to the receiver.
struct Message {
    op: usize,
    attempt: u32,
    deadline: u64,
    sent: u64,
    arrives: u64,
    /// The answer never reaches the sender (lost, or the sender crashed after sending).
    answer_lost: bool,
    /// Who sent it: an owner (records the answer) or the reconciler (settles it).
    by_reconciler: bool,
}

struct World {
    rng: Rng,
    now: u64,
    capability: Capability,
    ids: Vec<OpId>,
    fence: u64,
    records: Vec<Option<Record>>,
    /// Epochs issued so far (the newest is the current owner's).
    epochs: u64,
    messages: Vec<Message>,
    /// (time, op, attempt, epoch, result): owners recording an answer, or a timeout.
    finishes: Vec<(u64, usize, u32, SendResult)>,
    /// Effects the receiver performed, per op.
    performed: Vec<u32>,
    /// Keys the idempotent receiver has seen.
    seen: Vec<bool>,
    violations: Vec<String>,
}

impl World {
    fn new(seed: u64, capability: Capability) -> Self {
        let lock = LockName::new("sim/effects").unwrap();
        Self {
            rng: Rng(seed),
            now: 1_000_000,
            capability,
            ids: (0..OPS)
                .map(|n| OpId::new(lock.clone(), format!("op-{n}")).unwrap())
                .collect(),
            fence: 0,
            records: vec![None; OPS],
            epochs: 0,
            messages: Vec::new(),
            finishes: Vec::new(),
            performed: vec![0; OPS],
            seen: vec![false; OPS],
            violations: Vec::new(),
        }
    }

    fn check_final_unchanged(&mut self, op: usize, before: &Option<Record>) {
        if let (Some(b), Some(a)) = (before, &self.records[op]) {
            if b.state.is_final() && a.state != b.state {
                self.violations
                    .push(format!("{}: final {} became {}", b.id, b.state, a.state));
            }
        }
    }

    /// An owner of `epoch` runs `begin` for `op`, and sends (or crashes, or pauses).
    fn begin(&mut self, op: usize, epoch: u64, perfect: bool) {
        let id = self.ids[op].clone();
        let check = BeginCheck {
            id: &id,
            epoch: Epoch(epoch),
            payload: b"p",
            receiver: "r",
            capability: self.capability,
            attempt_timeout_ms: ATTEMPT_TIMEOUT,
            now_ms: self.now,
        };
        let before = self.records[op].clone();
        match decide_begin(self.fence, before.as_ref(), &check) {
            BeginDecision::Attempt { advance } => {
                if epoch < self.fence {
                    self.violations.push(format!(
                        "epoch {epoch} below fence {} got an attempt",
                        self.fence
                    ));
                }
                if advance {
                    self.fence = epoch;
                }
                let record = start_attempt(before.clone(), &check, "owner");
                let attempt = record.attempt;
                let deadline = record.deadline_ms;
                self.records[op] = Some(record);
                self.check_final_unchanged(op, &before);
                if !perfect && self.rng.chance(10) {
                    return; // crashed after recording, before sending: nothing more
                }
                // Normal delivery, or a pause between the deadline check and the send, or a
                // network that holds the request.
                let delay = if perfect || self.rng.chance(75) {
                    self.rng.below(50)
                } else {
                    self.rng.below(5_000)
                };
                let crashed_after_send = !perfect && self.rng.chance(10);
                let answer_lost = crashed_after_send || (!perfect && self.rng.chance(20));
                self.messages.push(Message {
                    op,
                    attempt,
                    deadline,
                    sent: self.now,
                    arrives: self.now + delay,
                    answer_lost,
                    by_reconciler: false,
                });
                if crashed_after_send {
                    return; // no answer is ever recorded
                }
                if answer_lost || delay >= ANSWER_TIMEOUT {
                    let reason = "timeout".to_owned();
                    self.finishes.push((
                        self.now + ANSWER_TIMEOUT,
                        op,
                        attempt,
                        SendResult::Ambiguous { reason },
                    ));
                }
            }
            BeginDecision::Lookup => {
                let record = before.clone().unwrap();
                let settlement = if self.performed[op] > 0 {
                    Settlement::Performed { reference: None }
                } else {
                    Settlement::NotPerformed
                };
                self.settle(op, record.attempt, settlement);
            }
            BeginDecision::Review {
                move_to_review: true,
                reason,
            } => {
                let record = self.records[op].as_mut().unwrap();
                record.state = OpState::NeedsReview;
                record.detail = Some(reason);
            }
            _ => {}
        }
    }

    fn settle(&mut self, op: usize, attempt: u32, settlement: Settlement) {
        let before = self.records[op].clone();
        if let Some(record) = self.records[op].as_mut() {
            let _ = apply_settle(record, attempt, &settlement, self.now);
        }
        self.check_final_unchanged(op, &before);
    }

    /// The receiver gets every message due by now.
    fn deliver(&mut self) {
        let now = self.now;
        let (due, later): (Vec<_>, Vec<_>) =
            self.messages.drain(..).partition(|m| m.arrives <= now);
        self.messages = later;
        for m in due {
            let result = match self.capability {
                Capability::Lookup if m.arrives > m.deadline => SendResult::Expired {
                    reason: "late".into(),
                },
                Capability::Idempotent if self.seen[m.op] => {
                    SendResult::Performed { reference: None }
                }
                _ => {
                    self.performed[m.op] += 1;
                    self.seen[m.op] = true;
                    SendResult::Performed { reference: None }
                }
            };
            if m.by_reconciler {
                let settlement = match result {
                    SendResult::Performed { reference } => Settlement::Performed { reference },
                    _ => continue,
                };
                self.settle(m.op, m.attempt, settlement);
            } else if !m.answer_lost && m.arrives - m.sent < ANSWER_TIMEOUT {
                self.finishes.push((m.arrives, m.op, m.attempt, result));
            }
        }
    }

    fn record_finishes(&mut self) {
        let now = self.now;
        let (due, later): (Vec<_>, Vec<_>) = self.finishes.drain(..).partition(|f| f.0 <= now);
        self.finishes = later;
        for (_, op, attempt, result) in due {
            let before = self.records[op].clone();
            if let Some(record) = self.records[op].as_mut() {
                let _: Applied = apply_finish(record, attempt, &result, now);
            }
            self.check_final_unchanged(op, &before);
        }
    }

    /// One pass of the reconciler, as `reconcile_once`.
    fn reconcile(&mut self) {
        for op in 0..OPS {
            let Some(record) = self.records[op].clone() else {
                continue;
            };
            if !record.state.is_in_doubt() {
                continue;
            }
            match self.capability {
                Capability::Idempotent
                    if record.state == OpState::Unknown || self.now >= record.deadline_ms =>
                {
                    let mut retried = record.clone();
                    let timeout = ATTEMPT_TIMEOUT;
                    if apply_reattempt(&mut retried, record.attempt, self.now, timeout)
                        == Ok(Applied::Recorded)
                    {
                        let (attempt, deadline) = (retried.attempt, retried.deadline_ms);
                        self.records[op] = Some(retried);
                        self.messages.push(Message {
                            op,
                            attempt,
                            deadline,
                            sent: self.now,
                            arrives: self.now + self.rng.below(50),
                            answer_lost: false,
                            by_reconciler: true,
                        });
                    }
                }
                Capability::Lookup if self.now >= lookup_after(&record) => {
                    let settlement = if self.performed[op] > 0 {
                        Settlement::Performed { reference: None }
                    } else {
                        Settlement::NotPerformed
                    };
                    self.settle(op, record.attempt, settlement);
                }
                Capability::None if self.now >= record.deadline_ms => {
                    let reason = "no answer".to_owned();
                    self.settle(op, record.attempt, Settlement::Review { reason });
                }
                _ => {}
            }
        }
    }

    /// A person resolves review items from the receiver's record, but only once no attempt of
    /// the operation can still arrive (docs/effects.md: its sender is known to be gone).
    fn review(&mut self) {
        for op in 0..OPS {
            let in_review = self.records[op]
                .as_ref()
                .is_some_and(|r| r.state == OpState::NeedsReview);
            if !in_review || self.messages.iter().any(|m| m.op == op) {
                continue;
            }
            let verdict = if self.performed[op] > 0 {
                Verdict::Done
            } else {
                Verdict::NotDone
            };
            let review = Review {
                verdict,
                by: "person".into(),
                why: "the receiver's record".into(),
                at_ms: self.now,
            };
            let record = self.records[op].as_mut().unwrap();
            apply_resolve(record, review).unwrap();
        }
    }

    fn step(&mut self) {
        self.now += self.rng.below(400);
        self.deliver();
        self.record_finishes();
        match self.rng.below(10) {
            0 | 1 => self.epochs += 1,
            2..=6 if self.epochs > 0 => {
                let op = self.rng.below(OPS as u64) as usize;
                // Mostly the current owner; sometimes a superseded one waking up.
                let epoch = if self.rng.chance(70) {
                    self.epochs
                } else {
                    1 + self.rng.below(self.epochs)
                };
                self.begin(op, epoch, false);
            }
            7 | 8 => self.reconcile(),
            _ => self.review(),
        }
    }

    /// Quiesce: deliver everything, then owners, the reconciler and the person until every
    /// operation is final.
    fn settle_everything(&mut self) {
        for _ in 0..50 {
            self.now += 10_000;
            self.deliver();
            self.record_finishes();
            self.reconcile();
            self.now += 100;
            self.deliver();
            self.record_finishes();
            self.review();
            self.epochs += 1;
            for op in 0..OPS {
                self.begin(op, self.epochs, true);
            }
            self.now += 100;
            self.deliver();
            self.record_finishes();
            if self
                .records
                .iter()
                .all(|r| r.as_ref().is_some_and(|r| r.state.is_final()))
            {
                return;
            }
        }
    }

    fn judge(&mut self) {
        for op in 0..OPS {
            let state = self.records[op].as_ref().map(|r| r.state);
            let done = matches!(state, Some(OpState::Succeeded | OpState::Reconciled));
            if self.performed[op] > 1 {
                self.violations
                    .push(format!("op-{op} performed {} times", self.performed[op]));
            }
            if !done || self.performed[op] != 1 {
                self.violations.push(format!(
                    "op-{op} ends {state:?} with {} effects",
                    self.performed[op]
                ));
            }
        }
    }
}

fn run(seed: u64, capability: Capability) -> Vec<String> {
    let mut world = World::new(seed, capability);
    for _ in 0..80 {
        world.step();
    }
    world.settle_everything();
    world.judge();
    world.violations
}

fn seeds() -> (u64, u64) {
    let count = std::env::var("PALISADE_EFFECTS_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000);
    let from = std::env::var("PALISADE_EFFECTS_SIM_FROM")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (from, count)
}

fn run_all(capability: Capability) {
    let (from, count) = seeds();
    let mut failed = BTreeMap::new();
    for seed in from..from + count {
        let violations = run(seed, capability);
        if !violations.is_empty() {
            failed.insert(seed, violations);
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {count} seeds failed ({capability}); first: {:?}",
        failed.len(),
        failed.iter().next()
    );
}

#[test]
fn p7_idempotent_receivers_never_perform_twice_and_nothing_is_lost() {
    run_all(Capability::Idempotent);
}

#[test]
fn p7_lookup_receivers_never_perform_twice_and_nothing_is_lost() {
    run_all(Capability::Lookup);
}

#[test]
fn p7_receivers_without_dedup_are_never_retried_blind() {
    run_all(Capability::None);
}

/// The simulation catches the classic bug: a receiver without deduplication retried blind.
#[test]
fn p7_a_blind_retry_is_caught() {
    // Retrying blind is what an idempotent receiver allows; declaring a `none` receiver
    // idempotent (a false declaration) is the same bug, and must show duplicates.
    let mut duplicates = 0;
    for seed in 0..300 {
        let mut world = World::new(seed, Capability::Idempotent);
        world.capability = Capability::Idempotent;
        // The receiver below does not deduplicate although the ledger was told it does.
        for _ in 0..80 {
            world.step();
            world.seen.iter_mut().for_each(|s| *s = false);
        }
        world.settle_everything();
        if world.performed.iter().any(|&n| n > 1) {
            duplicates += 1;
        }
    }
    assert!(
        duplicates > 0,
        "a receiver that lies about deduplication went unnoticed"
    );
}
