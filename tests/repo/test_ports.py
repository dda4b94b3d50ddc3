"""tests/ports.py: parallel test workers are never given the same port, nor one the kernel hands out."""

from __future__ import annotations

import contextlib
import socket

import pytest

from tests import ports


def test_the_workers_blocks_are_apart_and_below_the_kernels_ephemeral_ports() -> None:
    ephemeral = 32768
    blocks = [ports.worker_block(i, ephemeral) for i in range(16)]
    assert all(b is not None and b.start >= ports.LOWEST and b.stop <= ephemeral for b in blocks)
    taken = [port for b in blocks if b is not None for port in b]
    assert len(taken) == len(set(taken)) == 16 * ports.BLOCK
    assert ports.worker_block(0, ports.LOWEST + ports.BLOCK - 1) is None  # no room: the kernel picks


def test_a_worker_is_given_ports_of_its_own_block_each_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setattr(ports, "_given", set())
    block = ports.worker_block(3, ports.ephemeral_start())
    assert block is not None
    given = [ports.free_port() for _ in range(20)]
    assert all(port in block for port in given) and len(set(given)) == 20


def test_a_port_something_listens_on_is_never_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw5")
    monkeypatch.setattr(ports, "_given", set())
    block = ports.worker_block(5, ports.ephemeral_start())
    assert block is not None
    with contextlib.ExitStack() as stack:
        left = None
        for port in block:
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use elsewhere: not free either
            if left is None:
                left = port  # the one port left free
                sock.close()
            else:
                sock.listen()
        assert left is not None
        # The only free port, given again once every port of the block has had its turn.
        assert [ports.free_port() for _ in range(3)] == [left, left, left]
