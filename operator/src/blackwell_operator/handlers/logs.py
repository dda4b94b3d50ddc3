"""The logger a handler takes: Kopf's per-object logger (a logging.LoggerAdapter) or a plain Logger (the
resync loop's, a test's)."""

from __future__ import annotations

import logging
from typing import Any, TypeAlias

Logger: TypeAlias = logging.Logger | logging.LoggerAdapter[Any]
