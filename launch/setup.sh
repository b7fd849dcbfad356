#!/usr/bin/env bash
# Install distprof and its test tools into the current Python environment.
# Without torch, take the CPU wheel (a bare `torch` requirement can pull a multi-GB CUDA build).
# The HTML-report tests drive Debian's headless Chromium; it is installed when missing and apt is usable
# (set DISTPROF_SETUP_BROWSER=0 to skip; those tests then skip with a reason).
# The launcher tests need MPICH's mpiexec (pip's mpich, installed in CI and wherever there is no mpiexec on PATH, so
# a cluster's own MPI is never shadowed) and, as root with apt, Debian's openmpi-bin and slurm-wlm (a local one-node
# Slurm); set DISTPROF_SETUP_CLUSTER=0 to skip those two (their tests then skip outside CI). The framework tests need
# transformers, accelerate, lightning and deepspeed (below; DISTPROF_SETUP_FRAMEWORKS=0 skips them).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "setup: torch not found, installing the CPU build torch==2.13.0" >&2
    "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q -e ".[test,mpi]"
# The trainers the framework tests run (tests/test_frameworks.py): Hugging Face transformers + accelerate, Lightning and
# DeepSpeed, at the versions tested, constrained to the torch and numpy already here so that neither moves. DeepSpeed
# installs from source without compiling its ops (DS_BUILD_OPS=0; on CPU it uses its pure-Python CPU accelerator, gloo).
# Set DISTPROF_SETUP_FRAMEWORKS=0 to skip them (their tests then skip outside CI). About 25 s from a warm pip cache.
if [ "${DISTPROF_SETUP_FRAMEWORKS:-1}" != "0" ]; then
    keep=$(mktemp)
    "$PY" -c 'import importlib.metadata as m; print("\n".join(f"{p}=={m.version(p)}" for p in ("torch", "numpy")))' \
        > "$keep"
    echo "setup: installing transformers, accelerate, lightning and deepspeed for the framework tests" >&2
    DS_BUILD_OPS=0 "$PY" -m pip install -q -c "$keep" "transformers==5.24.0" "accelerate==1.16.0" \
        "lightning==2.6.6" "deepspeed==0.19.8"
    rm -f "$keep"
fi
if [ "${CI:-}" = "true" ] || ! command -v mpiexec >/dev/null 2>&1; then
    echo "setup: installing MPICH from PyPI for the MPI launcher tests" >&2
    "$PY" -m pip install -q mpich
fi
if [ "${DISTPROF_SETUP_BROWSER:-1}" != "0" ] && ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1 \
        && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    echo "setup: installing Debian's chromium for the HTML-report tests" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
        || echo "setup: warning: could not install chromium; the browser tests will skip" >&2
fi
cluster_pkgs=()
command -v slurmctld >/dev/null 2>&1 || cluster_pkgs+=(slurm-wlm)
command -v mpiexec.openmpi >/dev/null 2>&1 || cluster_pkgs+=(openmpi-bin)
if [ "${DISTPROF_SETUP_CLUSTER:-1}" != "0" ] && [ ${#cluster_pkgs[@]} -gt 0 ] \
        && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    echo "setup: installing Debian's ${cluster_pkgs[*]} for the Slurm and MPI launcher tests" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${cluster_pkgs[@]}" >/dev/null) \
        || echo "setup: warning: could not install ${cluster_pkgs[*]}; their tests will skip" >&2
fi
