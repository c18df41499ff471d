"""Fixtures: a real coordinator (the `palisade` binary named by PALISADE_BIN, which
scripts/test sets) on a loopback port of its own choosing, in a temporary directory."""

import os
import pathlib
import signal
import subprocess
import threading

import pytest

HERE = pathlib.Path(__file__).resolve().parent.parent


def _binary():
    binary = os.environ.get("PALISADE_BIN")
    if not binary:
        pytest.fail("PALISADE_BIN is not set: run ./scripts/test, which builds palisade and sets it")
    return binary


class Coordinator:
    def __init__(self, directory, *extra):
        self.process = subprocess.Popen(
            [_binary(), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(directory / "data"), *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "RUST_LOG": "warn"},
        )
        prefix = "palisade coordinator listening on "
        for line in self.process.stderr:
            if line.startswith(prefix):
                self.address = line[len(prefix):].strip()
                break
        else:
            raise RuntimeError("the coordinator exited before listening")
        # Keep draining its stderr so it never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in self.process.stderr], daemon=True).start()

    def signal(self, number):
        self.process.send_signal(number)

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=10)


@pytest.fixture
def coordinator(tmp_path):
    running = Coordinator(tmp_path)
    yield running
    running.stop()


@pytest.fixture
def start_coordinator(tmp_path):
    started = []

    def start(*extra):
        running = Coordinator(tmp_path, *extra)
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


@pytest.fixture
def database():
    url = os.environ.get("PALISADE_TEST_POSTGRES_URL")
    if not url:
        pytest.fail("PALISADE_TEST_POSTGRES_URL is not set: run ./scripts/test")
    import psycopg

    table = "report_result"
    # The README's SQL block, run as written: the table the example writes to.
    readme = (HERE / "README.md").read_text()
    setup = readme.split("```sql\n", 1)[1].split("```", 1)[0]
    # Before the first guard the database has no Palisade functions: drop only what is there.
    unguard = (
        f"DO $$ BEGIN IF to_regclass('{table}') IS NOT NULL"
        " AND to_regproc('palisade_drop_guard') IS NOT NULL THEN"
        f" EXECUTE 'SELECT palisade_drop_guard(''{table}'')'; END IF; END $$"
    )
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(unguard)
        db.execute(f"DROP TABLE IF EXISTS {table}")
        for statement in filter(str.strip, setup.split(";")):
            db.execute(statement)
    # The README's guard, installed with the command it names.
    guard = [os.environ["PALISADE_BIN"], "resource", "guard", "--postgres", url,
             "--table", table, "--lock-column", "lock"]
    installed = subprocess.run(guard, capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr
    yield url
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(unguard)
        db.execute(f"DROP TABLE {table}")
