//! The conformance suite: one set of cases every [`FencedResource`] adapter must pass.
//!
//! An adapter's test file implements [`Factory`] and invokes [`conformance_suite!`], which
//! expands to one `#[tokio::test]` per case, so each adapter reports its own counts. Cases use
//! lock names of their own (with a per-run suffix), so one database can host every case.
//! Each case names the properties it checks.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use palisade_core::{Epoch, HolderId, LockName, Principal, TokenSigner, TokenVerifier};

use crate::{Activation, FenceMode, FencedResource, Outcome, Rejection, Verifier, Write};

/// Builds resources for the suite.
pub trait Factory: Sync {
    /// The adapter under test.
    type Resource: FencedResource + 'static;
    /// A resource in `mode` that trusts `verifier`. Storage may be shared between calls.
    fn make(
        &self,
        mode: FenceMode,
        verifier: Arc<Verifier>,
    ) -> impl Future<Output = Self::Resource> + Send;
}

/// Expands to one test per conformance case for the factory expression `$factory`.
#[macro_export]
macro_rules! conformance_suite {
    ($factory:expr) => {
        $crate::conformance_suite!(@cases $factory;
            strict_accepts_only_higher_epochs,
            strict_refuses_an_old_owner_creating_a_key_the_new_owner_has_not_written,
            activated_accepts_only_the_activated_epoch,
            sequenced_orders_pairs_and_replays_idempotently,
            activation_is_refused_outside_activated_mode,
            tampered_tokens_are_rejected_and_apply_nothing,
            forged_enormous_epochs_do_not_move_the_fence,
            bad_keys_and_values_are_rejected,
            fences_are_per_lock_and_keys_per_lock,
            concurrent_strict_writers_respect_the_fence,
            concurrent_activated_owners_respect_the_fence,
            concurrent_sequenced_writers_respect_the_fence,
            fuzzed_writes_are_applied_or_rejected_never_failed,
        );
    };
    (@cases $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::conformance::$case(&$factory).await;
            }
        )*
    };
}

/// Keys and helpers shared by the cases.
pub struct Harness {
    /// The trusted coordinator key.
    pub signer: TokenSigner,
    /// A key nobody trusts.
    pub stranger: TokenSigner,
    /// Trusts `signer` only.
    pub verifier: Arc<Verifier>,
    suffix: String,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    /// Fixed test keys and a per-run suffix for lock names.
    pub fn new() -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let signer = TokenSigner::from_secret_bytes(&[7; 32]);
        let stranger = TokenSigner::from_secret_bytes(&[9; 32]);
        let verifier = Arc::new(Verifier::new(TokenVerifier::new([signer.verifying_key()])));
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        Self {
            signer,
            stranger,
            verifier,
            suffix: format!("{}-{nanos}-{n}", std::process::id()),
        }
    }

    /// A lock name unique to this run: `conformance/{case}/{suffix}`.
    pub fn lock(&self, case: &str) -> LockName {
        LockName::new(format!("conformance/{case}/{}", self.suffix)).unwrap()
    }

    /// A token for `lock` at `epoch` from the trusted key.
    pub fn token(&self, lock: &LockName, epoch: u64) -> String {
        sign(&self.signer, lock, epoch)
    }

    /// A token for `lock` at `epoch` from the untrusted key.
    pub fn stranger_token(&self, lock: &LockName, epoch: u64) -> String {
        sign(&self.stranger, lock, epoch)
    }
}

fn sign(signer: &TokenSigner, lock: &LockName, epoch: u64) -> String {
    let holder = HolderId::new("conformance").unwrap();
    signer.sign(lock, Epoch(epoch), &holder, &Principal::anonymous(), 0)
}

/// `token` with one bit of its epoch flipped (signature left as it was).
pub fn alter_epoch(token: &str) -> String {
    let mut bytes = URL_SAFE_NO_PAD.decode(&token[4..]).unwrap();
    bytes[1 + 8 + 7] ^= 0x40; // version, key id, then the epoch's last byte
    format!("pt1.{}", URL_SAFE_NO_PAD.encode(bytes))
}

