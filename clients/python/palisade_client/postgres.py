"""Fenced writes to PostgreSQL from Python, with the floors of a database that went back.

A database restarted, restored or failed over may have forgotten fences it raised: Palisade's
triggers (migration 8) then refuse each lock's first fenced write with SQLSTATE ``P5008``
until its floor — the coordinator's word on who is superseded — is recorded again. ``execute``
does that: it runs your statement, and on ``P5008`` asks the coordinator for the lock's floor
(``Client.floor``), records it with ``palisade_learn_floor`` and runs the statement once more.
A write below the floor raises ``Superseded``: stop, do not retry.

    from palisade_client.postgres import execute

    with client.lock("report/7") as lease, psycopg.connect(dsn) as db:
        row = execute(db, client, lease.lock,
                      "UPDATE report_result SET payload = %s, last_fence = t.epoch"
                      " FROM palisade_present_token(%s) AS t(epoch)"
                      " WHERE id = %s AND last_fence OPERATOR(pg_catalog.<) t.epoch"
                      " RETURNING id",
                      (payload, lease.token, 7), token=lease.token).fetchone()

Pass the lease's token, not its epoch: on a table guarded by ``palisade resource guard`` the
database reads the lock and epoch from the token and refuses a bare epoch (``P5010``), another
lock's token (``P5011``) or a ``last_fence`` that is not the token's epoch (``P5012``).

Given ``token=``, a refused stale write is recorded where ``palisade audit`` and the console
read it (``palisade_record_refusal``, migration 12): the refused transaction rolled back with
anything it wrote, so the record is made after it, committed at once outside a transaction (in
the caller's transaction, it goes with the caller's commit or rollback).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from palisade_client.client import Client, PalisadeError

FLOOR_UNKNOWN = "P5008"
"""SQLSTATE: the database does not know the lock's floor since it started or was restored."""
BELOW_FLOOR = "P5009"
"""SQLSTATE: the row's epoch is below its lock's floor (DETAIL: the floor)."""


MAX_FLOOR_REQUESTS = 8
"""Most floor requests this process has in flight at once, across locks: after a database
restart every lock's next write needs its floor at once."""

_FLOOR_REQUESTS = threading.BoundedSemaphore(MAX_FLOOR_REQUESTS)
_TURNS_GUARD = threading.Lock()
_TURNS: dict = {}


@contextmanager
def _floor_turn(lock: str) -> Iterator[None]:
    """Held, no other thread of this process learns ``lock``'s floor: one learner per lock,
    the others wait and then find the floor known."""
    with _TURNS_GUARD:
        turn = _TURNS.setdefault(lock, [threading.Lock(), 0])
        turn[1] += 1
    try:
        with turn[0]:
            yield
    finally:
        with _TURNS_GUARD:
            turn[1] -= 1
            if turn[1] == 0:
                del _TURNS[lock]


class Superseded(PalisadeError):
    """The write's epoch is below the lock's floor: a newer owner exists. Nothing was written."""

    def __init__(self, message: str, floor: int):
        super().__init__(message)
        self.floor = floor


def learn_floor(db: Any, client: Client, lock: str) -> int:
    """Asks the coordinator for ``lock``'s floor, verifies its signed statement
    (``Client.floor_statement``: a floor that does not verify raises ``Unavailable`` and nothing
    is recorded) and records both in ``db`` (a floor never goes down; the audit verifies the
    statement again); the floor now in force. Committed before it returns on a connection with
    no transaction open (autocommit or not); inside the caller's transaction, a savepoint of
    it."""
    import psycopg

    floor, statement = client.floor_statement(lock)
    # psycopg's default connection opens a transaction at its first statement and commits
    # nothing by itself: a bare SELECT here would leave one open, every later write of this
    # connection inside it, acknowledged and lost. `transaction()` commits it (or is a
    # savepoint of the caller's).
    with db.transaction():
        try:
            with db.transaction():
                row = db.execute("SELECT palisade_learn_floor(%s, %s, %s)",
                                 (lock, floor, statement)).fetchone()
        except psycopg.errors.UndefinedFunction:
            # A database before migration 10: the floor without its statement.
            row = db.execute("SELECT palisade_learn_floor(%s, %s)", (lock, floor)).fetchone()
    return int(row[0])


def record_refusal(db: Any, token: str) -> bool:
    """Records that ``token``'s write was refused as stale (``palisade_record_refusal``): the
    database records it only if the token is below what it holds for its lock. Best effort:
    False when nothing was recorded (not stale, a database before migration 12, or a role
    without the grant)."""
    import psycopg

    try:
        with db.transaction():
            row = db.execute("SELECT palisade_record_refusal(%s)", (token,)).fetchone()
        return bool(row[0])
    except psycopg.Error:
        return False


def execute(db: Any, client: Client, lock: str, query: str, params: Sequence[Any] = (),
            *, token: str | None = None) -> Any:
    """Runs ``query`` on the psycopg connection ``db``, learning ``lock``'s floor first when
    the database asks for it; the cursor. With no transaction open (autocommit or psycopg's
    default), the write is committed when this returns; inside the caller's transaction it is
    a savepoint, committed with the caller's, and the transaction is left as it was. One
    thread of the process learns a lock's floor at a time, and at most
    ``MAX_FLOOR_REQUESTS`` ask the coordinator at once. With ``token`` (the lease's), a
    refused stale write is recorded for the audit and the console (``record_refusal``)."""
    import psycopg

    def run() -> Any:
        try:
            with db.transaction():
                return db.execute(query, params)
        except psycopg.Error as error:
            if error.sqlstate == BELOW_FLOOR:
                detail = error.diag.message_detail or "0"
                if token is not None:
                    record_refusal(db, token)
                raise Superseded(error.diag.message_primary or str(error), int(detail)) from None
            raise

    try:
        return run()
    except psycopg.Error as error:
        if error.sqlstate != FLOOR_UNKNOWN:
            raise
    with _floor_turn(lock):
        try:
            return run()  # another thread learned the floor while this one waited
        except psycopg.Error as error:
            if error.sqlstate != FLOOR_UNKNOWN:
                raise
        with _FLOOR_REQUESTS:
            learn_floor(db, client, lock)
    return run()
