//! The boundaries as witnesses of the epochs a single node issued: asked at every start.
//!
//! The clock floor covers a volume put back, and the high-water file covers a data directory
//! copied back; neither covers both at once with a clock stepped back while the node was
//! stopped (the clock then reads earlier than some commit did, and the file went back with the
//! volume). The resources that enforce the locks saw the epochs, whoever issued them: a
//! reference store's highest fence, a PostgreSQL database's fences. So a single node asks
//! every boundary its policy names for its highest fence before it serves, and its counter
//! starts above the greatest answer (raised through the high-water bound, which is durable
//! before the engine loads). A boundary that does not answer within its timeout is named in a
//! warning and skipped: the start never waits on it for long, and the clock floor and the
//! boundaries' own refusal of obsolete epochs (P2) still stand.

use std::collections::BTreeSet;

use palisade_audit::policy::{Boundary, Policy};
use palisade_core::{LockName, TokenVerifier};

/// What the boundaries witnessed: the greatest fence any of them answered (0 when none did or
/// none is named), and each one that did not answer, with why.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Witnessed {
    /// The greatest fence answered, as far as it is believed ([`believed`]).
    pub greatest: u64,
    /// The boundaries that answered.
    pub answered: usize,
    /// Each boundary that did not, and why.
    pub silent: Vec<String>,
    /// Each boundary whose fence was not believed in full, and why.
    pub unproven: Vec<String>,
}

/// How much of `witness` a node believes, at wall time `now_ms`, with `verifier` holding its
/// keys; and why not all of it, when not. A fence a signed proof in the boundary backs is
/// believed whatever the clock says (the node's clock may have gone back: that is what
/// witnesses are for). A fence nothing signed backs — a number a SQL writer, or a forged
/// token, put in a fence column — is believed up to this clock's floor only: a coordinator
/// with a right clock never issued above it, and believing more would let one UPDATE stop
/// this node from starting until its clock passes the number (9e18: the year 2241) or make
/// it burn the epochs up to it. `palisade audit` reports such a fence (`poisoned_fence`).
pub fn believed(
    witness: &palisade_audit::observe::Witness,
    verifier: &TokenVerifier,
    now_ms: u64,
) -> (u64, Option<String>) {
    let Some(proofs) = &witness.proofs else {
        return (witness.fence, None);
    };
    let tokens = proofs
        .tokens
        .iter()
        .filter_map(|token| verifier.verify(token, None).ok())
        .map(|claims| claims.epoch.0);
    let floors = proofs.floors.iter().filter_map(|(lock, statement)| {
        let lock = LockName::new(lock.clone()).ok()?;
        Some(verifier.verify_floor(statement, &lock).ok()?.floor.0)
    });
    let proven = tokens.chain(floors).max().unwrap_or(0);
    let clock = palisade_core::clock::floor_at(now_ms);
    if witness.fence <= proven.max(clock) {
        return (witness.fence, None);
    }
    let why = format!(
        "fence {} is above this clock's floor {clock} and no token or floor statement this \
         node signed proves it (the greatest proven is {proven}): believed up to {}. A writer \
         may have put it there by SQL or with a forged token: run palisade audit \
         (poisoned_fence) and palisade resource repair-fence",
        witness.fence,
        proven.max(clock)
    );
    (proven.max(clock), Some(why))
}

/// The distinct boundaries of `policy`, one per place (an effects ledger lives in a reference
/// store: its `/v1/info` is the store's).
fn places(policy: &Policy) -> Vec<Boundary> {
    let mut seen = BTreeSet::new();
    palisade_audit::assess::boundaries(policy)
        .into_iter()
        .map(|(boundary, _)| boundary)
        .filter(|boundary| {
            let place = match boundary {
                Boundary::Resource { url } | Boundary::Effects { url, .. } => {
                    url.trim_end_matches('/').to_owned()
                }
                Boundary::Postgres { url, .. } => url.clone(),
            };
            seen.insert(place)
        })
        .collect()
}

