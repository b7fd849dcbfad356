"""What capture costs, judged on the training thread's CPU time, with wall time beside.

    python benchmarks/capture_overhead.py [--steps 128] [--rounds 3] [--block 8] [--quick] [--watch-arm]

On a loaded machine wall time per step moves by tens of percent with the load (two runs five minutes apart put the
same ratio at 1.19 and 0.68), so every goal is judged on CPU time: the scheduler's run time of the training thread
(``/proc/thread-self/schedstat``, read each iteration by benchmarks/_timed_train.py), which counts what the thread
ran and not the time other processes held it off a core. Wall-time ratios are printed beside.

The same 2-rank DDP job (gloo, CPU, OMP_NUM_THREADS=1) runs in four arms, interleaved `--rounds` times (a b c d, ...):

  (a) no profiler (a cross-check of the in-run blocks below);
  (b) bare torch.profiler with distprof's options (CPU, record_shapes, profile_memory, with_flops) and the same
      schedule (--wait 1 --warmup 1 --active 6 --repeat 3), each window exported with export_chrome_trace and loaded
      back with orjson in on_trace_ready (timed apart from torch's own stop);
  (c) distprof.launch with that schedule; after its windows, blocks of `--block` steps with distprof's per-step work
      taken off the training thread and put back in turn (ABBA), in the same process;
  (d) distprof.launch --watch --schedule none; the same blocks, the watch recorder removed with the rest.

Goals (issue 25), each a ratio with a 95 % bootstrap confidence interval: the step goals the median of the pairs'
ratios, resampling whole rank-runs of pairs (pairs of one process share its state); writing and size a ratio of
sums, resampling rank-runs:

  in a window        c / b, CPU per recorded step, pairs: the same window of the same rank and round   <= 1.03
  outside windows    c on / off blocks after the windows (in-run)                                        <= 1.005
  --watch            d on / off blocks (in-run)                                                          <= 1.005
  window-closing     distprof's hold (torch's stop + its on_trace_ready) / torch's own stop (b), CPU     <= 1.2
  shard writing      writer thread CPU per event / (export_chrome_trace + orjson load) CPU per event     <= 0.5
  size               shard / gzipped Chrome JSON of the same window (window 0)                           <= 0.5

A goal is met when its ratio is within it; a confidence interval that crosses the goal is flagged. `--watch-arm`
prices the watch by its parts in-process instead (benchmarks/_watch_cost.py; docs/watch.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCHED = {"wait": 1, "warmup": 1, "active": 6, "repeat": 3}
SCHED_END = (SCHED["wait"] + SCHED["warmup"] + SCHED["active"]) * SCHED["repeat"]  # every window is over here
SETTLE = 8  # steps after the last window before the blocks begin (its shard is written meanwhile)
WATCH_FROM = 8  # --schedule none: the blocks begin here
ARMS = "abcd"


# ---- running the arms -------------------------------------------------------------------------------------------
def command(tmp: Path, tag: str, args, arm: str) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    runs = ["-m", "distprof.launch", "--out", str(tmp / "runs"), "--run-id", tag]
    extra: list[str] = []
    if arm == "c":
        cmd += [*runs, *(f"--{k}={v}" for k, v in SCHED.items())]
        extra = ["--toggle-from", str(SCHED_END + SETTLE), "--block", str(args.block)]
    elif arm == "d":
        cmd += [*runs, "--schedule", "none", "--watch"]
        extra = ["--toggle-from", str(WATCH_FROM), "--block", str(args.block)]
    elif arm == "b":
        extra = ["--torch", ",".join(str(SCHED[k]) for k in ("wait", "warmup", "active", "repeat"))]
    return [*cmd, str(HERE / "_timed_train.py"), str(args.steps), str(args.batch), str(args.hidden),
            str(tmp / tag), *extra]


def run(tmp: Path, tag: str, args, arm: str) -> list[dict]:
    """One run of `arm`: each rank's record, with distprof's shards' event and memory rows counted."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    p = subprocess.run(command(tmp, tag, args, arm), env=env, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"arm {arm} failed ({p.returncode}):\n{p.stderr[-4000:]}")
    ranks = [json.loads(Path(f"{tmp / tag}.rank{r}.json").read_text()) for r in range(2)]
    for rank in ranks:
        for w in rank["written"]:
            w["rows"] = shard_rows(w["path"])
    return ranks


