"""A checkpoint's file list with sizes and CRC32 checksums: computed at save, checked at resume."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blackwell_trainer.plan.units import MIB

# The completion record, written last; its presence makes a step folder a checkpoint.
MARKER = "COMPLETE.json"
# 1: sizes only (before checksums). 2: size, CRC32 and the writing rank of every file.
MARKER_VERSION = 2
# CRC32 (zlib) because the threat is accidental damage (bit flips, a zeroed or torn block, a short copy),
# not an adversary: it detects every burst error up to 32 bits and misses random damage with probability
# 2^-32, and zlib computes it about twice as fast as hashlib's sha256 (2.8 vs 1.5 GiB/s on the build
# machine) and releases the GIL while doing so. Each rank checksums only the files it wrote.
CHECKSUM = "crc32"
_CHUNK = 8 * MIB


class ManifestError(ValueError):
    """A completion record that cannot be read (corrupted, or from an unknown version)."""


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: its size, its checksum (None before version 2) and who wrote it."""

    size: int
    crc32: str | None
    rank: int

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, CHECKSUM: self.crc32, "rank": self.rank}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> FileEntry:
        return cls(size=int(value["size"]), crc32=str(value[CHECKSUM]), rank=int(value["rank"]))


@dataclass(frozen=True)
class Manifest:
    """The completion record of one checkpoint."""

    version: int
    step: int
    world_size: int
    timestamp: float
    files: dict[str, FileEntry]
    # Whose checkpoint it is (checkpoint_owner.Owner's JSON); None in one written before the records.
    owner: dict[str, Any] | None = None

    @property
    def verifiable(self) -> bool:
        """Whether it carries checksums (version 2 on); an older one can only be checked for sizes."""
        return all(entry.crc32 is not None for entry in self.files.values())

    def to_json(self) -> dict[str, Any]:
        # `owner` is an added key of version 2: a reader without it ignores it.
        owner = {} if self.owner is None else {"owner": self.owner}
        return {
            "version": self.version,
            "step": self.step,
            "world_size": self.world_size,
            "timestamp": self.timestamp,
            "checksum": CHECKSUM,
            **owner,
            "files": {name: entry.to_json() for name, entry in sorted(self.files.items())},
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Manifest:
        """Parse either version; ManifestError names what is wrong."""
        try:
            version = int(raw.get("version", 1))
            files: dict[str, FileEntry] = {}
            for name, value in dict(raw["files"]).items():
                if version == 1:  # {name: size}: no checksums and no writer (rank 0 checks every size)
                    files[str(name)] = FileEntry(size=int(value), crc32=None, rank=0)
                else:
                    files[str(name)] = FileEntry.from_json(value)
            if version not in (1, MARKER_VERSION):
                raise ManifestError(f"{MARKER} version {version} is not 1 or {MARKER_VERSION}")
            if ".metadata" not in files:
                raise ManifestError(f"{MARKER} lists no .metadata")
            owner = raw.get("owner")
            if owner is not None and not isinstance(owner, dict):
                raise ManifestError(f"{MARKER} owner is not a JSON object")
            return cls(
                version=version,
                step=int(raw["step"]),
                world_size=int(raw["world_size"]),
                timestamp=float(raw["timestamp"]),
                files=files,
                owner=owner,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            if isinstance(err, ManifestError):
                raise
            raise ManifestError(f"{MARKER} is malformed ({type(err).__name__}: {err})") from None

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        """The record in `folder`; OSError if absent, ManifestError if unreadable."""
        text = (folder / MARKER).read_bytes()
        try:
            raw = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ManifestError(f"{MARKER} is not JSON ({err})") from None
        if not isinstance(raw, dict):
            raise ManifestError(f"{MARKER} is not a JSON object")
        return cls.from_json(raw)


def crc32_of(path: Path) -> str:
    """The file's CRC32 as 8 hex digits, read in chunks (shards are gigabytes)."""
    value = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            value = zlib.crc32(chunk, value)
    return f"{value:08x}"


def entries(folder: Path, names: Iterable[str], rank: int) -> dict[str, FileEntry]:
    """Size and checksum of each of `names` (relative to `folder`), as written by `rank`."""
    return {
        name: FileEntry(size=(folder / name).stat().st_size, crc32=crc32_of(folder / name), rank=rank)
        for name in sorted(names)
    }


def written_by(folder: Path, rank: int) -> list[str]:
    """The DCP shard files `rank` wrote into `folder` (DCP names them `__<rank>_<n>.distcp`)."""
    return sorted(str(p.relative_to(folder)) for p in folder.glob(f"__{rank}_*.distcp"))


def check_file(folder: Path, name: str, entry: FileEntry) -> str | None:
    """What is wrong with one file (missing, another size, another checksum), or None."""
    path = folder / name
    try:
        size = path.stat().st_size
        if size != entry.size:
            return f"{name} is {size} bytes, {MARKER} says {entry.size} (truncated or overwritten)"
        if entry.crc32 is None:
            return None
        found = crc32_of(path)
    except OSError as err:
        return f"{name} cannot be read ({err.strerror or err})"
    if found != entry.crc32:
        return f"{name} fails its checksum ({CHECKSUM} {found}, {MARKER} says {entry.crc32}): bytes changed"
    return None


def check_share(folder: Path, manifest: Manifest, rank: int, world_size: int) -> list[str]:
    """Check the files this rank verifies: those written by ranks w with w % world_size == rank.

    Every file is checked by exactly one current rank, so a resume reads each file once more in all,
    spread over the ranks, whatever world size wrote it.
    """
    return [
        problem
        for name, entry in sorted(manifest.files.items())
        if entry.rank % world_size == rank and (problem := check_file(folder, name, entry)) is not None
    ]
