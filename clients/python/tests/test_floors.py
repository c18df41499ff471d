"""Floors a man in the middle forges (P4, P6): the client verifies the coordinator's signed
floor statement before anything is recorded, and a database never learns a floor whose
statement does not verify. The man in the middle is a real HTTP server on loopback in front
of a real coordinator: it passes ``/v1/keys`` through and answers the floor requests."""

import base64
import hashlib
import http.server
import json
import struct
import threading
import urllib.request

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from palisade_client import Client, Unavailable
from palisade_client import floors

MAX_EPOCH = 2**63 - 1


def forged_statement(lock: str, floor: int) -> str:
    """A statement in the coordinator's format, signed by a key nobody trusts."""
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes_raw()
    name = lock.encode()
    payload = (bytes([floors.VERSION]) + hashlib.sha256(public).digest()[:8]
               + struct.pack(">QQH", floor, 0, len(name)) + name)
    raw = payload + key.sign(payload)
    return floors.PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


class MitM:
    """Answers floor requests with `answer(real_json)`; passes everything else through."""

    def __init__(self, upstream: str, answer):
        mitm = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                with urllib.request.urlopen(f"http://{upstream}{self.path}", timeout=5) as real:
                    body = json.load(real)
                if self.path.endswith("/floor"):
                    body = mitm.answer(body)
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.answer = answer
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def test_p4_the_real_floor_statement_verifies(coordinator):
    client = Client(coordinator.address)
    lease = client.acquire("report/7", ttl=10)
    floor, statement = client.floor_statement("report/7")
    assert floor >= 1 and statement.startswith("pf1.")
    # Pinned keys: the same answer, with no key fetched from the coordinator.
    keys = json.load(urllib.request.urlopen(f"http://{coordinator.address}/v1/keys"))["keys"]
    pinned = Client(coordinator.address, trusted_keys=[k["public_key"] for k in keys])
    assert pinned.floor_statement("report/7")[0] == floor
    lease.release()


@pytest.mark.parametrize("forgery", ["a greater number", "an untrusted key", "another lock"])
def test_p4_p6_a_forged_floor_is_never_returned_nor_recorded(coordinator, database, forgery):
    import psycopg

    from palisade_client.postgres import execute

    client = Client(coordinator.address)
    other = client.acquire("report/8", ttl=10)
    replayed = client.floor_statement("report/8")[1]

    def answer(real):
        if forgery == "a greater number":
            return {**real, "floor": str(MAX_EPOCH)}
        if forgery == "an untrusted key":
            return {**real, "floor": str(MAX_EPOCH),
                    "statement": forged_statement("report/7", MAX_EPOCH)}
        return {**real, "statement": replayed}

    mitm = MitM(coordinator.address, answer)
    # The coordinator's keys, pinned (the man in the middle answers the HTTP port only).
    keys = json.load(urllib.request.urlopen(f"http://{coordinator.address}/v1/keys"))["keys"]
    fooled = Client(mitm.address, trusted_keys=[k["public_key"] for k in keys])
    try:
        with pytest.raises(Unavailable, match="verify|signed statement"):
            fooled.floor_statement("report/7")
        # Through the database: its floors forgotten (P5008), the write asks the man in the
        # middle, nothing is recorded and nothing written.
        lease = client.acquire("report/7", ttl=10)
        with psycopg.connect(database, autocommit=True) as db:
            db.execute("DELETE FROM palisade_lock_floors")
            update = ("UPDATE report_result SET payload = 'x', last_fence = t.epoch"
                      " FROM palisade_present_token(%s) AS t(epoch)"
                      " WHERE id = 7 AND last_fence OPERATOR(pg_catalog.<) t.epoch RETURNING id")
            with pytest.raises(Unavailable):
                execute(db, fooled, "report/7", update, (lease.token,))
            learned = db.execute(
                "SELECT count(*) FROM palisade_lock_floors WHERE lock = 'report/7'").fetchone()
            assert learned == (0,)
            # The coordinator itself: the floor and its statement are recorded, the write made.
            assert execute(db, client, "report/7", update, (lease.token,)).fetchone()
            floor, statement = db.execute(
                "SELECT floor, statement FROM palisade_lock_floors WHERE lock = 'report/7'"
            ).fetchone()
            assert floor <= lease.epoch and statement.startswith("pf1.")
        lease.release()
    finally:
        mitm.close()
        other.release()


def test_p8_the_herd_of_floor_requests_after_a_restart_is_one_per_lock(coordinator, database):
    """P8: after the floors are forgotten (a restart), 12 threads writing rows of 3 locks ask
    the coordinator 3 times — one learner per lock, the others wait and find the floor known —
    never more than MAX_FLOOR_REQUESTS at once, and every write lands."""
    import time

    import psycopg

    from palisade_client import postgres
    from palisade_client.postgres import execute

    client = Client(coordinator.address)
    locks = [f"herd/{n}" for n in range(3)]
    leases = {lock: client.acquire(lock, ttl=60) for lock in locks}
    rows = list(range(60, 72))
    with psycopg.connect(database, autocommit=True) as db:
        for row in rows:
            db.execute("INSERT INTO report_result (id, lock, payload) VALUES (%s, %s, 'empty')",
                       (row, locks[row % 3]))
        db.execute("DELETE FROM palisade_lock_floors WHERE lock LIKE 'herd/%'")

    class Counting:
        """The client, counting floor requests and how many at once."""

        def __init__(self):
            self.asked, self.now, self.most = 0, 0, 0
            self.guard = threading.Lock()

        def floor_statement(self, lock):
            with self.guard:
                self.asked += 1
                self.now += 1
                self.most = max(self.most, self.now)
            time.sleep(0.1)
            try:
                return client.floor_statement(lock)
            finally:
                with self.guard:
                    self.now -= 1

    counting = Counting()
    update = ("UPDATE report_result SET payload = 'after restart', last_fence = t.epoch"
              " FROM palisade_present_token(%s) AS t(epoch)"
              " WHERE id = %s AND last_fence OPERATOR(pg_catalog.<) t.epoch RETURNING id")
    written = []

    def write(row):
        with psycopg.connect(database, autocommit=True) as db:
            lease = leases[locks[row % 3]]
            written.append(execute(db, counting, lease.lock, update, (lease.token, row)).fetchone())

    threads = [threading.Thread(target=write, args=(row,)) for row in rows]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(written) == [(row,) for row in rows]
    assert counting.asked == 3
    assert counting.most <= postgres.MAX_FLOOR_REQUESTS
    for lease in leases.values():
        lease.release()
