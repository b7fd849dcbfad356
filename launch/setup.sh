#!/usr/bin/env bash
# Install distprof and its test tools into the current Python environment.
# Without torch, take the CPU wheel (a bare `torch` requirement can pull a multi-GB CUDA build).
# The HTML-report tests drive Debian's headless Chromium; it is installed when missing and apt is usable
# (set DISTPROF_SETUP_BROWSER=0 to skip; those tests then skip with a reason).
# The launcher tests need MPICH's mpiexec (pip's mpich, installed in CI and wherever there is no mpiexec on PATH, so
# a cluster's own MPI is never shadowed) and, as root with apt, Debian's openmpi-bin and slurm-wlm (a local one-node
# Slurm); set DISTPROF_SETUP_CLUSTER=0 to skip those two (their tests then skip outside CI).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "setup: torch not found, installing the CPU build torch==2.13.0" >&2
    "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q -e ".[test,mpi]"
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
