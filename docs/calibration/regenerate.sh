#!/usr/bin/env bash
# Regenerate every committed calibration report from the committed records (CPU only, about a minute).
# Run from the repository root with the project installed (pip install -e '.[plot]').
set -u
REF_NOTE="Data: shared/reference/h200-reference-grid.md, imported with \`btj calibrate import tests/planner/data/h200_reference_grid.yaml -o benchmarks/calibration/records/h200-reference-grid.jsonl\` (the eager two-GPU 8B point has no exact memory). This is the plain-PyTorch reference trainer, not this project's trainer: it checks the machinery and the planner's model structure."
BTJ_NOTE="Data: benchmarks/results/trainer_h200.json (trainer-perf's grid, 2026-11-29, sequence 4096, 1B/3B/8B on one H200 and 8B on two), imported with \`btj calibrate import benchmarks/results/trainer_h200.json -o benchmarks/calibration/records/h200/trainer_h200.jsonl\` (the full-logits loss variant is left out: the planner models the trainer's 8192-token loss chunks). It is NOT the issue-6 grid: one sequence length, no micro-batch ladders to OOM, no measured OOM, one two-GPU scenario."

btj calibrate import tests/planner/data/h200_reference_grid.yaml -o benchmarks/calibration/records/h200-reference-grid.jsonl
FIT="btj calibrate fit benchmarks/calibration/records/h200-reference-grid.jsonl --base h200-reference -o docs/calibration/h200-reference/h200-reference-fit.yaml"
$FIT
btj calibrate report benchmarks/calibration/records/h200-reference-grid.jsonl \
  --calibration docs/calibration/h200-reference/h200-reference-fit.yaml --base h200-reference \
  -o docs/calibration/h200-reference --fit-command "$FIT" --note "$REF_NOTE" \
  --title "H200 reference grid (plain PyTorch FSDP2 trainer): calibration report"

btj calibrate import benchmarks/results/trainer_h200.json -o benchmarks/calibration/records/h200/trainer_h200.jsonl
FIT="btj calibrate fit benchmarks/calibration/records/h200 --base btj-trainer -o docs/calibration/h200-btj-trainer/btj-trainer-h200.yaml"
$FIT
btj calibrate report benchmarks/calibration/records/h200 \
  --calibration docs/calibration/h200-btj-trainer/btj-trainer-h200.yaml --base btj-trainer \
  -o docs/calibration/h200-btj-trainer --fit-command "$FIT" --note "$BTJ_NOTE" \
  --title "H200, this project's trainer (benchmarks/trainer_h200.py results): calibration report"

btj plot -o docs/calibration/btj-plot-example.png
