/**
 * A TypeScript client for the Palisade coordinator.
 *
 * ```ts
 * const client = new Client("127.0.0.1:7420");
 * await using lease = await client.lock("report/7", { ttl: "10s" });
 * await write({ fence: lease.epoch, token: lease.token, signal: lease.signal });
 * ```
 *
 * A lease is permission, not protection: a paused process can outlive its lease. Send
 * `lease.token` (or `lease.epoch`) with every write and let the resource refuse obsolete
 * owners. `lease.signal` aborts when the keepalive can no longer vouch for the lease.
 * Epochs are decimal strings (they exceed 2^53 after a restore; `BigInt(lease.epoch)` to
 * compare).
 */

import { existsSync, readFileSync } from "node:fs";
import { hostname, userInfo } from "node:os";
import { randomBytes } from "node:crypto";
import { get as httpGetPlain } from "node:http";
import { get as httpsGet } from "node:https";
import { fileURLToPath } from "node:url";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

import { FloorError, parseKeys, statementKeyId, verifyFloorStatement } from "./floors.js";

/** The coordinator's default address. */
export const DEFAULT_ENDPOINT = "127.0.0.1:7420";
/** The trailing metadata in which a member that does not lead names the leader. */
export const LEADER_METADATA = "palisade-leader";
/** Redirects to a named leader followed per call. */
export const MAX_REDIRECTS = 3;
/** Renewals per TTL: the keepalive renews every third of it. */
const RENEWALS_PER_TTL = 3;
/** After a failed renewal, the next comes this many times sooner. */
const RETRY_SPEEDUP = 4;

import {
  InvalidArgument,
  LeaseLost,
  LockHeld,
  PalisadeError,
  PermissionDenied,
  RefusedByPolicy,
  Unauthenticated,
  Unavailable,
} from "./errors.js";

export {
  InvalidArgument,
  LeaseLost,
  LockHeld,
  PalisadeError,
  PermissionDenied,
  RefusedByPolicy,
  Unauthenticated,
  Unavailable,
};

const ERRORS: Record<number, new (message: string, code: string) => PalisadeError> = {
  [grpc.status.INVALID_ARGUMENT]: InvalidArgument,
  [grpc.status.OUT_OF_RANGE]: InvalidArgument,
  [grpc.status.ALREADY_EXISTS]: LockHeld,
  [grpc.status.RESOURCE_EXHAUSTED]: LockHeld,
  [grpc.status.FAILED_PRECONDITION]: RefusedByPolicy,
  [grpc.status.NOT_FOUND]: LeaseLost,
  [grpc.status.UNAUTHENTICATED]: Unauthenticated,
  [grpc.status.PERMISSION_DENIED]: PermissionDenied,
  [grpc.status.UNAVAILABLE]: Unavailable,
  [grpc.status.DEADLINE_EXCEEDED]: Unavailable,
};

/** A duration with its unit: text such as `"500ms"`, `"10s"`, `"1m"`, `"1h"`, or
 * `{ seconds }` / `{ milliseconds }`. A bare number is refused: it meant milliseconds here and
 * means seconds in the Python client, and a lock held 10 ms instead of 10 s is a correctness
 * hazard. */
export type Duration = string | { seconds: number } | { milliseconds: number };

/** Milliseconds of a {@link Duration}. */
export function millis(duration: Duration): number {
  if (typeof duration === "number") {
    throw new InvalidArgument(
      `duration ${duration} has no unit: write "${duration}s" or "${duration}ms" (a bare number meant milliseconds in earlier versions)`,
    );
  }
  if (typeof duration === "object" && duration !== null) {
    const [value, scale] =
      "seconds" in duration ? [duration.seconds, 1_000] : [(duration as { milliseconds: number }).milliseconds, 1];
    if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
      throw new InvalidArgument(`duration ${JSON.stringify(duration)}: a finite number, not negative`);
    }
    return Math.round(value * scale);
  }
  if (typeof duration !== "string") {
    throw new InvalidArgument(`duration ${String(duration)}: use e.g. "500ms", "10s", "1m"`);
  }
  const match = /^(\d+(?:\.\d+)?)(ms|s|m|h)$/.exec(duration.trim());
  if (!match) {
    throw new InvalidArgument(`duration ${JSON.stringify(duration)}: use e.g. 500ms, 10s, 1m`);
  }
  const scale = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000 }[match[2] as "ms" | "s" | "m" | "h"];
  return Math.round(Number(match[1]) * scale);
}

