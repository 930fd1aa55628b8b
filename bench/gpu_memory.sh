#!/usr/bin/env bash
# One device call of bench/memory_bench.py on one H200 (issue 23 item 3). Carry .whl (diffusers' wheel).
#
#   bash bench/gpu_memory.sh [extra memory_bench args...]
#
# Default: tiers baseline, sol and turbo at 5 s and 14.375 s with the conditioner resident, then baseline at both
# durations with it offloaded; one denoising step each (the peak is inside a step and in the decode). About 1-2 min
# to install and build the 33B transformer plus the 47.8 GiB conditioner with random weights, then per request one
# step (5 s: ~6 s dense; 14.375 s: ~36 s dense) and the decode (~8 s / ~20 s): about 6-7 min, inside 600 s. Reload writes the conditioner to
# disk (48 GiB): add it alone, `bash bench/gpu_memory.sh --placements reload --tiers baseline --durations 5`.
# Copy $OUT/memory_bench.json to bench/results/memory_bench_h200.json and fill BENCHMARKS.md's table from it.
set -o pipefail
OUT=${OUT:-/tmp/memory_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/diffusers-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >"$OUT/nvidia_smi.csv" 2>&1
python3 -m bench.memory_bench --config full --out "$OUT" "$@" 2>&1 | tee "$OUT/memory_log.txt"
status=$?
nvidia-smi --query-gpu=memory.used --format=csv >>"$OUT/nvidia_smi.csv" 2>&1
exit $status
