// Fence a PostgreSQL write with the seed's statement: it applies only above the row's last
// fence, so a paused, superseded owner changes nothing. Args: DATABASE_URL ROW_ID PAYLOAD.
// The table and its guard: see the README (a row for ROW_ID, its lock `report/ROW_ID`).
import pg from "pg";
import { Client, fencedQuery } from "@palisade/client";

const [dsn, id, payload] = process.argv.slice(2);
const client = new Client(process.env.PALISADE_ENDPOINT ?? "127.0.0.1:7420");
const db = new pg.Client(dsn);
await db.connect();
try {
  await client.withLock(`report/${id}`, { ttl: "10s" }, async (lease) => {
    if (!lease.valid) throw new Error("lease lost before the write"); // no protection by itself
    const written = await fencedQuery(db, client, lease.lock,
      "UPDATE report_result SET payload = $1, last_fence = t.epoch FROM palisade_present_token($2) AS t(epoch) " +
        "WHERE id = $3 AND last_fence OPERATOR(pg_catalog.<) t.epoch RETURNING id",
      [payload, lease.token, id], // the token, not the epoch: the database reads both from it
      { token: lease.token }); // a refused stale write is recorded for the audit and the console
    if (written.rowCount === 0) throw new Error(`refused: row ${id} is missing or fenced above epoch ${lease.epoch}`);
    console.log(`row ${id} written at epoch ${lease.epoch}`);
  });
} catch (error) {
  console.error((error as Error).message);
  process.exitCode = 1;
} finally {
  await db.end();
  client.close();
}
