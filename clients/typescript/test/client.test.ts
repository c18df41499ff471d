// The TypeScript client against a real coordinator: the `palisade` binary that scripts/test
// builds (PALISADE_BIN), on a loopback port of its own choosing, in a temporary directory.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import {
  Client,
  InvalidArgument,
  LeaseLost,
  LockHeld,
  millis,
  protoText,
} from "../src/index.js";
import { Coordinator } from "./coordinator.js";

const HERE = fileURLToPath(new URL(".", import.meta.url));

async function withCoordinator(run: (c: Coordinator, client: Client) => Promise<void>) {
  const coordinator = await Coordinator.start();
  const client = new Client(coordinator.address);
  try {
    await run(coordinator, client);
  } finally {
    client.close();
    await coordinator.stop();
  }
}

test("P1: a lease carries its epoch exactly, as a string, even above 2^53", () =>
  withCoordinator(async (_, client) => {
    await using lease = await client.lock("ts/epoch", { ttl: "10s" });
    assert.match(lease.epoch, /^\d+$/);
    // Hybrid epochs start near now_ms × 2^20: far above Number.MAX_SAFE_INTEGER.
    assert.ok(lease.epochBigInt > BigInt(Number.MAX_SAFE_INTEGER), lease.epoch);
    assert.ok(lease.token.length > 20);
    const info = await client.describe("ts/epoch");
    assert.equal(info.held, true);
    assert.equal(info.epoch, lease.epoch);
    assert.ok(info.heldSince && Math.abs(info.heldSince.getTime() - Date.now()) < 60_000, String(info.heldSince));
    // One holder at a time: a second acquire is refused while the lease is held.
    await assert.rejects(client.acquire("ts/epoch"), LockHeld);
  }));

test("P1: `await using` and withLock release the lease; the next owner's epoch is higher", () =>
  withCoordinator(async (_, client) => {
    let first: string;
    {
      await using lease = await client.lock("ts/scope");
      first = lease.epoch;
    }
    assert.equal((await client.describe("ts/scope")).held, false);
    const second = await client.withLock("ts/scope", {}, async (lease, signal) => {
      assert.equal(signal.aborted, false);
      return lease.epoch;
    });
    assert.ok(BigInt(second) > BigInt(first));
    assert.equal((await client.describe("ts/scope")).held, false);
    // withLock releases when the work throws too.
    await assert.rejects(
      client.withLock("ts/scope", {}, async () => {
        throw new Error("work failed");
      }),
      /work failed/,
    );
    assert.equal((await client.describe("ts/scope")).held, false);
  }));

test("the keepalive holds a lease past its TTL", () =>
  withCoordinator(async (_, client) => {
    await using lease = await client.lock("ts/keepalive", { ttl: "300ms" });
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    assert.equal(lease.signal.aborted, false);
    assert.equal(lease.valid, true);
    assert.equal((await client.describe("ts/keepalive")).epoch, lease.epoch);
  }));

test("P1: lease.signal aborts with LeaseLost when no renewal is confirmed in time", () =>
  withCoordinator(async (coordinator, client) => {
    const lease = await client.lock("ts/lost", { ttl: "300ms" });
    const aborted = new Promise<unknown>((resolve) =>
      lease.signal.addEventListener("abort", () => resolve(lease.signal.reason)),
    );
    coordinator.process.kill("SIGSTOP"); // renewals go unanswered
    const began = Date.now();
    const reason = await aborted;
    coordinator.process.kill("SIGCONT");
    assert.ok(reason instanceof LeaseLost, String(reason));
    assert.ok(Date.now() - began < 5_000);
    assert.equal(lease.valid, false);
    await lease.release(); // gone already: not an error
  }));

test("errors say what the caller can do", () =>
  withCoordinator(async (_, client) => {
    await assert.rejects(client.acquire("not a lock name"), InvalidArgument);
    await assert.rejects(client.acquire("ts/x", { ttl: "soon" }), InvalidArgument);
    const lease = await client.acquire("ts/renew", { ttl: "10s" });
    await lease.release();
    await assert.rejects(lease.renew(), LeaseLost);
    assert.equal(millis("1.5s"), 1_500);
  }));

test("one meaning per duration: units required, a bare number refused", () =>
  withCoordinator(async (coordinator, client) => {
    assert.equal(millis({ seconds: 10 }), 10_000);
    assert.equal(millis({ milliseconds: 250 }), 250);
    assert.throws(() => millis(10 as unknown as string), /has no unit/);
    await assert.rejects(client.acquire("ts/bare", { ttl: 10 as unknown as string }), InvalidArgument);
    // A ttl of 10 seconds is 10 seconds at the coordinator.
    const lease = await client.acquire("ts/ten", { ttl: "10s" });
    const shown = (await fetch(`http://${coordinator.address}/v1/locks/ts%2Ften`).then((r) => r.json())) as {
      remaining_ms: number;
    };
    const remaining = Number(shown.remaining_ms);
    assert.ok(remaining > 9_000 && remaining <= 10_000, `remaining ${remaining} ms`);
    await lease.release();
  }));

test("an unreachable endpoint is skipped for the next one", () =>
  withCoordinator(async (coordinator) => {
    const client = new Client(["127.0.0.1:1", coordinator.address]);
    try {
      await using lease = await client.lock("ts/fallthrough");
      assert.match(lease.epoch, /^\d+$/);
    } finally {
      client.close();
    }
  }));

test("the proto the client carries is the coordinator's", () => {
  const repository = readFileSync(join(HERE, "../../../../proto/palisade.proto"), "utf8");
  assert.equal(protoText(), repository);
});

/** A loopback port free now. */
async function freePort(): Promise<number> {
  const { createServer } = await import("node:net");
  return new Promise((resolve) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as { port: number }).port;
      server.close(() => resolve(port));
    });
  });
}

test("in a cluster, a client given one member follows the leader it names", async () => {
  const ports = [await freePort(), await freePort(), await freePort()];
  const members = ports.map((port, i) => `${i + 1}=127.0.0.1:${port}`).join(",");
  const nodes: Coordinator[] = [];
  try {
    for (const [i, port] of ports.entries()) {
      nodes.push(
        await Coordinator.start(
          "--listen",
          `127.0.0.1:${port}`,
          "--node-id",
          String(i + 1),
          "--cluster",
          members,
          "--insecure-peers",
        ),
      );
    }
    // Each member alone: two of the three do not lead, and name the leader.
    const redirected = new Set<string>();
    for (const [i, node] of nodes.entries()) {
      const client = new Client(node.address);
      try {
        let lease;
        for (let attempt = 0; ; attempt++) {
          try {
            lease = await client.acquire(`ts/cluster-${i}`);
            break;
          } catch (error) {
            if (attempt > 100) throw error; // no leader within 20 s
            await new Promise((resolve) => setTimeout(resolve, 200));
          }
        }
        assert.match(lease.epoch, /^\d+$/);
        if (client.endpoint !== node.address) redirected.add(client.endpoint);
        await lease.release();
      } finally {
        client.close();
      }
    }
    // Two clients were sent on, both to the one leader.
    assert.equal(redirected.size, 1, [...redirected].join(", "));
  } finally {
    for (const node of nodes) await node.stop();
  }
});
