"""Step-time cost of distprof capture and time from window end to durable shard, against a baseline in the same run.

    python benchmarks/capture_overhead.py [--steps 60] [--batch 32] [--hidden 2048] [--rounds 2]

Runs the same 2-rank DDP job (gloo, CPU) without and with `distprof.launch` (all options on, windows of 6 recorded
steps back to back), interleaved `--rounds` times, and prints ratios: median recorded-step time vs baseline median,
the window-closing step vs torch's own stop, and the shard timings (extraction, write, durable-after).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def run(tmp: Path, tag: str, args, profiled: bool) -> list[list[float]]:
    out = tmp / tag
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    if profiled:
        cmd += ["-m", "distprof.launch", "--out", str(tmp / "runs"), "--run-id", tag, "--wait", "1", "--warmup", "1",
                "--active", "6", "--repeat", "0", *args.launch_args.split()]
    cmd += [str(HERE / "_timed_train.py"), str(args.steps), str(args.batch), str(args.hidden), str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--launch-args", default="", help="extra distprof.launch options, e.g. '--no-memory'")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from distprof.capture.schedule import Action, action_at
    from distprof.config import ScheduleConfig
    from distprof.storage import find_shards, read_shard

    sched = ScheduleConfig(wait=1, warmup=1, active=6, repeat=0)
    base, rec, closing, stop, ready, extract, write, durable, n_events = [], [], [], [], [], [], [], [], []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for r in range(args.rounds):
            for ranks in run(tmp, f"base{r}", args, False):
                base += ranks[5:]
            for ranks in run(tmp, f"prof{r}", args, True):
                for i, t in enumerate(ranks):
                    if i < 5:
                        continue
                    # the step that closes a window: the iteration whose deferred profiler step stops the trace
                    a = action_at(sched, i - 1)
                    (closing if a is Action.RECORD_AND_SAVE else rec if a is Action.RECORD else []).append(t)
            run_dir = tmp / "runs" / f"prof{r}"
            for p in find_shards(run_dir):
                tm = read_shard(p).attrs["timings"]
                stop.append(tm["stop_s"]); ready.append(tm["ready_s"]); extract.append(tm["extract_s"])
                write.append(tm["write_s"]); n_events.append(tm["n_events"])
            for st in run_dir.glob("rank*.status.json"):
                durable += [w["durable_after_s"] for w in json.loads(st.read_text())["windows"]]
    med = statistics.median
    mb = med(base)
    print(f"baseline step (median of {len(base)}): {mb * 1e3:.1f} ms")
    print(f"recorded step (median of {len(rec)}): {med(rec) * 1e3:.1f} ms  ratio {med(rec) / mb:.3f}")
    print(f"window-closing step (median of {len(closing)}): {med(closing) * 1e3:.1f} ms  "
          f"= baseline + {(med(closing) - mb) * 1e3:.1f} ms")
    print(f"  torch's own stop inside it: median {med(stop) * 1e3:.1f} ms; distprof's on_trace_ready "
          f"(clock sync + hand-off): median {med(ready) * 1e3:.2f} ms  ratio {med(ready) / med(stop):.3f}")
    print(f"window end -> durable shard (background): median {med(durable) * 1e3:.0f} ms "
          f"(extract {med(extract) * 1e3:.0f} ms, write {med(write) * 1e3:.0f} ms, {med(n_events):.0f} events; "
          f"extract rate {med(n_events) / med(extract):,.0f} events/s)")


if __name__ == "__main__":
    main()
