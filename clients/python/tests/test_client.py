"""The Python client against a real coordinator."""

import os
import pathlib
import subprocess
import sys
import threading
import time

import pytest

from palisade_client import (
    Client,
    InvalidArgument,
    LeaseLost,
    LockHeld,
    RefusedByPolicy,
    Unavailable,
)

HERE = pathlib.Path(__file__).resolve().parent.parent
# The fenced statement the README gives: the token, not a bare epoch (payload, token, row).
UPDATE = ("UPDATE report_result SET payload = %s, last_fence = t.epoch"
          " FROM palisade_present_token(%s) AS t(epoch)"
          " WHERE id = %s AND last_fence OPERATOR(pg_catalog.<) t.epoch RETURNING id")


def test_lock_yields_a_signed_token_and_releases_on_exit(coordinator):
    client = Client(coordinator.address)
    with client.lock("report/7", ttl=5) as lease:
        assert lease.epoch >= 1
        assert lease.lock == "report/7"
        assert lease.token.count(".") >= 1, lease.token
        info = client.describe("report/7")
        assert info.held and info.epoch == lease.epoch
        # Held since: the grant's wall-clock time (ms since the Unix epoch).
        assert abs(info.granted_unix_ms - time.time() * 1000) < 60_000, info.granted_unix_ms
    assert not client.describe("report/7").held
    # The next owner gets a higher epoch (P1).
    with client.lock("report/7", ttl=5) as second:
        assert second.epoch > lease.epoch


def test_epochs_above_2_pow_53_are_exact_over_grpc_and_json(coordinator):
    """Epochs start at the clock floor (ms x 2^20, about 2^61): a float would round them.
    gRPC gives Python an exact int; the HTTP API writes the same value as a decimal string."""
    import json
    import urllib.request

    client = Client(coordinator.address)
    with client.lock("exact/1", ttl=5) as lease:
        assert isinstance(lease.epoch, int) and lease.epoch > 2**53
        with urllib.request.urlopen(
            f"http://{coordinator.address}/v1/locks/exact%2F1", timeout=5
        ) as reply:
            shown = json.load(reply)
        assert shown["epoch"] == str(lease.epoch)
        assert int(shown["epoch"]) == lease.epoch
    with client.lock("exact/1", ttl=5) as second:
        assert second.epoch > lease.epoch


def test_the_keepalive_holds_the_lease_past_its_ttl(coordinator):
    client = Client(f"http://{coordinator.address}")
    with client.lock("keep/1", ttl=0.3) as lease:
        time.sleep(1.2)
        assert not lease.lost.is_set()
        info = client.describe("keep/1")
        assert info.held and info.epoch == lease.epoch


def test_a_lost_lease_is_reported(coordinator):
    client = Client(coordinator.address)
    lease = client.acquire("lost/1", ttl=0.2)
    time.sleep(0.5)
    with pytest.raises(LeaseLost):
        lease.renew()
    # The keepalive notices too.
    with client.lock("lost/2", ttl=0.6) as held:
        # Someone else releases it (the coordinator runs without auth: anyone may).
        from palisade_client.v1 import palisade_pb2 as pb

        Client(coordinator.address)._call("Release", pb.ReleaseRequest(lease_id=held.lease_id))
        # Renewals every ttl/3: within a few seconds the loss is seen.
        assert held.lost.wait(timeout=5)


def test_a_held_lock_raises_and_a_waiter_gets_it(coordinator):
    client = Client(coordinator.address)
    first = client.acquire("hot/1", ttl=5)
    with pytest.raises(LockHeld):
        client.acquire("hot/1", ttl=5)
    threading.Timer(0.3, first.release).start()
    second = client.acquire("hot/1", ttl=5, wait=5)
    assert second.epoch > first.epoch
    second.release()


def test_bad_input_is_refused_with_the_rule(coordinator):
    client = Client(coordinator.address)
    with pytest.raises(InvalidArgument):
        client.acquire("bad name with spaces", ttl=5)
    with pytest.raises(InvalidArgument):
        client.acquire("x", ttl=99 * 3600)
    with pytest.raises(InvalidArgument):
        client.acquire("x", lock_class="bogus")
    with pytest.raises(InvalidArgument):
        Client("ftp://127.0.0.1:1")


def test_an_unreachable_coordinator_is_unavailable(tmp_path):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = Client(f"127.0.0.1:{port}", timeout=1)
    with pytest.raises(Unavailable):
        client.acquire("x", ttl=5)