async fn put<R: FencedResource>(
    resource: &R,
    lock: &LockName,
    key: &str,
    token: &str,
    seq: Option<u64>,
    value: &[u8],
) -> Outcome {
    let write = Write {
        lock,
        key,
        token,
        seq,
        value,
    };
    resource
        .write(write)
        .await
        .expect("no storage failure in the suite")
}

fn accepted(epoch: u64, seq: Option<u64>) -> Outcome {
    Outcome::Accepted {
        epoch: Epoch(epoch),
        seq,
    }
}

fn stale(fence: u64) -> Outcome {
    Outcome::Rejected(Rejection::StaleEpoch {
        fence: Epoch(fence),
        fence_seq: None,
    })
}

async fn stored_epoch<R: FencedResource>(resource: &R, lock: &LockName, key: &str) -> Option<u64> {
    let stored = resource.read(lock, key).await.expect("read");
    stored.map(|s| s.epoch.0)
}

/// P2, strict mode: accept iff `epoch > fence`; equal and lower epochs are rejected with the
/// fence; the stored value is the highest accepted epoch's.
pub async fn strict_accepts_only_higher_epochs(factory: &impl Factory) {
    let h = Harness::new();
    let r = factory.make(FenceMode::Strict, h.verifier.clone()).await;
    let lock = h.lock("strict");
    assert_eq!(
        put(&r, &lock, "row", &h.token(&lock, 5), None, b"five").await,
        accepted(5, None)
    );
    assert_eq!(
        put(&r, &lock, "row", &h.token(&lock, 5), None, b"again").await,
        stale(5)
    );
    assert_eq!(
        put(&r, &lock, "row", &h.token(&lock, 4), None, b"four").await,
        stale(5)
    );
    assert_eq!(
        put(&r, &lock, "row", &h.token(&lock, 9), None, b"nine").await,
        accepted(9, None)
    );
    let stored = r.read(&lock, "row").await.unwrap().unwrap();
    assert_eq!(
        (stored.value.as_slice(), stored.epoch),
        (&b"nine"[..], Epoch(9))
    );
    assert_eq!(r.fence(&lock).await.unwrap(), Epoch(9));
    let with_seq = put(&r, &lock, "row", &h.token(&lock, 10), Some(1), b"x").await;
    assert!(
        matches!(with_seq, Outcome::Rejected(Rejection::InvalidRequest(_))),
        "{with_seq:?}"
    );
    assert_eq!(stored_epoch(&r, &lock, "row").await, Some(9));
}

/// P2, strict mode, where the resource knows the lock: an epoch below the lock's greatest
/// accepted epoch is refused on every key, including one nobody has written yet; the current
/// owner still writes other keys at its epoch (equal epochs are refused per key only).
pub async fn strict_refuses_an_old_owner_creating_a_key_the_new_owner_has_not_written(
    factory: &impl Factory,
) {
    let h = Harness::new();
    let r = factory.make(FenceMode::Strict, h.verifier.clone()).await;
    let lock = h.lock("strict-lock");
    assert_eq!(
        put(&r, &lock, "key1", &h.token(&lock, 42), None, b"new owner").await,
        accepted(42, None)
    );
    assert_eq!(
        put(&r, &lock, "key2", &h.token(&lock, 41), None, b"old owner").await,
        stale(42)
    );
    assert_eq!(stored_epoch(&r, &lock, "key2").await, None);
    assert_eq!(r.fence(&lock).await.unwrap(), Epoch(42));
    assert_eq!(
        put(&r, &lock, "key2", &h.token(&lock, 42), None, b"new owner").await,
        accepted(42, None)
    );
    assert_eq!(
        put(&r, &lock, "key2", &h.token(&lock, 42), None, b"again").await,
        stale(42)
    );
    let other = h.lock("strict-other");
    assert_eq!(
        put(
            &r,
            &other,
            "key1",
            &h.token(&other, 41),
            None,
            b"other lock"
        )
        .await,
        accepted(41, None),
        "fences are per lock"
    );
}