def shard_rows(path: str) -> int:
    """Events plus memory events in a shard: what a Chrome trace holds as complete events and [memory] instants."""
    from distprof.storage import read_shard

    s = read_shard(path)
    return int(s.attrs["timings"]["n_events"]) + int(s.table("memory", ["step"])["step"].size)


def run_all(args) -> dict[str, list[list[dict]]]:
    """rounds x arms, interleaved; per arm a list (one per round) of the ranks' records."""
    got: dict[str, list[list[dict]]] = {a: [] for a in args.arms}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            for arm in args.arms:
                got[arm].append(run(Path(d), f"{arm}{r}", args, arm))
                print(f"round {r} arm {arm} done", file=sys.stderr, flush=True)
    return got


# ---- blocks: what the bootstrap resamples -----------------------------------------------------------------------
def recorded_by_window() -> dict[int, list[int]]:
    """Iterations inside a window in both profilers, by window: a recording step after a recording step (the
    window's first and closing steps are left out: they hold its start and its stop)."""
    from distprof.capture.schedule import Action, action_at, window_of
    from distprof.config import ScheduleConfig

    sched = ScheduleConfig(**SCHED)
    out: dict[int, list[int]] = {}
    for i in range(1, SCHED_END):
        if action_at(sched, i) is Action.RECORD and action_at(sched, i - 1) is Action.RECORD:
            out.setdefault(window_of(sched, i), []).append(i)
    return out


def closing_iterations() -> list[int]:
    from distprof.capture.schedule import Action, action_at
    from distprof.config import ScheduleConfig

    sched = ScheduleConfig(**SCHED)
    return [i for i in range(SCHED_END) if action_at(sched, i) is Action.RECORD_AND_SAVE]


def window_blocks(rank: dict) -> dict[int, tuple[float, float]]:
    """window -> (median CPU ns, median wall s) of its recorded iterations."""
    return {w: (statistics.median(rank["cpu_ns"][i] for i in its), statistics.median(rank["wall"][i] for i in its))
            for w, its in recorded_by_window().items() if its[-1] < len(rank["cpu_ns"])}


def toggle_pairs(rank: dict, block: int) -> list[dict[str, tuple[float, float]]]:
    """Adjacent off/on blocks: per pair {"off"|"on": (median CPU ns, median wall s)}, each block's first iteration
    left out (the switch's own traces: hooks registered, caches re-specialised)."""
    arms = rank["arm"]
    start = next((i for i, a in enumerate(arms) if a), len(arms))
    blocks = []
    for b0 in range(start, len(arms) - block + 1, block):
        its = range(b0 + 1, b0 + block)
        blocks.append((arms[b0], statistics.median(rank["cpu_ns"][i] for i in its),
                       statistics.median(rank["wall"][i] for i in its)))
    return [{a: (c, w) for a, c, w in blocks[k:k + 2]} for k in range(0, len(blocks) - 1, 2)]


def holds(rank: dict, distprof: bool) -> dict[int, tuple[float, float]]:
    """window -> (CPU ns, wall s) of its closing profiler step: distprof's whole hold (torch's stop and its
    on_trace_ready), or torch's own stop under the bare profiler (the closing prof.step() minus the export)."""
    closing = closing_iterations()
    if distprof:  # its step_num is the step just begun: the closing call is the one after a window's last step
        calls = [c for c in rank["calls"] if c["step_num"] - 1 in closing]
        return {w: (c["cpu_ns"], c["wall_s"]) for w, c in enumerate(calls)}
    by_i = {c["i"]: c for c in rank["calls"]}
    return {e["window"]: (by_i[i]["cpu_ns"] - e["ready_cpu_ns"], by_i[i]["wall_s"] - e["ready_s"])
            for i, e in zip(closing, rank["export"])}


# ---- the bootstrap ----------------------------------------------------------------------------------------------
@dataclass
class Ratio:
    value: float
    lo: float
    hi: float
    n: int  # blocks (pairs) resampled

    def text(self, digits: int = 3) -> str:
        return f"{self.value:.{digits}f} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"


