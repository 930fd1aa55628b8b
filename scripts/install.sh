#!/usr/bin/env bash
# Idempotent install for a fresh machine: Python packages (CPU torch first, so nothing pulls a CUDA build),
# lpips without its torchvision dependency, and Debian's chromium for the browser test.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! $PY -c "import torch, diffusers, gradio, av, cv2, sqlalchemy, playwright, peft" 2>/dev/null; then
  $PY -m pip install -q torch==2.13.0
  $PY -m pip install -q -r requirements.txt
fi
# lpips needs torchvision, whose PyPI wheel does not import beside the CPU torch and breaks transformers;
# install lpips alone: LPIPS then reports itself unavailable with the reason.
$PY -m pip show -q lpips >/dev/null 2>&1 || $PY -m pip install -q --no-deps lpips==0.1.4
if $PY -m pip show -q torchvision >/dev/null 2>&1 && ! $PY -c "import torchvision" 2>/dev/null; then
  $PY -m pip uninstall -y -q torchvision
fi
if [ "${H3_SKIP_BROWSER:-0}" != "1" ] && [ ! -x /usr/bin/chromium ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install Debian chromium; the browser test will be skipped" >&2
fi
