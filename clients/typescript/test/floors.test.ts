// Floors and durability at a PostgreSQL boundary, against a real PostgreSQL
// (PALISADE_TEST_POSTGRES_URL) and a real coordinator:
// - P4, P6: a floor a man in the middle forges (a greater number, an untrusted key, another
//   lock's statement) is never returned nor recorded; the real one is recorded with its
//   statement. The man in the middle is a real HTTP server on loopback in front of the
//   coordinator's port, the coordinator's keys pinned.
// - P8: after a database restart (every floor unknown: P5008), every write fencedQuery
//   acknowledged is seen from another session.

import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, execSync } from "node:child_process";
import { createServer, get } from "node:http";
import type { AddressInfo } from "node:net";

import pg from "pg";

import { Client, MAX_FLOOR_REQUESTS, Unavailable, fencedQuery } from "../src/index.js";
import { Coordinator } from "./coordinator.js";

const MAX_EPOCH = "9223372036854775807";
// The token, not a bare epoch (payload, token, row).
const UPDATE =
  "UPDATE floor_rows SET payload = $1, last_fence = t.epoch FROM palisade_present_token($2) AS t(epoch) " +
  "WHERE id = $3 AND last_fence OPERATOR(pg_catalog.<) t.epoch RETURNING id";

function env(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run ./scripts/test`);
  return value;
}

function getJson(url: string): Promise<Record<string, unknown>> {
  return new Promise((resolve, reject) => {
    get(url, (response) => {
      let text = "";
      response.on("data", (chunk) => (text += chunk));
      response.on("end", () => resolve(JSON.parse(text)));
    }).on("error", reject);
  });
}

/** An HTTP server that passes requests to `upstream` and rewrites the floors' answers. */
async function manInTheMiddle(
  upstream: string,
  forge: (real: Record<string, unknown>) => Record<string, unknown>,
): Promise<{ address: string; close: () => void }> {
  const server = createServer(async (request, response) => {
    let body = await getJson(`http://${upstream}${request.url}`);
    if (request.url?.endsWith("/floor")) body = forge(body);
    response.setHeader("content-type", "application/json");
    response.end(JSON.stringify(body));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return { address: `127.0.0.1:${port}`, close: () => server.close() };
}

/** A guarded table of rows 1..3, each under lock floor/ID. */
async function guardedTable(url: string): Promise<void> {
  const db = new pg.Client(url);
  await db.connect();
  try {
    await db.query(
      "DO $$ BEGIN IF to_regclass('floor_rows') IS NOT NULL THEN " +
        "PERFORM palisade_drop_guard('floor_rows'); DROP TABLE floor_rows; END IF; END $$",
    );
    await db.query(
      "CREATE TABLE floor_rows (id bigint PRIMARY KEY, lock text NOT NULL, payload text NOT NULL, " +
        "last_fence bigint NOT NULL DEFAULT 0)",
    );
    await db.query("INSERT INTO floor_rows SELECT i, 'floor/' || i, 'empty' FROM generate_series(1, 3) i");
  } finally {
    await db.end();
  }
  execFileSync(env("PALISADE_BIN"), [
    "resource", "guard", "--postgres", url, "--table", "floor_rows", "--lock-column", "lock",
  ], { env: { ...process.env, RUST_LOG: "warn" } });
}

test("P4, P6: a forged floor is never returned nor recorded; the real one is, with its statement", async () => {
  const url = env("PALISADE_TEST_POSTGRES_URL");
  const coordinator = await Coordinator.start();
  const client = new Client(coordinator.address);
  const db = new pg.Client(url);
  await guardedTable(url);
  await db.connect();
  try {
    const lease = await client.acquire("floor/1", { ttl: "30s" });
    const other = await client.acquire("floor/2", { ttl: "30s" });
    const replayed = (await client.floorStatement("floor/2")).statement;
    const keys = (await client.keys()).map((key) => key.publicKey);
    const forgeries: [string, (real: Record<string, unknown>) => Record<string, unknown>][] = [
      ["a greater number", (real) => ({ ...real, floor: MAX_EPOCH })],
      ["another lock's statement", (real) => ({ ...real, statement: replayed })],
      ["no statement", (real) => ({ ...real, statement: undefined, floor: MAX_EPOCH })],
    ];
    for (const [name, forge] of forgeries) {
      const mitm = await manInTheMiddle(coordinator.address, forge);
      const fooled = new Client(mitm.address, { trustedKeys: keys });
      try {
        await assert.rejects(fooled.floorStatement("floor/1"), Unavailable, name);
        await db.query("DELETE FROM palisade_lock_floors");
        await assert.rejects(
          fencedQuery(db, fooled, "floor/1", UPDATE, ["x", lease.token, 1]),
          Unavailable,
          name,
        );
        const learned = await db.query("SELECT count(*)::int AS n FROM palisade_lock_floors");
        assert.equal(learned.rows[0].n, 0, `${name}: nothing recorded`);
      } finally {
        fooled.close();
        mitm.close();
      }
    }
    const written = await fencedQuery<pg.QueryResult>(db, client, "floor/1", UPDATE, ["x", lease.token, 1]);
    assert.equal(written.rowCount, 1);
    const stored = await db.query("SELECT floor::text, statement FROM palisade_lock_floors WHERE lock = 'floor/1'");
    assert.ok(BigInt(stored.rows[0].floor) <= BigInt(lease.epoch));
    assert.match(stored.rows[0].statement, /^pf1\./);
    await lease.release();
    await other.release();
  } finally {
    await db.end();
    client.close();
    await coordinator.stop();
  }
});

