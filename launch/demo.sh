#!/usr/bin/env bash
# Profile a 2-rank CPU DDP job end to end (rank 1 is made slow on purpose), then report on it:
# terminal summary, report.json, a self-contained report.html and a merged Perfetto timeline.
#   bash launch/demo.sh            -> shards in ./distprof-runs/demo-<time>/
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${DISTPROF_DEMO_OUT:-distprof-runs}
RUN_ID=demo-$(date +%Y%m%d-%H%M%S)
"$PY" -m torch.distributed.run --standalone --nproc_per_node=2 \
    -m distprof.launch --out "$OUT" --run-id "$RUN_ID" --wait 2 --warmup 2 --active 6 \
    examples/ddp_mlp.py --hidden 256 --steps 12 --slow-rank 1 --slow-ms 20
echo "demo: shards in $OUT/$RUN_ID:"
ls -l "$OUT/$RUN_ID"
"$PY" -m distprof report "$OUT/$RUN_ID" --json "$OUT/$RUN_ID/report.json" --html "$OUT/$RUN_ID/report.html"
"$PY" -m distprof timeline "$OUT/$RUN_ID" -o "$OUT/$RUN_ID/timeline.json.gz"
echo "demo: open $OUT/$RUN_ID/report.html in a browser, $OUT/$RUN_ID/timeline.json.gz in https://ui.perfetto.dev"
