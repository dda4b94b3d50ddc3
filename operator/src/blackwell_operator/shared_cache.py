"""A functools.cache that computes each value once even when many threads ask for it at the same time.

functools.cache is thread-safe for its dictionary but not for the computation: the operator's sixteen
handler threads all missed it together on the first burst of BTJs and each compiled the CEL grammar and
parsed the catalogs and calibration itself (sixteen times the CPU). One lock per function makes the first
caller compute and the others wait for its value; afterwards a call is a lock and a dictionary lookup.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def shared_cache(function: Callable[P, R]) -> Callable[P, R]:
    """`function` cached by its arguments, computed once per arguments across threads."""
    cached = functools.cache(function)
    lock = threading.Lock()

    @functools.wraps(function)
    def once(*args: P.args, **kwargs: P.kwargs) -> R:
        with lock:
            # The arguments are hashable wherever functools.cache would take them; ParamSpec cannot say so.
            return cached(*args, **kwargs)  # type: ignore[arg-type]

    once.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
    return once
