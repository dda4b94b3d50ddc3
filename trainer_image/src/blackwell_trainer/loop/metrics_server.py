"""The /metrics HTTP server: a fixed pool of threads, each connection bounded in time.

prometheus_client's own server starts a thread for every connection and waits on it for ever: anyone who
can reach the pod could hold one thread per idle connection (300 connections, 302 threads). Here at most
WORKERS connections are served at once, each may take IDLE_TIMEOUT_S per read or write, and a connection
that finds every worker busy is closed at once rather than queued.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

log = logging.getLogger(__name__)

# Prometheus and the operator's measure loop each scrape once every 15 to 60 s: two workers would do.
WORKERS = 4
IDLE_TIMEOUT_S = 10.0


class _Handler(WSGIRequestHandler):
    timeout = IDLE_TIMEOUT_S  # socketserver sets it on the connection: each read and write is bounded

    def log_message(self, format: str, *args: Any) -> None:
        return  # one line per scrape would flood the trainer's log


class BoundedServer(WSGIServer):
    """A WSGI server whose connections are served by a pool of `workers` threads."""

    # The listen backlog (socketserver's default is 5): a burst of connections is accepted, and the ones
    # beyond the pool closed, at once rather than left to the client's SYN retries.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], app: Callable[..., Iterable[bytes]], workers: int) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="btj-metrics")
        self._free = threading.BoundedSemaphore(workers)
        super().__init__(address, _Handler)
        self.set_app(app)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._free.acquire(blocking=False):
            self.shutdown_request(request)  # every worker busy: a scraper tries again at its next interval
            return
        self._pool.submit(self._serve, request, client_address)

    def _serve(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception as exc:  # a client that went quiet or away: its connection only
            log.debug("metrics connection from %s ended: %r", client_address, exc)
        finally:
            self.shutdown_request(request)
            self._free.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("metrics connection from %s failed", client_address)

    def server_close(self) -> None:
        super().server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def start(
    address: str, port: int, app: Callable[..., Iterable[bytes]]
) -> tuple[BoundedServer, threading.Thread]:
    """Serve `app` on address:port (0: a free port) from a daemon thread; (server, thread)."""
    server = BoundedServer((address, port), app, WORKERS)
    thread = threading.Thread(target=server.serve_forever, name="btj-metrics-accept", daemon=True)
    thread.start()
    return server, thread
