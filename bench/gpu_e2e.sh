#!/usr/bin/env bash
# One device call of bench/e2e_bench.py on one H200 (issue 16 item 1). Carry .whl (diffusers' wheel).
#
#   bash bench/gpu_e2e.sh TIERS [DURATION] [extra e2e_bench args...]
#
# Planned split, each call well inside the 600 s limit (composed estimates from bench/results/tier_bench.json,
# plus about 1-2 min to install, build the 33B model with random weights and warm up):
#   1. bash bench/gpu_e2e.sh baseline                        # ~300 s clip
#   2. bash bench/gpu_e2e.sh turbo,turbo-5 5 --requests 2    # ~2 x 61 + 2 x 38 s
#   3. bash bench/gpu_e2e.sh sol 5 --requests 2 --prompts mixed    # ~2 x 120-200 s
#   4. bash bench/gpu_e2e.sh turbo-sparse 14.375             # ~160 s clip + 20 s decode
#   5. bash bench/gpu_e2e.sh fp8,sol-fp8 ... (each ~1 clip per call; not yet measured anywhere)
# After each call copy $OUT/e2e_bench.json over bench/results/e2e_bench.json and commit it: the next call merges
# into it (--into). Nothing else persists between calls (a fresh machine each time).
set -o pipefail
TIERS=${1:?usage: bash bench/gpu_e2e.sh TIERS [DURATION] [extra e2e_bench args]}
DURATION=${2:-5}
shift $(( $# < 2 ? $# : 2 ))
OUT=${OUT:-/tmp/e2e_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/diffusers-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv >"$OUT/nvidia_smi.csv" 2>&1
python3 -m bench.e2e_bench --config full --tiers "$TIERS" --duration "$DURATION" \
    --into bench/results/e2e_bench.json --out "$OUT" "$@" 2>&1 | tee "$OUT/e2e_log.txt"
status=$?
nvidia-smi --query-gpu=memory.used --format=csv >>"$OUT/nvidia_smi.csv" 2>&1
exit $status
