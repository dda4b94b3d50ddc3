"""Which content hash an S3 object offers (its checksums, its ETag), and whether a local file has it.

A cached copy of an object is used only when its bytes hash to what S3 says the object holds
(docs/security.md, "Verified cache"; the S3 facts in docs/reference/s3-object-integrity.md). In order of
preference, the first the object has:

1. `ChecksumSHA256`, `ChecksumSHA1` (full-object): cryptographic, present when the uploader asked for them.
2. The ETag, when it is the MD5 of the bytes: one-part uploads not encrypted with SSE-KMS or SSE-C.
3. A multipart ETag (`<md5 of the parts' MD5s>-<parts>`), recomputed from the part size S3 reports for
   part 1; an upload whose parts differ in size does not match, and the next hash is used instead.
4. `ChecksumCRC64NVME` (S3 adds it to every object uploaded without a checksum), `ChecksumCRC32C` (both
   need awscrt, botocore's optional runtime) and `ChecksumCRC32`: full-object CRCs, which catch any
   accidental change and an in-place rewrite, though not a forgery crafted to keep the CRC.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHUNK = 8 << 20
# A composite (multipart) checksum or ETag ends in -<parts>.
_PARTS_SUFFIX = re.compile(r"-(\d+)$")
# Server-side encryption whose ETag is not the MD5 of the object's bytes.
_ETAG_NOT_MD5 = ("aws:kms", "aws:kms:dsse")


@dataclass(frozen=True)
class ContentHash:
    """One hash of an object's whole content: its name (for messages) and how to check a file against it."""

    algorithm: str
    expected: str
    compute: Callable[[Path], str]
    # A multipart ETag is recomputed on an assumption (equal parts): a miss says little about the bytes.
    assumed: bool = False

    def matches(self, path: Path) -> bool:
        return self.compute(path) == self.expected


def _digest(path: Path, *, make: Callable[[], Any], encode: Callable[[bytes], str]) -> str:
    hasher = make()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            hasher.update(chunk)
    return encode(hasher.digest())


def _md5() -> Any:
    return hashlib.md5(usedforsecurity=False)  # S3's own choice for ETags, checked, not chosen


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _hex(raw: bytes) -> str:
    return raw.hex()


def _crc32(path: Path) -> str:
    value = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            value = zlib.crc32(chunk, value)
    return _b64(value.to_bytes(4, "big"))


def _crt(name: str, width: int) -> Callable[[Path], str] | None:
    """awscrt's CRC32C / CRC64NVME, when botocore's optional runtime is installed."""
    try:
        from awscrt import checksums  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    function = getattr(checksums, name)

    def compute(path: Path) -> str:
        value = 0
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                value = function(chunk, value)
        return _b64(int(value).to_bytes(width, "big"))

    return compute


def _multipart_etag(part_size: int) -> Callable[[Path], str]:
    def compute(path: Path) -> str:
        digests = []
        with open(path, "rb") as f:
            while part := f.read(part_size):
                digests.append(hashlib.md5(part, usedforsecurity=False).digest())
        return f"{hashlib.md5(b''.join(digests), usedforsecurity=False).hexdigest()}-{len(digests)}"

    return compute


def _full_object(head: dict[str, Any], field: str) -> str | None:
    """A checksum of the whole object, or None when it is absent or composite (of the parts)."""
    value = head.get(field)
    if not value:
        return None
    kind = head.get("ChecksumType")
    if kind is not None:
        return str(value) if kind == "FULL_OBJECT" else None
    # Older stores say nothing of the type: a composite value carries -<parts>, as a multipart ETag does.
    etag = str(head.get("ETag", "")).strip('"')
    return None if _PARTS_SUFFIX.search(str(value)) or _PARTS_SUFFIX.search(etag) else str(value)


def content_hashes(head: dict[str, Any], part_size: Callable[[], int | None]) -> list[ContentHash]:
    """Every hash the object's HeadObject answer (asked with ChecksumMode=ENABLED) lets us check, best first.

    `part_size` gives part 1's size (HeadObject with PartNumber=1) for a multipart ETag; asked only then.
    """
    hashes: list[ContentHash] = []
    for field, make in (("ChecksumSHA256", hashlib.sha256), ("ChecksumSHA1", hashlib.sha1)):
        value = _full_object(head, field)
        if value:
            hashes.append(ContentHash(field, value, functools.partial(_digest, make=make, encode=_b64)))
    etag = str(head.get("ETag", "")).strip('"')
    encrypted = head.get("ServerSideEncryption") in _ETAG_NOT_MD5 or bool(head.get("SSECustomerAlgorithm"))
    if etag and not encrypted:
        parts = _PARTS_SUFFIX.search(etag)
        if parts is None and re.fullmatch(r"[0-9a-f]{32}", etag):
            hashes.append(ContentHash("ETag (MD5)", etag, functools.partial(_digest, make=_md5, encode=_hex)))
        elif parts is not None:
            size = part_size()
            if size:
                hashes.append(ContentHash("ETag (multipart MD5)", etag, _multipart_etag(size), assumed=True))
    for field, compute in (
        ("ChecksumCRC64NVME", _crt("crc64nvme", 8)),
        ("ChecksumCRC32C", _crt("crc32c", 4)),
        ("ChecksumCRC32", _crc32),
    ):
        value = _full_object(head, field)
        if value and compute is not None:
            hashes.append(ContentHash(field, value, compute))
    return hashes