/// P2, activated mode: writes need `epoch == fence`; activation moves only up, is idempotent,
/// and rejects the old owner before the new one writes.
pub async fn activated_accepts_only_the_activated_epoch(factory: &impl Factory) {
    let h = Harness::new();
    let r = factory.make(FenceMode::Activated, h.verifier.clone()).await;
    let lock = h.lock("activated");
    let (t3, t5) = (h.token(&lock, 3), h.token(&lock, 5));
    let not_activated = put(&r, &lock, "k", &t3, None, b"early").await;
    assert_eq!(
        not_activated,
        Outcome::Rejected(Rejection::NotActivated { fence: Epoch(0) })
    );
    let activated = Activation::Activated { fence: Epoch(3) };
    assert_eq!(r.activate(&lock, &t3).await.unwrap(), activated);
    assert_eq!(
        r.activate(&lock, &t3).await.unwrap(),
        activated,
        "retry must succeed"
    );
    assert_eq!(
        put(&r, &lock, "k", &t3, None, b"a").await,
        accepted(3, None)
    );
    assert_eq!(
        put(&r, &lock, "k", &t3, None, b"b").await,
        accepted(3, None)
    );
    assert_eq!(
        r.activate(&lock, &t5).await.unwrap(),
        Activation::Activated { fence: Epoch(5) }
    );
    // The old owner is out as soon as the new one activates, before it writes.
    assert_eq!(put(&r, &lock, "k", &t3, None, b"late").await, stale(5));
    let old = r.activate(&lock, &t3).await.unwrap();
    assert_eq!(
        old,
        Activation::Rejected(Rejection::StaleEpoch {
            fence: Epoch(5),
            fence_seq: None
        })
    );
    assert_eq!(
        put(&r, &lock, "k", &t5, None, b"new").await,
        accepted(5, None)
    );
    let stored = r.read(&lock, "k").await.unwrap().unwrap();
    assert_eq!(
        (stored.value.as_slice(), stored.epoch),
        (&b"new"[..], Epoch(5))
    );
    assert_eq!(r.fence(&lock).await.unwrap(), Epoch(5));
}

/// P2 and idempotency, sequenced mode: pairs must rise; a replay of an applied pair returns the
/// recorded outcome and applies nothing; a reused pair with another value is refused.
pub async fn sequenced_orders_pairs_and_replays_idempotently(factory: &impl Factory) {
    let h = Harness::new();
    let r = factory.make(FenceMode::Sequenced, h.verifier.clone()).await;
    let lock = h.lock("sequenced");
    let (t2, t3) = (h.token(&lock, 2), h.token(&lock, 3));
    assert_eq!(
        put(&r, &lock, "k", &t2, Some(1), b"a").await,
        accepted(2, Some(1))
    );
    let replay = Outcome::Replayed {
        epoch: Epoch(2),
        seq: 1,
    };
    assert_eq!(put(&r, &lock, "k", &t2, Some(1), b"a").await, replay);
    let mismatch = put(&r, &lock, "k", &t2, Some(1), b"other").await;
    assert_eq!(
        mismatch,
        Outcome::Rejected(Rejection::ReplayMismatch {
            epoch: Epoch(2),
            seq: 1
        })
    );
    let behind = put(&r, &lock, "k", &t2, Some(0), b"z").await;
    assert!(
        matches!(behind, Outcome::Rejected(Rejection::StaleEpoch { .. })),
        "{behind:?}"
    );
    assert_eq!(
        put(&r, &lock, "k", &t2, Some(2), b"b").await,
        accepted(2, Some(2))
    );
    assert_eq!(
        put(&r, &lock, "k", &t3, Some(0), b"c").await,
        accepted(3, Some(0))
    );
    let old_owner = put(&r, &lock, "k", &t2, Some(3), b"d").await;
    assert_eq!(
        old_owner,
        Outcome::Rejected(Rejection::StaleEpoch {
            fence: Epoch(3),
            fence_seq: Some(0)
        })
    );
    let no_seq = put(&r, &lock, "k", &t3, None, b"e").await;
    assert!(
        matches!(no_seq, Outcome::Rejected(Rejection::InvalidRequest(_))),
        "{no_seq:?}"
    );
    let stored = r.read(&lock, "k").await.unwrap().unwrap();
    assert_eq!(
        (stored.value.as_slice(), stored.epoch, stored.seq),
        (&b"c"[..], Epoch(3), Some(0))
    );
}

