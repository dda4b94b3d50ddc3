set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/operator/src:$PWD/trainer_image/src || exit 1
export PYTHONUNBUFFERED=1 BTJ_BENCH_COMMIT=$1
nvidia-smi > $OUT/smi_b.txt; CARD=h100; grep -q H200 $OUT/smi_b.txt && CARD=h200
T=/tmp/oB; mkdir -p $T/s
python3 benchmarks/titan_side_by_side.py --card $CARD --configs 1b-bf16-b4,ours-1b-bf16-b4+compiled_update=true,ours-1b-bf16-b4+compiled_update=true+fp32_weight_gradients=true --out $T --budget-s 250 2>&1 | tail -40
BTJ_BENCH_MEMORY_SNAPSHOT=$T/snap python3 benchmarks/titan_side_by_side.py --card $CARD --configs ours-3b-bf16-b2+bf16_gradients=true,ours-3b-bf16-b2+bf16_gradients=true+loss_chunk=4096,ours-3b-bf16-b2 --out $T/s --budget-s 250 2>&1 | tail -40
ls -la $T/snap
cp $T/titan_side_by_side_$CARD.json $OUT/side_1b.json; cp $T/s/titan_side_by_side_$CARD.json $OUT/side_snap.json
tar czf $OUT/snap_summaries.tgz -C $T snap --exclude='*.pickle'; tar czf $OUT/allB.tgz -C /tmp oB --exclude='*.pickle'
