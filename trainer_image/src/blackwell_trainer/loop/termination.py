"""The pod's termination message: one line for people (retryable or permanent), the OOM and probe lines.

Kubernetes copies the file into the pod's status when the container ends (lastState.terminated.message);
the rendered pod falls back to the log's tail when it is empty.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys

from blackwell_trainer.errors import NonFiniteStep
from blackwell_trainer.loop.oom import GpuOutOfMemory
from blackwell_trainer.plan.config import PERMANENT_ERROR_PREFIX, ProbeResult
from blackwell_trainer.plan.env_vars import TERMINATION_LOG_ENV

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
    from blackwell_trainer.checkpoint.store import (
        StorageFailed,
    )  # not at start-up: a refused plan loads no checkpoint code

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
    probe = _PROBE[0] or ProbeResult.find(read_message())
    if probe is not None:  # the probe's choice outlives a failure: the restart trains with it
        probe_line = probe.to_line()
        message = f"{message[: MESSAGE_LIMIT - len(probe_line) - 1]}\n{probe_line}"
    write_message(message[:MESSAGE_LIMIT] + "\n")
    return code


# The probe's result in this process, once it ran (or was kept from an earlier start): fail() adds its line
# to the termination message, and a run that completes writes it alone (succeeded()). Not written when the
# probe ends: an empty message lets a pod that is killed later fall back to its log's tail.
_PROBE: list[ProbeResult | None] = [None]


def remember_probe(result: ProbeResult) -> None:
    """Keep the probe's result for the termination message this process writes when it ends."""
    _PROBE[0] = result


def succeeded() -> None:
    """A completed run's termination message: the probe's line (the operator's status.probe), if any."""
    if _PROBE[0] is not None:
        write_message(_PROBE[0].to_line()[:MESSAGE_LIMIT] + "\n")


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