test("P8: writes fencedQuery acknowledged after a database restart are seen from another session", async () => {
  const url = env("PALISADE_TEST_POSTGRES_URL");
  const restart = env("PALISADE_TEST_POSTGRES_RESTART");
  const coordinator = await Coordinator.start();
  const client = new Client(coordinator.address);
  await guardedTable(url);
  try {
    const leases = [];
    for (const id of [1, 2, 3]) leases.push(await client.acquire(`floor/${id}`, { ttl: "60s" }));
    execSync(restart, { stdio: "ignore", timeout: 60_000 });
    const db = new pg.Client(url);
    await db.connect();
    try {
      for (const [i, lease] of leases.entries()) {
        const written = await fencedQuery<pg.QueryResult>(db, client, lease.lock, UPDATE, [
          `after restart ${i + 1}`, lease.token, i + 1,
        ]);
        assert.equal(written.rowCount, 1);
      }
      const other = new pg.Client(url);
      await other.connect();
      try {
        const seen = await other.query("SELECT id::int, payload, last_fence::text FROM floor_rows ORDER BY id");
        assert.deepEqual(
          seen.rows,
          leases.map((lease, i) => ({ id: i + 1, payload: `after restart ${i + 1}`, last_fence: lease.epoch })),
        );
      } finally {
        await other.end();
      }
    } finally {
      await db.end();
    }
    for (const lease of leases) await lease.release();
  } finally {
    client.close();
    await coordinator.stop();
  }
});

test("P8: after the floors are forgotten, concurrent writers of a lock ask the coordinator once", async () => {
  const url = env("PALISADE_TEST_POSTGRES_URL");
  const coordinator = await Coordinator.start();
  const client = new Client(coordinator.address);
  await guardedTable(url);
  const pool = new pg.Pool({ connectionString: url, max: 12 });
  try {
    await pool.query(
      "INSERT INTO floor_rows SELECT i, 'floor/' || (i % 3 + 1), 'empty' FROM generate_series(10, 21) i",
    );
    const leases = new Map<string, Awaited<ReturnType<Client["acquire"]>>>();
    for (const n of [1, 2, 3]) leases.set(`floor/${n}`, await client.acquire(`floor/${n}`, { ttl: "60s" }));
    await pool.query("DELETE FROM palisade_lock_floors WHERE lock LIKE 'floor/%'");
    let asked = 0;
    let now = 0;
    let most = 0;
    const ask = client.floorStatement.bind(client);
    client.floorStatement = async (name: string) => {
      asked++;
      most = Math.max(most, ++now);
      await new Promise((resolve) => setTimeout(resolve, 100));
      try {
        return await ask(name);
      } finally {
        now--;
      }
    };
    const writes = [];
    for (let id = 10; id <= 21; id++) {
      const lease = leases.get(`floor/${(id % 3) + 1}`)!;
      writes.push(fencedQuery<pg.QueryResult>(pool, client, lease.lock, UPDATE, ["herd", lease.token, id]));
    }
    for (const written of await Promise.all(writes)) assert.equal(written.rowCount, 1);
    assert.equal(asked, 3, "one request per lock");
    assert.ok(most <= MAX_FLOOR_REQUESTS, `${most} requests at once`);
    for (const lease of leases.values()) await lease.release();
  } finally {
    await pool.end();
    client.close();
    await coordinator.stop();
  }
});