/// Activation means nothing in strict and sequenced mode and is refused there.
pub async fn activation_is_refused_outside_activated_mode(factory: &impl Factory) {
    let h = Harness::new();
    for mode in [FenceMode::Strict, FenceMode::Sequenced] {
        let r = factory.make(mode, h.verifier.clone()).await;
        let lock = h.lock(&format!("activate-{mode}"));
        let outcome = r.activate(&lock, &h.token(&lock, 1)).await.unwrap();
        assert!(
            matches!(outcome, Activation::Rejected(Rejection::InvalidRequest(_))),
            "{mode}: {outcome:?}"
        );
    }
}

/// P4: altered, foreign-key, wrong-lock, malformed, truncated and oversized tokens are
/// rejected in every mode, and nothing is applied.
pub async fn tampered_tokens_are_rejected_and_apply_nothing(factory: &impl Factory) {
    let h = Harness::new();
    for mode in [
        FenceMode::Strict,
        FenceMode::Activated,
        FenceMode::Sequenced,
    ] {
        let r = factory.make(mode, h.verifier.clone()).await;
        let lock = h.lock(&format!("tampered-{mode}"));
        let other = h.lock(&format!("tampered-other-{mode}"));
        let good = h.token(&lock, 4);
        let seq = (mode == FenceMode::Sequenced).then_some(1);
        if mode == FenceMode::Activated {
            assert!(matches!(
                r.activate(&lock, &good).await.unwrap(),
                Activation::Activated { .. }
            ));
        }
        assert_eq!(
            put(&r, &lock, "k", &good, seq, b"good").await,
            accepted(4, seq)
        );
        let oversized = format!("pt1.{}", "A".repeat(4_000));
        let bad_tokens = [
            alter_epoch(&h.token(&lock, 4)),
            h.stranger_token(&lock, 8),
            h.token(&other, 8),
            "not a token".to_string(),
            good[..good.len() - 7].to_string(),
            oversized,
            String::new(),
        ];
        for bad in &bad_tokens {
            let seq = seq.map(|s| s + 1);
            let outcome = put(&r, &lock, "k", bad, seq, b"evil").await;
            assert!(
                matches!(outcome, Outcome::Rejected(Rejection::InvalidToken(_))),
                "{mode}: {bad:.40}: {outcome:?}"
            );
            if mode == FenceMode::Activated {
                let activation = r.activate(&lock, bad).await.unwrap();
                assert!(
                    matches!(activation, Activation::Rejected(Rejection::InvalidToken(_))),
                    "{mode}: {activation:?}"
                );
            }
        }
        let stored = r.read(&lock, "k").await.unwrap().unwrap();
        assert_eq!(
            (stored.value.as_slice(), stored.epoch),
            (&b"good"[..], Epoch(4)),
            "{mode}"
        );
        assert_eq!(r.fence(&lock).await.unwrap(), Epoch(4), "{mode}");
    }
}

/// P4: an enormous epoch signed by an untrusted key, or an altered one, cannot push the fence
/// up (which would lock the real owner out).
pub async fn forged_enormous_epochs_do_not_move_the_fence(factory: &impl Factory) {
    let h = Harness::new();
    let r = factory.make(FenceMode::Activated, h.verifier.clone()).await;
    let lock = h.lock("enormous");
    let forged = h.stranger_token(&lock, u64::MAX);
    let activation = r.activate(&lock, &forged).await.unwrap();
    assert!(matches!(
        activation,
        Activation::Rejected(Rejection::InvalidToken(_))
    ));
    assert_eq!(r.fence(&lock).await.unwrap(), Epoch(0));
    let real = h.token(&lock, 2);
    assert!(matches!(
        r.activate(&lock, &real).await.unwrap(),
        Activation::Activated { .. }
    ));
    assert_eq!(
        put(&r, &lock, "k", &real, None, b"ok").await,
        accepted(2, None)
    );
}