/// Asks every boundary of `policy` at once for its highest fence, and believes each as far as
/// [`believed`] says (`verifier` holds this node's keys).
pub async fn ask(policy: &Policy, verifier: &TokenVerifier) -> Witnessed {
    let http = palisade_audit::observe::http_client();
    let boundaries = places(policy);
    let answers = futures::future::join_all(
        boundaries
            .iter()
            .map(|boundary| palisade_audit::observe::witness(&http, boundary)),
    )
    .await;
    let now_ms = palisade_core::clock::now_ms();
    let mut witnessed = Witnessed::default();
    for (boundary, answer) in boundaries.iter().zip(answers) {
        match answer {
            Ok(witness) => {
                witnessed.answered += 1;
                let (fence, unproven) = believed(&witness, verifier, now_ms);
                witnessed.greatest = witnessed.greatest.max(fence);
                if let Some(why) = unproven {
                    let place = boundary.redacted().describe();
                    witnessed.unproven.push(format!("{place}: {why}"));
                }
            }
            Err(why) => witnessed
                .silent
                .push(format!("{}: {why}", boundary.redacted().describe())),
        }
    }
    witnessed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p6_a_fence_nothing_signed_proves_is_believed_up_to_the_clock_only() {
        use palisade_audit::observe::FenceProofs;
        use palisade_audit::observe::Witness;
        use palisade_core::{Epoch, HolderId, Principal, TokenSigner};
        let signer = TokenSigner::from_secret_bytes(&[9; 32]);
        let verifier = TokenVerifier::new([signer.verifying_key()]);
        let now_ms = 1_800_000_000_000;
        let clock = palisade_core::clock::floor_at(now_ms);
        let ahead = clock + (3_600_000 << palisade_core::clock::CLOCK_SHIFT);
        let lock = LockName::new("w/1").unwrap();
        let holder = HolderId::new("h").unwrap();
        let token = |s: &TokenSigner, epoch| {
            s.sign(&lock, Epoch(epoch), &holder, &Principal::anonymous(), 0)
        };
        let postgres = |fence, tokens: Vec<String>| Witness {
            fence,
            proofs: Some(FenceProofs {
                tokens,
                floors: Vec::new(),
            }),
        };
        // Below the clock: believed, proven or not.
        assert_eq!(
            believed(&postgres(clock - 1, vec![]), &verifier, now_ms),
            (clock - 1, None)
        );
        // Ahead of the clock with a token this node signed: believed (its clock went back).
        let signed = postgres(ahead, vec![token(&signer, ahead)]);
        assert_eq!(believed(&signed, &verifier, now_ms), (ahead, None));
        // 9e18 by SQL, or with a forged token: the clock's floor, and said why.
        let forger = TokenSigner::from_secret_bytes(&[10; 32]);
        for tokens in [vec![], vec![token(&forger, 9_000_000_000_000_000_000)]] {
            let (fence, why) = believed(
                &postgres(9_000_000_000_000_000_000, tokens),
                &verifier,
                now_ms,
            );
            assert_eq!(fence, clock);
            assert!(why.unwrap().contains("poisoned_fence"));
        }
        // A floor statement this node signed proves its floor.
        let floors = Witness {
            fence: ahead,
            proofs: Some(FenceProofs {
                tokens: Vec::new(),
                floors: vec![("w/1".into(), signer.sign_floor(&lock, Epoch(ahead), 0))],
            }),
        };
        assert_eq!(believed(&floors, &verifier, now_ms), (ahead, None));
        // A reference store verifies tokens itself: its fence is believed.
        let store = Witness {
            fence: ahead,
            proofs: None,
        };
        assert_eq!(believed(&store, &verifier, now_ms), (ahead, None));
    }

    #[tokio::test]
    async fn a_policy_without_boundaries_witnesses_nothing() {
        let verifier = TokenVerifier::new([]);
        assert_eq!(ask(&Policy::none(), &verifier).await, Witnessed::default());
    }

    #[tokio::test]
    async fn a_boundary_that_does_not_answer_is_named_and_skipped() {
        let policy = Policy::parse(
            r#"
[[lock]]
pattern = "a/*"
class = "critical"
boundary = { kind = "resource", url = "http://127.0.0.1:1" }

[[lock]]
pattern = "b/*"
class = "critical"
boundary = { kind = "effects", url = "http://127.0.0.1:1/", capability = "idempotent" }
"#,
        )
        .unwrap();
        let witnessed = ask(&policy, &TokenVerifier::new([])).await;
        assert_eq!(witnessed.greatest, 0);
        assert_eq!(witnessed.answered, 0);
        assert_eq!(
            witnessed.silent.len(),
            1,
            "one place: {:?}",
            witnessed.silent
        );
        assert!(witnessed.silent[0].contains("127.0.0.1:1"));
    }
}
