"""Reading manifest YAML as kubectl reads it, within the API server's bounds on size, depth and values."""

from __future__ import annotations

import codecs
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.events import ScalarEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import BaseResolver
from yaml.scanner import Scanner

from blackwell_operator.admission.goyaml import PLAIN_TAG, STR_TAG, GoYamlError, to_json
from blackwell_operator.admission.limits import MAX_DEPTH, MAX_NODES, MAX_REQUEST_BYTES
from blackwell_operator.units import MIB


class InputError(ValueError):
    """A manifest that cannot be read at all; the message is one line, ready for the user."""


class _BoundedLoader(Reader, Scanner, Parser, Composer, BaseResolver):
    """PyYAML's reader, parser and composer, bounded; values are resolved by goyaml as kubectl does.

    Every plain scalar gets PLAIN_TAG and every quoted or block one `!!str`, so goyaml sees what was
    written; explicit tags (`!!int`, `!!binary`) are kept as the composer reads them.
    """

    def __init__(self, stream: str) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        BaseResolver.__init__(self)
        self._depth = 0
        self._nodes = 0

    def resolve(self, kind: type[Node], value: Any, implicit: tuple[bool, bool]) -> str:
        if kind is ScalarNode:
            return PLAIN_TAG if implicit[0] else STR_TAG
        return str(BaseResolver.resolve(self, kind, value, implicit))  # type: ignore[no-untyped-call]

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        # The composer recurses once per nesting level: bound it before Python's recursion limit does.
        self._depth += 1
        try:
            self._nodes += 1
            event = self.peek_event()  # type: ignore[no-untyped-call]
            line = event.start_mark.line + 1
            if self._depth > MAX_DEPTH:
                raise InputError(f"line {line}: nested deeper than {MAX_DEPTH} levels")
            if self._nodes > MAX_NODES:
                raise InputError(
                    f"line {line}: more than {MAX_NODES:,} YAML values; no "
                    "BlackwellTrainingJob has that many (the CRD bounds its lists)"
                )
            node = Composer.compose_node(self, parent, index)
            if isinstance(event, ScalarEvent) and event.tag == "!" and node is not None:
                node.tag = STR_TAG  # the non-specific tag: go-yaml keeps the text (`! 12` is "12")
            return node
        finally:
            self._depth -= 1


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


def _size(size: int) -> str:
    return f"{size / MIB:.1f} MiB ({size:,} bytes)"


def decode(data: bytes, name: str, *, size: int | None = None, notes: list[str] | None = None) -> str:
    """The manifest's text as kubectl reads it, within the request limit.

    size: the file's size when known (only the first bytes past the limit are read). UTF-8 with or
    without a BOM, or UTF-16 with a BOM; a byte that is not UTF-8 is read as U+FFFD, which is what
    kubectl sends for it, and `notes` says where.
    """
    if len(data) > MAX_REQUEST_BYTES:
        shown = _size(size) if size is not None and size > MAX_REQUEST_BYTES else "more than 3 MiB"
        raise InputError(
            f"{name}: {shown} is over the API server's request limit of {_size(MAX_REQUEST_BYTES)}; "
            "no manifest this large can be applied"
        )
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise InputError(f"{name}: not UTF-16 text past its byte order mark (byte {exc.start})") from None
    if b"\x00" in data:
        raise InputError(f"{name}: a binary file, not a YAML manifest")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        if notes is not None:
            line = data.count(b"\n", 0, exc.start) + 1
            notes.append(
                f"{name}: line {line}: byte 0x{data[exc.start]:02X} is not UTF-8 (a Latin-1 file?); kubectl "
                "sends each such byte as U+FFFD, and btj reads it so: save the file as UTF-8 to keep the "
                "character"
            )
        # kubectl's reader replaces each maximal invalid sequence with one U+FFFD, as Python's "replace".
        return data.removeprefix(codecs.BOM_UTF8).decode("utf-8", errors="replace")


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A PyYAML error as `line L, column C: problem`, without its multi-line excerpt."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        problem = exc.problem or exc.context or ""
        if "'\\t'" in problem or "tab character" in problem:
            # PyYAML's own words ("found character '\t' that cannot start any token") name no fix.
            problem = (
                "a tab indents or separates this line; YAML allows only spaces there: replace each tab "
                "with spaces"
            )
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    if isinstance(exc, yaml.reader.ReaderError):
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        return f"character U+{code:04X} at position {exc.position} is not allowed in YAML"
    return " ".join(str(exc).split())[:200]


def load_documents(text: str, name: str, notes: list[str] | None = None) -> list[Any]:
    """Every non-empty YAML document in `text` as kubectl would send it, or one InputError line.

    notes: gets a line for what kubectl accepts silently and a person may not mean (a key given twice).
    """
    documents: list[Any] = []
    found: list[str] = []
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
            document = to_json(node, found)
            if document is not None:
                documents.append(document)
    except (InputError, GoYamlError) as exc:
        message = str(exc)
        raise InputError(message if message.startswith(name) else f"{name}: {message}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{name}: not valid YAML ({yaml_problem(exc)})") from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise InputError(f"{name}: not a manifest YAML can hold ({exc})") from None
    finally:
        if loader is not None:
            loader.dispose()
    if notes is not None:
        notes.extend(f"{name}: {line}" for line in found)
    return documents
