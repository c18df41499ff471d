"""Floor statements: the coordinator's signed word that every owner of a lock below an epoch is
superseded (``GET /v1/locks/NAME/floor``), verified as the Rust ``KeyRing`` verifies them.

A floor only rises: recorded in a database, a forged one (2^63-1 from a man in the middle)
would refuse the lock's legitimate owner for good. So a floor is used only once its statement's
Ed25519 signature checks against a key the client trusts, for the lock it asked about, and
says the floor the answer says.

Statement: ``pf1.`` + base64url(0xf1, key id (8), floor (u64 BE), issued at ms (u64 BE),
lock length (u16 BE), lock (UTF-8), signature (64)); the signature covers everything before
it. A key id is the first 8 bytes of the SHA-256 of the 32-byte public key.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from dataclasses import dataclass
from typing import Dict, Iterable

PREFIX = "pf1."
VERSION = 0xF1
SIGNATURE_BYTES = 64
#: Longest statement text accepted (the coordinator's token limit).
MAX_TEXT = 1024


class FloorError(ValueError):
    """A floor statement that does not verify: not used, nothing recorded."""


@dataclass(frozen=True)
class FloorClaims:
    """What a verified statement says."""

    key_id: str
    lock: str
    floor: int
    issued_at_ms: int


def _unbase64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError) as error:
        raise FloorError(f"not base64url: {error}") from None


def key_id(public_key: bytes) -> str:
    """The id of a 32-byte Ed25519 public key, as 16 hex digits."""
    return hashlib.sha256(public_key).digest()[:8].hex()


def parse_keys(answer: dict) -> Dict[str, bytes]:
    """The public keys of a ``GET /v1/keys`` answer (or a list of base64url keys), by id."""
    encoded: Iterable[str] = answer["keys"] if isinstance(answer, dict) else answer
    keys = {}
    for item in encoded:
        text = item["public_key"] if isinstance(item, dict) else item
        raw = _unbase64(text.strip())
        if len(raw) != 32:
            raise FloorError("a public key is not 32 bytes")
        keys[key_id(raw)] = raw
    if not keys:
        raise FloorError("no keys")
    return keys


def statement_key_id(text: str) -> str:
    """The id of the key a statement names (before anything of it is verified)."""
    raw = _unbase64(text[len(PREFIX):]) if text.startswith(PREFIX) else b""
    if len(raw) < 9:
        raise FloorError("not a floor statement")
    return raw[1:9].hex()


def verify(text: str, lock: str, keys: Dict[str, bytes]) -> FloorClaims:
    """The claims of ``text`` once its signature checks with one of ``keys`` and it names
    ``lock``; raises ``FloorError`` otherwise."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if len(text) > MAX_TEXT or not text.startswith(PREFIX):
        raise FloorError("not a floor statement")
    raw = _unbase64(text[len(PREFIX):])
    if len(raw) <= SIGNATURE_BYTES + 27:
        raise FloorError("the statement is truncated")
    payload, signature = raw[:-SIGNATURE_BYTES], raw[-SIGNATURE_BYTES:]
    signer = payload[1:9].hex()
    if signer not in keys:
        raise FloorError(f"signed by key {signer}, which is not trusted")
    try:
        Ed25519PublicKey.from_public_bytes(keys[signer]).verify(signature, payload)
    except InvalidSignature:
        raise FloorError("the signature does not verify") from None
    if payload[0] != VERSION:
        raise FloorError("not a floor statement")
    floor, issued_at_ms, lock_len = struct.unpack(">QQH", payload[9:27])
    if len(payload) != 27 + lock_len:
        raise FloorError("the statement's lock does not fit it")
    named = payload[27:].decode("utf-8", errors="strict")
    if named != lock:
        raise FloorError(f"the statement is for lock {named!r}, not {lock!r}")
    return FloorClaims(key_id=signer, lock=named, floor=floor, issued_at_ms=issued_at_ms)
