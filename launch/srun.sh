#!/usr/bin/env bash
# Profile any training script with one Slurm task per rank (no torchrun), inside an allocation or making one:
#   launch/srun.sh train.py --your-args                  inside sbatch/salloc: as many tasks as the allocation has
#   NTASKS=8 launch/srun.sh train.py --your-args         8 tasks (srun allocates them when run outside a job)
#   launch/srun.sh -m pkg.train --your-args              a module, as python -m runs it (found from this directory)
# distprof.launch gives each task RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT from
# Slurm's variables where they are not set. distprof options come from DISTPROF_* variables (DISTPROF_OUT, ...).
# Environment: NTASKS [the allocation's], SRUN_ARGS (extra srun options, word-split) [], PYTHON [python3],
# OMP_NUM_THREADS [SLURM_CPUS_PER_TASK, else 1].
set -euo pipefail
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
ntasks=()
if [ -n "${NTASKS:-}" ]; then
    ntasks=(--ntasks="$NTASKS")
fi
# shellcheck disable=SC2086  # SRUN_ARGS is a list of options
exec srun "${ntasks[@]}" --kill-on-bad-exit=1 ${SRUN_ARGS:-} "${PYTHON:-python3}" -m distprof.launch "$@"
