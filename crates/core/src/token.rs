//! Ownership tokens: "holder H owns lock L at epoch E", signed by the coordinator with
//! Ed25519 so that resources verify them offline and no client can forge an epoch (P4).
//!
//! Text form: `pt1.` followed by the base64url (no padding) of `payload ‖ signature`, where the
//! 64-byte signature covers the payload bytes exactly as sent (no re-encoding before verifying):
//!
//! ```text
//! payload = version:u8 (=2) ‖ key_id:[u8;8] ‖ epoch:u64 ‖ issued_at_ms:u64
//!           ‖ lock_len:u16 ‖ lock ‖ holder_len:u8 ‖ holder
//!           ‖ principal_len:u8 ‖ principal                         (integers big-endian)
//! ```
//!
//! The principal is the authenticated identity that acquired the lease, so a resource can
//! check offline *who* writes, not only *when*. The lease id is deliberately not in the token:
//! tokens are shown to resources, and a lease id is the capability to renew or release.
//! A token of the longest lock, holder and principal is under 900 characters, so it fits an
//! HTTP header.

use std::collections::HashMap;
use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use sha2::{Digest as _, Sha256};

use crate::limits::MAX_TOKEN_TEXT_BYTES;
use crate::types::{Epoch, HolderId, LockName, Principal};

const TEXT_PREFIX: &str = "pt1.";
const PAYLOAD_VERSION: u8 = 2;
/// Text prefix of a floor statement ([`FloorClaims`]).
const FLOOR_PREFIX: &str = "pf1.";
/// First byte of a floor statement's payload: never a token's version, so no floor statement
/// verifies as a token (and no token as a floor statement), whatever its prefix says.
const FLOOR_PAYLOAD_VERSION: u8 = 0xf1;
const SIGNATURE_BYTES: usize = 64;

/// The id of a signing key: the first 8 bytes of the SHA-256 of its public key, shown as 16
/// hex digits. Lets a verifier pick the right key among several (rotation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub [u8; 8]);

impl KeyId {
    /// The id of `key`.
    pub fn of(key: &VerifyingKey) -> Self {
        let digest = Sha256::digest(key.as_bytes());
        let mut id = [0; 8];
        id.copy_from_slice(&digest[..8]);
        Self(id)
    }
}

impl std::str::FromStr for KeyId {
    type Err = TokenError;

    /// Parses the 16 hex digits of [`KeyId`]'s display form.
    fn from_str(text: &str) -> Result<Self, TokenError> {
        let text = text.trim();
        if text.len() != 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(TokenError::Malformed("a key id is 16 hex digits"));
        }
        let mut id = [0; 8];
        for (i, byte) in id.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
                .map_err(|_| TokenError::Malformed("a key id is 16 hex digits"))?;
        }
        Ok(Self(id))
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// What a token states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenClaims {
    /// The key that signed it.
    pub key_id: KeyId,
    /// The lock it grants.
    pub lock: LockName,
    /// The ownership epoch.
    pub epoch: Epoch,
    /// The holder it was issued to (the client's label).
    pub holder: HolderId,
    /// The authenticated principal that acquired the lease (`anonymous` on a coordinator
    /// without authentication).
    pub principal: Principal,
    /// Wall-clock issue time, milliseconds since the Unix epoch (informational; resources
    /// fence on the epoch, never on clocks).
    pub issued_at_ms: u64,
}

impl TokenClaims {
    fn encode(&self) -> Vec<u8> {
        let lock = self.lock.as_str().as_bytes();
        let holder = self.holder.as_str().as_bytes();
        let principal = self.principal.as_str().as_bytes();
        let mut out = Vec::with_capacity(29 + lock.len() + holder.len() + principal.len());
        out.push(PAYLOAD_VERSION);
        out.extend_from_slice(&self.key_id.0);
        out.extend_from_slice(&self.epoch.0.to_be_bytes());
        out.extend_from_slice(&self.issued_at_ms.to_be_bytes());
        let lock_len = u16::try_from(lock.len()).expect("lock names are at most 256 bytes");
        out.extend_from_slice(&lock_len.to_be_bytes());
        out.extend_from_slice(lock);
        let holder_len = u8::try_from(holder.len()).expect("holders are at most 128 bytes");
        out.push(holder_len);
        out.extend_from_slice(holder);
        let principal_len =
            u8::try_from(principal.len()).expect("principals are at most 128 bytes");
        out.push(principal_len);
        out.extend_from_slice(principal);
        out
    }

