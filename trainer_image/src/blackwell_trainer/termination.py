"""The pod's termination message: one line for people (retryable or permanent) and the OOM result line.

Kubernetes copies the file into the pod's status when the container ends (lastState.terminated.message);
the rendered pod falls back to the log's tail when it is empty.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys

from .config import PERMANENT_ERROR_PREFIX
from .errors import NonFiniteStep
from .oom import GpuOutOfMemory

TERMINATION_LOG_ENV = "BTJ_TERMINATION_LOG"
TERMINATION_LOG = "/dev/termination-log"
# The kubelet keeps at most 4096 bytes of the file.
MESSAGE_LIMIT = 4000


def fail(err: BaseException, code: int = 2) -> int:
    """One line on stderr and in the pod's termination message; returns `code` (2: plan or storage).

    The termination message says whether a restart can help: storage that failed to take saves may
    recover, and a non-finite step resumes from the last good checkpoint (both start `error: `); a
    plan, data or checkpoint that does not fit cannot (it starts PERMANENT_ERROR_PREFIX, and the
    operator stops the job instead of retrying it). A plan that ran out of GPU memory adds its OOM
    result as a second line (config.OOM_RESULT_MARKER), which the operator re-plans from.
    """
    from .checkpoint import StorageFailed  # not at start-up: a refused plan loads no checkpoint code

    line = f"error: {err}"
    print(line, file=sys.stderr)
    retryable = isinstance(err, StorageFailed | NonFiniteStep)
    message = line if retryable else f"{PERMANENT_ERROR_PREFIX}{err}"
    if isinstance(err, GpuOutOfMemory):
        # On stderr too: the pod falls back to the log's tail when the termination file stays empty.
        result_line = err.result.to_line()
        print(result_line, file=sys.stderr)
        # The first line is cut to fit the kubelet's 4096 bytes beside the result line, never the result.
        message = f"{message[: MESSAGE_LIMIT - len(result_line)]}\n{result_line}"
    write_message(message[:MESSAGE_LIMIT] + "\n")
    return code


def read_message() -> str:
    """What an earlier start in this container wrote to the termination file ("" when none)."""
    try:
        with open(os.environ.get(TERMINATION_LOG_ENV, TERMINATION_LOG)) as log:
            return log.read(8192)
    except OSError:
        return ""


def write_message(text: str) -> None:
    """Replace the pod's termination message; ranks that fail together write one after another (flock),
    so the file holds one whole message, not an interleaving of several."""
    path = os.environ.get(TERMINATION_LOG_ENV, TERMINATION_LOG)
    # Outside a pod the file does not exist (or is not ours to create): the stderr line is enough.
    if not (os.path.exists(path) or TERMINATION_LOG_ENV in os.environ):
        return
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, 0)
            os.write(fd, text.encode())
        finally:
            os.close(fd)  # releases the lock
