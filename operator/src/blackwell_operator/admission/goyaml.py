"""YAML nodes as the JSON kubectl sends: go-yaml v2's scalar rules and merges, sigs.k8s.io/yaml's keys.

kubectl reads a manifest with sigs.k8s.io/yaml (go-yaml v2 underneath, YAML 1.1) and sends JSON, which
the API server decodes into int64 and float64. The rules here, and the kubectl 1.35 outputs they were
checked against, are in docs/reference/kubectl-yaml.md; tests/admission/test_kubectl_parity.py runs the
real kubectl on each case.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import math
import struct
from typing import Any

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from blackwell_operator.admission.limits import MAX_DEPTH
from blackwell_operator.yamlscalars import INT64_MAX, INT64_MIN, Uint64, resolve_plain

# The tag the reader gives a plain (unquoted, untagged) scalar, which go-yaml resolves by its content.
PLAIN_TAG = "btj:plain"
_YAML = "tag:yaml.org,2002:"
STR_TAG = _YAML + "str"


class GoYamlError(ValueError):
    """What kubectl says about a document it cannot turn into JSON; the message names the line."""


def _line(node: Node) -> str:
    return f"line {node.start_mark.line + 1}"


_CHECKED_TAGS = {_YAML + kind: kind for kind in ("bool", "null", "int", "float", "timestamp")}


def _scalar(node: ScalarNode) -> Any:
    tag, text = node.tag, str(node.value)
    if tag == PLAIN_TAG:
        return resolve_plain(text)[1]
    if tag == _YAML + "binary":
        try:
            raw = base64.b64decode("".join(text.split()), validate=True)
        except (binascii.Error, ValueError):
            raise GoYamlError(f"{_line(node)}: !!binary value contains invalid base64 data") from None
        return raw.decode("utf-8", errors=GO_JSON)
    wanted = _CHECKED_TAGS.get(tag)
    if wanted is None:  # !!str, quoted and block scalars, and tags go-yaml does not know: the text
        return text
    kind, value = resolve_plain(text)
    if kind == wanted:
        return value
    if wanted == "float" and kind == "int":
        return float(value)
    raise GoYamlError(f"{_line(node)}: cannot decode !!{kind} `{text}` as a !!{wanted}")


def _float32_text(value: float) -> str:
    """Go's strconv.FormatFloat(value, 'g', -1, 32), which sigs.k8s.io/yaml writes a float key with."""
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    single = struct.unpack("f", struct.pack("f", value))[0]
    if single == 0:
        return "-0" if math.copysign(1, single) < 0 else "0"
    for digits in range(1, 10):  # the shortest decimal that reads back as the same float32
        text = f"{single:.{digits - 1}e}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == single:
            break
    mantissa, exponent_text = text.split("e")
    exponent = int(exponent_text)
    figures = mantissa.replace("-", "").replace(".", "").rstrip("0") or "0"
    point = exponent + 1  # where the decimal point falls after the first figure
    limit = len(figures) if 6 > len(figures) >= point else 6
    if exponent < -4 or exponent >= limit:
        sign = "-" if single < 0 else ""
        rest = f".{figures[1:]}" if len(figures) > 1 else ""
        return f"{sign}{figures[0]}{rest}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    return f"{single:.{max(len(figures) - point, 0)}f}"


def _key(node: Node, value: Any) -> str:
    """sigs.k8s.io/yaml's JSON key for a decoded YAML key."""
    if isinstance(node, MappingNode | SequenceNode):
        raise GoYamlError(f"{_line(node)}: a mapping or list cannot be a key (invalid map key)")
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Uint64):
        raise GoYamlError(f"{_line(node)}: key {int(value)} is beyond int64 (unsupported map key)")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float32_text(value)
    raise GoYamlError(f"{_line(node)}: a null key (~, null or empty) is not allowed (unsupported map key)")


def _json_number(value: Any, node: Node) -> Any:
    """The value the API server decodes from the JSON kubectl writes: a whole float becomes an integer."""
    if isinstance(value, Uint64):
        return float(value)  # written as digits beyond int64: the server reads a float64
    if isinstance(value, float) and not isinstance(value, bool):
        if math.isnan(value) or math.isinf(value):
            raise GoYamlError(f"{_line(node)}: {value} cannot be sent as JSON (json: unsupported value)")
        # Go writes whole floats under 1e21 as plain digits, which the server decodes as an int64.
        if value.is_integer() and abs(value) < 1e21 and INT64_MIN <= value <= INT64_MAX:
            return int(value)
    return value


def _is_merge(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.value == "<<" and node.tag in (PLAIN_TAG, _YAML + "merge")


class _Converter:
    def __init__(self, notes: list[str]) -> None:
        self.notes = notes
        self._open: set[int] = set()  # the nodes being converted: an alias to one is a cycle
        self._depth = 0

    def value(self, node: Node) -> Any:
        if isinstance(node, ScalarNode):
            return _json_number(_scalar(node), node)
        if id(node) in self._open:
            raise GoYamlError(f"{_line(node)}: an anchor's value contains an alias of itself")
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise GoYamlError(f"{_line(node)}: nested deeper than {MAX_DEPTH} levels once aliases expand")
        self._open.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                return [self.value(item) for item in node.value]
            out: dict[str, Any] = {}
            self._fill(node, out)
            return out
        finally:
            self._open.discard(id(node))
            self._depth -= 1

    def _fill(self, node: Node, out: dict[str, Any]) -> None:
        """go-yaml's mapping decode: pairs in order, the later one winning, a merge setting its keys."""
        if not isinstance(node, MappingNode):
            raise GoYamlError(f"{_line(node)}: a merge (<<) needs a mapping or a list of mappings")
        written: dict[str, Node] = {}
        for key_node, value_node in node.value:
            if _is_merge(key_node):
                self._merge(value_node, out)
                continue
            key = _key(key_node, _scalar(key_node) if isinstance(key_node, ScalarNode) else None)
            if key in written:
                self.notes.append(
                    f"{_line(written[key])}: key {key!r} is given again on {_line(key_node)}; the last one "
                    "wins, as with kubectl"
                )
            written[key] = key_node
            out.pop(key, None)  # the last one wins, and takes the last place
            out[key] = self.value(value_node)

    def _merge(self, node: Node, out: dict[str, Any]) -> None:
        if id(node) in self._open:
            raise GoYamlError(f"{_line(node)}: an anchor's value contains an alias of itself")
        if isinstance(node, SequenceNode):
            for item in reversed(node.value):  # the earlier mapping of the list wins
                self._merge_one(item, out)
        else:
            self._merge_one(node, out)

    def _merge_one(self, node: Node, out: dict[str, Any]) -> None:
        self._open.add(id(node))
        try:
            self._fill(node, out)
        finally:
            self._open.discard(id(node))


def to_json(node: Node, notes: list[str]) -> Any:
    """The document's value as kubectl sends it and the API server decodes it; `notes` gets what a
    person may not expect (a key given twice)."""
    return _Converter(notes).value(node)


def _go_json_errors(error: UnicodeError) -> tuple[str, int]:
    """Go's JSON encoder writes each byte that is not UTF-8 as U+FFFD, one per byte."""
    if not isinstance(error, UnicodeDecodeError):
        raise error
    return "\ufffd", error.start + 1


# `bytes.decode("utf-8", errors=GO_JSON)`: a `!!binary` value as kubectl sends it (its text is the file's,
# which kubectl's reader decodes differently: one U+FFFD per invalid sequence, Python's "replace").
GO_JSON = "go-json"
codecs.register_error(GO_JSON, _go_json_errors)
