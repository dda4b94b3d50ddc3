"""Which BlackwellTrainingJob of a namespace holds a checkpoint folder: one with a child, else the first."""

from __future__ import annotations

from typing import Any

from blackwell_operator.lifecycle.references import checkpoint_folder, path_holder


def job(name: str, created: str, path: str | None, **meta: Any) -> dict[str, Any]:
    spec = {"training": {"checkpoint": {"path": path}}} if path is not None else {"training": {}}
    status = meta.pop("status", {})
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": created, **meta},
        "spec": spec,
        "status": status,
    }


def test_the_folder_is_normalised_and_none_without_a_path() -> None:
    assert checkpoint_folder(job("a", "t", "/fsx/ckpt/a/")) == "/fsx/ckpt/a"
    assert checkpoint_folder(job("a", "t", "/fsx//ckpt/./a")) == "/fsx/ckpt/a"
    assert checkpoint_folder(job("a", "t", None)) is None
    assert checkpoint_folder(job("a", "t", "")) is None
    assert checkpoint_folder({"spec": {"training": "not an object"}}) is None


def test_the_earlier_job_holds_the_folder_and_a_tie_goes_by_name() -> None:
    first = job("first", "2026-12-06T06:00:00Z", "/fsx/c")
    second = job("second", "2026-12-06T06:00:05Z", "/fsx/c/")
    both = [first, second]
    assert path_holder(second, both) is first
    assert path_holder(first, both) is None  # the later one does not hold the earlier one up
    tied = job("also", "2026-12-06T06:00:00Z", "/fsx/c")
    assert path_holder(first, [first, tied]) is tied and path_holder(tied, [first, tied]) is None
    assert path_holder(second, [second, job("other", "2026-12-06T05:00:00Z", "/fsx/d")]) is None
    assert path_holder(job("none", "2026-12-06T07:00:00Z", None), both) is None


def test_a_job_with_a_child_holds_the_folder_and_one_being_deleted_does_not() -> None:
    running = job("zeta", "2026-12-06T06:00:09Z", "/fsx/c", status={"child": {"name": "zeta"}})
    newer_name = job("alpha", "2026-12-06T06:00:01Z", "/fsx/c")
    assert path_holder(newer_name, [newer_name, running]) is running
    going = job("going", "2026-12-06T05:00:00Z", "/fsx/c", deletionTimestamp="2026-12-06T06:00:00Z")
    assert path_holder(newer_name, [newer_name, going]) is None
