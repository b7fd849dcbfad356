#!/usr/bin/env bash
# Profile any training script under an MPI launcher (no torchrun):  NP=4 launch/mpirun.sh train.py --your-args
# (or a module, as python -m runs it: NP=4 launch/mpirun.sh -m pkg.train --your-args).
# distprof.launch gives each rank RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT from
# the MPI variables (Open MPI, MPICH/Intel MPI, MVAPICH2) where they are not set. On several nodes outside Slurm, set
# MASTER_ADDR to rank 0's host. distprof options come from DISTPROF_* variables (DISTPROF_OUT, DISTPROF_ACTIVE, ...).
# Environment: NP [2] ranks, MPIEXEC [mpiexec], MPIEXEC_ARGS (extra launcher options, word-split) [], PYTHON
# [python3], OMP_NUM_THREADS [1].
set -euo pipefail
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
MPIEXEC=${MPIEXEC:-mpiexec}
# The interpreter by its absolute path: Open MPI puts its own bin directory first on the ranks' PATH, where
# `python3` may be another Python than this one.
PY=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')
forward=()
if "$MPIEXEC" --version 2>/dev/null | grep -qi "open mpi\|openrte"; then
    # Open MPI's mpirun passes only the variables named with -x to the ranks; MPICH/Hydra passes all of them.
    for var in $(compgen -e); do
        case "$var" in
            OMP_NUM_THREADS|PYTHONPATH|DISTPROF_*|MASTER_ADDR|MASTER_PORT) forward+=(-x "$var") ;;
        esac
    done
fi
# shellcheck disable=SC2086  # MPIEXEC_ARGS is a list of options
exec "$MPIEXEC" -n "${NP:-2}" "${forward[@]}" ${MPIEXEC_ARGS:-} "$PY" -m distprof.launch "$@"
