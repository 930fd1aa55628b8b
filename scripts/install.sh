#!/usr/bin/env bash
# Idempotent install for a fresh machine, into a virtualenv (.venv in the repo root, or $H3_VENV), never into the
# system python (Debian's and Ubuntu's refuse: externally-managed-environment). Steps:
#   1. the virtualenv, made with $PYTHON (default python3) -m venv
#   2. CPU torch first (so nothing pulls a multi-GB CUDA build), then requirements.txt; again only when
#      requirements.txt changed since the last install
#   3. lpips without its torchvision dependency; sglang's wheel without its serving runtime (the tests read its
#      /v1/videos protocol models, tests/sglang_protocol.py)
#   4. Debian's chromium for the browser test (skipped with H3_SKIP_BROWSER=1)
# With arguments, runs them with the virtualenv's python afterwards: `bash scripts/install.sh app.py --port 8000`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${H3_VENV:-.venv}
BASE_PY=${PYTHON:-python3}
PY="$VENV/bin/python"
STAMP="$VENV/.h3-requirements.sha256"

step() { printf '==> %s\n' "$*" >&2; }
pip_install() { "$PY" -m pip install --progress-bar on "$@"; }

if [ ! -x "$PY" ]; then
  step "1/4 creating the virtualenv $VENV ($("$BASE_PY" --version 2>&1))"
  if ! "$BASE_PY" -m venv "$VENV"; then
    rm -rf "$VENV"
    echo "error: '$BASE_PY -m venv' failed; on Debian/Ubuntu install the venv module first:" \
         "sudo apt-get install python3-venv (or set PYTHON to another python ≥ 3.11)" >&2
    exit 1
  fi
else
  step "1/4 virtualenv $VENV exists"
fi

wanted=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$wanted" ]; then
  step "2/4 installing Python packages into $VENV (first time: a few minutes; CPU torch, then requirements.txt)"
  pip_install torch==2.13.0
  pip_install -r requirements.txt
  echo "$wanted" > "$STAMP"
else
  step "2/4 Python packages up to date (requirements.txt unchanged)"
fi

# lpips needs torchvision, whose PyPI wheel does not import beside the CPU torch and breaks transformers;
# install lpips alone: the studio uses only its linear-head weights (quality/lpips_net.py).
if ! "$PY" -m pip show -q lpips >/dev/null 2>&1; then
  step "3/4 installing lpips without its torchvision dependency"
  pip_install --no-deps lpips==0.1.4
fi
# sglang: only its pydantic protocol models are used (tests/sglang_protocol.py, the /v1/videos oracle); its
# dependencies are the whole serving stack (CUDA torch, kernels), so the wheel goes in alone.
SGLANG_VERSION=0.5.23
if [ "$("$PY" -m pip show sglang 2>/dev/null | sed -n 's/^Version: //p')" != "$SGLANG_VERSION" ]; then
  step "3/4 installing sglang $SGLANG_VERSION without its serving runtime (its /v1/videos models are the test oracle)"
  pip_install --no-deps "sglang==$SGLANG_VERSION"
fi
if "$PY" -m pip show -q torchvision >/dev/null 2>&1 && ! "$PY" -c "import torchvision" 2>/dev/null; then
  step "3/4 removing a torchvision that does not import beside this torch"
  "$PY" -m pip uninstall -y torchvision
fi

if [ "${H3_SKIP_BROWSER:-0}" != "1" ] && [ ! -x /usr/bin/chromium ]; then
  step "4/4 installing Debian's chromium for the browser test"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install Debian chromium; the browser test will be skipped" >&2
fi

if [ $# -gt 0 ]; then
  exec "$PY" "$@"
fi
