"""Kopf's JSON patch of an object is not built when there is nothing in it.

After a BTJ's handlers, Kopf merge-patches the object (its annotations), then asks what is left of the
patch, usually nothing, for its JSON-patch operations (`Patch.as_json_patch`). That method deep-copies the
whole object it is given before it finds the patch empty and returns []: for a BTJ, its status and plan,
about 0.7 ms in the event loop per handled event (py-spy, `benchmarks/operator_load.py`). The wrapper
returns that [] at once, as Kopf's own code does after the copy; any other patch goes to Kopf's method. It
wraps an internal method (through handlers/kopf_private.py), which is why the project pins `kopf<2`.
"""

from __future__ import annotations

from typing import Any

from blackwell_operator.handlers.kopf_private import patches

_original = patches.Patch.as_json_patch


def as_json_patch(self: patches.Patch, body: Any = None) -> patches.JSONPatch:
    """Kopf's Patch.as_json_patch, without its copy of `body` when the patch is empty (no keys, no fns)."""
    if not self:
        return []
    return _original(self, body)


def install() -> None:
    """Put the wrapper in place of Kopf's method (idempotent: it always wraps Kopf's own)."""
    patches.Patch.as_json_patch = as_json_patch  # type: ignore[method-assign]
