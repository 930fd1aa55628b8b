#!/usr/bin/env bash
# One device call of bench/tier_ratios.py on one H200 or H100 (issue 39 item 2). Carry .whld: diffusers' wheel unpacked and
# xz-tarred (.whld/diffusers.tar.xz, 2 MB; PyAV's 25 MB does not fit beside the tree, so the MP4 is bench/e2e_bench's
# OpenCV stand-in, recorded as `mux` in the JSON).
#
#   bash bench/tier_ratios_gpu.sh NAME SCHEDULE [DEADLINE_S]
#
# Calls made back to back on one warm machine (the lease keeps it between calls), each writing $OUT/NAME.json;
# `python -m bench.tier_ratios --summarise bench/results/tier_ratios_*.json` gives the ratios across them.
set -o pipefail
NAME=${1:?usage: bash bench/tier_ratios_gpu.sh NAME SCHEDULE [DEADLINE_S]}
SCHEDULE=${2:?schedule: tier:prompt[:compiled],...}
DEADLINE=${3:-560}
OUT=${OUT:-/tmp/tier_ratios_out}
mkdir -p "$OUT"
mkdir -p /tmp/site && xz -dc .whld/diffusers.tar.xz | tar xf - -C /tmp/site || exit 1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.sm,temperature.gpu --format=csv \
    >"$OUT/${NAME}_nvidia_smi.csv" 2>&1
python3 -m bench.tier_ratios --config full --schedule "$SCHEDULE" --deadline "$DEADLINE" --name "$NAME" \
    --out "$OUT" 2>&1 | tee "$OUT/${NAME}_log.txt"
status=$?
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv >>"$OUT/${NAME}_nvidia_smi.csv" 2>&1
exit $status
