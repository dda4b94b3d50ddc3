"""Whose a checkpoint is (job, model, data, global batch), and whether this job may resume it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blackwell_trainer.plan.config import Architecture, JobIdentity

CHECKPOINT_FIELD = "spec.training.checkpoint.path"
START_FROM_FIELD = "spec.training.checkpoint.startFrom"


def model_fingerprint(architecture: Architecture) -> str:
    """The model's shape as 16 hex digits: the architecture's canonical JSON, hashed."""
    canonical = json.dumps(architecture.model_dump(mode="json", by_alias=True), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def data_fingerprint(state: Mapping[str, Any]) -> str:
    """What the data source reads, from its checkpoint state: its kind, seed and files' fingerprint."""
    parts = [str(state.get("kind", "?")), f"seed {state.get('seed', '?')}"]
    if state.get("fingerprint"):
        parts.append(f"files {state['fingerprint']}")
    return ", ".join(parts)


@dataclass(frozen=True)
class Owner:
    """What a checkpoint records of the job that wrote it (COMPLETE.json's `owner`)."""

    job: JobIdentity
    model: str  # model_fingerprint
    data: str  # data_fingerprint
    global_batch_tokens: int

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.job.namespace,
            "name": self.job.name,
            "uid": self.job.uid,
            "model": self.model,
            "data": self.data,
            "globalBatchTokens": self.global_batch_tokens,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Owner:
        """ValueError (KeyError, TypeError) when `raw` is not an owner record."""
        job = JobIdentity(namespace=str(raw["namespace"]), name=str(raw["name"]), uid=str(raw["uid"]))
        return cls(
            job=job,
            model=str(raw["model"]),
            data=str(raw["data"]),
            global_batch_tokens=int(raw["globalBatchTokens"]),
        )


@dataclass(frozen=True)
class Judgement:
    """Whether this job may resume a checkpoint: `refusal` says why not (one line naming the field and
    the fix); `own` is True when the checkpoint records this job; `note` is a line to log."""

    refusal: str | None = None
    own: bool = False
    note: str | None = None


def same_job(recorded: JobIdentity, mine: JobIdentity) -> bool:
    """Same name, and the same namespace where both are known (a uid differs after a delete and re-create)."""
    if recorded.name != mine.name:
        return False
    return not (recorded.namespace and mine.namespace and recorded.namespace != mine.namespace)


def judge(recorded: Owner | None, mine: Owner, where: str) -> Judgement:
    """May the job `mine` resume the checkpoint at `where` (a step folder) that records `recorded`?

    The same job is the same namespace and name: a BlackwellTrainingJob deleted and re-created under its
    name continues its training (the operator's own advice to apply a spec change to a running job is
    exactly that), with a line naming both uids. Its model must be the one the checkpoint was written
    for; its data and global batch are checked by the data position's resume (data.py), with their own
    fixes, as before ownership records. Another job's checkpoint is refused:
    spec.training.checkpoint.startFrom is the explicit way to start from its weights. A checkpoint from
    before ownership records (none recorded) is resumed as this job's, but never counted as this job's
    own finished run.
    """
    if recorded is None:
        legacy = (
            f"checkpoint {where} records no owner (written before ownership records): resumed as this job's"
        )
        return Judgement(note=legacy)
    fix_other = (
        f"Fix: give this job a {CHECKPOINT_FIELD} of its own; to train on from those weights, set "
        f"{START_FROM_FIELD} to that folder (a new run from step 0)"
    )
    if not same_job(recorded.job, mine.job):
        return Judgement(
            refusal=f"{CHECKPOINT_FIELD}: checkpoint {where} belongs to job {recorded.job.describe()}, "
            f"not to this job {mine.job.describe()}; a job resumes only its own checkpoints. {fix_other}"
        )
    if recorded.model != mine.model:
        return Judgement(
            refusal=f"{CHECKPOINT_FIELD}: checkpoint {where} was written by a job of this name for another "
            f"model (architecture fingerprint {recorded.model}, this plan's {mine.model}). {fix_other}"
        )
    note = None
    if recorded.job.uid and mine.job.uid and recorded.job.uid != mine.job.uid:
        note = (
            f"checkpoint {where} was written by an earlier BlackwellTrainingJob {recorded.job.describe()} of "
            f"this namespace and name; this one (uid {mine.job.uid}) continues its training"
        )
    return Judgement(own=True, note=note)