def test_the_policy_decides_the_class_and_can_refuse(start_coordinator, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(
        'default_class = "efficiency"\n'
        '[[lock]]\npattern = "report/*"\nclass = "critical"\n'
        'boundary = { kind = "resource", url = "http://127.0.0.1:1" }\n'
    )
    running = start_coordinator("--policy", str(policy), "--require-policy")
    client = Client(running.address)
    with client.lock("report/1", ttl=5) as lease:
        assert lease.lock_class == "critical"
    with client.lock("cache/1", ttl=5) as lease:
        assert lease.lock_class == "efficiency"
    with pytest.raises(RefusedByPolicy):
        client.acquire("report/2", ttl=5, lock_class="efficiency")
    with pytest.raises(RefusedByPolicy):
        client.acquire("orders/1", ttl=5, lock_class="critical")


def test_the_committed_stubs_match_the_proto(tmp_path):
    """The committed stubs are what grpcio-tools makes from proto/palisade.proto today."""
    generated = tmp_path / "out"
    generated.mkdir()
    proto = HERE.parent.parent / "proto"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-Ipalisade_client/v1={proto}",
         f"--python_out={generated}", f"--grpc_python_out={generated}",
         "palisade_client/v1/palisade.proto"],
        check=True, cwd=HERE,
    )
    for name in ["palisade_pb2.py", "palisade_pb2_grpc.py"]:
        fresh = (generated / "palisade_client" / "v1" / name).read_text()
        committed = (HERE / "palisade_client" / "v1" / name).read_text()
        assert fresh == committed, f"{name} is stale: regenerate it (clients/python/README.md)"


def test_p1_the_postgres_example_fences_a_paused_owner(coordinator, database):
    """P1: the 20-line example writes under its lease; an owner that paused past its lease and
    writes after a newer owner is refused by the same statement."""
    import psycopg

    env = {**os.environ, "PALISADE_ENDPOINT": coordinator.address, "PYTHONPATH": str(HERE)}
    example = [sys.executable, str(HERE / "examples" / "fence_postgres.py"), database, "7"]
    written = subprocess.run(example + ["first"], env=env, capture_output=True, text=True)
    assert written.returncode == 0, written.stderr
    assert "written at epoch" in written.stdout

    # A paused owner: acquired, lease expired while it slept; a new owner ran the example.
    client = Client(coordinator.address)
    paused = client.acquire("report/7", ttl=0.1)
    time.sleep(0.3)
    newer = subprocess.run(example + ["newer"], env=env, capture_output=True, text=True)
    assert newer.returncode == 0, newer.stderr
    with psycopg.connect(database, autocommit=True) as db:
        # A newer owner's token was presented for the lock: the paused one is superseded.
        with pytest.raises(psycopg.Error) as stale:
            db.execute(UPDATE, ("stale", paused.token, 7))
        assert stale.value.sqlstate == "P5009"
        row = db.execute("SELECT payload, last_fence FROM report_result WHERE id = 7").fetchone()
    assert row[0] == "newer" and row[1] > paused.epoch

    # The guard refuses a write that does not raise the fence, whoever makes it.
    with psycopg.connect(database, autocommit=True) as db:
        with pytest.raises(psycopg.Error, match="last_fence"):
            db.execute("UPDATE report_result SET payload = 'bypass' WHERE id = 7")

    # P4: a bare epoch, or the token of another lock, is refused by the database itself.
    with psycopg.connect(database, autocommit=True) as db:
        with pytest.raises(psycopg.Error) as bare:
            db.execute("UPDATE report_result SET last_fence = 9000000000000000000 WHERE id = 7")
        assert bare.value.sqlstate == "P5010"
        other = client.acquire("report/8", ttl=10)
        with pytest.raises(psycopg.Error) as wrong_lock:
            db.execute("UPDATE report_result SET payload = 'x', last_fence = t.epoch"
                       " FROM palisade_present_token(%s) AS t(epoch) WHERE id = 7",
                       (other.token,))
        assert wrong_lock.value.sqlstate == "P5011"
        other.release()

    # The example run as that paused owner would be refused too: a row fenced above its epoch
    # (raised by the table's owner, the token check switched off for it).
    with psycopg.connect(database, autocommit=True) as db:
        db.execute("ALTER TABLE report_result DISABLE TRIGGER palisade_guard_token")
        db.execute("UPDATE report_result SET last_fence = last_fence + 1000 WHERE id = 7")
        db.execute("ALTER TABLE report_result ENABLE ALWAYS TRIGGER palisade_guard_token")
    refused = subprocess.run(example + ["late"], env=env, capture_output=True, text=True)
    assert refused.returncode == 1
    assert "refused: row 7 is fenced at" in refused.stderr

    # A row that does not exist is said to be missing, not fenced by a newer owner.
    missing = [sys.executable, str(HERE / "examples" / "fence_postgres.py"), database, "8"]
    absent = subprocess.run(missing + ["x"], env=env, capture_output=True, text=True)
    assert absent.returncode == 1
    assert "no row 8 in report_result" in absent.stderr, absent.stderr


