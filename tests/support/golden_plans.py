"""The golden plans' cases and their compact records (tests/planner/golden/plans.json), computed now.

tests/planner/test_golden.py compares the committed file with these; scripts/generate.sh rewrites it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from blackwell_operator.catalogs import list_presets
from blackwell_operator.errors import PlanningError
from blackwell_operator.planner import plan_job
from blackwell_operator.units import GIB
from tests.support.specs import make_spec

GOLDEN = Path(__file__).resolve().parents[1] / "planner" / "golden" / "plans.json"
# B200 (modelled), H200 (the shared fit) and H100 (its own constants, docs/calibration/h100).
INSTANCES = ("ml.p6-b200.48xlarge", "ml.p5en.48xlarge", "ml.p5.48xlarge")
CASES = [
    (preset.name, instance, nodes, seq)
    for preset in list_presets()
    for instance in INSTANCES
    for nodes in (1, 2)
    for seq in (4096, 8192)
]


def case_id(preset: str, instance: str, nodes: int, seq: int) -> str:
    return f"{preset}/{instance.split('.')[1]}/n{nodes}/s{seq}"


def summarise(preset: str, instance: str, nodes: int, seq: int) -> dict[str, Any]:
    """The compact golden record of one case."""
    try:
        plan = plan_job(make_spec(preset, instance, nodes, seq))
    except PlanningError as exc:
        return {"error": exc.message}
    c = plan.chosen
    return {
        "precision": c.precision.value,
        "recipe": c.precision_recipe.value,
        "ac": c.activation_checkpointing.value,
        "mbs": c.micro_batch_size,
        "ga": c.gradient_accumulation_steps,
        "sharding": c.sharding.value,
        "cp": c.context_parallel,
        "tokens_per_second_per_gpu": round(plan.predicted.tokens_per_second_per_gpu),
        "mfu": round(plan.predicted.model_flops_utilization, 3),
        "peak_reserved_gib": round(plan.predicted.memory.peak_reserved / GIB, 1),
    }


def current() -> dict[str, dict[str, Any]]:
    return {case_id(*case): summarise(*case) for case in CASES}


def golden_text() -> str:
    """The file as it should be committed: one case per line keeps it compact and its diffs readable."""
    lines = [f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(current().items())]
    return "{\n" + ",\n".join(lines) + "\n}\n"
