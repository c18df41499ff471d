/**
 * Floor statements: the coordinator's signed word that every owner of a lock below an epoch is
 * superseded (`GET /v1/locks/NAME/floor`), verified as the Rust `KeyRing` verifies them.
 *
 * A floor only rises: recorded in a database, a forged one (2^63-1 from a man in the middle)
 * would refuse the lock's legitimate owner for good. So a floor is used only once its
 * statement's Ed25519 signature checks against a key the client trusts, for the lock it asked
 * about, and says the floor the answer says.
 *
 * Statement: `pf1.` + base64url(0xf1, key id (8), floor (u64 BE), issued at ms (u64 BE), lock
 * length (u16 BE), lock (UTF-8), signature (64)); the signature covers everything before it.
 * A key id is the first 8 bytes of the SHA-256 of the 32-byte public key.
 */

import { createHash, createPublicKey, verify } from "node:crypto";

const PREFIX = "pf1.";
const VERSION = 0xf1;
const SIGNATURE_BYTES = 64;
/** Bytes before the lock: version, key id, floor, issued at, lock length. */
const FIXED_BYTES = 27;
/** Longest statement text accepted (the coordinator's token limit). */
const MAX_TEXT = 1024;

/** A floor statement that does not verify: not used, nothing recorded. */
export class FloorError extends Error {}

/** What a verified statement says. */
export interface FloorClaims {
  keyId: string;
  lock: string;
  /** Decimal string (u64). */
  floor: string;
  issuedAtMs: string;
}

/** The id of a 32-byte Ed25519 public key, as 16 hex digits. */
export function keyId(publicKey: Buffer): string {
  return createHash("sha256").update(publicKey).digest().subarray(0, 8).toString("hex");
}

/** Base64url public keys (as `GET /v1/keys` and the `Keys` call serve them), by id. */
export function parseKeys(encoded: string[]): Map<string, Buffer> {
  const keys = new Map<string, Buffer>();
  for (const text of encoded) {
    const raw = Buffer.from(text.trim(), "base64url");
    if (raw.length !== 32) throw new FloorError("a public key is not 32 bytes");
    keys.set(keyId(raw), raw);
  }
  if (keys.size === 0) throw new FloorError("no keys");
  return keys;
}

/** The id of the key a statement names (before anything of it is verified). */
export function statementKeyId(text: string): string {
  const raw = text.startsWith(PREFIX) ? Buffer.from(text.slice(PREFIX.length), "base64url") : Buffer.alloc(0);
  if (raw.length < 9) throw new FloorError("not a floor statement");
  return raw.subarray(1, 9).toString("hex");
}

/** The claims of `text` once its signature checks with one of `keys` and it names `lock`. */
export function verifyFloorStatement(text: string, lock: string, keys: Map<string, Buffer>): FloorClaims {
  if (text.length > MAX_TEXT || !text.startsWith(PREFIX)) throw new FloorError("not a floor statement");
  const raw = Buffer.from(text.slice(PREFIX.length), "base64url");
  if (raw.length <= SIGNATURE_BYTES + FIXED_BYTES) throw new FloorError("the statement is truncated");
  const payload = raw.subarray(0, raw.length - SIGNATURE_BYTES);
  const signature = raw.subarray(raw.length - SIGNATURE_BYTES);
  const signer = payload.subarray(1, 9).toString("hex");
  const publicKey = keys.get(signer);
  if (!publicKey) throw new FloorError(`signed by key ${signer}, which is not trusted`);
  const key = createPublicKey({
    key: { kty: "OKP", crv: "Ed25519", x: publicKey.toString("base64url") },
    format: "jwk",
  });
  if (!verify(null, payload, key, signature)) throw new FloorError("the signature does not verify");
  if (payload[0] !== VERSION) throw new FloorError("not a floor statement");
  const floor = payload.readBigUInt64BE(9);
  const issuedAtMs = payload.readBigUInt64BE(17);
  const lockLength = payload.readUInt16BE(25);
  if (payload.length !== FIXED_BYTES + lockLength) throw new FloorError("the statement's lock does not fit it");
  const named = new TextDecoder("utf-8", { fatal: true }).decode(payload.subarray(FIXED_BYTES));
  if (named !== lock) throw new FloorError(`the statement is for lock ${JSON.stringify(named)}, not ${JSON.stringify(lock)}`);
  return { keyId: signer, lock: named, floor: floor.toString(), issuedAtMs: issuedAtMs.toString() };
}
