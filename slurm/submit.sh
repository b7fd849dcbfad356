#!/usr/bin/env bash
# Submit a profiled training job and its report as one chain: the training job (template torchrun.sbatch or
# tasks.sbatch), then report.sbatch with --dependency=afterany on it (it runs however training ended).
#
#   slurm/submit.sh torchrun|tasks [sbatch options --] train.py|-m pkg.module [script args]
#   slurm/submit.sh torchrun train.py --lr 3e-4                  (no sbatch options: no --)
#   slurm/submit.sh tasks -m mytrain.train --lr 3e-4              (a module, found from this directory: Slurm runs the
#                                                                 job here, and python -m looks here first)
#   slurm/submit.sh tasks --nodes=2 --ntasks-per-node=8 --gpus-per-node=8 --time=1:00:00 -- train.py --lr 3e-4
#
# Everything of one run lands in DISTPROF_OUT/<training job id>/: the shards, both jobs' logs (%x-%j.out), report.json
# and report.html. The training job is submitted held and released once that directory exists (Slurm does not create
# the directory of a log file).
# Environment: DISTPROF_OUT [distprof], REPORT_SBATCH_ARGS (options for the report job only, word-split) [], and
# everything the templates read (NPROC_PER_NODE, TASKS_PER_NODE, PYTHON, DISTPROF_*, DISTPROF_REPORT_*).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage="usage: slurm/submit.sh torchrun|tasks [sbatch options --] train.py|-m pkg.module [script args]"
mode=${1:-}
case "$mode" in
    torchrun|tasks) shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
esac
sbatch_opts=()
first=${1:-}
if [ "$first" != "--" ] && [ "$first" != "-m" ] && [ "$first" != "${first#-}" ]; then  # sbatch options, up to --
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do sbatch_opts+=("$1"); shift; done
    if [ $# -eq 0 ]; then
        echo "submit: end the sbatch options with -- before the script ($usage)" >&2
        exit 2
    fi
fi
if [ "${1:-}" = "--" ]; then
    shift
fi
if [ $# -lt 1 ]; then
    echo "$usage" >&2
    exit 2
fi
if [ "$1" = "-m" ]; then  # a module: distprof.launch looks for it in the job (and names what it looked for)
    if [ $# -lt 2 ]; then
        echo "submit: -m needs a module name ($usage)" >&2
        exit 2
    fi
elif [ ! -f "$1" ]; then
    echo "submit: training script $1 not found" >&2
    exit 2
fi
out=${DISTPROF_OUT:-distprof}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export DISTPROF_OUT="$out"
train=$(sbatch --parsable --hold --output="$out/%j/%x-%j.out" "${sbatch_opts[@]}" "$here/$mode.sbatch" "$@")
train=${train%%;*}
if ! mkdir -p "$out/$train" || ! scontrol release "$train"; then
    scancel "$train" || true
    echo "submit: could not prepare $out/$train for job $train; cancelled it" >&2
    exit 1
fi
# shellcheck disable=SC2086  # REPORT_SBATCH_ARGS is a list of options
report=$(sbatch --parsable --dependency="afterany:$train" --output="$out/$train/%x-%j.out" \
    --export="ALL,DISTPROF_TRAIN_JOB_ID=$train" ${REPORT_SBATCH_ARGS:-} "$here/report.sbatch" "$out/$train")
report=${report%%;*}
echo "distprof: training job $train ($mode.sbatch), report job $report after it"
echo "distprof: run directory $out/$train (shards, logs, report.json, report.html)"
