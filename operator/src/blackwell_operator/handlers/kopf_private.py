"""Kopf's private modules (`kopf._cogs`), imported here and nowhere else.

Kopf's public API offers no hook for the two wrappers this operator installs (handlers/watch_gone.py: a
watch answered with HTTP 410 restarts instead of stopping the operator; handlers/kopf_patch.py: an empty
JSON patch is not built from a copy of the object), nor its namespace matcher, which the chart's tests
check the served namespaces with. Private names may change in any Kopf release: the project pins `kopf<2`,
and a rename breaks this one module's imports (tests/repo/test_kopf_private.py keeps them here).
"""

from __future__ import annotations

from kopf._cogs.clients import errors, watching
from kopf._cogs.structs import patches
from kopf._cogs.structs.references import match_namespace

__all__ = ["errors", "match_namespace", "patches", "watching"]
