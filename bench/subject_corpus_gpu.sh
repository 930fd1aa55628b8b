#!/usr/bin/env bash
# One device call that builds issue 35's corpus (bench/subject_corpus.py) on one GPU (8 engine processes share it),
# then runs the GPU test suite (issue 39 item 1) on the same machine.
# CORPUS_ARGS adds bench.subject_corpus options (prompts, seeds, configs); TEST_SECS=0 skips the GPU suite.
# Carry .whlx: diffusers 0.42.1 and av 18.1.0 (cp311-abi3), each wheel unzipped and packed as NAME.tar.xz (the
# zipped wheels are over what a call carries; xz brings av from 36 to 25 MB).
# What comes back is at most 64 MiB, so the corpus is packed in two halves of whole (prompt, seed) groups:
# $OUT/corpus_a.tar.* now, and /tmp/corpus_b.tar.* for a second call on the still-warm machine
# (`cp /tmp/corpus_b.tar.* $OUT/`). Unpack with: cat corpus_a.tar.* | tar xf - -C DIR (then the same for b).
set -o pipefail
mkdir -p /tmp/site && for f in .whlx/*.tar.xz; do tar xJf "$f" -C /tmp/site || exit 1; done
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-/tmp/corpus_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/nvidia_smi.csv" 2>&1
python3 -c "import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)" \
    >>"$OUT/nvidia_smi.csv" 2>&1
timeout "${SECS:-300}" python3 -m bench.subject_corpus --out /tmp/corpus --workers "${WORKERS:-8}" --device cuda ${CORPUS_ARGS:-} \
    2>&1 | tee "$OUT/corpus_log.txt" | grep -E "^\[[0-9]*00/|pairs|Error|error|done" | tail -20
python3 -m bench.subject_corpus --out /tmp/corpus --assemble --device cuda ${CORPUS_ARGS:-} 2>&1 | tail -1
# The GPU suite while the clips are packed (the packing needs no GPU).
python3 - <<'PY'
import json, os, tarfile
from pathlib import Path
root = Path("/tmp/corpus")
pairs = json.loads((root / "corpus.json").read_text())["pairs"]
groups = {}
for p in pairs:
    groups.setdefault((p["prompt"], p["seed"]), set()).update(f for f in (p["baseline"], p["candidate"]) if f)
budget, used, halves = 56 * 2**20, 0, {"a": [], "b": []}
for key, files in groups.items():
    size = sum((root / f).stat().st_size for f in files)
    half = "a" if used + size <= budget else "b"
    used += size if half == "a" else 0
    halves[half] += sorted(files)
for half, files in halves.items():
    with tarfile.open(f"/tmp/corpus_{half}.tar", "w") as tar:
        if half == "a":
            for name in ("corpus.json", "clips.jsonl"):
                tar.add(root / name, arcname=name)
        for f in files:
            tar.add(root / f, arcname=f)
    print(half, len(files), "clips", os.path.getsize(f"/tmp/corpus_{half}.tar") // 2**20, "MiB")
PY
(cd /tmp && split -b 15M corpus_a.tar "$OUT/corpus_a.tar." && split -b 15M corpus_b.tar corpus_b.tar.)
[ "${TEST_SECS:-240}" = 0 ] || timeout "${TEST_SECS:-240}" python3 -m pytest -q -p no:cacheprovider -m gpu -rs --durations=15 \
    tests/test_kernels_gpu.py tests/test_bsa_backend.py tests/test_peers.py >"$OUT/gpu_tests.txt" 2>&1
tail -5 "$OUT/gpu_tests.txt"
ls -la "$OUT" /tmp/corpus_b.tar.*
