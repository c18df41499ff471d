"""A thin Python client for the Palisade coordinator.

    from palisade_client import Client

    with Client("127.0.0.1:7420").lock("report/7", ttl=10) as lease:
        write(fence=lease.epoch, token=lease.token)

The lease is renewed in a background thread every ttl/3 seconds; ``lease.lost`` is set when a
renewal fails for good (the lease expired or was released). A lease is permission, not
protection: send ``lease.token`` or ``lease.epoch`` with every write and let the resource refuse
obsolete owners.
"""

from palisade_client.client import (
    Client,
    Duration,
    InvalidArgument,
    Lease,
    LeaseLost,
    LockHeld,
    PalisadeError,
    PermissionDenied,
    RefusedByPolicy,
    Unauthenticated,
    Unavailable,
    seconds,
)

__all__ = [
    "Client",
    "Duration",
    "InvalidArgument",
    "Lease",
    "LeaseLost",
    "LockHeld",
    "PalisadeError",
    "PermissionDenied",
    "RefusedByPolicy",
    "Unauthenticated",
    "Unavailable",
    "seconds",
]
