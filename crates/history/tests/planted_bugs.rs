//! The checker must catch broken resources: writers race on a resource with a planted bug,
//! the history is recorded, and the checker must name a violation. The same race against a
//! correct resource must pass (so the test can fail both ways).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use palisade_history::{check, Entry, History, Mode, Op, Outcome, TokenKind};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Bug {
    /// `fence < epoch`, in one step: correct.
    None,
    /// Checks the fence, yields, then writes: not atomic.
    CheckThenWrite,
    /// `fence <= epoch`: equal epochs accepted twice.
    LessOrEqual,
}

#[derive(Default)]
struct Row {
    fence: u64,
    value: String,
}

struct Resource {
    row: Mutex<Row>,
    bug: Bug,
}

impl Resource {
    async fn write(&self, epoch: u64, value: String) -> bool {
        match self.bug {
            Bug::None | Bug::LessOrEqual => {
                let mut row = self.row.lock().unwrap();
                let ok = if self.bug == Bug::None {
                    row.fence < epoch
                } else {
                    row.fence <= epoch
                };
                if ok {
                    *row = Row {
                        fence: epoch,
                        value,
                    };
                }
                ok
            }
            Bug::CheckThenWrite => {
                let ok = self.row.lock().unwrap().fence < epoch;
                // Other writers run between the check and the write (how long depends on the
                // epoch, so the interleavings differ from write to write).
                for _ in 0..epoch % 3 {
                    tokio::task::yield_now().await;
                }
                if ok {
                    *self.row.lock().unwrap() = Row {
                        fence: epoch,
                        value,
                    };
                }
                ok
            }
        }
    }
}

fn race(bug: Bug, seed: u64) -> History {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let resource = Arc::new(Resource {
            row: Mutex::default(),
            bug,
        });
        let clock = Arc::new(AtomicU64::new(0));
        let history = Arc::new(Mutex::new(History::default()));
        let mut writers = Vec::new();
        for writer in 0..32u64 {
            let (resource, clock, history) = (resource.clone(), clock.clone(), history.clone());
            writers.push(tokio::spawn(async move {
                let mut state = seed ^ (writer + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                for n in 0..10 {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let epoch = 1 + state % 16;
                    let value = format!("w{writer}n{n}");
                    let invoked = clock.fetch_add(1, Ordering::SeqCst);
                    let ok = resource.write(epoch, value.clone()).await;
                    let completed = clock.fetch_add(1, Ordering::SeqCst);
                    history.lock().unwrap().push(Entry {
                        process: format!("w{writer}"),
                        lock: "l".into(),
                        op: Op::Write {
                            key: "k".into(),
                            epoch,
                            seq: None,
                            value,
                            token: TokenKind::Valid,
                        },
                        invoked,
                        completed,
                        outcome: if ok {
                            Outcome::Accepted
                        } else {
                            Outcome::Rejected {
                                reason: "stale_epoch".into(),
                            }
                        },
                    });
                    tokio::task::yield_now().await;
                }
            }));
        }
        for writer in writers {
            writer.await.unwrap();
        }
        let row = resource.row.lock().unwrap();
        let at = clock.fetch_add(1, Ordering::SeqCst);
        let mut history = history.lock().unwrap().clone();
        history.push(Entry {
            process: "reader".into(),
            lock: "l".into(),
            op: Op::Read { key: "k".into() },
            invoked: at,
            completed: at,
            outcome: Outcome::Value {
                value: Some(row.value.clone()),
                epoch: Some(row.fence),
            },
        });
        history
    })
}

#[test]
fn the_correct_resource_passes() {
    for seed in 0..20 {
        let history = race(Bug::None, seed);
        if let Err(violation) = check(&history, Mode::Strict) {
            panic!("seed {seed}: {}", violation.excerpt(&history));
        }
    }
}

#[test]
fn p2_check_then_write_without_atomicity_is_caught() {
    // A race only shows in a history when the interleaving exposes it; runs are deterministic
    // (one thread, fixed seeds), so the count is exact.
    let caught = (0..20)
        .filter(|&seed| {
            let history = race(Bug::CheckThenWrite, seed);
            check(&history, Mode::Strict).is_err_and(|v| v.property == "P2")
        })
        .count();
    eprintln!("planted race found in {caught} of 20 runs");
    assert!(
        caught >= 15,
        "the planted race was found in only {caught} of 20 runs"
    );
}

#[test]
fn p2_less_or_equal_instead_of_less_is_caught() {
    for seed in 0..20 {
        let history = race(Bug::LessOrEqual, seed);
        let violation = check(&history, Mode::Strict).expect_err("equal epochs accepted twice");
        assert_eq!(violation.property, "P2", "seed {seed}");
    }
}
