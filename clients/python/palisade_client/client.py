"""The client: a gRPC channel to one coordinator (following a cluster's leader), leases, and
errors by what the caller can do about them."""

from __future__ import annotations

import contextlib
import datetime
import getpass
import math
import re
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Iterator, Optional, Union

import grpc

from palisade_client.v1 import palisade_pb2 as pb
from palisade_client.v1 import palisade_pb2_grpc as pb_grpc

#: Metadata key of a follower's UNAVAILABLE answer naming the leader's URL.
LEADER_METADATA = "palisade-leader"
#: How many times one call follows a leader hint before giving up.
MAX_REDIRECTS = 3


class PalisadeError(Exception):
    """Any failure of a Palisade call."""


class InvalidArgument(PalisadeError):
    """The request breaks a rule (bad lock name, TTL, wait, holder); retrying will not help."""


class LockHeld(PalisadeError):
    """The lock is held by another owner (and the wait, if any, ran out)."""


class RefusedByPolicy(PalisadeError):
    """The coordinator's lock policy refuses the acquire (a critical lock asked as efficiency,
    or a critical lock with no boundary under --require-policy)."""


Duration = Union[int, float, str, datetime.timedelta]
"""A duration: a number of **seconds** (as everywhere in this client), text with its unit
(``"500ms"``, ``"10s"``, ``"1m"``, ``"1h"``, as the CLI and the TypeScript client take it), or a
``datetime.timedelta``."""

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def seconds(duration: Duration, what: str = "duration") -> float:
    """Seconds of a :data:`Duration`; ``InvalidArgument`` for anything else."""
    if isinstance(duration, bool):
        raise InvalidArgument(f"{what} {duration!r} is not a duration")
    if isinstance(duration, (int, float)):
        value = float(duration)
    elif isinstance(duration, datetime.timedelta):
        value = duration.total_seconds()
    elif isinstance(duration, str):
        match = _DURATION.match(duration.strip())
        if not match:
            raise InvalidArgument(f"{what} {duration!r}: use seconds (10), '10s', '500ms' or '1m'")
        value = float(match.group(1)) * _UNITS[match.group(2)]
    else:
        raise InvalidArgument(f"{what} {duration!r}: use seconds (10), '10s' or a timedelta")
    if not math.isfinite(value) or value < 0:
        raise InvalidArgument(f"{what} {duration!r} is not a duration")
    return value


class LeaseLost(PalisadeError):
    """The lease is unknown, released or expired: stop writing under it."""


class Unauthenticated(PalisadeError):
    """No credentials, or credentials the coordinator does not know."""


class PermissionDenied(PalisadeError):
    """The credentials lack the right for this lock, or the lease is another principal's."""


class Unavailable(PalisadeError):
    """The coordinator cannot answer now; the outcome of a state-changing call is unknown."""


_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.ALREADY_EXISTS: LockHeld,
    grpc.StatusCode.RESOURCE_EXHAUSTED: LockHeld,
    grpc.StatusCode.FAILED_PRECONDITION: RefusedByPolicy,
    grpc.StatusCode.NOT_FOUND: LeaseLost,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Unavailable,
}

_CLASSES = {
    None: pb.LOCK_CLASS_UNSPECIFIED,
    "critical": pb.LOCK_CLASS_CRITICAL,
    "efficiency": pb.LOCK_CLASS_EFFICIENCY,
}


def _target(endpoint: str) -> tuple[str, bool]:
    """``HOST:PORT`` and whether to use TLS, from ``HOST:PORT`` or ``http(s)://HOST:PORT``."""
    endpoint = endpoint.strip().rstrip("/")
    if endpoint.startswith("https://"):
        return endpoint[len("https://"):], True
    if endpoint.startswith("http://"):
        return endpoint[len("http://"):], False
    if "://" in endpoint:
        raise InvalidArgument(f"{endpoint!r} is not a coordinator address; use HOST:PORT")
    return endpoint, False


def default_holder() -> str:
    """``user@host:pid`` of this process."""
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name is not an error worth failing for
        user = "user"
    return f"{user}@{socket.gethostname()}:{os.getpid()}"


