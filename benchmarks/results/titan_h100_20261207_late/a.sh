set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/operator/src:$PWD/trainer_image/src || exit 1
export PYTHONUNBUFFERED=1 BTJ_BENCH_COMMIT=$1
nvidia-smi > $OUT/smi.txt; CARD=h100; grep -q H200 $OUT/smi.txt && CARD=h200
T=/tmp/oA; mkdir -p $T
timeout 120 python3 .devcmd/smoke.py $T/smoke.json 2>&1 | tail -30
python3 benchmarks/titan_side_by_side.py --card $CARD --configs 3b-bf16-b2,ours-3b-bf16-b2+compiled_update=true,ours-3b-bf16-b2+fp32_weight_gradients=true,ours-3b-bf16-b2+compiled_update=true+fp32_weight_gradients=true,3b-fp8-b2,ours-3b-fp8-b2+compiled_update=true --out $T --budget-s 430 2>&1 | tail -60
cp $T/*.json $OUT/; tar czf $OUT/all.tgz -C /tmp oA
