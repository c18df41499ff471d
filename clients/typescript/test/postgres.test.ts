// The README's PostgreSQL example against a real PostgreSQL (PALISADE_TEST_POSTGRES_URL, set by
// scripts/test) and a real coordinator: it writes under its lease; a paused owner is refused by
// the row's fence; and after the database went back (the row's fence lowered, the floors
// forgotten), the paused owner is refused by the coordinator's floor, learned on P5008.

import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

import pg from "pg";

import { Client, Superseded, fencedQuery } from "../src/index.js";
import { Coordinator } from "./coordinator.js";

const EXAMPLE = fileURLToPath(new URL("../examples/fence_postgres.js", import.meta.url));
// The README's statement: the token, not a bare epoch (payload, token, row).
const UPDATE =
  "UPDATE report_result SET payload = $1, last_fence = t.epoch FROM palisade_present_token($2) AS t(epoch) " +
  "WHERE id = $3 AND last_fence OPERATOR(pg_catalog.<) t.epoch RETURNING id";

function databaseUrl(): string {
  const url = process.env.PALISADE_TEST_POSTGRES_URL;
  if (!url) throw new Error("PALISADE_TEST_POSTGRES_URL is not set: run ./scripts/test");
  return url;
}

async function sql(url: string, ...statements: string[]): Promise<pg.QueryResult[]> {
  const db = new pg.Client(url);
  await db.connect();
  try {
    const results = [];
    for (const statement of statements) results.push(await db.query(statement));
    return results;
  } finally {
    await db.end();
  }
}

test("P1, P6: the PostgreSQL example fences a paused owner, also after the database went back", async () => {
  const url = databaseUrl();
  const coordinator = await Coordinator.start();
  const client = new Client(coordinator.address);
  const unguard =
    "DO $$ BEGIN IF to_regclass('report_result') IS NOT NULL AND to_regproc('palisade_drop_guard') " +
    "IS NOT NULL THEN PERFORM palisade_drop_guard('report_result'); END IF; END $$";
  try {
    await sql(
      url,
      unguard,
      "DROP TABLE IF EXISTS report_result",
      "CREATE TABLE report_result (id bigint PRIMARY KEY, lock text NOT NULL, payload text NOT NULL, " +
        "last_fence bigint NOT NULL DEFAULT 0)",
      "INSERT INTO report_result (id, lock, payload) VALUES (7, 'report/7', 'empty')",
    );
    execFileSync(process.env.PALISADE_BIN!, [
      "resource", "guard", "--postgres", url, "--table", "report_result", "--lock-column", "lock",
    ], { env: { ...process.env, RUST_LOG: "warn" } });
    const env = { ...process.env, PALISADE_ENDPOINT: coordinator.address };
    const run = (payload: string) =>
      spawnSync(process.execPath, [EXAMPLE, url, "7", payload], { env, encoding: "utf8" });

    // The README's command for the example: one npm script builds it and runs it.
    const first = spawnSync("npm", ["run", "--silent", "example", "--", url, "7", "first"], {
      env,
      encoding: "utf8",
      cwd: fileURLToPath(new URL("../..", import.meta.url)),
    });
    assert.equal(first.status, 0, first.stderr);
    assert.match(first.stdout, /row 7 written at epoch \d+/);

    // A paused owner: its lease ran out while it slept; a newer owner ran the example.
    const paused = await client.acquire("report/7", { ttl: "100ms" });
    await new Promise((resolve) => setTimeout(resolve, 300));
    const newer = run("newer");
    assert.equal(newer.status, 0, newer.stderr);
    const db = new pg.Client(url);
    await db.connect();
    try {
      // A newer owner's token was presented for the lock: the paused one is superseded.
      await assert.rejects(
        fencedQuery(db, client, "report/7", UPDATE, ["stale", paused.token, 7], { token: paused.token }),
        (error: unknown) => error instanceof Superseded,
      );
      // The refusal is recorded where the audit and the console read it (migration 12).
      const recorded = await db.query(
        "SELECT reason FROM palisade_recent_refusals(1000) WHERE lock = 'report/7' AND epoch = $1",
        [paused.epoch],
      );
      assert.deepEqual(recorded.rows.map((r) => r.reason), ["stale_epoch"]);

      // The database goes back: the row's fence and the floors are a copy from before.
      await db.query("ALTER TABLE report_result DISABLE TRIGGER palisade_guard_update");
      await db.query("ALTER TABLE report_result DISABLE TRIGGER palisade_guard_token");
      await db.query("UPDATE report_result SET payload = 'old', last_fence = 0 WHERE id = 7");
      await db.query("ALTER TABLE report_result ENABLE ALWAYS TRIGGER palisade_guard_update");
      await db.query("ALTER TABLE report_result ENABLE ALWAYS TRIGGER palisade_guard_token");
      await db.query("TRUNCATE palisade_lock_floors");
      await db.query("TRUNCATE palisade_presented_tokens");
      await assert.rejects(db.query(UPDATE, ["stale", paused.token, 7]), { code: "P5008" });
      await assert.rejects(
        fencedQuery(db, client, "report/7", UPDATE, ["stale", paused.token, 7]),
        (error: unknown) =>
          error instanceof Superseded && BigInt(error.floor) > BigInt(paused.epoch),
      );
      const row = await db.query("SELECT payload FROM report_result WHERE id = 7");
      assert.equal(row.rows[0].payload, "old");
    } finally {
      await db.end();
    }
    const again = run("again");
    assert.equal(again.status, 0, again.stderr);
  } finally {
    client.close();
    await coordinator.stop();
    await sql(url, unguard, "DROP TABLE IF EXISTS report_result");
  }
});
