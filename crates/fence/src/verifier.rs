//! A token verifier whose trusted keys can be replaced while it is in use (key refresh), with a
//! bounded cache of tokens already verified.
//!
//! An owner presents the same token for every write of its epoch, and an Ed25519 verification
//! costs tens of microseconds: the cache maps the token's exact text to its verified claims, so
//! a repeated token costs a hash lookup. This is sound because the signature covers exactly
//! those bytes and the cache is emptied whenever the trusted keys change. A verification that
//! raced with a change of keys is not remembered: the cache has a generation, bumped by every
//! change, and a result is stored only under the generation it started in.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};

use palisade_core::{
    InvalidInput, KeyId, LockName, Principal, TokenClaims, TokenError, TokenVerifier,
};

/// Most verified tokens remembered. A full cache is emptied and refilled, which costs one
/// verification per live owner.
pub const VERIFIED_TOKEN_CACHE: usize = 4_096;

/// Shared, refreshable set of trusted coordinator keys.
#[derive(Debug, Default)]
pub struct Verifier {
    keys: RwLock<TokenVerifier>,
    verified: Mutex<Cache>,
    principals: RwLock<Vec<PrincipalRule>>,
}

/// Which principals a resource accepts tokens of, for locks under a prefix: a token is then
/// refused (even with a valid signature and the newest epoch) unless the principal that
/// acquired it matches one of the rules whose prefix covers the lock. Locks no rule covers
/// accept any principal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrincipalRule {
    /// Lock-name prefix (empty: every lock).
    pub lock_prefix: String,
    /// A principal name, or a prefix of one followed by `*`.
    pub principal: String,
}

impl PrincipalRule {
    /// Parses `LOCK_PREFIX=PRINCIPAL` (`*` alone as the prefix: every lock; a trailing `*` on
    /// the principal: any principal starting so), as `--require-principal` takes it.
    pub fn parse(text: &str) -> Result<Self, InvalidInput> {
        let (prefix, principal) = text
            .split_once('=')
            .ok_or_else(|| InvalidInput(format!("{text:?}: expected LOCK_PREFIX=PRINCIPAL")))?;
        let lock_prefix = if prefix == "*" { "" } else { prefix };
        if !lock_prefix.is_empty() {
            LockName::new(lock_prefix)?;
        }
        let name = principal.strip_suffix('*').unwrap_or(principal);
        if !(name.is_empty() && principal == "*") {
            Principal::new(name)?;
        }
        Ok(Self {
            lock_prefix: lock_prefix.to_owned(),
            principal: principal.to_owned(),
        })
    }

    fn covers(&self, lock: &LockName) -> bool {
        lock.as_str().starts_with(&self.lock_prefix)
    }

    fn admits(&self, principal: &Principal) -> bool {
        match self.principal.strip_suffix('*') {
            Some(prefix) => principal.as_str().starts_with(prefix),
            None => principal.as_str() == self.principal,
        }
    }
}

/// Verified tokens, valid for one set of trusted keys (one generation).
#[derive(Debug, Default)]
struct Cache {
    generation: u64,
    tokens: HashMap<String, TokenClaims>,
}

impl Verifier {
    /// A verifier trusting exactly the keys of `verifier`.
    pub fn new(verifier: TokenVerifier) -> Self {
        Self {
            keys: RwLock::new(verifier),
            verified: Mutex::default(),
            principals: RwLock::default(),
        }
    }

    /// Sets the principal rules (see [`PrincipalRule`]); empty: any principal.
    pub fn require_principals(&self, rules: Vec<PrincipalRule>) {
        *self.principals.write().expect("not poisoned") = rules;
    }

    /// Verifies `token` for `lock` (P4): signature by a trusted key, then the lock.
    pub fn verify(&self, token: &str, lock: &LockName) -> Result<TokenClaims, TokenError> {
        let (cached, generation) = {
            let cache = self.verified.lock().expect("not poisoned");
            (cache.tokens.get(token).cloned(), cache.generation)
        };
        let claims = match cached {
            Some(claims) => claims,
            None => {
                let claims = self
                    .keys
                    .read()
                    .expect("not poisoned")
                    .verify(token, None)?;
                self.remember(token, &claims, generation);
                claims
            }
        };
        if claims.lock != *lock {
            return Err(TokenError::WrongLock {
                expected: lock.clone(),
                actual: claims.lock,
            });
        }
        let rules = self.principals.read().expect("not poisoned");
        let mut covering = rules.iter().filter(|rule| rule.covers(lock)).peekable();
        if covering.peek().is_some() && !covering.any(|rule| rule.admits(&claims.principal)) {
            return Err(TokenError::WrongPrincipal {
                lock: lock.clone(),
                principal: claims.principal,
            });
        }
        drop(rules);
        Ok(claims)
    }

    /// Verifies a coordinator's floor statement for `lock` with the trusted keys.
    pub fn verify_floor(
        &self,
        statement: &str,
        lock: &LockName,
    ) -> Result<palisade_core::FloorClaims, TokenError> {
        self.keys
            .read()
            .expect("not poisoned")
            .verify_floor(statement, lock)
    }

