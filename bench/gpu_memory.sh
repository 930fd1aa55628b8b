#!/usr/bin/env bash
# One device call of bench/memory_bench.py on one H200 (issue 23 item 3). Carry .whl (diffusers' wheel).
#
#   bash bench/gpu_memory.sh [extra memory_bench args...]
#
# Default (REQUESTS): with the conditioner resident, baseline (1 step), sol (20 steps: its cache refuses fewer, and
# steps 10+ are sparse) and turbo (1 step, LoRA merged) at 5 s; baseline (1 step) and turbo-sparse (2 steps: dense,
# then sparse) at 14.375 s; then baseline at both durations with the conditioner offloaded. The peak is inside a
# step and in the decode. Measured on the H200 (2026-12-04): the build takes under a minute; a request ~20 s at
# 5 s (sol's 20 steps 82 s) and ~67 s at 14.375 s (one dense step 35 s, decode 24 s); an offloaded encode 11-38 s
# before pinned host memory. The default set runs about 6 min; split it with REQUESTS if the call limit is near. Reload writes the conditioner to
# disk (48 GiB): add it alone, `REQUESTS=baseline@5 bash bench/gpu_memory.sh --placements reload`.
# Copy $OUT/memory_bench.json to bench/results/memory_bench_h200.json and fill BENCHMARKS.md's table from it.
set -o pipefail
OUT=${OUT:-/tmp/memory_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/diffusers-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >"$OUT/nvidia_smi.csv" 2>&1
REQUESTS=${REQUESTS:-baseline@5,sol@5:20,turbo@5,baseline@14.375,turbo-sparse@14.375:2}
python3 -m bench.memory_bench --config full --out "$OUT" --requests "$REQUESTS" "$@" 2>&1 | tee "$OUT/memory_log.txt"
status=$?
nvidia-smi --query-gpu=memory.used --format=csv >>"$OUT/nvidia_smi.csv" 2>&1
exit $status