    fn decode(payload: &[u8]) -> Result<Self, TokenError> {
        let mut reader = Reader(payload);
        if reader.take(1)? != [PAYLOAD_VERSION] {
            return Err(TokenError::Malformed("unknown token version"));
        }
        let key_id = KeyId(reader.take(8)?.try_into().expect("8 bytes"));
        let epoch = Epoch(reader.u64()?);
        let issued_at_ms = reader.u64()?;
        let lock_len = u16::from_be_bytes(reader.take(2)?.try_into().expect("2 bytes"));
        let lock = reader.text(lock_len as usize)?;
        let holder_len = reader.take(1)?[0];
        let holder = reader.text(holder_len as usize)?;
        let principal_len = reader.take(1)?[0];
        let principal = reader.text(principal_len as usize)?;
        if !reader.0.is_empty() {
            return Err(TokenError::Malformed("trailing bytes after the claims"));
        }
        Ok(Self {
            key_id,
            lock: LockName::new(lock).map_err(|_| TokenError::Malformed("invalid lock name"))?,
            epoch,
            holder: HolderId::new(holder).map_err(|_| TokenError::Malformed("invalid holder"))?,
            principal: Principal::new(principal)
                .map_err(|_| TokenError::Malformed("invalid principal"))?,
            issued_at_ms,
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], TokenError> {
        if self.0.len() < n {
            return Err(TokenError::Malformed("token is truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u64(&mut self) -> Result<u64, TokenError> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn text(&mut self, n: usize) -> Result<String, TokenError> {
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| TokenError::Malformed("not UTF-8"))
    }
}

/// Why a token was not accepted. Every variant is a rejection (P4); none is an I/O failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// Not a token at all: wrong prefix, bad base64, truncated, oversized, bad fields.
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    /// Signed by a key this verifier does not trust (or does not know yet).
    #[error("token signed by unknown key {0}")]
    UnknownKey(KeyId),
    /// The signature does not match the claims: the token was altered or forged.
    #[error("token signature is invalid")]
    BadSignature,
    /// A valid token, but acquired by a principal the resource does not accept for this lock
    /// (a service writing where only another may write).
    #[error("token of principal {principal} is not accepted for lock {lock}")]
    WrongPrincipal {
        /// The lock.
        lock: LockName,
        /// The principal in the token.
        principal: Principal,
    },
    /// A valid token, but for another lock than the one it was presented for.
    #[error("token is for lock {actual}, not {expected}")]
    WrongLock {
        /// The lock the resource guards.
        expected: LockName,
        /// The lock in the token.
        actual: LockName,
    },
}

/// Signs tokens with the coordinator's Ed25519 key.
pub struct TokenSigner {
    key: SigningKey,
    key_id: KeyId,
}

impl fmt::Debug for TokenSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the secret half.
        f.debug_struct("TokenSigner")
            .field("key_id", &self.key_id)
            .finish()
    }
}

impl TokenSigner {
    /// A signer for the 32-byte Ed25519 secret key `secret`.
    pub fn from_secret_bytes(secret: &[u8; 32]) -> Self {
        let key = SigningKey::from_bytes(secret);
        let key_id = KeyId::of(&key.verifying_key());
        Self { key, key_id }
    }

    /// The id of this signer's key.
    pub fn key_id(&self) -> KeyId {
        self.key_id
    }