/** How to acquire. */
export interface LockOptions {
  /** Lease TTL (default 10 s; 10 ms to 1 h). */
  ttl?: Duration;
  /** How long to wait for a held lock (default 0; at most 5 m). */
  wait?: Duration;
  /** Holder id recorded in the lease (default `user@host:pid`). */
  holder?: string;
  /** `critical` or `efficiency` (default: what the coordinator's lock policy says). */
  class?: "critical" | "efficiency";
  /** Id of this acquire: a retry with the same id and holder returns the same live lease. */
  requestId?: string;
}

/** Where and how to connect. */
export interface ClientOptions {
  /** Bearer secret (default: `PALISADE_AUTH_TOKEN`, else the older `PALISADE_TOKEN`). */
  token?: string;
  /** PEM of the CA that signed the coordinator's certificate, for `https://` endpoints. */
  ca?: Buffer;
  /** Deadline of each call other than a waiting acquire (default 10 s). */
  timeoutMs?: number;
  /** The coordinator's public keys (base64url, as `GET /v1/keys` serves them) that floor
   * statements must be signed with; without them the keys are asked of the coordinator over
   * the gRPC channel ({@link Client.keys}). */
  trustedKeys?: string[];
}

/** One lock as the coordinator describes it. */
export interface LockInfo {
  lock: string;
  held: boolean;
  /** Decimal string. */
  epoch: string;
  holder: string;
  principal: string;
  leaseId: string;
  ttlMs: number;
  remainingMs: number;
  class: "critical" | "efficiency";
  waiters: number;
  /** When the lease was granted, by the granting coordinator's clock; null when free (or
   * granted before grant times were recorded). */
  heldSince: Date | null;
}

interface Wire {
  [key: string]: unknown;
}

type Stub = grpc.Client & Record<string, Function>;

/** The proto file: beside `dist/` in the package (`../../proto` from a test build). */
const PROTO = ["../proto/palisade.proto", "../../proto/palisade.proto"]
  .map((path) => fileURLToPath(new URL(path, import.meta.url)))
  .find((path) => existsSync(path)) ?? "palisade.proto not found beside the client";
let service: grpc.ServiceClientConstructor | undefined;

function coordinatorService(): grpc.ServiceClientConstructor {
  if (!service) {
    const definition = protoLoader.loadSync(PROTO, {
      longs: String,
      enums: String,
      defaults: true,
      keepCase: true,
    });
    const loaded = grpc.loadPackageDefinition(definition) as any;
    service = loaded.palisade.v1.Coordinator as grpc.ServiceClientConstructor;
  }
  return service;
}

/** `HOST:PORT` and whether to use TLS, from `HOST:PORT` or `http(s)://HOST:PORT`. */
function target(endpoint: string): { address: string; tls: boolean } {
  const trimmed = endpoint.trim().replace(/\/+$/, "");
  if (trimmed.startsWith("https://")) return { address: trimmed.slice(8), tls: true };
  if (trimmed.startsWith("http://")) return { address: trimmed.slice(7), tls: false };
  if (trimmed.includes("://")) {
    throw new InvalidArgument(`${JSON.stringify(endpoint)} is not a coordinator address`);
  }
  return { address: trimmed, tls: false };
}

/** `user@host:pid` of this process. */
export function defaultHolder(): string {
  let user = "user";
  try {
    user = userInfo().username;
  } catch {
    // no user name is not worth failing for
  }
  return `${user}@${hostname()}:${process.pid}`;
}

