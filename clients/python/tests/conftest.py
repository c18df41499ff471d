"""Fixtures: a real coordinator (the `palisade` binary named by PALISADE_BIN, which
scripts/test sets) on a loopback port of its own choosing, in a temporary directory."""

import os
import signal
import subprocess
import threading

import pytest


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