/// Bad input: empty or overlong keys and oversized values are rejected and store nothing.
pub async fn bad_keys_and_values_are_rejected(factory: &impl Factory) {
    let h = Harness::new();
    let r = factory.make(FenceMode::Strict, h.verifier.clone()).await;
    let lock = h.lock("bad-input");
    let token = h.token(&lock, 1);
    let long_key = "k".repeat(crate::MAX_KEY_BYTES + 1);
    let big = vec![0u8; crate::MAX_VALUE_BYTES + 1];
    for (key, value) in [
        ("", &b"v"[..]),
        (long_key.as_str(), b"v"),
        ("k", big.as_slice()),
    ] {
        let outcome = put(&r, &lock, key, &token, None, value).await;
        assert!(
            matches!(outcome, Outcome::Rejected(Rejection::InvalidRequest(_))),
            "{outcome:?}"
        );
    }
    assert_eq!(stored_epoch(&r, &lock, "k").await, None);
    let max = vec![1u8; crate::MAX_VALUE_BYTES];
    assert_eq!(
        put(&r, &lock, "k", &token, None, &max).await,
        accepted(1, None)
    );
    assert_eq!(
        r.read(&lock, "k").await.unwrap().unwrap().value.len(),
        crate::MAX_VALUE_BYTES
    );
}

/// Fences of different locks are independent, and a key of one lock is not a key of another.
pub async fn fences_are_per_lock_and_keys_per_lock(factory: &impl Factory) {
    let h = Harness::new();
    let r = factory.make(FenceMode::Strict, h.verifier.clone()).await;
    let (a, b) = (h.lock("lock-a"), h.lock("lock-b"));
    assert_eq!(
        put(&r, &a, "k", &h.token(&a, 50), None, b"a").await,
        accepted(50, None)
    );
    assert_eq!(
        put(&r, &b, "k", &h.token(&b, 2), None, b"b").await,
        accepted(2, None)
    );
    assert_eq!(stored_epoch(&r, &a, "k").await, Some(50));
    assert_eq!(stored_epoch(&r, &b, "k").await, Some(2));
    assert_eq!(r.fence(&b).await.unwrap(), Epoch(2));
}

/// Writers racing in each concurrency case.
pub const CONCURRENT_WRITERS: usize = 32;
/// Writes per writer in each concurrency case.
pub const WRITES_PER_WRITER: usize = 12;

/// One write as the history records it: logical invocation and completion times, its epoch
/// (and seq), and whether it was accepted.
#[derive(Debug, Clone)]
pub struct HistoryEntry {
    /// Logical time the write was sent.
    pub invoked: u64,
    /// Logical time its answer arrived.
    pub completed: u64,
    /// `(epoch, seq)` of the write.
    pub pair: (u64, u64),
    /// The value it carried.
    pub value: Vec<u8>,
    /// Accepted or not.
    pub accepted: bool,
}