def ratio_ci(x, y, *, paired: bool, n_boot: int = 4000, seed: int = 0) -> Ratio:
    """(Σ numerators / Σ denominators of x) over the same of y, with a 95 % percentile bootstrap interval from
    resampling blocks: x and y are (numerators, denominators) per block; paired: block k of x goes with block k of
    y (resampled together). A plain list of values is numerators over 1 each."""
    (xn, xd), (yn, yd) = _nd(x), _nd(y)
    if not xn.size or not yn.size:
        return Ratio(float("nan"), float("nan"), float("nan"), 0)
    rng = np.random.default_rng(seed)
    ix = rng.integers(0, xn.size, (n_boot, xn.size))
    iy = ix if paired else rng.integers(0, yn.size, (n_boot, yn.size))
    boot = (xn[ix].sum(1) / xd[ix].sum(1)) / (yn[iy].sum(1) / yd[iy].sum(1))
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return Ratio(float(xn.sum() / xd.sum() / (yn.sum() / yd.sum())), float(lo), float(hi), int(xn.size))


def paired_median_ci(x, y, groups=None, *, n_boot: int = 4000, seed: int = 0) -> Ratio:
    """The median of the pairs' ratios x[k] / y[k], with a 95 % percentile bootstrap interval. A median, not a ratio
    of sums: on a loaded machine a few pairs run 20-30 % apart (another process thrashed the caches of one block),
    and a mean would follow them. `groups` (one label per pair: its rank-run): pairs of one process share its state,
    so whole groups are resampled (a cluster bootstrap), else single pairs."""
    r = np.asarray(x, float) / np.asarray(y, float)
    if not r.size:
        return Ratio(float("nan"), float("nan"), float("nan"), 0)
    rng = np.random.default_rng(seed)
    if groups is None:
        boot = np.median(r[rng.integers(0, r.size, (n_boot, r.size))], axis=1)
    else:
        labels = sorted(set(groups))
        members = [np.flatnonzero(np.asarray([g == lab for g in groups])) for lab in labels]
        picks = rng.integers(0, len(labels), (n_boot, len(labels)))
        boot = np.array([np.median(r[np.concatenate([members[j] for j in row])]) for row in picks])
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return Ratio(float(np.median(r)), float(lo), float(hi), int(r.size))


def _nd(v) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(v, tuple):
        return np.asarray(v[0], float), np.asarray(v[1], float)
    a = np.asarray(v, float)
    return a, np.ones_like(a)


# ---- the goals --------------------------------------------------------------------------------------------------
@dataclass
class Goal:
    name: str
    cpu: Ratio
    wall: Ratio
    limit: float
    detail: str

    def line(self) -> str:
        met = "met" if self.cpu.value <= self.limit else "NOT MET"
        if self.cpu.lo <= self.limit < self.cpu.hi:
            met += " (CI crosses the goal)"
        return (f"  {self.name:<44} CPU {self.cpu.text()}  goal <= {self.limit:<6g} {met:<28} "
                f"wall {self.wall.text()}   {self.detail}")


def paired_keys(xs: dict, ys: dict) -> tuple[list, list]:
    keys = sorted(set(xs) & set(ys))
    return [xs[k] for k in keys], [ys[k] for k in keys]


def keyed(runs: list[list[dict]], fn) -> dict:
    """(round, rank, key) -> value of fn(rank record) for every run of an arm."""
    return {(r, k, w): v for r, ranks in enumerate(runs) for k, rank in enumerate(ranks) for w, v in fn(rank).items()}


def goal_window(got) -> Goal:
    keys = sorted(set(keyed(got["c"], window_blocks)) & set(keyed(got["b"], window_blocks)))
    c, b = paired_keys(keyed(got["c"], window_blocks), keyed(got["b"], window_blocks))
    cc, bc = [v[0] for v in c], [v[0] for v in b]
    by_w = {w: statistics.median(x / y for k, x, y in zip(keys, cc, bc) if k[2] == w) for w in {k[2] for k in keys}}
    g = [k[:2] for k in keys]
    return Goal("in a window: distprof / bare torch.profiler", paired_median_ci(cc, bc, g),
                paired_median_ci([v[1] for v in c], [v[1] for v in b], g), 1.03,
                f"{np.median(cc) / 1e6:.2f} vs {np.median(bc) / 1e6:.2f} ms CPU per recorded step, "
                f"{len(c)} window pairs; by window " + " ".join(f"{by_w[w]:.3f}" for w in sorted(by_w)))


