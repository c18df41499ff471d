//! The checker against hand-made histories: each property's violation is found, and legal
//! concurrency is not flagged.

use super::*;

fn entry(process: &str, invoked: u64, completed: u64, op: Op, outcome: Outcome) -> Entry {
    Entry {
        process: process.into(),
        lock: "l".into(),
        op,
        invoked,
        completed,
        outcome,
    }
}

fn write(epoch: u64, value: &str) -> Op {
    Op::Write {
        key: "k".into(),
        epoch,
        seq: None,
        value: value.into(),
        token: TokenKind::Valid,
    }
}

fn accepted() -> Outcome {
    Outcome::Accepted
}

fn rejected() -> Outcome {
    Outcome::Rejected {
        reason: "stale_epoch".into(),
    }
}

fn history(entries: Vec<Entry>) -> History {
    History { entries }
}

#[test]
fn p1_a_reissued_epoch_is_found() {
    let h = history(vec![
        entry("a", 0, 1, Op::Acquire, Outcome::Granted { epoch: 5 }),
        entry("b", 2, 3, Op::Acquire, Outcome::Granted { epoch: 5 }),
    ]);
    let violation = check(&h, Mode::Strict).unwrap_err();
    assert_eq!(
        (violation.property, violation.entries.clone()),
        ("P1", vec![0, 1])
    );
    assert!(violation.excerpt(&h).contains("#1"));
}

#[test]
fn p1_a_lower_later_grant_is_found() {
    let h = history(vec![
        entry("a", 0, 1, Op::Acquire, Outcome::Granted { epoch: 5 }),
        entry("b", 2, 3, Op::Acquire, Outcome::Granted { epoch: 4 }),
    ]);
    assert_eq!(check(&h, Mode::Strict).unwrap_err().property, "P1");
}

#[test]
fn p2_the_stale_process_accepted_is_found() {
    let h = history(vec![
        entry("b", 0, 1, write(7, "B"), accepted()),
        entry("a", 2, 3, write(6, "A"), accepted()),
    ]);
    let violation = check(&h, Mode::Strict).unwrap_err();
    assert_eq!(
        (violation.property, violation.entries.clone()),
        ("P2", vec![0, 1])
    );
}

#[test]
fn p2_an_equal_epoch_accepted_twice_in_strict_mode_is_found() {
    let h = history(vec![
        entry("a", 0, 1, write(7, "A"), accepted()),
        entry("b", 2, 3, write(7, "B"), accepted()),
    ]);
    assert_eq!(check(&h, Mode::Strict).unwrap_err().property, "P2");
    // ...which activated mode allows (several writes per epoch).
    let activate = Op::Activate {
        epoch: 7,
        token: TokenKind::Valid,
    };
    let mut entries = vec![entry("a", 0, 0, activate, accepted())];
    entries.extend(h.entries);
    let mut h = history(entries);
    for e in &mut h.entries {
        e.invoked += 1;
        e.completed += 1;
    }
    h.entries[0].invoked = 0;
    h.entries[0].completed = 0;
    assert!(check(&h, Mode::Activated).is_ok());
}

#[test]
fn p2_an_old_owner_accepted_after_the_new_one_activated_is_found() {
    let h = history(vec![
        entry(
            "b",
            0,
            1,
            Op::Activate {
                epoch: 9,
                token: TokenKind::Valid,
            },
            accepted(),
        ),
        entry("a", 2, 3, write(8, "A"), accepted()),
    ]);
    let violation = check(&h, Mode::Activated).unwrap_err();
    assert_eq!(
        (violation.property, violation.entries.clone()),
        ("P2", vec![0, 1])
    );
}

#[test]
fn p2_a_write_accepted_at_an_epoch_never_activated_is_found() {
    let activate = |epoch| Op::Activate {
        epoch,
        token: TokenKind::Valid,
    };
    let h = history(vec![
        entry("a", 0, 1, activate(7), accepted()),
        entry("a", 2, 3, write(7, "A"), accepted()),
        entry("b", 4, 5, write(8, "B"), accepted()),
    ]);
    let violation = check(&h, Mode::Activated).unwrap_err();
    assert_eq!(
        (violation.property, violation.entries.clone()),
        ("P2", vec![2])
    );
    assert!(
        violation.message.contains("never activated"),
        "{}",
        violation.message
    );
}

