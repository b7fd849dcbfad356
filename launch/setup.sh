#!/usr/bin/env bash
# Install distprof and its test tools into the current Python environment.
# Without torch, take the CPU wheel (a bare `torch` requirement can pull a multi-GB CUDA build).
# The HTML-report tests drive Debian's headless Chromium; it is installed when missing and apt is usable
# (set DISTPROF_SETUP_BROWSER=0 to skip; those tests then skip with a reason).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "setup: torch not found, installing the CPU build torch==2.13.0" >&2
    "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q -e ".[test]"
if [ "${DISTPROF_SETUP_BROWSER:-1}" != "0" ] && ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1 \
        && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    echo "setup: installing Debian's chromium for the HTML-report tests" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
        || echo "setup: warning: could not install chromium; the browser tests will skip" >&2
fi
