"""The S3 permissions the docs list are the ones the trainer's calls need (issue 39: cluster-access.md
listed only s3:PutObject for writing jobs, while the export also aborts, lists and deletes)."""

from __future__ import annotations

import re
from pathlib import Path

from blackwell_trainer.cloud_errors import PERMISSION_OF

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "trainer_image" / "src" / "blackwell_trainer"
DOCS = [ROOT / "docs" / "reference" / "cluster-access.md", ROOT / "docs" / "install.md"]
# boto3's managed calls, as the S3 operations they make (s3transfer: multipart above 8 MB, an abort on
# failure; a download heads the object, then gets it in ranges).
MANAGED = {
    "upload_file": [
        "PutObject",
        "CreateMultipartUpload",
        "UploadPart",
        "CompleteMultipartUpload",
        "AbortMultipartUpload",
    ],
    "download_file": ["HeadObject", "GetObject"],
}
PAGINATORS = {"list_objects_v2": "ListObjectsV2"}


def _operations() -> set[str]:
    """Every S3 operation the trainer's source calls on a boto3 client."""
    found: set[str] = set()
    for source in TRAINER.rglob("*.py"):
        text = source.read_text()
        for name in re.findall(r"client\.(\w+)\(", text):
            if name in MANAGED:
                found.update(MANAGED[name])
            elif name != "get_paginator":
                found.add("".join(part.title() for part in name.split("_")))
        for name in re.findall(r'get_paginator\("(\w+)"\)', text):
            found.add(PAGINATORS[name])
    return found


def test_every_s3_call_of_the_trainer_has_its_permission_in_the_docs() -> None:
    operations = _operations()
    assert {"ListObjectsV2", "GetObject", "HeadObject", "DeleteObject", "CreateMultipartUpload"} <= operations
    for operation in operations:
        assert operation in PERMISSION_OF, f"{operation}: not mapped in cloud_errors.PERMISSION_OF"
    actions = {PERMISSION_OF[operation] for operation in operations}
    assert actions == {
        "s3:ListBucket",
        "s3:GetObject",
        "s3:PutObject",
        "s3:AbortMultipartUpload",
        "s3:DeleteObject",
    }
    for doc in DOCS:
        text = doc.read_text()
        missing = sorted(action for action in actions if f"`{action}`" not in text)
        assert not missing, f"{doc.relative_to(ROOT)} does not list {missing}"
