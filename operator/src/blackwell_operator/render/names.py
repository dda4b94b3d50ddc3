"""The BTJ name rule: the child takes the name, so it must be a DNS-1035 label short enough for Services."""

from __future__ import annotations

import re

DNS1035_PATTERN = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
# The training operator names Services `<job>-worker-<index>` (DNS-1035, 63 characters at most);
# 51 leaves room for "-worker-1023".
MAX_NAME_LENGTH = 51


def name_problem(name: str) -> str | None:
    """Why the API server (the CRD's CEL rules) would reject this BTJ name, or None."""
    if not re.match(DNS1035_PATTERN, name):
        return (
            "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting "
            "with a letter): the child PyTorchJob takes the same name"
        )
    if len(name) > MAX_NAME_LENGTH:
        return (
            f"metadata.name must be at most {MAX_NAME_LENGTH} characters: the training operator "
            "names Services <name>-worker-<index>, which must fit 63"
        )
    return None
