"""250 keepalive and 250 watch streams from one grpcio process (issue 26, item 13; P8).

grpcio shares one connection between its channels to the same address (its global subchannel
pool), so every stream below travels on one HTTP/2 connection whatever the channel count. At
the coordinator's old limit of 256 streams per connection, the 250 watches (which never end)
left the keepalives six slots; the other 244 queued inside grpcio until their leases expired
and the describe calls behind them stalled. This test hung before the limit was raised to 1,024.
"""

import threading
import time

import grpc

from palisade_client.v1 import palisade_pb2 as pb
from palisade_client.v1 import palisade_pb2_grpc as pb_grpc

STREAMS = 250
TTL_MS = 4000
RENEW_EVERY = 0.5
RUN_FOR = 8.0


def test_p8_five_hundred_mixed_streams_from_one_grpcio_process_are_all_served(coordinator):
    channels = [grpc.insecure_channel(coordinator.address) for _ in range(5)]
    stubs = [pb_grpc.CoordinatorStub(channel) for channel in channels]
    leases = [
        stubs[i % 5].Acquire(pb.AcquireRequest(lock=f"mixed/{i}", ttl_ms=TTL_MS), timeout=10)
        for i in range(STREAMS)
    ]
    stop = threading.Event()
    seen = {"refused": [], "released": 0, "longest_gap": 0.0}
    guard = threading.Lock()

    def keep(i):
        def renews():
            while not stop.is_set():
                yield pb.RenewRequest(lease_id=leases[i].lease_id)
                stop.wait(RENEW_EVERY)

        last = time.monotonic()
        try:
            for _ in stubs[i % 5].Keepalive(renews(), timeout=60):
                now = time.monotonic()
                with guard:
                    seen["longest_gap"] = max(seen["longest_gap"], now - last)
                last = now
        except grpc.RpcError as error:
            with guard:
                seen["refused"].append(f"{error.code()}: {error.details()}")
            return
        # Stopped: release at once, before the TTL runs out.
        stubs[i % 5].Release(pb.ReleaseRequest(lease_id=leases[i].lease_id), timeout=10)

    def watch(i):
        try:
            for event in stubs[(i + 1) % 5].Watch(pb.WatchRequest(lock=f"mixed/{i}"), timeout=60):
                if event.kind == "released":
                    with guard:
                        seen["released"] += 1
                    return
        except grpc.RpcError as error:
            with guard:
                seen["refused"].append(f"watch {error.code()}: {error.details()}")

    watchers = [threading.Thread(target=watch, args=(i,), daemon=True) for i in range(STREAMS)]
    keepers = [threading.Thread(target=keep, args=(i,), daemon=True) for i in range(STREAMS)]
    for thread in watchers + keepers:
        thread.start()
    time.sleep(RUN_FOR)
    # Twice the TTL later, every lease is held by the epoch it was granted (keepalives running).
    for i, lease in enumerate(leases):
        info = stubs[0].Describe(pb.DescribeRequest(lock=f"mixed/{i}"), timeout=5)
        assert info.held and info.epoch == lease.epoch, f"mixed/{i}: {info}"
    stop.set()
    for thread in keepers:
        thread.join(15)
    assert seen["refused"] == []
    assert seen["longest_gap"] < TTL_MS / 1000, seen["longest_gap"]
    for thread in watchers:
        thread.join(15)
    assert seen["released"] == STREAMS
    for channel in channels:
        channel.close()
