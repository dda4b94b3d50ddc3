"""Adopt a fitted H200 calibration as the shipped `btj-trainer` profile, carrying Blackwell along by ratio;
or a fit of another GPU as that GPU's own constants in it (`--gpu`).

    python benchmarks/calibration/adopt.py docs/calibration/h200-issue6/btj-trainer-h200.yaml \
        --base docs/calibration/h200-issue6/base-btj-trainer.yaml
    python benchmarks/calibration/adopt.py docs/calibration/h100/btj-trainer-h100.yaml \
        --base docs/calibration/h100/base-btj-trainer.yaml --gpu H100

With `--gpu`, every constant the fit moved goes into the shipped profile's `gpus.<GPU>` block with the fit
as its source (the planner uses them for that GPU only, Calibration.for_gpu); nothing shared changes.

The fit moves only Hopper (compute capability 9.x) recipe efficiencies. Blackwell (10.x) efficiencies are
derived, never measured: spec ratios times the Hopper correction of the same recipe family. This keeps that
derivation: each 10.x efficiency is multiplied by its family's 9.x ratio (fitted / base). MXFP8 and NVFP4
run through Transformer Engine like the `current` recipe, so they follow its ratio.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "operator" / "src" / "blackwell_operator" / "calibration" / "btj-trainer.yaml"
# Blackwell recipe -> the Hopper recipe whose fitted correction it follows.
FAMILY = {"mxfp8-block": "current", "nvfp4-block": "current"}


def blackwell_scaled(fitted: dict[str, Any], base: dict[str, Any]) -> list[str]:
    """Scale 10.x efficiencies by the 9.x fitted/base ratio of their family; say what moved."""
    hopper_new, hopper_old = fitted["throughput"]["recipes"]["9"], base["throughput"]["recipes"]["9"]
    notes = []
    for recipe, consts in fitted["throughput"]["recipes"].get("10", {}).items():
        family = FAMILY.get(recipe, recipe)
        if family not in hopper_new or family not in hopper_old:
            continue
        ratio = hopper_new[family]["efficiency"] / hopper_old[family]["efficiency"]
        before = base["throughput"]["recipes"]["10"][recipe]["efficiency"]
        consts["efficiency"] = round(min(1.0, before * ratio), 4)
        after = consts["efficiency"]
        notes.append(f"#   10.{recipe}: {before} -> {after} (x{ratio:.3f}, the 9.{family} fit)")
        fitted["sources"][f"throughput.recipes.10.{recipe}.efficiency"] = (
            f"Derived [derived]: {before} (spec ratios and published anchors) x {ratio:.3f}, the H200 fit's "
            f"change of the {family} recipe (benchmarks/calibration/adopt.py). Not measured on Blackwell."
        )
    return notes


def _keep_trainer_block(body: str, shipped: Path) -> str:
    """The shipped file's `trainer:` block verbatim (its comments give reasons); fits never change it."""
    if not shipped.exists():
        return body
    old = shipped.read_text()
    start, end = old.find("\ntrainer:\n"), old.find("\nmemory:\n")
    new_start, new_end = body.find("\ntrainer:\n"), body.find("\nmemory:\n")
    if min(start, end, new_start, new_end) < 0:
        return body
    return body[:new_start] + old[start:end] + body[new_end:]


def moved_constants(fitted: dict[str, Any], base: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Every dotted memory.*/throughput.* constant whose value the fit changed."""
    out: dict[str, float] = {}
    for key, value in fitted.items():
        path = f"{prefix}{key}"
        if not prefix and key not in ("memory", "throughput"):
            continue
        if isinstance(value, dict):
            out.update(moved_constants(value, base.get(key, {}), f"{path}."))
        elif isinstance(value, int | float) and not isinstance(value, bool) and value != base.get(key):
            out[path] = float(value)
    return out


def adopt_gpu(fitted_path: Path, base_path: Path, gpu: str, output: Path) -> None:
    """Write the fit's moved constants as the shipped profile's gpus.<gpu> block."""
    text = fitted_path.read_text()
    fitted, base = yaml.safe_load(text), yaml.safe_load(base_path.read_text())
    moved = moved_constants(fitted, base)
    records = next((line for line in text.splitlines() if line.startswith("# Records:")), "# Records: ?")
    source = (
        f"Fitted on {gpu} [measured]: {fitted_path} ({records.removeprefix('# ').lower()}), adopted with "
        f"benchmarks/calibration/adopt.py --gpu {gpu}"
    )
    shipped = output.read_text()
    data = yaml.safe_load(shipped)
    gpus = data.get("gpus") or {}
    gpus[gpu] = {
        "description": f"This trainer measured on {gpu} (docs/calibration/{gpu.lower()}/report.md): the "
        "constants its fit moved from the shared (H200-fitted) ones.",
        "constants": {k: round(v, 6) for k, v in moved.items()},
        "sources": {k: source for k in moved},
    }
    block = yaml.safe_dump({"gpus": gpus}, sort_keys=False, width=110)
    start = shipped.find("\ngpus:\n")
    body = shipped if start < 0 else shipped[: start + 1]
    output.write_text(body.rstrip("\n") + "\n" + block)
    print(f"wrote {output}: gpus.{gpu} with {len(moved)} constants", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("fitted", type=Path, help="calibration YAML written by `btj calibrate fit`")
    parser.add_argument("--base", type=Path, required=True, help="the base that fit started from")
    parser.add_argument("-o", "--output", type=Path, default=SHIPPED)
    parser.add_argument("--gpu", default="", help="adopt as this GPU's own constants (the catalog's name)")
    args = parser.parse_args(argv)
    if args.gpu:
        adopt_gpu(args.fitted, args.base, args.gpu, args.output)
        return 0
    text = args.fitted.read_text()
    fitted, base = yaml.safe_load(text), yaml.safe_load(args.base.read_text())
    notes = blackwell_scaled(fitted, base)
    fitted["name"] = "btj-trainer"
    fitted["status"] = "mixed"
    fitted["description"] = (
        "This project's trainer (FSDP2 + compile + chunked loss + SAC + TE/torchao low precision). Hopper "
        "constants fitted to its H200 runs; Blackwell recipe efficiencies derived."
    )
    header = [
        "# Calibration of this project's trainer (blackwell_trainer). STATUS: mixed.",
        f"# Adopted from {args.fitted.relative_to(REPO) if args.fitted.is_absolute() else args.fitted} with",
        f"#   python benchmarks/calibration/adopt.py {args.fitted} --base {args.base}",
        "# Memory constants and Hopper (9.x) recipe efficiencies are fitted to this trainer on H200; the",
        "# fit's own header follows. Blackwell (10.x) efficiencies stay derived, scaled by the Hopper fit",
        "# of their family:",
        *notes,
        "# Constants shared by both generations (activation bytes, fragmentation, attention and elementwise",
        "# efficiency) are fitted on H200 and assumed for Blackwell: docs/calibration/README.md.",
    ]
    fit_header = [line for line in text.splitlines() if line.startswith("#")]
    body = _keep_trainer_block(yaml.safe_dump(fitted, sort_keys=False, width=110), args.output)
    args.output.write_text("\n".join([*header, *fit_header, body]))
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
