"""Text inputs of the data preparation: JSONL, Parquet or plain text files cut into independent work units.

A unit is a part of one input file that a worker reads on its own (a byte range of whole lines, a Parquet
row group, a whole text file): units are fixed by the inputs alone, so a resumed run cuts them the same way
and redoes exactly the units that had not finished.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path


class InputError(ValueError):
    """An input that cannot be read as documents; the message names the file, the place and the fix."""


class InputFormat(StrEnum):
    """How a file holds documents."""

    JSONL = "jsonl"  # one JSON object per line, the text in one field
    PARQUET = "parquet"  # one document per row, the text in one column
    TEXT = "text"  # a whole file is one document
    TEXT_LINES = "text-lines"  # every non-empty line is one document


SUFFIXES = {".jsonl": InputFormat.JSONL, ".ndjson": InputFormat.JSONL, ".parquet": InputFormat.PARQUET}
TEXT_SUFFIXES = (".txt", ".text", ".md")


@dataclass(frozen=True)
class Unit:
    """One work unit of `path`: the byte range [start, end), or row group `start` of a Parquet file."""

    path: str
    fmt: InputFormat
    start: int
    end: int

    def describe(self) -> str:
        """Where the unit's documents come from, for the manifest."""
        if self.fmt is InputFormat.PARQUET:
            return f"{self.path}#row-group={self.start}"
        if self.fmt is InputFormat.TEXT:
            return self.path
        return f"{self.path}#bytes={self.start}-{self.end}"


def input_format(path: Path, text_lines: bool) -> InputFormat:
    """The format of an input file, from its suffix."""
    suffix = path.suffix.lower()
    if suffix in SUFFIXES:
        return SUFFIXES[suffix]
    if suffix in TEXT_SUFFIXES:
        return InputFormat.TEXT_LINES if text_lines else InputFormat.TEXT
    raise InputError(
        f"{path}: unknown input format {suffix or '(no suffix)'}; use .jsonl/.ndjson, .parquet or "
        f".txt files (or pass a folder holding them)"
    )


def expand_inputs(inputs: list[str]) -> list[Path]:
    """The input files: each argument is a file or a folder (its files of known formats, recursively)."""
    files: list[Path] = []
    for raw in inputs:
        path = Path(raw)
        if path.is_dir():
            known = (*SUFFIXES, *TEXT_SUFFIXES)
            files.extend(p for p in sorted(path.rglob("*")) if p.is_file() and p.suffix.lower() in known)
        elif path.is_file():
            files.append(path)
        else:
            raise InputError(f"{raw}: no such file or folder; pass existing JSONL, Parquet or text files")
    if not files:
        raise InputError(f"{' '.join(inputs)}: no .jsonl, .parquet or .txt files found")
    resolved = [p.resolve() for p in files]
    if len(set(resolved)) != len(resolved):
        raise InputError("an input file is given twice; each document must be prepared once")
    return resolved


def _line_ranges(path: Path, chunk_bytes: int) -> list[tuple[int, int]]:
    """Byte ranges of about `chunk_bytes` that start and end on line boundaries."""
    size = path.stat().st_size
    starts = [0]
    with path.open("rb") as handle:
        while starts[-1] + chunk_bytes < size:
            handle.seek(starts[-1] + chunk_bytes)
            handle.readline()  # to the end of the line the cut falls in
            position = handle.tell()
            if position >= size:
                break
            starts.append(position)
    ends = [*starts[1:], size]
    return [(s, e) for s, e in zip(starts, ends, strict=True) if e > s]


def plan_units(path: Path, fmt: InputFormat, *, text_field: str, chunk_bytes: int) -> list[Unit]:
    """The work units of one input file; a Parquet file without the text column is refused here."""
    if fmt is InputFormat.PARQUET:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as err:
            raise InputError(f"{path}: not a readable Parquet file ({err})") from err
        schema = parquet.schema_arrow
        if text_field not in schema.names:
            raise InputError(
                f"{path}: no column {text_field!r} (columns: {', '.join(schema.names)}); pass --text-field "
                "with the column that holds the text"
            )
        kind = schema.field(text_field).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise InputError(f"{path}: column {text_field!r} is {kind}, not text; pass the text column")
        return [Unit(str(path), fmt, g, g + 1) for g in range(parquet.metadata.num_row_groups)]
    if fmt is InputFormat.TEXT:
        return [Unit(str(path), fmt, 0, path.stat().st_size)]
    return [Unit(str(path), fmt, s, e) for s, e in _line_ranges(path, chunk_bytes)]


def _line_number(path: str, offset: int, index: int) -> int:
    """1-based line number of the `index`-th line after byte `offset` (only computed for an error)."""
    with open(path, "rb") as handle:
        return handle.read(offset).count(b"\n") + index + 1


def _decode(data: bytes, unit: Unit, index: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = _line_number(unit.path, unit.start, index)
        raise InputError(
            f"{unit.path}: line {line}: not UTF-8 ({err.reason}); convert the file to UTF-8"
        ) from err


def _lines(unit: Unit) -> Iterator[tuple[int, str]]:
    """The non-blank lines of a JSONL or line-text unit, decoded, with their index in the unit."""
    with open(unit.path, "rb") as handle:
        handle.seek(unit.start)
        data = handle.read(unit.end - unit.start)
    for index, raw in enumerate(data.split(b"\n")):
        if raw.strip():  # a blank line is no document (and the file's last newline leaves one)
            yield index, _decode(raw, unit, index)


def json_records(unit: Unit) -> Iterator[tuple[int, dict[str, object]]]:
    """The JSON objects of a JSONL unit with their 1-based line numbers (computed only on demand)."""
    for index, text in _lines(unit):
        try:
            record = json.loads(text)
        except json.JSONDecodeError as err:
            line = _line_number(unit.path, unit.start, index)
            raise InputError(
                f"{unit.path}: line {line}: not JSON ({err.msg}); fix or remove the line"
            ) from err
        if not isinstance(record, dict):
            line = _line_number(unit.path, unit.start, index)
            raise InputError(f"{unit.path}: line {line}: not a JSON object; write one object per line")
        yield index, record


def line_number(unit: Unit, index: int) -> int:
    """The 1-based line number in the file of the unit's `index`-th line, for an error message."""
    return _line_number(unit.path, unit.start, index)


def documents(unit: Unit, *, text_field: str) -> Iterator[str | None]:
    """The unit's documents in file order; None stands for an input that holds no text (skipped)."""
    if unit.fmt is InputFormat.PARQUET:
        import pyarrow.parquet as pq

        table = pq.ParquetFile(unit.path).read_row_group(unit.start, columns=[text_field])
        for value in table.column(0).to_pylist():
            yield value or None
        return
    if unit.fmt is InputFormat.TEXT:
        with open(unit.path, "rb") as handle:
            yield _decode(handle.read(), unit, 0) or None
        return
    if unit.fmt is InputFormat.TEXT_LINES:
        for _, text in _lines(unit):
            yield text.rstrip("\r")
        return
    for index, record in json_records(unit):
        if text_field not in record:
            raise InputError(
                f"{unit.path}: line {line_number(unit, index)}: no field {text_field!r}; pass --text-field "
                "with the field that holds the text"
            )
        value = record[text_field]
        if value is not None and not isinstance(value, str):
            raise InputError(
                f"{unit.path}: line {line_number(unit, index)}: field {text_field!r} is "
                f"{type(value).__name__}, not text"
            )
        yield value or None