#[test]
fn p2_a_final_value_from_a_lower_epoch_is_found() {
    let read = Op::Read { key: "k".into() };
    let value = |v: &str, e: u64| Outcome::Value {
        value: Some(v.into()),
        epoch: Some(e),
    };
    let h = history(vec![
        entry("a", 0, 5, write(6, "A"), accepted()),
        entry("b", 0, 5, write(7, "B"), accepted()),
        entry("r", 6, 7, read.clone(), value("A", 6)),
    ]);
    let violation = check(&h, Mode::Strict).unwrap_err();
    assert_eq!(
        (violation.property, violation.entries.clone()),
        ("P2", vec![1, 2])
    );
    let good = history(vec![
        entry("a", 0, 5, write(6, "A"), accepted()),
        entry("b", 0, 5, write(7, "B"), accepted()),
        entry("r", 6, 7, read, value("B", 7)),
    ]);
    assert!(check(&good, Mode::Strict).is_ok());
}

#[test]
fn p2_one_epoch_accepted_twice_concurrently_in_strict_mode_is_found() {
    let h = history(vec![
        entry("a", 0, 10, write(7, "A"), accepted()),
        entry("b", 1, 9, write(7, "B"), accepted()),
    ]);
    assert_eq!(check(&h, Mode::Strict).unwrap_err().property, "P2");
}

#[test]
fn concurrent_writes_may_take_effect_in_either_order() {
    let h = history(vec![
        entry("a", 0, 10, write(7, "A"), accepted()),
        entry("b", 1, 9, write(6, "B"), accepted()),
    ]);
    assert!(check(&h, Mode::Strict).is_ok());
}

#[test]
fn stale_attempts_are_counted_and_rejections_are_fine() {
    let h = history(vec![
        entry("b", 0, 1, write(7, "B"), accepted()),
        entry("a", 2, 3, write(6, "A"), rejected()),
        entry("a", 4, 5, write(7, "A2"), rejected()),
    ]);
    let summary = check(&h, Mode::Strict).unwrap();
    assert_eq!((summary.stale_attempted, summary.stale_accepted), (2, 0));
}

#[test]
fn p4_an_accepted_forged_token_is_found() {
    let forged = Op::Write {
        key: "k".into(),
        epoch: u64::MAX,
        seq: None,
        value: "evil".into(),
        token: TokenKind::Forged,
    };
    let h = history(vec![entry("m", 0, 1, forged, accepted())]);
    assert_eq!(check(&h, Mode::Strict).unwrap_err().property, "P4");
}

#[test]
fn p5_a_successful_bypass_is_found() {
    let bypass = Op::Bypass {
        key: "k".into(),
        path: "plain UPDATE".into(),
    };
    let h = history(vec![entry("admin", 0, 1, bypass, accepted())]);
    assert_eq!(check(&h, Mode::Strict).unwrap_err().property, "P5");
}

#[test]
fn sequenced_pairs_and_replays() {
    let w = |epoch, seq, v: &str| Op::Write {
        key: "k".into(),
        epoch,
        seq: Some(seq),
        value: v.into(),
        token: TokenKind::Valid,
    };
    let ok = history(vec![
        entry("a", 0, 1, w(3, 1, "x"), accepted()),
        entry("a", 2, 3, w(3, 1, "x"), Outcome::Replayed),
        entry("a", 4, 5, w(3, 2, "y"), accepted()),
    ]);
    assert!(check(&ok, Mode::Sequenced).is_ok());
    let bad = history(vec![
        entry("a", 0, 1, w(3, 2, "x"), accepted()),
        entry("a", 2, 3, w(3, 1, "y"), accepted()),
    ]);
    assert_eq!(check(&bad, Mode::Sequenced).unwrap_err().property, "P2");
}
