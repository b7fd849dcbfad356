#!/usr/bin/env bash
# Profile any training script on this node:  NPROC=4 launch/torchrun.sh train.py --your-args
# or a module, as python -m runs it:           NPROC=4 launch/torchrun.sh -m pkg.train --your-args
# distprof options come from DISTPROF_* variables (e.g. DISTPROF_OUT, DISTPROF_ACTIVE).
set -euo pipefail
exec "${PYTHON:-python3}" -m torch.distributed.run --standalone --nproc_per_node="${NPROC:-2}" -m distprof.launch "$@"
