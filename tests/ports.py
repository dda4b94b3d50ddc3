"""A free TCP port on the loopback interface, for servers the tests start (one helper for every test).

Tests run in parallel (pytest-xdist), so a port must not be handed to two workers. Each worker takes its
ports from a block of its own below the kernel's ephemeral range, where the kernel never picks a port by
itself (not for bind to port 0, not for an outgoing connection): a port one worker was given and has not
bound yet cannot be given to another worker, nor taken by a connection. A port is checked free before it
is handed out, and one process is given each port of its block once before any port again; a random
start in the block keeps two test runs of the same worker number (two people on one machine) from walking
the block in step.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

BLOCK = 400  # ports per worker: far more than one worker's tests hold at once
LOWEST = 10_000  # below: well-known and registered services
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_given: set[int] = set()


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's default, 32768, where it cannot be read)."""
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def worker_index() -> int:
    """This xdist worker's number (gw0 is 0); 0 outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    digits = name.removeprefix("gw")
    return int(digits) if digits.isdigit() else 0


def worker_block(index: int, ephemeral: int) -> range | None:
    """The ports of worker `index`, or None where the range below the ephemeral ports has no room."""
    blocks = (ephemeral - LOWEST) // BLOCK
    if blocks < 1:
        return None
    start = LOWEST + (index % blocks) * BLOCK
    return range(start, start + BLOCK)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _any_free() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port() -> int:
    """A port nothing listens on now, from this worker's block (the kernel's pick where there is none)."""
    block = worker_block(worker_index(), ephemeral_start())
    if block is None:
        return _any_free()
    offset = random.randrange(len(block))
    for _ in range(2):
        for i in range(len(block)):
            port = block[(offset + i) % len(block)]
            if port not in _given and _bindable(port):
                _given.add(port)
                return port
        _given.difference_update(block)  # every port given once: start the round again
    raise RuntimeError(f"no free port left in {block.start}-{block.stop - 1} for this test worker")