def test_the_readme_block_runs(coordinator):
    """The README's Python block, run as written (the default address is this test's)."""
    readme = (HERE / "README.md").read_text()
    block = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert "127.0.0.1:7420" in block
    written = []
    namespace = {"write_report": lambda **kw: written.append(kw) or True}
    exec(compile(block.replace("127.0.0.1:7420", coordinator.address), "README.md", "exec"), namespace)
    assert len(written) == 1 and written[0]["fence"] >= 1 and written[0]["token"]


def test_credentials_are_sent_and_refusals_typed(start_coordinator, tmp_path):
    """A coordinator with principals: the token authenticates; none, or a wrong one, is refused;
    a principal without the right gets PermissionDenied."""
    from palisade_client import PermissionDenied, Unauthenticated

    binary = os.environ["PALISADE_BIN"]
    lines = ""
    for principal in ["orders", "reader"]:
        made = subprocess.run(
            [binary, "auth", "new", principal, "--secret-file", str(tmp_path / principal)],
            check=True, capture_output=True, text=True,
        )
        lines += made.stdout
    (tmp_path / "auth").write_text(lines)
    (tmp_path / "acl").write_text("orders acquire orders/\nreader read *\n")
    running = start_coordinator("--auth-file", str(tmp_path / "auth"), "--acl-file", str(tmp_path / "acl"))
    secret = (tmp_path / "orders").read_text().strip()
    with Client(running.address, token=secret).lock("orders/1", ttl=5) as lease:
        assert lease.principal == "orders"
    with pytest.raises(Unauthenticated):
        Client(running.address).acquire("orders/2", ttl=5)
    with pytest.raises(Unauthenticated):
        Client(running.address, token="not-a-secret").acquire("orders/2", ttl=5)
    reader = (tmp_path / "reader").read_text().strip()
    with pytest.raises(PermissionDenied):
        Client(running.address, token=reader).acquire("orders/3", ttl=5)