function lockClass(wire: unknown): "critical" | "efficiency" {
  return wire === "LOCK_CLASS_EFFICIENCY" ? "efficiency" : "critical";
}

/** A connection to a coordinator, or to the members of a cluster (calls follow the leader). */
export class Client {
  private endpoints: string[];
  private current = 0;
  private stub: Stub;
  private readonly token?: string;
  private readonly ca?: Buffer;
  private readonly trustedKeys?: Map<string, Buffer>;
  private fetchedKeys?: Map<string, Buffer>;
  readonly timeoutMs: number;

  constructor(endpoints: string | string[] = DEFAULT_ENDPOINT, options: ClientOptions = {}) {
    this.endpoints = (Array.isArray(endpoints) ? endpoints : endpoints.split(","))
      .map((e) => e.trim())
      .filter((e) => e.length > 0);
    if (this.endpoints.length === 0) throw new InvalidArgument("no coordinator endpoint");
    this.token =
      options.token ?? (process.env.PALISADE_AUTH_TOKEN ?? process.env.PALISADE_TOKEN)?.trim() ?? undefined;
    this.ca = options.ca;
    this.trustedKeys = options.trustedKeys ? parseKeys(options.trustedKeys) : undefined;
    this.timeoutMs = options.timeoutMs ?? 10_000;
    this.stub = this.connect(this.endpoints[0]);
  }

  /** The endpoint calls go to now (the leader, once one was named). */
  get endpoint(): string {
    return this.endpoints[this.current];
  }

  private connect(endpoint: string): Stub {
    const { address, tls } = target(endpoint);
    const credentials = tls
      ? grpc.credentials.createSsl(this.ca ?? null)
      : grpc.credentials.createInsecure();
    const Coordinator = coordinatorService();
    return new Coordinator(address, credentials) as unknown as Stub;
  }

  private switchTo(endpoint: string): void {
    this.stub.close();
    if (!this.endpoints.includes(endpoint)) this.endpoints.push(endpoint);
    this.current = this.endpoints.indexOf(endpoint);
    this.stub = this.connect(endpoint);
  }

  private metadata(): grpc.Metadata {
    const metadata = new grpc.Metadata();
    if (this.token) metadata.set("authorization", `Bearer ${this.token}`);
    return metadata;
  }

  /** One unary call: a member that names the leader is left for it; an unreachable endpoint
   * for the next one. */
  async call<T>(method: string, request: Wire, timeoutMs = this.timeoutMs): Promise<T> {
    let tried = 0;
    for (let redirects = 0; ; ) {
      try {
        return await this.once<T>(method, request, timeoutMs);
      } catch (error) {
        const failure = error as grpc.ServiceError;
        if (failure.code !== grpc.status.UNAVAILABLE) throw toPalisade(failure);
        const leader = failure.metadata?.get(LEADER_METADATA)?.[0]?.toString();
        if (leader && leader !== this.endpoints[this.current] && redirects < MAX_REDIRECTS) {
          redirects += 1;
          this.switchTo(leader);
          continue;
        }
        tried += 1;
        if (leader || tried >= this.endpoints.length) throw toPalisade(failure);
        this.switchTo(this.endpoints[(this.current + 1) % this.endpoints.length]);
      }
    }
  }

  private once<T>(method: string, request: Wire, timeoutMs: number): Promise<T> {
    return new Promise((resolve, reject) => {
      const deadline = new Date(Date.now() + timeoutMs);
      this.stub[method](request, this.metadata(), { deadline }, (error: unknown, reply: T) =>
        error ? reject(error) : resolve(reply),
      );
    });
  }

