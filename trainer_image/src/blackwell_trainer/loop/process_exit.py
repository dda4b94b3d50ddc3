"""The trainer process's exit: the code main() returned, and no interpreter teardown under torch's threads.

Why the process does not end through Python's normal finalization: torch's gloo process group keeps two
worker threads (``pt_gloo_runloop``) for as long as its C++ object lives, and that is the whole process. It
has no shutdown (``destroy_process_group()`` only forgets it), and FSDP2's and DTensor's own caches keep
it alive after the trainer dropped every object of its own. Such a worker drops the last reference to a
collective's tensors after the collective completed, and when the tensor's Python object died first it
takes the GIL to free it. A worker that asks for the GIL just before the interpreter finalizes and gets it
during finalization is ended by CPython with ``pthread_exit``, whose unwinding crosses a ``noexcept`` C++
destructor: ``std::terminate``, "terminate called without an active exception", SIGABRT (exit -6) after a
run that had finished and recorded everything (CPython before 3.14 does this; CI runs 3.11). The
same worker is ended harmlessly by ``os._exit``.

So ``python -m blackwell_trainer`` ends with ``os._exit(code)`` from the last atexit handler: non-daemon
threads are joined and every other atexit handler (logging's flush, torch's) has run by then, with the
interpreter fully alive; what is skipped is the module teardown and garbage collection that would follow,
which the trainer does not need: its checkpoints, export and termination message are written (their files
closed) before main() returns, and os._exit loses only what is buffered in Python, which stdio no longer is.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from collections.abc import Callable
from typing import NoReturn

# What Python itself exits with for an exception that escapes (1) or Ctrl-C (128 + SIGINT).
EXIT_UNCAUGHT = 1
EXIT_INTERRUPTED = 130


def exit_status(code: object) -> int:
    """The status `SystemExit(code)` ends a Python process with: None is 0, an int itself, else 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return EXIT_UNCAUGHT  # Python prints a message code to stderr itself


class ProcessExit:
    """Ends the process with `code` from the last atexit handler (create it first, so that it is last).

    atexit runs handlers in the reverse order of registration, after the interpreter joined the
    non-daemon threads; an instance created before anything else registers one therefore exits after
    every other handler ran.
    """

    def __init__(self) -> None:
        self.code = EXIT_UNCAUGHT  # until run() knows better: an exception escaped
        atexit.register(self._exit)

    def run(self, entry: Callable[[], int]) -> NoReturn:
        """Call `entry` and exit with what it returns (or with its SystemExit's status, or 1 on an error)."""
        try:
            self.code = entry()
        except SystemExit as stop:  # argparse's usage errors (2), --help (0)
            self.code = exit_status(stop.code)
            raise
        except KeyboardInterrupt:
            self.code = EXIT_INTERRUPTED
            raise
        raise SystemExit(self.code)

    def _exit(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed or broken stream has nothing left to lose
                stream.flush()
        os._exit(self.code)
