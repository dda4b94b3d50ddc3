"""Operator settings that are a number of seconds in an environment variable, refused with one line."""

from __future__ import annotations

import os


def env_seconds(name: str, default: float, *, zero_turns_off: bool) -> float | None:
    """The variable's seconds (`default` when unset); None for 0 when `zero_turns_off`.

    A value that is not a number, is negative, or is 0 where 0 means nothing raises ValueError naming the
    variable and the fix (the operator stops at start rather than run with a setting it cannot read).
    """
    raw = os.environ.get(name, "")
    fix = f"Fix: e.g. {default:g}" + (", or 0 for off" if zero_turns_off else "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name}={raw!r}: not a number of seconds. {fix}") from None
    if value < 0 or (value == 0 and not zero_turns_off):
        allowed = "must not be negative" if zero_turns_off else "must be positive"
        raise ValueError(f"{name}={raw!r}: {allowed}. {fix}")
    return value or None
