"""How kubectl's YAML reader (go-yaml v2, YAML 1.1) resolves a plain scalar: one rule for reader and writer.

The admission reader (admission/goyaml.py) reads a manifest's values with it, and the renderer
(render/yamlio.py) quotes every string it would read as something else (`y`, `1e3`, `0o17`), so
`btj render -o yaml` read back by kubectl gives the strings it printed. docs/reference/kubectl-yaml.md has the
rules and the kubectl 1.35 outputs they were checked against.
"""

from __future__ import annotations

import math
import re
from typing import Any

# The API server decodes JSON integers to int64 (and anything larger to float64).
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1

# go-yaml v2's table of words (resolve.go); `y` and `n` are booleans there, unlike YAML 1.2.
_WORDS: dict[str, Any] = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False),
    **dict.fromkeys(("", "~", "null", "Null", "NULL"), None),
    **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf),
}
# go-yaml looks a plain scalar up only when its first character could start a word or a number.
_HINTED = set("yYnNtTfFoO~+-.0123456789")
# Go's strconv.ParseInt(s, 0, 64) syntax: a sign, then 0x / 0o / 0b / a leading 0 (octal) / decimal.
_GO_INT = re.compile(r"([+-]?)(?:0[xX]([0-9a-fA-F]+)|0[oO]([0-7]+)|0[bB]([01]+)|0([0-7]*)|([1-9][0-9]*))")
# go-yaml's yamlStyleFloat: digits with an optional fraction and exponent (no dot needed: `1e3`).
_GO_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
# A plain scalar starting with a dot goes to Go's ParseFloat as written: underscores only between digits,
# as Python's float() takes them too (`.5_0` is 0.5, `._5` a string).
_DOT_FLOAT = re.compile(r"\.[0-9_]+([eE][-+]?[0-9_]+)?")
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}([Tt ].*)?")
# No integer of more characters fits in uint64 (64 binary digits, a prefix and a sign).
_INT_CHARS = 68


class Uint64(int):
    """An integer only uint64 holds: kubectl refuses it as a key and the API server reads it as a float."""


def _go_int(text: str) -> int | None:
    """strconv.ParseInt(text, 0, 64), then ParseUint (no sign) as go-yaml tries them; None if neither."""
    if len(text) > _INT_CHARS:
        return None
    match = _GO_INT.fullmatch(text)
    if match is None:
        return None
    sign, hexa, octal, binary, lead_octal, decimal = match.groups()
    if hexa is not None:
        value = int(hexa, 16)
    elif octal is not None:
        value = int(octal, 8)
    elif binary is not None:
        value = int(binary, 2)
    elif lead_octal is not None:
        value = int(lead_octal or "0", 8)
    else:
        value = int(decimal)
    if sign == "-":
        value = -value
    if INT64_MIN <= value <= INT64_MAX:
        return value
    if not sign and value <= UINT64_MAX:
        return Uint64(value)
    return None


def _go_float(text: str) -> float | None:
    """strconv.ParseFloat(text, 64); None where Go reports an error (out of range: Python says inf)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isinf(value) else value


def resolve_plain(text: str) -> tuple[str, Any]:
    """go-yaml v2's resolve() of a plain scalar: (the tag it gets, its value)."""
    if (not text or text[0] in _HINTED) and text in _WORDS:
        value = _WORDS[text]
        kind = "null" if value is None else "bool" if isinstance(value, bool) else "float"
        return kind, value
    if text and text[0] in "+-0123456789":
        if _TIMESTAMP.fullmatch(text):  # kept as the text written when decoded into a generic value
            return "timestamp", text
        plain = text.replace("_", "")
        integer = _go_int(plain)
        if integer is not None:
            return "int", integer
        if _GO_FLOAT.fullmatch(plain):
            number = _go_float(plain)
            if number is not None:
                return "float", number
    elif text.startswith(".") and _DOT_FLOAT.fullmatch(text):
        number = _go_float(text)
        if number is not None:
            return "float", number
    return "str", text