    /// True once at least one key is trusted.
    pub fn has_any_key(&self) -> bool {
        !self.keys.read().expect("not poisoned").is_empty()
    }

    /// True when `key_id` is trusted.
    pub fn knows(&self, key_id: KeyId) -> bool {
        self.keys.read().expect("not poisoned").knows(key_id)
    }

    /// Replaces the trusted keys (and forgets every verified token, including any whose
    /// verification is still running: see [`Self::remember`]).
    pub fn replace(&self, verifier: TokenVerifier) {
        let mut keys = self.keys.write().expect("not poisoned");
        *keys = verifier;
        let mut cache = self.verified.lock().expect("not poisoned");
        cache.generation += 1;
        cache.tokens.clear();
    }

    /// Caches `claims`, verified under the keys of `generation`, unless the keys have changed
    /// since (a token of a removed key must not outlive the removal in the cache).
    fn remember(&self, token: &str, claims: &TokenClaims, generation: u64) {
        let mut cache = self.verified.lock().expect("not poisoned");
        if cache.generation != generation {
            return;
        }
        if cache.tokens.len() >= VERIFIED_TOKEN_CACHE {
            cache.tokens.clear();
        }
        cache.tokens.insert(token.to_owned(), claims.clone());
    }
}

#[cfg(test)]
mod tests {
    use palisade_core::{Epoch, HolderId, TokenSigner};

    use super::*;

    #[test]
    fn p4_a_valid_token_of_the_wrong_principal_is_refused_where_a_rule_covers_the_lock() {
        let signer = TokenSigner::from_secret_bytes(&[1; 32]);
        let holder = HolderId::new("h").unwrap();
        let verifier = Verifier::new(TokenVerifier::new([signer.verifying_key()]));
        verifier.require_principals(vec![
            PrincipalRule::parse("billing/=billing").unwrap(),
            PrincipalRule::parse("billing/=ops-*").unwrap(),
        ]);
        let billing = LockName::new("billing/7").unwrap();
        let other = LockName::new("reports/7").unwrap();
        let token = |lock: &LockName, principal: &str| {
            signer.sign(
                lock,
                Epoch(9),
                &holder,
                &Principal::new(principal).unwrap(),
                0,
            )
        };
        assert!(verifier
            .verify(&token(&billing, "billing"), &billing)
            .is_ok());
        assert!(verifier
            .verify(&token(&billing, "ops-oncall"), &billing)
            .is_ok());
        assert!(matches!(
            verifier.verify(&token(&billing, "orders"), &billing),
            Err(TokenError::WrongPrincipal { .. })
        ));
        // A cached token is checked again (the rules may change while it is cached).
        assert!(verifier.verify(&token(&other, "orders"), &other).is_ok());
        assert!(PrincipalRule::parse("no-equals").is_err());
        assert!(PrincipalRule::parse("a=bad principal").is_err());
        assert!(PrincipalRule::parse("*=*").is_ok());
    }

    #[test]
    fn p4_a_cached_token_is_still_checked_for_its_lock_and_forgotten_with_its_key() {
        let signer = TokenSigner::from_secret_bytes(&[1; 32]);
        let lock = LockName::new("a").unwrap();
        let other = LockName::new("b").unwrap();
        let holder = HolderId::new("h").unwrap();
        let token = signer.sign(&lock, Epoch(3), &holder, &Principal::anonymous(), 0);
        let verifier = Verifier::new(TokenVerifier::new([signer.verifying_key()]));
        assert_eq!(verifier.verify(&token, &lock).unwrap().epoch, Epoch(3));
        assert!(matches!(
            verifier.verify(&token, &other),
            Err(TokenError::WrongLock { .. })
        ));
        verifier.replace(TokenVerifier::default());
        assert!(matches!(
            verifier.verify(&token, &lock),
            Err(TokenError::UnknownKey(_))
        ));
    }

    #[test]
    fn p4_a_verification_that_raced_with_a_key_removal_is_not_cached() {
        // The interleaving: a verification starts under key K, the operator removes K (the
        // cache is emptied), then the verification stores its result. Before, the result was
        // cached and the token of the removed key kept being accepted.
        let signer = TokenSigner::from_secret_bytes(&[1; 32]);
        let lock = LockName::new("a").unwrap();
        let holder = HolderId::new("h").unwrap();
        let token = signer.sign(&lock, Epoch(3), &holder, &Principal::anonymous(), 0);
        let old_keys = TokenVerifier::new([signer.verifying_key()]);
        let verifier = Verifier::new(TokenVerifier::new([signer.verifying_key()]));
        let started_in = verifier.verified.lock().unwrap().generation;
        let claims = old_keys.verify(&token, None).unwrap();
        verifier.replace(TokenVerifier::default());
        verifier.remember(&token, &claims, started_in);
        assert!(matches!(
            verifier.verify(&token, &lock),
            Err(TokenError::UnknownKey(_))
        ));
    }
}
