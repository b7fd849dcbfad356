#!/usr/bin/env bash
# The GPU checks in one call, for a lent CUDA machine (docs: tests/gpu/README.md):
#   bash tests/gpu/lent_machine.sh [OUT_DIR]
# 1. tests/gpu/check_gpu.py (kinds, 1 GPU, 2-rank NCCL, a 20 ms straggler and its re-run, the NCCL watch);
# 2. the capture benchmark (benchmarks/capture_overhead.py, 2 rounds: CPU-time ratios on the machine's idle cores).
# Wheels in .whl/ (packages the machine lacks, e.g. orjson and hdf5plugin) are installed to /tmp/site first.
# Each part has its own time limit, so one that hangs leaves the other's figures; logs and the straggler runs'
# report.json files go to OUT_DIR.
set -u
cd "$(dirname "$0")/../.."
out=${1:-gpu-check-out}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{ nvidia-smi -L; python3 -c "import torch, torch.cuda.nccl as n; print('torch', torch.__version__, 'nccl', n.version())"
  nproc; } 2>&1 | tee "$out/machine.txt"
t0=$SECONDS
timeout 330 python3 tests/gpu/check_gpu.py --keep /tmp/gpu-check 2>&1 | tee "$out/check_gpu.log"
echo "check_gpu: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
for r in straggle even; do cp /tmp/gpu-check/$r-*/report.json "$out/$r-report.json" 2>/dev/null; done
t0=$SECONDS
timeout 200 python3 benchmarks/capture_overhead.py --rounds 2 2>&1 | grep -v "Warning\|_warn_once" \
  | tee "$out/capture_overhead.log"
echo "capture_overhead: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