def goal_toggle(runs: list[list[dict]], block: int, name: str) -> Goal:
    pairs = [(r, k, p) for r, ranks in enumerate(runs) for k, rank in enumerate(ranks)
             for p in toggle_pairs(rank, block) if len(p) == 2]
    g = [(r, k) for r, k, _ in pairs]
    on, off = [p["on"][0] for _, _, p in pairs], [p["off"][0] for _, _, p in pairs]
    return Goal(name, paired_median_ci(on, off, g),
                paired_median_ci([p["on"][1] for _, _, p in pairs], [p["off"][1] for _, _, p in pairs], g), 1.005,
                f"{np.median(on) / 1e6:.3f} vs {np.median(off) / 1e6:.3f} ms CPU per step, {len(pairs)} block pairs "
                f"of {block} in {len(set(g))} rank-runs")


def goal_hold(got) -> Goal:
    xs, ys = keyed(got["c"], lambda r: holds(r, True)), keyed(got["b"], lambda r: holds(r, False))
    c, b = paired_keys(xs, ys)
    g = [k[:2] for k in sorted(set(xs) & set(ys))]
    cc, bc = [v[0] for v in c], [v[0] for v in b]
    return Goal("window-closing hold: distprof / torch's stop", paired_median_ci(cc, bc, g),
                paired_median_ci([v[1] for v in c], [v[1] for v in b], g), 1.2,
                f"{np.median(cc) / 1e6:.1f} vs {np.median(bc) / 1e6:.1f} ms CPU, "
                f"{np.median([v[1] for v in c]) * 1e3:.1f} vs {np.median([v[1] for v in b]) * 1e3:.1f} ms wall, "
                f"{len(c)} window pairs")


def goal_writing(got) -> Goal:
    """Per event: the writer thread's CPU over a rank's run (it does nothing else) against the training thread's
    CPU in export_chrome_trace + orjson.loads over the same rank's windows in the same round (paired); wall: the
    writer's extract + build + disk seconds against export + load."""
    def writer(rank):
        return {0: (rank["writer_cpu_ns"], sum(w["extract_s"] + w["build_s"] + w["disk_s"] for w in rank["written"]),
                    sum(w["rows"] for w in rank["written"]), len(rank["written"]))} if rank["written"] else {}

    def export(rank):
        ex = rank["export"]
        return {0: (sum(e["cpu_ns"] for e in ex), sum(e["export_s"] + e["load_s"] for e in ex),
                    sum(e["events"] for e in ex), len(ex))} if ex else {}

    w, e = paired_keys(keyed(got["c"], writer), keyed(got["b"], export))
    cpu = ratio_ci(([v[0] for v in w], [v[2] for v in w]), ([v[0] for v in e], [v[2] for v in e]), paired=True)
    wall = ratio_ci(([v[1] for v in w], [v[2] for v in w]), ([v[1] for v in e], [v[2] for v in e]), paired=True)
    per = [sum(v[0] for v in x) / max(1, sum(v[2] for v in x)) / 1e3 for x in (w, e)]
    ev = [sum(v[2] for v in x) / max(1, sum(v[3] for v in x)) for x in (w, e)]
    return Goal("shard writing (background): per event", cpu, wall, 0.5,
                f"{per[0]:.2f} vs {per[1]:.2f} us CPU per event (export + load), {ev[0]:.0f} vs {ev[1]:.0f} events "
                f"per window, {len(w)} rank-run pairs")


def goal_size(got) -> Goal:
    shard = [w["bytes"] for ranks in got["c"] for rank in ranks for w in rank["written"] if w["window"] == 0]
    gz = [e["gzip_bytes"] for ranks in got["b"] for rank in ranks for e in rank["export"] if e["gzip_bytes"]]
    r = ratio_ci(shard, gz, paired=False)
    return Goal("size: shard / gzipped Chrome JSON (window 0)", r, r, 0.5,
                f"{np.mean(shard) / 1e3:.0f} vs {np.mean(gz) / 1e3:.0f} kB (bytes: wall = CPU)")


