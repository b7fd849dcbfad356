"""The what-if on real frameworks against re-runs: Hugging Face `Trainer` and DeepSpeed ZeRO-1 (2 ranks, gloo, tiny
random models), rank 1 slowed by `--slow-ms` at the start of every forward, every rank's device time a sleep.

    python benchmarks/framework_whatif.py                 # 3 pairs per framework, about 2 minutes
    python benchmarks/framework_whatif.py --jobs hf --pairs 5 --slow-ms 20

Per pair: the job with the delay (examples/hf_trainer.py or examples/deepspeed_zero.py under ``distprof.launch``, 10
recorded steps), then the same job without it. The **measured gain** is the delayed run's mean step minus the
re-run's; the **predicted gain** is the report's what-if ``straggler`` row (rank 1 at its peers' median, on the chained
step graph) on the delayed run. These are issue 22's examples: before the chained replay a delay before the forward
was priced at about half (HF Trainer 16.2 ms predicted against 37.3 measured; DeepSpeed ZeRO-1 15.3 against 28.0).
Needs transformers / deepspeed (``launch/setup.sh`` installs them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = {"hf": ["examples/hf_trainer.py"], "ds1": ["examples/deepspeed_zero.py", "--stage", "1"]}


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return {k: v for k, v in env.items() if not k.startswith("DISTPROF_")}


def run(job: str, slow_ms: float, base_ms: float, out: Path) -> dict:
    """One profiled run (3 idle, 2 warm-up, 10 recorded steps) and its report.json."""
    shutil.rmtree(out, ignore_errors=True)
    script, *extra = JOBS[job]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "distprof.launch",
           "--out", str(out), "--run-id", "r", "--wait", "3", "--warmup", "2", "--active", "10", script,
           "--steps", "18", "--base-ms", f"{base_ms:g}", *extra]
    if slow_ms > 0:
        cmd += ["--slow-rank", "1", "--slow-ms", f"{slow_ms:g}"]
    p = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
    if p.returncode:
        raise SystemExit(f"{job} failed:\n{p.stderr[-3000:]}")
    q = subprocess.run([sys.executable, "-m", "distprof", "report", str(out / "r"), "--json", "-", "--no-progress"],
                       cwd=ROOT, env=_env(), capture_output=True, text=True)
    if q.returncode:
        raise SystemExit(f"report failed on {out}:\n{q.stderr[-3000:]}")
    return json.loads(q.stdout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", default="hf,ds1", help="comma-separated: hf (HF Trainer), ds1 (DeepSpeed ZeRO-1)")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--slow-ms", type=float, default=30.0, help="rank 1's delay per forward")
    ap.add_argument("--base-ms", type=float, default=40.0, help="every rank's device time per forward (a sleep)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        for job in args.jobs.split(","):
            errs = []
            for i in range(args.pairs):
                a = run(job, args.slow_ms, args.base_ms, Path(tmp) / f"{job}-delayed-{i}")
                b = run(job, 0.0, args.base_ms, Path(tmp) / f"{job}-rerun-{i}")
                w = next((x for x in a.get("whatif") or [] if x["change"] == "straggler"), None)
                named = [s["rank"] for s in a.get("stragglers") or [] if s["named"]]
                measured = a["summary"]["step_ms_mean"] - b["summary"]["step_ms_mean"]
                predicted = None if w is None else w["gain_ms_per_step"]
                if predicted is not None:
                    errs.append(predicted - measured)
                print(f"{job} pair {i}: step {a['summary']['step_ms_mean']:.1f} -> re-run "
                      f"{b['summary']['step_ms_mean']:.1f} ms; gain measured {measured:.1f}, predicted "
                      f"{'-' if predicted is None else f'{predicted:.1f}'} ms; named {named}", flush=True)
            if errs:
                print(f"{job}: worst error {max(errs, key=abs):+.1f} ms over {len(errs)} pair(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