  /** Acquires `name` once, without a keepalive: the lease ends at its TTL unless renewed
   * (see {@link Client.lock}). */
  async acquire(name: string, options: LockOptions = {}): Promise<Lease> {
    const ttl = millis(options.ttl ?? "10s");
    const wait = millis(options.wait ?? "0s");
    if (ttl <= 0) throw new InvalidArgument("ttl must be positive");
    const request = {
      lock: name,
      ttl_ms: String(ttl),
      wait_ms: String(wait),
      holder: options.holder ?? defaultHolder(),
      class:
        options.class === undefined
          ? "LOCK_CLASS_UNSPECIFIED"
          : options.class === "critical"
            ? "LOCK_CLASS_CRITICAL"
            : options.class === "efficiency"
              ? "LOCK_CLASS_EFFICIENCY"
              : (() => {
                  throw new InvalidArgument(`class ${options.class}: critical or efficiency`);
                })(),
      request_id: options.requestId ?? randomBytes(16).toString("hex"),
    };
    const sent = Date.now();
    const reply = await this.call<Wire>("Acquire", request, wait + this.timeoutMs);
    return new Lease(this, reply, sent);
  }

  /** Acquires `name` and keeps the lease alive until it is released (`await using` releases
   * it at the end of the block) or lost (`lease.signal` aborts). */
  async lock(name: string, options: LockOptions = {}): Promise<Lease> {
    const lease = await this.acquire(name, options);
    lease.startKeepalive();
    return lease;
  }

  /** Runs `work` while holding `name`, and releases the lease after it, whatever happens.
   * `signal` aborts when the lease is lost: pass it to what `work` awaits. */
  async withLock<T>(
    name: string,
    options: LockOptions,
    work: (lease: Lease, signal: AbortSignal) => Promise<T>,
  ): Promise<T> {
    const lease = await this.lock(name, options);
    try {
      return await work(lease, lease.signal);
    } finally {
      await lease.release();
    }
  }

  /** The state of one lock. */
  async describe(name: string): Promise<LockInfo> {
    const info = await this.call<Wire>("Describe", { lock: name });
    return {
      lock: String(info.lock),
      held: Boolean(info.held),
      epoch: String(info.epoch),
      holder: String(info.holder),
      principal: String(info.principal),
      leaseId: String(info.lease_id),
      ttlMs: Number(info.ttl_ms),
      remainingMs: Number(info.remaining_ms),
      class: lockClass(info.class),
      waiters: Number(info.waiters),
      heldSince: Number(info.granted_unix_ms ?? 0) > 0 ? new Date(Number(info.granted_unix_ms)) : null,
    };
  }

  /** The lock's floor (a decimal string) and the coordinator's signed statement of it,
   * verified: every owner below the floor is superseded or its lease has ended
   * (`GET /v1/locks/NAME/floor` on the coordinator's port; a member that does not lead names
   * the leader, asked once more). What a database that restarted or was restored asks before
   * it trusts its fences again ({@link fencedQuery}). The statement's Ed25519 signature is
   * checked against `trustedKeys` when given, else against the coordinator's keys
   * ({@link Client.keys}, asked again when a statement names a key not seen yet): a floor that
   * does not verify throws {@link Unavailable} and is never returned. */
  async floorStatement(name: string): Promise<{ floor: string; statement: string }> {
    let endpoint = this.endpoints[this.current];
    for (let redirects = 0; ; redirects++) {
      const { address, tls } = target(endpoint);
      const url = `${tls ? "https" : "http"}://${address}/v1/locks/${encodeURIComponent(name)}/floor`;
      const { status, body } = await httpGet(url, this.ca, this.timeoutMs);
      if (status === 200 && body.floor !== undefined) return this.verifiedFloor(url, name, body);
      if (body.error === "not_leader" && typeof body.leader === "string" && redirects < MAX_REDIRECTS) {
        endpoint = body.leader;
        continue;
      }
      throw new Unavailable(`GET ${url}: ${status} ${JSON.stringify(body)}`, "UNAVAILABLE");
    }
  }

  /** The lock's verified floor, a decimal string (see {@link Client.floorStatement}). */
  async floor(name: string): Promise<string> {
    return (await this.floorStatement(name)).floor;
  }

