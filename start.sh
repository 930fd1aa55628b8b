#!/usr/bin/env bash
# Install what is missing, then start the studio on the embedded h3-nano model at http://127.0.0.1:7860/
set -euo pipefail
cd "$(dirname "$0")"
H3_SKIP_BROWSER=1 bash scripts/install.sh
exec python3 app.py "$@"
