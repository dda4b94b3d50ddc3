"""Error types that several trainer modules raise (the data source and the node's shard cache)."""

from __future__ import annotations


class DataError(ValueError):
    """A data source that cannot be built or resumed; the message names the field and the fix."""
