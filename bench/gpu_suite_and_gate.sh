#!/usr/bin/env bash
# One device call (one H100 or H200; carry .whld): the GPU test tier, then bench/trajectory.py on the GPU for the
# Sol-Attn gate's bf16 figures (issue 37: the gate's floor with every tile kept, and sol / sparse-aggressive).
#
#   bash bench/gpu_suite_and_gate.sh [PROMPTS]
#
# PyAV (the engine writes MP4s with it; the image has none) is too large to carry beside the tree in one call: it
# travels xz-tarred in parts (.whlx0/av.part00, .whlx1/av.part01, ...), one call each on a warm machine, each kept under
# /tmp/avparts; the call that finds them all (AV_PARTS) unpacks them.
#
# bench/trajectory.py imports the studio's trajectory comparison, which needs SQLAlchemy, Alembic and Mako: carry
# them as .whlx3/*.tar.xz (tar of the venv's site-packages folders), unpacked into /tmp/site when present.
#
# Writes $OUT/gpu_tests.txt, $OUT/trajectory_gpu_64.json, $OUT/trajectory_gpu_128.json, $OUT/env.txt.
set -o pipefail
PROMPTS=${1:-12}
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT" /tmp/site
mkdir -p /tmp/avparts; cp .whlx*/av.part* /tmp/avparts/ 2>/dev/null
if [ "${STAGE_ONLY:-0}" = 1 ]; then ls -la /tmp/avparts; exit 0; fi
[ -d /tmp/site/diffusers ] || { xz -dc .whld/diffusers.tar.xz | tar xf - -C /tmp/site || exit 1; }
[ "$(ls /tmp/avparts | wc -l)" = "${AV_PARTS:-3}" ] && [ ! -d /tmp/site/av ] && { cat /tmp/avparts/av.part* | xz -dc | tar xf - -C /tmp/site || exit 1; }
for extra in .whlx3/*.tar.xz; do [ -f "$extra" ] && xz -dc "$extra" | tar xf - -C /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
{ nvidia-smi --query-gpu=name,memory.total --format=csv; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
  for m in cv2 av flip_evaluator lpips sqlalchemy fastapi; do python3 -c "import $m" 2>/dev/null && echo "$m yes" || echo "$m no"; done; } >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu --continue-on-collection-errors --durations=10 tests 2>&1 | tail -40 >"$OUT/gpu_tests.txt"
tail -3 "$OUT/gpu_tests.txt"
for edge in 64 128; do
  timeout 150 python3 -m bench.trajectory --tiers sparse-keep1,sol,sparse-aggressive --prompts "$PROMPTS" \
      --short-edge $edge --out "$OUT/trajectory_gpu_$edge.json" 2>&1 | grep -v Warning | tail -4
done