/// Checks P2 on a history of writes to one key: for two accepted writes where the first
/// completed before the second was invoked, the second's pair is above (strictly, unless
/// `equal_allowed`) the first's; and the stored value is the one written by the highest
/// accepted pair. Returns the first violation found.
pub fn check_history(
    history: &[HistoryEntry],
    stored: Option<(u64, u64, Vec<u8>)>,
    equal_allowed: bool,
) -> Result<usize, String> {
    let accepted: Vec<&HistoryEntry> = history.iter().filter(|e| e.accepted).collect();
    for first in &accepted {
        for second in &accepted {
            if first.completed < second.invoked {
                let ok = second.pair > first.pair || (equal_allowed && second.pair == first.pair);
                if !ok {
                    return Err(format!(
                        "P2 violated: {:?} was accepted after {:?} had been accepted",
                        second, first
                    ));
                }
            }
        }
    }
    let highest = accepted.iter().map(|e| e.pair).max();
    match (highest, stored) {
        (None, None) => Ok(0),
        (Some(pair), Some((epoch, seq, value))) => {
            if (epoch, seq) != pair {
                return Err(format!(
                    "stored pair {:?}, highest accepted {pair:?}",
                    (epoch, seq)
                ));
            }
            // With several writes per epoch (activated), the last writer of that epoch wins;
            // with one write per pair, it must be exactly that write's value.
            let writers: Vec<_> = accepted.iter().filter(|e| e.pair == pair).collect();
            if !writers.iter().any(|e| e.value == value) {
                return Err(format!(
                    "stored value was not written by the highest pair {pair:?}"
                ));
            }
            Ok(accepted.len())
        }
        (highest, stored) => Err(format!("highest accepted {highest:?}, stored {stored:?}")),
    }
}

/// SplitMix64: a seeded generator for reproducible random epochs.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

async fn race<R: FencedResource + 'static>(
    resource: Arc<R>,
    harness: Arc<Harness>,
    lock: LockName,
    mode: FenceMode,
) -> Vec<HistoryEntry> {
    let clock = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for writer in 0..CONCURRENT_WRITERS {
        let (resource, harness, lock, clock) = (
            resource.clone(),
            harness.clone(),
            lock.clone(),
            clock.clone(),
        );
        writers.push(tokio::spawn(async move {
            let mut random = SplitMix(writer as u64 + 1);
            let mut history = Vec::new();
            for n in 0..WRITES_PER_WRITER {
                let epoch = 1 + random.next() % 64;
                let seq = (mode == FenceMode::Sequenced).then(|| random.next() % 4);
                let token = harness.token(&lock, epoch);
                let value = format!("w{writer}-n{n}-e{epoch}-s{seq:?}").into_bytes();
                let invoked = clock.fetch_add(1, Ordering::SeqCst);
                if mode == FenceMode::Activated {
                    let _ = resource.activate(&lock, &token).await.expect("activate");
                }
                let outcome = put(&*resource, &lock, "row", &token, seq, &value).await;
                let completed = clock.fetch_add(1, Ordering::SeqCst);
                if let Outcome::Rejected(Rejection::InvalidToken(e)) = &outcome {
                    panic!("valid token rejected: {e}");
                }
                history.push(HistoryEntry {
                    invoked,
                    completed,
                    pair: (epoch, seq.unwrap_or(0)),
                    value,
                    accepted: matches!(outcome, Outcome::Accepted { .. }),
                });
            }
            history
        }));
    }
    let mut history = Vec::new();
    for writer in writers {
        history.extend(writer.await.expect("writer"));
    }
    history
}

async fn concurrent_case(factory: &impl Factory, mode: FenceMode) {
    let harness = Arc::new(Harness::new());
    let resource = Arc::new(factory.make(mode, harness.verifier.clone()).await);
    let lock = harness.lock(&format!("race-{mode}"));
    let history = race(resource.clone(), harness.clone(), lock.clone(), mode).await;
    let stored = resource.read(&lock, "row").await.unwrap();
    let stored = stored.map(|s| (s.epoch.0, s.seq.unwrap_or(0), s.value));
    let equal_allowed = mode == FenceMode::Activated;
    match check_history(&history, stored, equal_allowed) {
        Ok(accepted) => assert!(accepted > 0, "{mode}: nothing was accepted"),
        Err(violation) => panic!("{mode}: {violation}"),
    }
}

/// P2 + P3, strict: 32 writers with random epochs race on one row; the history shows nothing
/// accepted at or below an earlier accepted epoch, and the highest accepted value is stored.
pub async fn concurrent_strict_writers_respect_the_fence(factory: &impl Factory) {
    concurrent_case(factory, FenceMode::Strict).await;
}

/// P2 + P3, activated: 32 owners with random epochs activate and write on one row.
pub async fn concurrent_activated_owners_respect_the_fence(factory: &impl Factory) {
    concurrent_case(factory, FenceMode::Activated).await;
}