  /** The floor of `body` (the answer of `url`) once its statement verifies for `lock`. */
  private async verifiedFloor(
    url: string,
    lock: string,
    body: Record<string, unknown>,
  ): Promise<{ floor: string; statement: string }> {
    const statement = body.statement;
    if (typeof statement !== "string") {
      throw new Unavailable(`GET ${url}: no floor statement (an older coordinator?)`, "UNAVAILABLE");
    }
    try {
      let keys = await this.floorKeys(false);
      if (!keys.has(statementKeyId(statement))) keys = await this.floorKeys(true);
      const claims = verifyFloorStatement(statement, lock, keys);
      if (String(body.floor) !== claims.floor) {
        throw new FloorError(`the answer says floor ${String(body.floor)}, its signed statement ${claims.floor}`);
      }
      return { floor: claims.floor, statement };
    } catch (error) {
      if (!(error instanceof FloorError)) throw error;
      throw new Unavailable(`the floor statement from ${url} does not verify: ${error.message}`, "UNAVAILABLE");
    }
  }

  /** The keys floor statements are checked with: the pinned ones, or the coordinator's. */
  private async floorKeys(refresh: boolean): Promise<Map<string, Buffer>> {
    if (this.trustedKeys) return this.trustedKeys;
    if (refresh || !this.fetchedKeys) {
      this.fetchedKeys = parseKeys((await this.keys()).map((key) => key.publicKey));
    }
    return this.fetchedKeys;
  }

  /** The coordinator's public verification keys (base64url Ed25519), by key id. */
  async keys(): Promise<{ keyId: string; publicKey: string; algorithm: string }[]> {
    const reply = await this.call<{ keys: Wire[] }>("Keys", {});
    return reply.keys.map((k) => ({
      keyId: String(k.key_id),
      publicKey: String(k.public_key),
      algorithm: String(k.algorithm),
    }));
  }

  /** Closes the connection. */
  close(): void {
    this.stub.close();
  }
}

/** GET `url` as JSON, within `timeoutMs`. */
function httpGet(
  url: string,
  ca: Buffer | undefined,
  timeoutMs: number,
): Promise<{ status: number; body: Record<string, unknown> }> {
  const get = url.startsWith("https:") ? httpsGet : httpGetPlain;
  return new Promise((resolve, reject) => {
    const request = get(url, { ca, timeout: timeoutMs }, (response) => {
      let text = "";
      response.setEncoding("utf8");
      response.on("data", (chunk: string) => {
        text += chunk;
        if (text.length > 65_536) request.destroy(new Error("answer too large"));
      });
      response.on("end", () => {
        try {
          resolve({ status: response.statusCode ?? 0, body: JSON.parse(text || "{}") });
        } catch {
          reject(new Unavailable(`GET ${url}: not JSON`, "UNAVAILABLE"));
        }
      });
    });
    request.on("timeout", () => request.destroy(new Error("timed out")));
    request.on("error", (error) => reject(new Unavailable(`GET ${url}: ${error.message}`, "UNAVAILABLE")));
  });
}

function toPalisade(error: grpc.ServiceError): PalisadeError {
  const name = grpc.status[error.code] ?? "UNKNOWN";
  const Kind = ERRORS[error.code] ?? PalisadeError;
  return new Kind(`${name}: ${error.details ?? error.message}`, name);
}

/** A granted lease. */
export class Lease implements AsyncDisposable {
  readonly lock: string;
  /** The ownership epoch (fencing token number), a decimal string. */
  readonly epoch: string;
  /** The signed token to present to resources. */
  readonly token: string;
  readonly leaseId: string;
  readonly ttlMs: number;
  readonly holder: string;
  readonly principal: string;
  readonly class: "critical" | "efficiency";
  /** Aborts (with a {@link LeaseLost}) when the lease can no longer be vouched for. */
  readonly signal: AbortSignal;
  private readonly lost = new AbortController();
  /** Until when the holder may believe it holds the lease: the send time of the last
   * confirmed renewal (or the acquire) plus the TTL. */
  private validUntil: number;
  private timer?: NodeJS.Timeout;
  private expiry?: NodeJS.Timeout;
  private released = false;

