#!/usr/bin/env bash
# Install what is missing into .venv (see scripts/install.sh), then start the studio on the embedded h3-nano model
# at http://127.0.0.1:7860/ with that virtualenv's python.
set -euo pipefail
cd "$(dirname "$0")"
H3_SKIP_BROWSER=1 exec bash scripts/install.sh app.py "$@"