class Lease:
    """A granted lease: its lock, epoch, token and id. ``lost`` is set when the keepalive
    could not renew it (expired, released, or unreachable past its TTL)."""

    def __init__(self, client: "Client", reply: pb.AcquireResponse, sent: Optional[float] = None):
        self._client = client
        self.lock: str = reply.lock
        self.epoch: int = reply.epoch
        self.lease_id: str = reply.lease_id
        self.ttl: float = reply.ttl_ms / 1000.0
        self.holder: str = reply.holder
        self.principal: str = reply.principal
        self.token: str = reply.token
        efficiency = getattr(reply, "class") == pb.LOCK_CLASS_EFFICIENCY
        self.lock_class: str = "efficiency" if efficiency else "critical"
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._keepalive: Optional[threading.Thread] = None
        # Until when the holder may believe it holds the lease (time.monotonic()): the send
        # time of the acquire or of the last confirmed renewal, plus the TTL.
        self._valid_until = (time.monotonic() if sent is None else sent) + self.ttl

    @property
    def valid(self) -> bool:
        """True while the lease is held and its validity has not run out: check it before a
        write. A ``True`` does not make the write safe — a pause can outlast the lease right
        after it — only the resource's fence does: send ``token`` with the write."""
        return (not self.lost.is_set() and not self._stop.is_set()
                and time.monotonic() < self._valid_until)

    def __repr__(self) -> str:
        return f"Lease(lock={self.lock!r}, epoch={self.epoch}, lease_id={self.lease_id!r})"

    def renew(self) -> None:
        """Renews the lease by its full TTL; raises :class:`LeaseLost` when it is gone."""
        sent = time.monotonic()
        self._client._call("Renew", pb.RenewRequest(lease_id=self.lease_id))
        self._valid_until = max(self._valid_until, sent + self.ttl)

    def release(self) -> None:
        """Releases the lease (stopping the keepalive). Releasing a lease already gone is not an
        error: the lock is free of it either way."""
        self._stop.set()
        if self._keepalive is not None and self._keepalive is not threading.current_thread():
            self._keepalive.join()
        try:
            self._client._call("Release", pb.ReleaseRequest(lease_id=self.lease_id))
        except LeaseLost:
            pass

    def start_keepalive(self) -> None:
        """Renews every ttl/3 seconds in a daemon thread until released or lost."""
        if self._keepalive is None:
            self._keepalive = threading.Thread(
                target=self._run_keepalive, name=f"palisade-keepalive-{self.lock}", daemon=True
            )
            self._keepalive.start()

    def _run_keepalive(self) -> None:
        interval = max(self.ttl / 3.0, 0.005)
        # A renewal that fails for a passing reason (unavailable) is retried until the lease's
        # TTL has run out since the last success; then it is lost either way.
        budget = self.ttl
        failing_for = 0.0
        while not self._stop.wait(interval):
            try:
                self.renew()
                failing_for = 0.0
            except LeaseLost:
                self.lost.set()
                return
            except Unavailable:
                failing_for += interval
                if failing_for >= budget:
                    self.lost.set()
                    return
            except PalisadeError:
                self.lost.set()
                return


