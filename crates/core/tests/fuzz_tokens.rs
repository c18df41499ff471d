//! Fuzzing the token decoder and verifier (P4: no client can forge or alter a token). Runs
//! `PALISADE_FUZZ_CASES` cases per property (default 1,000, fixed seed: CI sees the same cases
//! every run); `scripts/fuzz` runs many more with a fresh seed. Every property holds for
//! arbitrary input: no panic, and nothing but the exact text the coordinator signed verifies.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use palisade_core::token::{decode_public_key, decode_unverified};
use palisade_core::{Epoch, HolderId, KeyId, LockName, Principal, TokenSigner, TokenVerifier};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PALISADE_FUZZ_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(1_000),
        rng_seed: std::env::var("PROPTEST_RNG_SEED")
            .ok()
            .and_then(|seed| seed.parse().ok())
            .map_or(
                proptest::test_runner::RngSeed::Fixed(0x746f_6b65),
                proptest::test_runner::RngSeed::Fixed,
            ),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn signer() -> TokenSigner {
    TokenSigner::from_secret_bytes(&[7; 32])
}

fn verifier() -> TokenVerifier {
    TokenVerifier::new([signer().verifying_key()])
}

fn valid_token(epoch: u64, lock: &str) -> String {
    signer().sign(
        &LockName::new(lock).unwrap(),
        Epoch(epoch),
        &HolderId::new("worker-1").unwrap(),
        &Principal::new("orders").unwrap(),
        1_700_000_000_000,
    )
}

fn encode(bytes: &[u8]) -> String {
    format!("pt1.{}", URL_SAFE_NO_PAD.encode(bytes))
}

proptest! {
    #![proptest_config(config())]

    /// P4: arbitrary text never panics the decoder or the verifier, and never verifies.
    #[test]
    fn p4_arbitrary_text_is_refused(text in ".{0,1200}") {
        let _ = decode_unverified(&text);
        let _ = decode_public_key(&text);
        prop_assert!(verifier().verify(&text, None).is_err());
    }

    /// P4: arbitrary bytes in the token's own envelope (`pt1.` + base64url) are refused, with
    /// the signing key's id in place so that the signature check is reached.
    #[test]
    fn p4_arbitrary_payloads_under_a_known_key_id_are_refused(
        payload in proptest::collection::vec(any::<u8>(), 0..700),
        version in any::<u8>(),
    ) {
        let key_id = KeyId::of(&signer().verifying_key());
        let mut bytes = vec![version];
        bytes.extend_from_slice(&key_id.0);
        bytes.extend_from_slice(&payload);
        let text = encode(&bytes);
        let _ = decode_unverified(&text);
        prop_assert!(verifier().verify(&text, None).is_err());
    }

    /// P4: any change to a signed token's bytes (payload or signature), any truncation or
    /// extension is refused; the untouched token verifies.
    #[test]
    fn p4_every_alteration_of_a_signed_token_is_refused(
        epoch in any::<u64>(),
        lock in "[a-z0-9/_.-]{1,64}",
        at in any::<prop::sample::Index>(),
        xor in 1u8..,
        cut in any::<prop::sample::Index>(),
        extra in proptest::collection::vec(any::<u8>(), 1..16),
    ) {
        let token = valid_token(epoch, &lock);
        let claims = verifier().verify(&token, None).expect("the signed token verifies");
        prop_assert_eq!(claims.epoch, Epoch(epoch));
        let bytes = URL_SAFE_NO_PAD.decode(token.trim_start_matches("pt1.")).unwrap();
        let mut flipped = bytes.clone();
        flipped[at.index(bytes.len())] ^= xor;
        prop_assert!(verifier().verify(&encode(&flipped), None).is_err());
        let truncated = &bytes[..cut.index(bytes.len())];
        prop_assert!(verifier().verify(&encode(truncated), None).is_err());
        let mut extended = bytes.clone();
        extended.extend_from_slice(&extra);
        prop_assert!(verifier().verify(&encode(&extended), None).is_err());
        // In the text: another character anywhere after the prefix.
        let mut text: Vec<char> = token.chars().collect();
        let i = 4 + at.index(text.len() - 4);
        text[i] = if text[i] == 'A' { 'B' } else { 'A' };
        let altered: String = text.into_iter().collect();
        prop_assert!(verifier().verify(&altered, None).is_err());
    }

    /// P4: a valid token is refused for another lock.
    #[test]
    fn p4_a_token_never_verifies_for_another_lock(
        lock in "[a-z]{1,20}",
        other in "[a-z]{1,20}",
    ) {
        let token = valid_token(1, &lock);
        let expected = LockName::new(other.clone()).unwrap();
        let verified = verifier().verify(&token, Some(&expected));
        prop_assert_eq!(verified.is_ok(), lock == other);
    }
}