/// P2 + P3, sequenced: 32 writers with random `(epoch, seq)` race on one row.
pub async fn concurrent_sequenced_writers_respect_the_fence(factory: &impl Factory) {
    concurrent_case(factory, FenceMode::Sequenced).await;
}

/// A small deterministic generator for [`fuzzed_writes_are_applied_or_rejected_never_failed`]
/// (SplitMix64: no dependency for the library).
struct Fuzz(u64);

impl Fuzz {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Text mixing what breaks storage layers: NUL and control characters, quotes,
    /// backslashes, SQL and LIKE metacharacters, multi-byte characters, long runs.
    fn text(&mut self, max_chars: u64) -> String {
        const PIECES: &[&str] = &[
            "\0",
            "\u{1}",
            "\n",
            "'",
            "\"",
            "\\",
            "%",
            "_",
            ";",
            "--",
            "' OR '1'='1",
            "é",
            "ß",
            "日本",
            "🦀",
            "\u{202e}",
            "\u{feff}",
            "a",
            "k",
            "/",
            " ",
        ];
        let n = self.below(max_chars + 1);
        (0..n)
            .map(|_| PIECES[self.below(PIECES.len() as u64) as usize])
            .collect()
    }
}

/// One fuzzed write: its parts, and whether its token is the exact trusted one.
struct FuzzedWrite {
    key: String,
    value: Vec<u8>,
    token: String,
    trusted: bool,
    seq: Option<u64>,
}

impl Fuzz {
    /// The next write's parts, drawn in a fixed order (a seed gives the same cases); raises
    /// `epoch` one time in three.
    fn write(
        &mut self,
        h: &Harness,
        lock: &LockName,
        mode: FenceMode,
        epoch: &mut u64,
    ) -> FuzzedWrite {
        let key = match self.below(4) {
            0 => "k".to_owned(),
            1 => self.text(8),
            _ => self.text(300),
        };
        let size = match self.below(10) {
            0 => crate::MAX_VALUE_BYTES + self.below(2) as usize,
            _ => self.below(256) as usize,
        };
        let value: Vec<u8> = (0..size).map(|_| self.next() as u8).collect();
        if self.below(3) == 0 {
            *epoch += 1;
        }
        let (token, trusted) = self.token(h, lock, *epoch);
        let seq = match (mode, self.below(6)) {
            (_, 0) => None,
            (_, 1) => Some(self.next()),
            (FenceMode::Sequenced, _) => Some(1 + self.below(1_000)),
            _ => None,
        };
        FuzzedWrite {
            key,
            value,
            token,
            trusted,
            seq,
        }
    }

    /// A token for `epoch`: valid two times in five, else altered in one bit, signed by an
    /// untrusted key, or arbitrary text. Says whether it is the exact trusted one.
    fn token(&mut self, h: &Harness, lock: &LockName, epoch: u64) -> (String, bool) {
        let valid = h.token(lock, epoch);
        match self.below(5) {
            0 | 1 => (valid, true),
            2 => {
                let mut bytes = URL_SAFE_NO_PAD.decode(&valid[4..]).unwrap();
                let at = self.below(bytes.len() as u64) as usize;
                bytes[at] ^= 1 << self.below(8);
                (format!("pt1.{}", URL_SAFE_NO_PAD.encode(bytes)), false)
            }
            3 => (h.stranger_token(lock, epoch), false),
            _ => (self.text(40), false),
        }
    }
}

