"""Reading manifest YAML within the API server's bounds: UTF-8, no duplicate keys, bounded size and depth."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import Composer
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from blackwell_operator.admission.limits import MAX_DEPTH, MAX_INT_CHARS, MAX_NODES, MAX_REQUEST_BYTES
from blackwell_operator.units import MIB


class InputError(ValueError):
    """A manifest that cannot be read at all; the message is one line, ready for the user."""


def _where(node: Node) -> str:
    return f"line {node.start_mark.line + 1}"


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses what kubectl and the API server would refuse (or silently mangle)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        # The composer recurses once per nesting level: bound it before Python's recursion limit does.
        self._depth += 1
        try:
            self._nodes += 1
            if self._depth > MAX_DEPTH or self._nodes > MAX_NODES:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                if self._depth > MAX_DEPTH:
                    raise InputError(f"line {mark.line + 1}: nested deeper than {MAX_DEPTH} levels")
                raise InputError(
                    f"line {mark.line + 1}: more than {MAX_NODES:,} YAML values; no BlackwellTrainingJob "
                    "has that many (the CRD bounds its lists)"
                )
            return Composer.compose_node(self, parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        # Go's YAML decoder (kubectl) rejects a repeated key; PyYAML would keep the last one silently.
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, ScalarNode):
                key = self.construct_object(key_node)
                if key in seen:
                    raise InputError(f"{_where(key_node)}: key {key!r} appears twice in one mapping")
                seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        text = str(node.value).replace("_", "")
        if len(text.lstrip("+-")) > MAX_INT_CHARS:
            raise InputError(
                f"{_where(node)}: integer of {len(text)} digits is outside the int64 range the API "
                "server accepts"
            )
        value: int = super().construct_yaml_int(node)
        return value


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def _expanded_bytes(node: Node, sizes: dict[int, int]) -> int:
    """About how many bytes of JSON the node becomes with every alias written out (memoised per node)."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    sizes[id(node)] = 0  # a recursive alias counts once: the constructor rejects nothing, JSON cannot hold it
    if isinstance(node, ScalarNode):
        size = len(str(node.value)) + 3
    elif isinstance(node, SequenceNode):
        size = 2 + sum(_expanded_bytes(item, sizes) + 1 for item in node.value)
    elif isinstance(node, MappingNode):
        size = 2 + sum(_expanded_bytes(k, sizes) + _expanded_bytes(v, sizes) + 2 for k, v in node.value)
    else:  # pragma: no cover - the three node kinds are all YAML has
        size = 0
    sizes[id(node)] = size
    return size


def decode(data: bytes, name: str) -> str:
    """The manifest's text: UTF-8 (what kubectl and the API server read), within the request limit."""
    if len(data) > MAX_REQUEST_BYTES:
        raise InputError(
            f"{name}: {len(data) / MIB:.1f} MiB is over the API server's {MAX_REQUEST_BYTES // MIB} MiB "
            "request limit"
        )
    if b"\x00" in data:
        raise InputError(f"{name}: a binary file, not a YAML manifest")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{name}: not UTF-8 text (byte {exc.start} is {data[exc.start : exc.start + 1]!r}); "
            "save it as UTF-8"
        ) from None


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A PyYAML error as `line L, column C: problem`, without its multi-line excerpt."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem or exc.context}"
    if isinstance(exc, yaml.reader.ReaderError):
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        return f"character U+{code:04X} at position {exc.position} is not allowed in YAML"
    return " ".join(str(exc).split())[:200]


def load_documents(text: str, name: str) -> list[Any]:
    """Every non-empty YAML document in `text`, or one InputError line saying what is wrong."""
    documents: list[Any] = []
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text)  # the reader already refuses control characters here
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            expanded = _expanded_bytes(node, {})
            if expanded > MAX_REQUEST_BYTES:
                raise InputError(
                    f"{name}: its aliases expand to over {MAX_REQUEST_BYTES // MIB} MiB (the API server's "
                    "request limit); write the values out instead of repeating anchors"
                )
            document = loader.construct_document(node)
            if document is not None:
                documents.append(document)
    except InputError as exc:
        message = str(exc)
        raise InputError(message if message.startswith(name) else f"{name}: {message}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{name}: not valid YAML ({yaml_problem(exc)})") from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise InputError(f"{name}: not a manifest YAML can hold ({exc})") from None
    finally:
        if loader is not None:
            loader.dispose()
    return documents
