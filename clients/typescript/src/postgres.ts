/**
 * Fenced writes to PostgreSQL, with the floors of a database that went back in time.
 *
 * A database restarted, restored or failed over may have forgotten fences it raised:
 * Palisade's triggers (migration 8) then refuse each lock's first fenced write with SQLSTATE
 * `P5008` until its floor — the coordinator's word on who is superseded — is recorded again.
 * {@link fencedQuery} runs your statement, and on `P5008` asks the coordinator for the lock's
 * floor, records it with `palisade_learn_floor` and runs the statement once more. A write
 * below the floor throws {@link Superseded}: stop, do not retry.
 */

import { PalisadeError } from "./errors.js";
import type { Client } from "./index.js";

/** SQLSTATE: the database does not know the lock's floor since it started or was restored. */
export const FLOOR_UNKNOWN = "P5008";
/** SQLSTATE: the row's epoch is below its lock's floor (DETAIL: the floor). */
export const BELOW_FLOOR = "P5009";
/** SQLSTATE: no such function (a database before migration 10). */
const UNDEFINED_FUNCTION = "42883";

/** What {@link fencedQuery} needs of a database client (`pg`'s `Client` or `Pool`). */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<unknown>;
}

/** The part of a query's result the helpers read (`pg`'s `QueryResult`). */
export interface QueryResultLike {
  rowCount: number | null;
  rows: any[];
}

/** The owner's epoch is below the lock's floor: a newer owner exists. Nothing was written. */
export class Superseded extends PalisadeError {
  constructor(
    message: string,
    readonly floor: string,
  ) {
    super(message, "FAILED_PRECONDITION");
  }
}

interface DatabaseError {
  code?: string;
  detail?: string;
  message?: string;
}

/** Asks the coordinator for `lock`'s floor, verifies its signed statement
 * ({@link Client.floorStatement}: a floor that does not verify throws and nothing is recorded)
 * and records both in `db` (a floor never goes down; the audit verifies the statement again);
 * the floor now in force, a decimal string. */
export async function learnFloor(db: Queryable, client: Client, lock: string): Promise<string> {
  const { floor, statement } = await client.floorStatement(lock);
  try {
    const sql = "SELECT palisade_learn_floor($1, $2, $3)::text AS floor";
    const result = (await db.query(sql, [lock, floor, statement])) as QueryResultLike;
    return String(result.rows[0].floor);
  } catch (error) {
    // A database before migration 10 (no statement column): the floor alone. Outside a
    // transaction only: inside one, the failed call has aborted it, and the caller sees that.
    if ((error as DatabaseError).code !== UNDEFINED_FUNCTION) throw error;
    const sql = "SELECT palisade_learn_floor($1, $2)::text AS floor";
    const result = (await db.query(sql, [lock, floor])) as QueryResultLike;
    return String(result.rows[0].floor);
  }
}

/** Most floor requests this process has in flight at once, across locks: after a database
 * restart every lock's next write needs its floor at once. */
export const MAX_FLOOR_REQUESTS = 8;

let requestsInFlight = 0;
const waitingForRequest: Array<() => void> = [];
/** Each client's floor requests in flight, by lock: the lock's other writers wait for it. */
const flights = new WeakMap<Client, Map<string, Promise<string>>>();

async function withRequestPermit<T>(run: () => Promise<T>): Promise<T> {
  while (requestsInFlight >= MAX_FLOOR_REQUESTS) {
    await new Promise<void>((resolve) => waitingForRequest.push(resolve));
  }
  requestsInFlight++;
  try {
    return await run();
  } finally {
    requestsInFlight--;
    waitingForRequest.shift()?.();
  }
}

/** {@link learnFloor}, once per client and lock at a time: a writer that finds the lock's floor
 * being learned waits for that request instead of sending its own. */
function learnFloorOnce(db: Queryable, client: Client, lock: string): Promise<string> {
  let byLock = flights.get(client);
  if (!byLock) {
    byLock = new Map();
    flights.set(client, byLock);
  }
  const running = byLock.get(lock);
  if (running) return running;
  const flight = withRequestPermit(() => learnFloor(db, client, lock)).finally(() => byLock.delete(lock));
  byLock.set(lock, flight);
  return flight;
}

/** Records that `token`'s write was refused as stale (`palisade_record_refusal`, migration
 * 12), where `palisade audit` and the console read it: the database records it only if the
 * token is below what it holds for its lock. Best effort: false when nothing was recorded (not
 * stale, an older database, a role without the grant, or inside an aborted transaction). */
export async function recordRefusal(db: Queryable, token: string): Promise<boolean> {
  try {
    const result = (await db.query("SELECT palisade_record_refusal($1) AS recorded", [token])) as QueryResultLike;
    return Boolean(result.rows[0]?.recorded);
  } catch {
    return false;
  }
}

/** Runs `text` with `values` on `db` — outside a transaction, or inside one you protect with
 * a savepoint — learning `lock`'s floor first when the database asks for it. One request per
 * client and lock is in flight at a time, and at most {@link MAX_FLOOR_REQUESTS} in all. With
 * `options.token` (the lease's), a refused stale write is recorded for the audit and the
 * console ({@link recordRefusal}) before {@link Superseded} is thrown. */
export async function fencedQuery<R = QueryResultLike>(
  db: Queryable,
  client: Client,
  lock: string,
  text: string,
  values: unknown[] = [],
  options: { token?: string } = {},
): Promise<R> {
  for (let attempt = 0; ; attempt++) {
    try {
      return (await db.query(text, values)) as R;
    } catch (error) {
      const failure = error as DatabaseError;
      if (failure.code === FLOOR_UNKNOWN && attempt === 0) {
        await learnFloorOnce(db, client, lock);
        continue;
      }
      if (failure.code === FLOOR_UNKNOWN && attempt === 1) {
        // Learned through another database than this one: learn it here.
        await withRequestPermit(() => learnFloor(db, client, lock));
        continue;
      }
      if (failure.code === BELOW_FLOOR) {
        if (options.token !== undefined) await recordRefusal(db, options.token);
        throw new Superseded(failure.message ?? "superseded", failure.detail ?? "0");
      }
      throw error;
    }
  }
}
