"""Deterministic YAML for rendered objects and the CRD (insertion order kept, no aliases, wide lines)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

from blackwell_operator.yamlscalars import resolve_plain


class _NoAliasDumper(yaml.SafeDumper):
    """SafeDumper that writes repeated objects in full instead of &anchors (kubectl users read this)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    # Multi-line strings (the plan JSON) as literal blocks: readable and diff-friendly. A string kubectl
    # would read as something else (`y` is true and `1e3` 1000 to go-yaml, not to PyYAML) is quoted.
    style = "|" if "\n" in data else "'" if resolve_plain(data)[0] != "str" else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_NoAliasDumper.add_representer(str, _str_presenter)


def dump_yaml(obj: Any) -> str:
    """One YAML document."""
    return yaml.dump(obj, Dumper=_NoAliasDumper, sort_keys=False, width=100, allow_unicode=False)


def dump_documents(objects: Iterable[Any]) -> str:
    """Multi-document YAML, each document started by `---`."""
    return "".join(f"---\n{dump_yaml(obj)}" for obj in objects)