    /// The public half, for verifiers.
    pub fn verifying_key(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    /// Signs the statement that `holder`, authenticated as `principal`, owns `lock` at `epoch`,
    /// and returns the token's text form.
    pub fn sign(
        &self,
        lock: &LockName,
        epoch: Epoch,
        holder: &HolderId,
        principal: &Principal,
        issued_at_ms: u64,
    ) -> String {
        let claims = TokenClaims {
            key_id: self.key_id,
            lock: lock.clone(),
            epoch,
            holder: holder.clone(),
            principal: principal.clone(),
            issued_at_ms,
        };
        let mut bytes = claims.encode();
        let signature = self.key.sign(&bytes);
        bytes.extend_from_slice(&signature.to_bytes());
        format!("{TEXT_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes))
    }
}

impl TokenSigner {
    /// Signs a **floor statement** for `lock`: "every owner of `lock` whose epoch is below
    /// `floor` has been superseded (or its lease has ended)", as of `issued_at_ms`. A
    /// resource that cannot trust its own memory (its volume may have been put back) refuses
    /// epochs below it. It grants nothing: it is not a token and never verifies as one.
    ///
    /// ```text
    /// pf1. base64url( 0xf1 ‖ key_id:[u8;8] ‖ floor:u64 ‖ issued_at_ms:u64
    ///                 ‖ lock_len:u16 ‖ lock ‖ signature:[u8;64] )
    /// ```
    pub fn sign_floor(&self, lock: &LockName, floor: Epoch, issued_at_ms: u64) -> String {
        let mut bytes = vec![FLOOR_PAYLOAD_VERSION];
        bytes.extend_from_slice(&self.key_id.0);
        bytes.extend_from_slice(&floor.0.to_be_bytes());
        bytes.extend_from_slice(&issued_at_ms.to_be_bytes());
        let lock_bytes = lock.as_str().as_bytes();
        let lock_len = u16::try_from(lock_bytes.len()).expect("lock names are short");
        bytes.extend_from_slice(&lock_len.to_be_bytes());
        bytes.extend_from_slice(lock_bytes);
        let signature = self.key.sign(&bytes);
        bytes.extend_from_slice(&signature.to_bytes());
        format!("{FLOOR_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes))
    }
}

/// What a floor statement says ([`TokenSigner::sign_floor`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FloorClaims {
    /// The key that signed it.
    pub key_id: KeyId,
    /// The lock.
    pub lock: LockName,
    /// Every owner below this epoch is superseded.
    pub floor: Epoch,
    /// When the coordinator made it (ms since the Unix epoch).
    pub issued_at_ms: u64,
}

/// Verifies tokens against a set of trusted public keys (several, for rotation).
#[derive(Debug, Clone, Default)]
pub struct TokenVerifier {
    keys: HashMap<KeyId, VerifyingKey>,
}

impl TokenVerifier {
    /// A verifier that trusts `keys`.
    pub fn new(keys: impl IntoIterator<Item = VerifyingKey>) -> Self {
        let mut verifier = Self::default();
        keys.into_iter().for_each(|key| verifier.trust(key));
        verifier
    }

    /// Adds a trusted key.
    pub fn trust(&mut self, key: VerifyingKey) {
        self.keys.insert(KeyId::of(&key), key);
    }

    /// Stops trusting a key (revocation); true when it was trusted.
    pub fn distrust(&mut self, key_id: KeyId) -> bool {
        self.keys.remove(&key_id).is_some()
    }

    /// The trusted key ids, sorted.
    pub fn key_ids(&self) -> Vec<KeyId> {
        let mut ids: Vec<KeyId> = self.keys.keys().copied().collect();
        ids.sort_by_key(|id| id.to_string());
        ids
    }

    /// True when no key is trusted.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The payload of `text` (with `prefix`) and the key that signed it, once its signature by
    /// a trusted key is checked: nothing of a payload is read before that.
    fn signed_payload(&self, text: &str, prefix: &str) -> Result<(Vec<u8>, KeyId), TokenError> {
        let (payload, signature) = split_signed(text, prefix)?;
        let key_id = peek_key_id(&payload)?;
        let key = self
            .keys
            .get(&key_id)
            .ok_or(TokenError::UnknownKey(key_id))?;
        key.verify_strict(&payload, &signature)
            .map_err(|_| TokenError::BadSignature)?;
        Ok((payload, key_id))
    }

    /// True when the verifier knows this key id (a resource refreshes its keys otherwise).
    pub fn knows(&self, key_id: KeyId) -> bool {
        self.keys.contains_key(&key_id)
    }

    /// Verifies the signature of `text` and, when `expected_lock` is given, that the token is
    /// for that lock. The signature is checked before any claim is trusted.
    pub fn verify(
        &self,
        text: &str,
        expected_lock: Option<&LockName>,
    ) -> Result<TokenClaims, TokenError> {
        let (payload, _) = self.signed_payload(text, TEXT_PREFIX)?;
        let claims = TokenClaims::decode(&payload)?;
        match expected_lock {
            Some(expected) if *expected != claims.lock => Err(TokenError::WrongLock {
                expected: expected.clone(),
                actual: claims.lock,
            }),
            _ => Ok(claims),
        }
    }
}

impl TokenVerifier {
    /// Verifies a floor statement's signature and that it is about `expected_lock`.
    pub fn verify_floor(
        &self,
        text: &str,
        expected_lock: &LockName,
    ) -> Result<FloorClaims, TokenError> {
        let (payload, key_id) = self.signed_payload(text, FLOOR_PREFIX)?;
        let mut reader = Reader(&payload);
        if reader.take(1)? != [FLOOR_PAYLOAD_VERSION] {
            return Err(TokenError::Malformed("not a floor statement"));
        }
        reader.take(8)?;
        let floor = Epoch(reader.u64()?);
        let issued_at_ms = reader.u64()?;
        let lock_len = u16::from_be_bytes(reader.take(2)?.try_into().expect("2 bytes"));
        let lock = reader.text(lock_len as usize)?;
        if !reader.0.is_empty() {
            return Err(TokenError::Malformed("trailing bytes after the claims"));
        }
        let lock = LockName::new(lock).map_err(|_| TokenError::Malformed("invalid lock name"))?;
        if lock != *expected_lock {
            return Err(TokenError::WrongLock {
                expected: expected_lock.clone(),
                actual: lock,
            });
        }
        Ok(FloorClaims {
            key_id,
            lock,
            floor,
            issued_at_ms,
        })
    }
}

/// The key id a floor statement names, *without* verifying it: only to fetch that key.
pub fn floor_key_id(text: &str) -> Result<KeyId, TokenError> {
    let (payload, _) = split_signed(text, FLOOR_PREFIX)?;
    peek_key_id(&payload)
}

/// Reads a token's claims *without* verifying it: for display and for choosing which key to
/// fetch. Never base a decision on the result.
pub fn decode_unverified(text: &str) -> Result<TokenClaims, TokenError> {
    let (payload, _) = split_token(text)?;
    TokenClaims::decode(&payload)
}

fn split_token(text: &str) -> Result<(Vec<u8>, Signature), TokenError> {
    split_signed(text, TEXT_PREFIX)
}

fn split_signed(text: &str, prefix: &str) -> Result<(Vec<u8>, Signature), TokenError> {
    if text.len() > MAX_TOKEN_TEXT_BYTES {
        return Err(TokenError::Malformed("token is longer than 1024 bytes"));
    }
    let body = text.strip_prefix(prefix).ok_or(TokenError::Malformed(
        "token does not start with its prefix",
    ))?;
    let mut bytes = URL_SAFE_NO_PAD
        .decode(body)
        .map_err(|_| TokenError::Malformed("token is not base64url"))?;
    if bytes.len() <= SIGNATURE_BYTES {
        return Err(TokenError::Malformed("token is truncated"));
    }
    let signature_bytes = bytes.split_off(bytes.len() - SIGNATURE_BYTES);
    let signature = Signature::from_slice(&signature_bytes)
        .map_err(|_| TokenError::Malformed("bad signature encoding"))?;
    Ok((bytes, signature))
}

fn peek_key_id(payload: &[u8]) -> Result<KeyId, TokenError> {
    let id = payload
        .get(1..9)
        .ok_or(TokenError::Malformed("token is truncated"))?;
    Ok(KeyId(id.try_into().expect("8 bytes")))
}

/// Base64url (no padding) of a public key, the form served at `GET /v1/keys`.
pub fn encode_public_key(key: &VerifyingKey) -> String {
    URL_SAFE_NO_PAD.encode(key.as_bytes())
}

/// Parses a public key from its base64url form.
pub fn decode_public_key(text: &str) -> Result<VerifyingKey, TokenError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(text.trim())
        .map_err(|_| TokenError::Malformed("public key is not base64url"))?;
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|_| TokenError::Malformed("public key is not 32 bytes"))?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| TokenError::Malformed("invalid public key"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{MAX_HOLDER_BYTES, MAX_LOCK_NAME_BYTES, MAX_PRINCIPAL_BYTES};

    fn signer(seed: u8) -> TokenSigner {
        TokenSigner::from_secret_bytes(&[seed; 32])
    }

    fn sample(signer: &TokenSigner) -> String {
        let lock = LockName::new("report/7").unwrap();
        signer.sign(
            &lock,
            Epoch(42),
            &HolderId::new("w1").unwrap(),
            &Principal::new("orders").unwrap(),
            1_700,
        )
    }

    #[test]
    fn p4_a_signed_token_round_trips() {
        let signer = signer(1);
        let verifier = TokenVerifier::new([signer.verifying_key()]);
        let claims = verifier.verify(&sample(&signer), None).unwrap();
        assert_eq!(claims.epoch, Epoch(42));
        assert_eq!(claims.lock.as_str(), "report/7");
        assert_eq!(claims.holder.as_str(), "w1");
        assert_eq!(claims.principal.as_str(), "orders");
        assert_eq!(claims.key_id, signer.key_id());
        assert_eq!(claims.issued_at_ms, 1_700);
    }

    #[test]
    fn p4_an_altered_epoch_is_rejected() {
        let signer = signer(1);
        let verifier = TokenVerifier::new([signer.verifying_key()]);
        let token = sample(&signer);
        let mut bytes = URL_SAFE_NO_PAD.decode(&token[4..]).unwrap();
        bytes[9 + 7] ^= 0x01; // last byte of the epoch
        let altered = format!("pt1.{}", URL_SAFE_NO_PAD.encode(bytes));
        assert_eq!(
            verifier.verify(&altered, None),
            Err(TokenError::BadSignature)
        );
    }

    #[test]
    fn p4_a_token_signed_by_an_unknown_key_is_rejected() {
        let verifier = TokenVerifier::new([signer(1).verifying_key()]);
        let err = verifier.verify(&sample(&signer(2)), None).unwrap_err();
        assert_eq!(err, TokenError::UnknownKey(signer(2).key_id()));
    }

    #[test]
    fn p4_a_forged_key_id_with_a_foreign_signature_is_rejected() {
        // An attacker signs with their own key but claims the trusted key's id.
        let trusted = signer(1);
        let attacker = signer(2);
        let verifier = TokenVerifier::new([trusted.verifying_key()]);
        let claims = TokenClaims {
            key_id: trusted.key_id(),
            lock: LockName::new("report/7").unwrap(),
            epoch: Epoch(u64::MAX),
            holder: HolderId::new("mallory").unwrap(),
            principal: Principal::new("orders").unwrap(),
            issued_at_ms: 0,
        };
        let mut bytes = claims.encode();
        bytes.extend_from_slice(&attacker.key.sign(&bytes).to_bytes());
        let forged = format!("pt1.{}", URL_SAFE_NO_PAD.encode(bytes));
        assert_eq!(
            verifier.verify(&forged, None),
            Err(TokenError::BadSignature)
        );
    }

    #[test]
    fn p4_a_token_for_another_lock_is_rejected() {
        let signer = signer(1);
        let verifier = TokenVerifier::new([signer.verifying_key()]);
        let other = LockName::new("report/8").unwrap();
        let err = verifier.verify(&sample(&signer), Some(&other)).unwrap_err();
        assert!(matches!(err, TokenError::WrongLock { .. }));
    }

    #[test]
    fn p4_a_token_of_the_previous_format_is_refused() {
        // Version 1 carried no principal; a resource must not read one as principal-less.
        let signer = signer(1);
        let mut bytes = URL_SAFE_NO_PAD.decode(&sample(&signer)[4..]).unwrap();
        bytes[0] = 1;
        let payload_len = bytes.len() - SIGNATURE_BYTES;
        let signature = signer.key.sign(&bytes[..payload_len]).to_bytes();
        bytes[payload_len..].copy_from_slice(&signature);
        let old = format!("pt1.{}", URL_SAFE_NO_PAD.encode(bytes));
        let verifier = TokenVerifier::new([signer.verifying_key()]);
        assert!(matches!(
            verifier.verify(&old, None),
            Err(TokenError::Malformed(_))
        ));
    }

    #[test]
    fn p4_a_distrusted_key_is_refused_and_key_ids_round_trip_through_text() {
        let mut verifier =
            TokenVerifier::new([signer(1).verifying_key(), signer(2).verifying_key()]);
        let id = signer(1).key_id();
        assert_eq!(id.to_string().parse::<KeyId>().unwrap(), id);
        assert!("xyz".parse::<KeyId>().is_err());
        assert!(verifier.distrust(id));
        assert_eq!(
            verifier.verify(&sample(&signer(1)), None),
            Err(TokenError::UnknownKey(id))
        );
        assert!(verifier.verify(&sample(&signer(2)), None).is_ok());
    }

    #[test]
    fn rotation_accepts_every_trusted_key() {
        let verifier = TokenVerifier::new([signer(1).verifying_key(), signer(2).verifying_key()]);
        assert!(verifier.verify(&sample(&signer(1)), None).is_ok());
        assert!(verifier.verify(&sample(&signer(2)), None).is_ok());
        assert!(verifier.knows(signer(2).key_id()));
    }

    #[test]
    fn malformed_tokens_are_rejected_without_panicking() {
        let signer = signer(1);
        let verifier = TokenVerifier::new([signer.verifying_key()]);
        let token = sample(&signer);
        let oversized = format!("pt1.{}", "A".repeat(2_000));
        for bad in ["", "pt1.", "pt2.AAAA", "pt1.!!!!", &token[..40], &oversized] {
            assert!(
                matches!(verifier.verify(bad, None), Err(TokenError::Malformed(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_longest_token_fits_a_header() {
        let signer = signer(1);
        let lock = LockName::new("l".repeat(MAX_LOCK_NAME_BYTES)).unwrap();
        let holder = HolderId::new("h".repeat(MAX_HOLDER_BYTES)).unwrap();
        let principal = Principal::new("p".repeat(MAX_PRINCIPAL_BYTES)).unwrap();
        let token = signer.sign(&lock, Epoch(u64::MAX), &holder, &principal, u64::MAX);
        assert!(token.len() < 900, "{} bytes", token.len());
        assert!(token.len() <= MAX_TOKEN_TEXT_BYTES, "{} bytes", token.len());
        let verifier = TokenVerifier::new([signer.verifying_key()]);
        assert_eq!(verifier.verify(&token, Some(&lock)).unwrap().holder, holder);
    }

    #[test]
    fn public_keys_round_trip_through_text() {
        let key = signer(3).verifying_key();
        assert_eq!(decode_public_key(&encode_public_key(&key)).unwrap(), key);
        assert!(decode_public_key("short").is_err());
    }
}

#[cfg(test)]
mod floor_tests {
    use super::*;

    #[test]
    fn p4_a_floor_statement_verifies_for_its_lock_and_never_as_a_token() {
        let signer = TokenSigner::from_secret_bytes(&[7; 32]);
        let verifier = TokenVerifier::new([signer.verifying_key()]);
        let lock = LockName::new("report/7").unwrap();
        let text = signer.sign_floor(&lock, Epoch(42), 1_800_000_000_000);
        let claims = verifier.verify_floor(&text, &lock).unwrap();
        assert_eq!(
            (claims.floor, claims.lock.as_str()),
            (Epoch(42), "report/7")
        );
        // Another lock's statement, an altered one, an unknown key: refused.
        let other = LockName::new("report/8").unwrap();
        assert!(matches!(
            verifier.verify_floor(&text, &other),
            Err(TokenError::WrongLock { .. })
        ));
        let mut altered = text.clone().into_bytes();
        let at = altered.len() / 2;
        altered[at] = if altered[at] == b'A' { b'B' } else { b'A' };
        let altered = String::from_utf8(altered).unwrap();
        assert!(verifier.verify_floor(&altered, &lock).is_err());
        assert!(TokenVerifier::default().verify_floor(&text, &lock).is_err());
        // Never a token, even re-prefixed; and a token is never a floor statement.
        assert!(verifier.verify(&text, Some(&lock)).is_err());
        let swapped = text.replacen("pf1.", "pt1.", 1);
        assert!(verifier.verify(&swapped, Some(&lock)).is_err());
        let token = signer.sign(
            &lock,
            Epoch(42),
            &HolderId::new("h").unwrap(),
            &Principal::anonymous(),
            1,
        );
        assert!(verifier.verify_floor(&token, &lock).is_err());
        let swapped = token.replacen("pt1.", "pf1.", 1);
        assert!(verifier.verify_floor(&swapped, &lock).is_err());
    }
}