class Client:
    """A connection to a Palisade coordinator (or a cluster's member: calls follow the leader
    it names)."""

    def __init__(
        self,
        endpoint: str = "127.0.0.1:7420",
        token: Optional[str] = None,
        ca: Optional[str] = None,
        timeout: float = 10.0,
        trusted_keys: Optional[list] = None,
    ):
        """``trusted_keys``: the coordinator's public keys (base64url, as ``GET /v1/keys``
        serves them) that floor statements must be signed with; without them the keys are
        asked of the coordinator over the gRPC channel."""
        from palisade_client import floors

        self._trusted_keys = floors.parse_keys(trusted_keys) if trusted_keys else None
        self._fetched_keys: Optional[dict] = None
        self._timeout = timeout
        self._token = token.strip() if token else None
        self._ca = ca
        self._lock = threading.Lock()
        self._endpoint = endpoint
        self._channel, self._stub = self._connect(endpoint)

    def _connect(self, endpoint: str):
        target, tls = _target(endpoint)
        if tls:
            root = open(self._ca, "rb").read() if self._ca else None
            channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=root))
        else:
            channel = grpc.insecure_channel(target)
        return channel, pb_grpc.CoordinatorStub(channel)

    def close(self) -> None:
        """Closes the channel."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _metadata(self):
        return (("authorization", f"Bearer {self._token}"),) if self._token else ()

    def _call(self, method: str, request, timeout: Optional[float] = None):
        for _ in range(MAX_REDIRECTS + 1):
            with self._lock:
                stub = self._stub
            try:
                return getattr(stub, method)(
                    request, timeout=timeout or self._timeout, metadata=self._metadata()
                )
            except grpc.RpcError as error:
                code, details = error.code(), error.details() or ""
                leader = dict(error.trailing_metadata() or ()).get(LEADER_METADATA)
                if code == grpc.StatusCode.UNAVAILABLE and leader and leader != self._endpoint:
                    with self._lock:
                        self._channel.close()
                        self._endpoint = leader
                        self._channel, self._stub = self._connect(leader)
                    continue
                raise _ERRORS.get(code, PalisadeError)(f"{code.name}: {details}") from None
        raise Unavailable(f"no leader after {MAX_REDIRECTS} redirects")

    def acquire(
        self,
        name: str,
        ttl: "Duration" = 10.0,
        wait: "Duration" = 0.0,
        holder: Optional[str] = None,
        lock_class: Optional[str] = None,
        request_id: Optional[str] = None,
    ) -> Lease:
        """Acquires ``name`` for ``ttl``, waiting up to ``wait`` for a held lock (each a
        :data:`Duration`: seconds, ``"10s"``/``"500ms"``, or a ``timedelta``). No keepalive:
        renew it yourself, or use :meth:`lock`. A retry with the same ``request_id`` returns the
        same lease while it is live."""
        if lock_class not in _CLASSES:
            raise InvalidArgument(f"lock_class {lock_class!r} is unknown; use critical or efficiency")
        ttl, wait = seconds(ttl, "ttl"), seconds(wait, "wait")
        if ttl <= 0 or wait < 0:
            raise InvalidArgument("ttl must be positive and wait not negative")
        fields = {
            "lock": name,
            "ttl_ms": int(round(ttl * 1000)),
            "wait_ms": int(round(wait * 1000)),
            "holder": default_holder() if holder is None else holder,
            "request_id": request_id or uuid.uuid4().hex,
        }
        request = pb.AcquireRequest(**fields)
        setattr(request, "class", _CLASSES[lock_class])
        sent = time.monotonic()
        reply = self._call("Acquire", request, timeout=wait + self._timeout)
        # Validity counts from the grant, not the send, after a wait for a held lock.
        return Lease(self, reply, sent=sent if wait == 0 else None)

    @contextlib.contextmanager
    def lock(self, name: str, ttl: "Duration" = 10.0, wait: "Duration" = 0.0,
             **options) -> Iterator[Lease]:
        """Holds ``name`` for the ``with`` block: acquires, keeps the lease alive, releases on
        exit (also on an exception)."""
        lease = self.acquire(name, ttl=ttl, wait=wait, **options)
        lease.start_keepalive()
        try:
            yield lease
        finally:
            lease.release()

    def floor_statement(self, name: str) -> tuple:
        """The lock's floor and the coordinator's signed statement of it, verified: every owner
        below the floor is superseded or its lease has ended (``GET /v1/locks/NAME/floor`` on
        the coordinator's port; a follower's answer naming the leader is followed once). What a
        database that was restarted or restored asks before it trusts its fences again
        (``palisade_client.postgres``). The statement's Ed25519 signature is checked against
        ``trusted_keys`` when the client was given them, else against the coordinator's keys
        (its ``Keys`` call, over the gRPC channel; asked again when a statement names a key not
        seen yet): a floor that does not verify raises ``Unavailable`` and is never returned."""
        from palisade_client import floors

        path = f"/v1/locks/{urllib.parse.quote(name, safe='')}/floor"
        answer, base = self._get_json(path)
        statement = answer.get("statement")
        if not isinstance(statement, str):
            raise Unavailable(f"GET {path}: no floor statement (an older coordinator?)")
        try:
            if floors.statement_key_id(statement) not in self._floor_keys(refresh=False):
                self._floor_keys(refresh=True)
            claims = floors.verify(statement, name, self._floor_keys(refresh=False))
        except floors.FloorError as why:
            raise Unavailable(f"the floor statement from {base}{path} does not verify: {why}") from None
        if str(answer.get("floor")) != str(claims.floor):
            raise Unavailable(
                f"GET {path}: the answer says floor {answer.get('floor')}, its signed statement"
                f" {claims.floor}"
            )
        return claims.floor, statement

    def floor(self, name: str) -> int:
        """The lock's verified floor (see ``floor_statement``)."""
        return self.floor_statement(name)[0]

    def _floor_keys(self, refresh: bool) -> dict:
        """The keys floor statements are checked with: the pinned ones, or the coordinator's."""
        from palisade_client import floors

        if self._trusted_keys is not None:
            return self._trusted_keys
        if refresh or self._fetched_keys is None:
            # Over the gRPC channel the tokens come from (TLS with ``ca``, or loopback): a
            # man in the middle of the floor's HTTP request cannot answer this too.
            reply = self._call("Keys", pb.KeysRequest())
            try:
                self._fetched_keys = floors.parse_keys([key.public_key for key in reply.keys])
            except floors.FloorError as why:
                raise Unavailable(f"the coordinator's keys: {why}") from None
        return self._fetched_keys

    def _get_json(self, path: str) -> tuple:
        """``GET path`` on the coordinator's port (following a follower's leader once): the JSON
        and the base URL that answered."""
        target, tls = _target(self._endpoint)
        base = f"{'https' if tls else 'http'}://{target}"
        context = None
        if base.startswith("https://"):
            import ssl

            context = ssl.create_default_context(cafile=self._ca)
        for _ in range(2):
            try:
                with urllib.request.urlopen(base + path, timeout=self._timeout, context=context) as answer:
                    return json.load(answer), base
            except urllib.error.HTTPError as error:
                body = json.loads(error.read() or b"{}")
                if body.get("error") == "not_leader" and body.get("leader"):
                    base = body["leader"].rstrip("/")
                    continue
                raise Unavailable(f"GET {path}: {error.code} {body}") from None
            except (urllib.error.URLError, OSError, ValueError, KeyError) as error:
                raise Unavailable(f"GET {base}{path}: {error}") from None
        raise Unavailable(f"GET {path}: no member names a leader")

    def describe(self, name: str) -> pb.LockInfo:
        """The lock's state: ``held``, ``epoch``, ``holder``, ``remaining_ms``, ``waiters``, and
        ``granted_unix_ms`` (when the lease was granted, ms since the Unix epoch; 0 if free)."""
        return self._call("Describe", pb.DescribeRequest(lock=name))