  constructor(
    private readonly client: Client,
    reply: Wire,
    sent: number,
  ) {
    this.lock = String(reply.lock);
    this.epoch = String(reply.epoch);
    this.token = String(reply.token);
    this.leaseId = String(reply.lease_id);
    this.ttlMs = Number(reply.ttl_ms);
    this.holder = String(reply.holder);
    this.principal = String(reply.principal);
    this.class = lockClass(reply.class);
    this.signal = this.lost.signal;
    this.validUntil = sent + this.ttlMs;
  }

  /** The epoch as a bigint, for comparisons. */
  get epochBigInt(): bigint {
    return BigInt(this.epoch);
  }

  /** True while the lease is held and its validity has not run out. A `true` does not make a
   * later write safe: only the resource's fence does. */
  get valid(): boolean {
    return !this.signal.aborted && !this.released && Date.now() < this.validUntil;
  }

  /** Renews the lease by its full TTL; throws {@link LeaseLost} when it is gone. */
  async renew(timeoutMs = this.client.timeoutMs): Promise<void> {
    const sent = Date.now();
    await this.client.call("Renew", { lease_id: this.leaseId }, timeoutMs);
    this.validUntil = Math.max(this.validUntil, sent + this.ttlMs);
  }

  /** Renews every third of the TTL (sooner after a failure) until released or lost. The
   * lease is lost when its validity ends with no renewal confirmed, even while a renewal is
   * still on its way. */
  startKeepalive(): void {
    if (this.timer || this.released) return;
    const interval = Math.max(Math.floor(this.ttlMs / RENEWALS_PER_TTL), 5);
    const watch = () => {
      if (this.released || this.signal.aborted) return;
      const left = this.validUntil - Date.now();
      if (left <= 0) return this.lose("no renewal was confirmed before the lease's validity ended");
      this.expiry = setTimeout(watch, left);
      this.expiry.unref();
    };
    const schedule = (delay: number) => {
      this.timer = setTimeout(tick, delay);
      this.timer.unref();
    };
    const tick = async () => {
      if (this.released || this.signal.aborted) return;
      try {
        // A renewal answered after the validity ended is of no use: wait no longer.
        await this.renew(Math.max(1, Math.min(this.client.timeoutMs, this.validUntil - Date.now())));
        schedule(interval);
      } catch (error) {
        if (this.released || this.signal.aborted) return;
        if (error instanceof LeaseLost) return this.lose(error.message);
        schedule(Math.max(Math.floor(interval / RETRY_SPEEDUP), 5));
      }
    };
    watch();
    schedule(interval);
  }

  private lose(reason: string): void {
    clearTimeout(this.timer);
    clearTimeout(this.expiry);
    this.lost.abort(new LeaseLost(`lease ${this.leaseId} on ${this.lock} lost: ${reason}`, "NOT_FOUND"));
  }

  /** Stops the keepalive and releases the lease. Releasing a lease already gone is not an
   * error: the lock is free of it either way. */
  async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
    clearTimeout(this.timer);
    clearTimeout(this.expiry);
    try {
      await this.client.call("Release", { lease_id: this.leaseId });
    } catch (error) {
      if (!(error instanceof LeaseLost)) throw error;
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }

  toString(): string {
    return `Lease(lock=${this.lock}, epoch=${this.epoch}, leaseId=${this.leaseId})`;
  }
}

/** The proto file this client speaks (for tools that want it). */
export function protoText(): string {
  return readFileSync(PROTO, "utf8");
}

export { BELOW_FLOOR, FLOOR_UNKNOWN, MAX_FLOOR_REQUESTS, Superseded, fencedQuery, learnFloor, recordRefusal } from "./postgres.js";
export { FloorError, verifyFloorStatement } from "./floors.js";
export type { FloorClaims } from "./floors.js";
export type { Queryable, QueryResultLike } from "./postgres.js";
