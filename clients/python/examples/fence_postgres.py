"""Fence a PostgreSQL write with the seed's statement: it applies only above the row's last
fence, so a paused, superseded owner changes nothing. The statement passes the lease's token,
not a bare epoch: the database reads the lock and epoch from it (``palisade_present_token``)
and refuses a token of another lock, or a last_fence that is not the token's epoch. Args: DATABASE_URL ROW_ID PAYLOAD.
The table and its guard: see the README (a row for ROW_ID, its lock `report/ROW_ID`)."""
import os
import sys

import psycopg

from palisade_client import Client
from palisade_client.postgres import Superseded, execute

dsn, row_id, payload = sys.argv[1], int(sys.argv[2]), sys.argv[3]
client = Client(os.environ.get("PALISADE_ENDPOINT", "127.0.0.1:7420"))
with client.lock(f"report/{row_id}", ttl=10) as lease, psycopg.connect(dsn) as db:
    try:  # `execute` learns the lock's floor when the database restarted or was restored
        written = execute(
            db, client, lease.lock,
            "UPDATE report_result SET payload = %s, last_fence = t.epoch"
            " FROM palisade_present_token(%s) AS t(epoch)"
            " WHERE id = %s AND last_fence OPERATOR(pg_catalog.<) t.epoch RETURNING id",
            (payload, lease.token, row_id),
            token=lease.token,  # a refused stale write is recorded for the audit and console
        ).fetchone()  # committed by `execute`, before the lease is released
    except Superseded as why:
        sys.exit(f"refused: {why}; epoch {lease.epoch} is obsolete")
    fence = None if written else db.execute(
        "SELECT last_fence FROM report_result WHERE id = %s", (row_id,)
    ).fetchone()
if written is None and fence is None:
    sys.exit(f"no row {row_id} in report_result: insert it first (nothing was written)")
if written is None:
    sys.exit(f"refused: row {row_id} is fenced at {fence[0]}; epoch {lease.epoch} is obsolete")
print(f"row {row_id} written at epoch {lease.epoch}")
