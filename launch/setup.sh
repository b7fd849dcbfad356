#!/usr/bin/env bash
# Install distprof and its test tools into the current Python environment.
# Without torch, take the CPU wheel (a bare `torch` requirement can pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "setup: torch not found, installing the CPU build torch==2.13.0" >&2
    "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q -e ".[test]"