def test_p6_a_database_that_went_back_learns_the_floor_and_refuses_the_superseded_owner(
    coordinator, database
):
    """P6/P8: the database forgets the newest owner's fence (its row goes back, and its floors
    with the rest, as a restore would leave them). A superseded owner's plain-SQL write is
    refused anyway: the database asks for the lock's floor (P5008), ``execute`` learns it from
    the coordinator, and the write is below it (``Superseded``)."""
    import psycopg

    from palisade_client.postgres import Superseded, execute

    env = {**os.environ, "PALISADE_ENDPOINT": coordinator.address, "PYTHONPATH": str(HERE)}
    example = [sys.executable, str(HERE / "examples" / "fence_postgres.py"), database, "7"]
    client = Client(coordinator.address)
    paused = client.acquire("report/7", ttl=0.1)
    time.sleep(0.3)
    newer = subprocess.run(example + ["newer"], env=env, capture_output=True, text=True)
    assert newer.returncode == 0, newer.stderr

    # The put-back: the row's fence goes back to 0, and the floors are a file that went back.
    with psycopg.connect(database, autocommit=True) as db:
        db.execute("ALTER TABLE report_result DISABLE TRIGGER palisade_guard_update")
        db.execute("ALTER TABLE report_result DISABLE TRIGGER palisade_guard_token")
        db.execute("UPDATE report_result SET payload = 'old', last_fence = 0 WHERE id = 7")
        db.execute("ALTER TABLE report_result ENABLE ALWAYS TRIGGER palisade_guard_update")
        db.execute("ALTER TABLE report_result ENABLE ALWAYS TRIGGER palisade_guard_token")
        db.execute("TRUNCATE palisade_lock_floors")
        db.execute("TRUNCATE palisade_presented_tokens")

    with psycopg.connect(database, autocommit=True) as db:
        # The plain statement alone is stopped until the floor is known again ...
        with pytest.raises(psycopg.Error) as unknown:
            db.execute(UPDATE, ("stale", paused.token, 7))
        assert unknown.value.sqlstate == "P5008"
        # ... and `execute` learns it from the coordinator: the paused owner is superseded.
        with pytest.raises(Superseded) as superseded:
            execute(db, client, "report/7", UPDATE, ("stale", paused.token, 7),
                    token=paused.token)
        assert superseded.value.floor > paused.epoch
        # The refusal is recorded where the audit and the console read it (migration 12).
        recorded = db.execute(
            "SELECT fence FROM palisade_recent_refusals(1000) WHERE lock = 'report/7' AND epoch = %s",
            (paused.epoch,)).fetchall()
        assert recorded and recorded[0][0] > paused.epoch, recorded
        assert db.execute("SELECT payload FROM report_result WHERE id = 7").fetchone()[0] == "old"
    # The current owner writes on.
    again = subprocess.run(example + ["again"], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr


def test_p8_writes_acknowledged_on_a_default_connection_survive_a_database_restart(
    coordinator, database
):
    """P8: on psycopg's default connection (not autocommit), after a database restart (every
    lock's floor unknown again: P5008), every write ``execute`` acknowledged is committed — seen
    from another session — and the connection is left with no transaction open. (``execute``
    once learned the floor with a bare SELECT, which opened a transaction nothing committed:
    every later write sat in it, acknowledged, and was lost with the session.)"""
    import psycopg

    from palisade_client.postgres import execute

    restart = os.environ.get("PALISADE_TEST_POSTGRES_RESTART")
    if not restart:
        pytest.fail("PALISADE_TEST_POSTGRES_RESTART is not set: run ./scripts/test")
    rows = [20, 21, 22]
    with psycopg.connect(database, autocommit=True) as db:
        for row in rows:
            db.execute("INSERT INTO report_result (id, lock, payload) VALUES (%s, %s, 'empty')",
                       (row, f"report/{row}"))
    client = Client(coordinator.address)
    leases = {row: client.acquire(f"report/{row}", ttl=60) for row in rows}
    subprocess.run(restart, shell=True, check=True, capture_output=True, timeout=60)

    with psycopg.connect(database) as db:
        for row, lease in leases.items():
            written = execute(db, client, lease.lock, UPDATE,
                              (f"after restart {row}", lease.token, row))
            assert written.fetchone() == (row,)
            assert db.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        # Another session sees every acknowledged write while this one is still open.
        with psycopg.connect(database, autocommit=True) as other:
            seen = other.execute(
                "SELECT id, payload, last_fence FROM report_result WHERE id = ANY(%s) ORDER BY id",
                (rows,),
            ).fetchall()
    assert seen == [(row, f"after restart {row}", leases[row].epoch) for row in rows]
    for lease in leases.values():
        lease.release()


def test_one_meaning_per_duration(coordinator):
    """A duration is seconds, text with its unit, or a timedelta; anything else is refused with
    InvalidArgument (``ttl="10s"`` raised a raw TypeError). A ttl of 10 seconds is 10 seconds at
    the coordinator."""
    import datetime
    import json
    import urllib.request

    from palisade_client import InvalidArgument, seconds

    assert seconds(10) == seconds("10s") == seconds(datetime.timedelta(seconds=10)) == 10.0
    assert seconds("500ms") == 0.5 and seconds("1m") == 60.0
    client = Client(coordinator.address)
    for bad in ["soon", "10", True, None, -1, float("nan")]:
        with pytest.raises(InvalidArgument):
            client.acquire("py/bad-duration", ttl=bad)
    for ttl in ["10s", datetime.timedelta(seconds=10), 10]:
        lease = client.acquire("py/ten", ttl=ttl)
        assert lease.ttl == 10.0
        with urllib.request.urlopen(f"http://{coordinator.address}/v1/locks/py%2Ften") as answer:
            remaining = json.load(answer)["remaining_ms"]
        assert 9_000 < remaining <= 10_000, remaining
        lease.release()


def test_lease_valid_before_the_write(coordinator):
    """``lease.valid`` is true while held and renewed, false once released or run out."""
    client = Client(coordinator.address)
    lease = client.acquire("py/valid", ttl="300ms")
    assert lease.valid
    time.sleep(0.4)  # no keepalive: the validity runs out
    assert not lease.valid
    with client.lock("py/valid-kept", ttl="300ms") as kept:
        time.sleep(0.5)  # the keepalive renews every 100 ms
        assert kept.valid
    assert not kept.valid  # released
    lease.release()
