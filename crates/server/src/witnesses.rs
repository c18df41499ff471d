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

/// What the boundaries witnessed: the greatest fence any of them answered (0 when none did or
/// none is named), and each one that did not answer, with why.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Witnessed {
    /// The greatest fence answered.
    pub greatest: u64,
    /// The boundaries that answered.
    pub answered: usize,
    /// Each boundary that did not, and why.
    pub silent: Vec<String>,
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

/// Asks every boundary of `policy` at once for its highest fence.
pub async fn ask(policy: &Policy) -> Witnessed {
    let http = palisade_audit::observe::http_client();
    let boundaries = places(policy);
    let answers = futures::future::join_all(
        boundaries
            .iter()
            .map(|boundary| palisade_audit::observe::highest_fence(&http, boundary)),
    )
    .await;
    let mut witnessed = Witnessed::default();
    for (boundary, answer) in boundaries.iter().zip(answers) {
        match answer {
            Ok(fence) => {
                witnessed.answered += 1;
                witnessed.greatest = witnessed.greatest.max(fence);
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

    #[tokio::test]
    async fn a_policy_without_boundaries_witnesses_nothing() {
        assert_eq!(ask(&Policy::none()).await, Witnessed::default());
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
        let witnessed = ask(&policy).await;
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