def goals(got, block: int) -> list[Goal]:
    """Every goal the arms present allow, in the issue's order."""
    both = "b" in got and "c" in got
    out = [goal_window(got)] if both else []
    if "c" in got:
        out.append(goal_toggle(got["c"], block, "outside windows: distprof / no profiler"))
    if "d" in got:
        out.append(goal_toggle(got["d"], block, "--watch: distprof --watch / no profiler"))
    if both:
        out += [goal_hold(got), goal_writing(got), goal_size(got)]
    return out


# ---- what else the run shows ------------------------------------------------------------------------------------
def side_threads(runs: list[list[dict]]) -> str:
    """distprof's side threads' CPU per toggled step (the writer left out: it is priced per event)."""
    per = {}
    for ranks in runs:
        for rank in ranks:
            for name, ns in rank["side_cpu_ns"].items():
                if name != "distprof-writer" and rank["toggled_steps"]:
                    per.setdefault(name, []).append(ns / rank["toggled_steps"])
    return ", ".join(f"{k.removeprefix('distprof-')} {statistics.median(v) / 1e3:.1f}" for k, v in sorted(per.items()))


def against_runs(got, arm: str, block: int) -> str:
    """The in-run blocks against the no-profiler runs (interleaved runs, rank-runs as blocks)."""
    def med(rank, which):
        return statistics.median(c for c, a in zip(rank["cpu_ns"], rank["arm"]) if a == which)

    start = SCHED_END + SETTLE if arm == "c" else WATCH_FROM
    on, off, base = [], [], []
    for r, ranks in enumerate(got[arm]):
        for k, rank in enumerate(ranks):
            on.append(med(rank, "on"))
            off.append(med(rank, "off"))
            base.append(statistics.median(got["a"][r][k]["cpu_ns"][start:]))
    return (f"on blocks {paired_median_ci(on, base).text()}, off blocks {paired_median_ci(off, base).text()}")


def report(got, args, load0) -> None:
    load = os.getloadavg()
    print(f"capture cost: 2-rank DDP MLP (hidden {args.hidden}, batch {args.batch}), {args.steps} steps, arms "
          f"{args.arms} interleaved x {args.rounds} rounds; CPU = the training thread's scheduler run time; 95 % "
          f"bootstrap CIs; load average {load0[0]:.2f} at the start, {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at "
          f"the end, on {os.cpu_count()} CPUs")
    if "a" in got:
        ranks = [rank for ranks in got["a"] for rank in ranks]
        print(f"  no profiler: median step {statistics.median(c for k in ranks for c in k['cpu_ns']) / 1e6:.2f} ms "
              f"CPU, {statistics.median(w for k in ranks for w in k['wall']) * 1e3:.2f} ms wall")
    for g in goals(got, args.block):
        print(g.line())
    for arm, name in (("c", "distprof"), ("d", "distprof --watch")):
        if arm in got:
            print(f"  {name}: side threads' CPU per step while the blocks ran (us): {side_threads(got[arm])}")
            if "a" in got:
                print(f"  {name} / the no-profiler runs (CPU, interleaved runs, a cross-check of the blocks): "
                      f"{against_runs(got, arm, args.block)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--block", type=int, default=8, help="steps per block of the in-run arms")
    ap.add_argument("--arms", default=ARMS, help="which arms to run; goals are printed for the arms present")
    ap.add_argument("--quick", action="store_true", help="a smoke run: one round of 64 steps, blocks of 4")
    ap.add_argument("--save", type=Path, help="also write every rank's per-step record here (JSON)")
    ap.add_argument("--watch-arm", action="store_true", help="only the watch's cost by its parts, in-process")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.watch_arm:
        import _watch_cost

        _watch_cost.main()
        return
    if args.quick:
        args.rounds, args.steps, args.block = 1, 64, 4
    load0 = os.getloadavg()
    got = run_all(args)
    if args.save:
        args.save.write_text(json.dumps(got))
    report(got, args, load0)


if __name__ == "__main__":
    main()