/// A number from the environment variable `name`, else `default`.
fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// P2, P4 and the contract's error rule under arbitrary input: keys of any characters (NUL,
/// quotes, SQL metacharacters, multi-byte) and lengths, values of any bytes and sizes, tokens
/// valid, altered in one byte, from an untrusted key, or arbitrary text, sequence numbers
/// present or not. Every write is `Accepted` or `Rejected` (never a storage failure), nothing
/// but an exact trusted token is accepted, an accepted write reads back exactly, and the fence
/// never moves below what was accepted. `PALISADE_FUZZ_CASES` writes (default 200; fixed seed
/// unless `PROPTEST_RNG_SEED` is set, as for the other fuzz tests).
pub async fn fuzzed_writes_are_applied_or_rejected_never_failed(factory: &impl Factory) {
    let cases = env_u64("PALISADE_FUZZ_CASES", 200);
    let seed = env_u64("PROPTEST_RNG_SEED", 0x6675_7a7a);
    for mode in [FenceMode::Strict, FenceMode::Sequenced] {
        let h = Harness::new();
        let r = factory.make(mode, h.verifier.clone()).await;
        let lock = h.lock("fuzz");
        let mut fuzz = Fuzz(seed ^ mode as u64);
        let mut epoch = 1u64;
        let mut highest_accepted = 0u64;
        for _ in 0..cases {
            let w = fuzz.write(&h, &lock, mode, &mut epoch);
            check_fuzzed(&r, mode, &lock, &w, &mut highest_accepted).await;
        }
        let fence = r.fence(&lock).await.expect("fence");
        assert_eq!(
            fence.0, highest_accepted,
            "{mode}: the fence is the highest accepted epoch"
        );
    }
}

/// Makes one fuzzed write and checks its outcome: never a storage failure; accepted only with
/// the exact trusted token, never below an earlier acceptance, and reading back exactly.
async fn check_fuzzed<R: FencedResource>(
    r: &R,
    mode: FenceMode,
    lock: &LockName,
    w: &FuzzedWrite,
    highest_accepted: &mut u64,
) {
    let write = Write {
        lock,
        key: &w.key,
        token: &w.token,
        seq: w.seq,
        value: &w.value,
    };
    let outcome = r.write(write).await.unwrap_or_else(|error| {
        panic!(
            "{mode}: a storage failure for input {:?} ({} bytes): {error}",
            w.key,
            w.value.len()
        )
    });
    let Outcome::Accepted {
        epoch: accepted, ..
    } = outcome
    else {
        return;
    };
    assert!(
        w.trusted,
        "{mode}: P4: an untrusted token was accepted: {}",
        w.token
    );
    assert!(
        accepted.0 >= *highest_accepted,
        "{mode}: P2: accepted below the fence"
    );
    *highest_accepted = accepted.0;
    let stored = r.read(lock, &w.key).await.expect("read").expect("stored");
    assert_eq!(
        stored.value, w.value,
        "{mode}: the accepted value reads back"
    );
    assert_eq!(stored.epoch, accepted);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(invoked: u64, completed: u64, epoch: u64, accepted: bool) -> HistoryEntry {
        HistoryEntry {
            invoked,
            completed,
            pair: (epoch, 0),
            value: vec![epoch as u8],
            accepted,
        }
    }

    #[test]
    fn the_history_check_finds_a_stale_acceptance() {
        let history = [entry(0, 1, 5, true), entry(2, 3, 4, true)];
        assert!(check_history(&history, Some((5, 0, vec![5])), false).is_err());
    }

    #[test]
    fn the_history_check_finds_an_equal_epoch_accepted_twice_in_strict_mode() {
        let history = [entry(0, 1, 5, true), entry(2, 3, 5, true)];
        assert!(check_history(&history, Some((5, 0, vec![5])), false).is_err());
        assert!(check_history(&history, Some((5, 0, vec![5])), true).is_ok());
    }

    #[test]
    fn the_history_check_finds_a_lost_highest_write() {
        let history = [entry(0, 1, 5, true), entry(0, 3, 7, true)];
        assert!(check_history(&history, Some((5, 0, vec![5])), false).is_err());
        assert!(check_history(&history, Some((7, 0, vec![9])), false).is_err());
        assert_eq!(check_history(&history, Some((7, 0, vec![7])), false), Ok(2));
    }

    #[test]
    fn concurrent_writes_may_be_accepted_in_either_order() {
        let history = [entry(0, 3, 5, true), entry(1, 2, 4, true)];
        assert_eq!(check_history(&history, Some((5, 0, vec![5])), false), Ok(2));
    }
}
