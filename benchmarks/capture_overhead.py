"""What capture costs, side by side: no profiler, bare torch.profiler, distprof, and `--watch` alone.

    python benchmarks/capture_overhead.py [--steps 120] [--batch 32] [--hidden 2048] [--rounds 3]

The same 2-rank DDP job (gloo, CPU; benchmarks/_timed_train.py records each iteration's wall time) runs in four arms,
interleaved `--rounds` times (a b c d, a b c d, ...):

  (a) no profiler;
  (b) bare torch.profiler, distprof's options (CPU, record_shapes, profile_memory, with_flops) and the same schedule
      (--wait 1 --warmup 1 --active 6 --repeat 3), each window exported with export_chrome_trace and loaded back with
      orjson in on_trace_ready (timed apart from torch's own stop);
  (c) distprof.launch with that schedule;
  (d) distprof.launch --watch --schedule none (every step timed and flushed, no window);
  (f, with --arms) distprof.launch with the same schedule and --cpu-sample-ms 0: the CPU sampler's part of (c).

Medians over both ranks and every round, and the ratios against the goals of issue 14:

  active window           c / b recorded steps                       <= 1.02
  outside a window        c / a steps 50.. (after the last window)   <= 1.005
  --watch                 d / a steps 50..                           <= 1.005
  window-closing step     distprof's hold (torch's stop + its on_trace_ready) / torch's own stop (b)  <= 1.2
  window end -> durable   (export_chrome_trace + orjson load) / distprof's window end -> fsynced shard  >= 3
  size                    shard / gzipped chrome JSON of the same window (window 0)                     <= 0.5

and the per-step cost of --watch on the training thread measured in-process (microseconds; the step-time ratio above
is within the noise of a loaded machine, this is not).

The watch arm (`--watch-arm`: only it, a minute) measures what the watch's synchronisation-point timing costs the
training thread of a real DDP job, in the thread's CPU time (scheduler statistics: what the thread ran, not what the
loaded machine's other processes made it wait): one process, a gloo group of one, DDP over a 12-layer MLP in many
buckets, the same steps with and without the watch's recorder (its Work.wait, wait_tensor, DataLoader and optimizer
wrappers, the backward-end hooks and callbacks, the step row), interleaved; and, apart, one NCCL completion as the
watch's hook handles it (on NCCL's hook thread, not the training thread).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCHED = {"wait": 1, "warmup": 1, "active": 6, "repeat": 3}
OUTSIDE_FROM = 50  # steps from here on are after every window (and its background write)


def run(tmp: Path, tag: str, args, arm: str) -> list[dict]:
    out = tmp / tag
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    sched = [f"--{k}={v}" for k, v in SCHED.items()]
    if arm in "cf":
        cmd += ["-m", "distprof.launch", "--out", str(tmp / "runs"), "--run-id", tag, *sched,
                *(["--cpu-sample-ms", "0"] if arm == "f" else [])]
    elif arm in "de":
        cmd += ["-m", "distprof.launch", "--out", str(tmp / "runs"), "--run-id", tag, "--schedule", "none",
                *(["--watch"] if arm == "d" else [])]
    cmd += [str(HERE / "_timed_train.py"), str(args.steps), str(args.batch), str(args.hidden), str(out)]
    if arm == "b":
        cmd += ["torch", *(str(SCHED[k]) for k in ("wait", "warmup", "active", "repeat"))]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(2)]


def micro_watch(n: int = 100_000) -> dict[str, float]:
    """In-process: microseconds per step the watch adds on the training thread (its row, and its optimizer hooks
    around one tiny optimizer step), and per Work.wait / DataLoader batch (its wrapper)."""
    import torch

    from distprof.capture.watch import WatchRecorder

    rec = WatchRecorder(threading.get_ident())
    t0 = time.perf_counter()
    for i in range(n):
        rec.step_end(i, False)
    row_us = (time.perf_counter() - t0) / n * 1e6
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    p.grad = torch.zeros(1)

    def opt_us() -> float:
        best = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(5000):
                opt.step()
            best.append((time.perf_counter() - t) / 5000 * 1e6)
        return min(best)

    base = opt_us()
    rec.install()
    try:
        hooked = opt_us()
        from torch.utils.data import DataLoader

        data = list(range(20000))
        t = time.perf_counter()
        for _ in DataLoader(data, batch_size=None):
            pass
        with_wrap = time.perf_counter() - t
    finally:
        rec.remove()
    t = time.perf_counter()
    for _ in DataLoader(data, batch_size=None):
        pass
    without = time.perf_counter() - t

    class Waitable:  # the wrapper Work.wait gets, around a call that does nothing
        def wait(self):
            return True

    w = Waitable()
    t = time.perf_counter()
    for _ in range(n):
        w.wait()
    plain = time.perf_counter() - t
    rec._patch(Waitable, "wait", "comm_ns")
    t = time.perf_counter()
    for _ in range(n):
        w.wait()
    wrapped = time.perf_counter() - t
    rec.remove()
    return {"row_us": row_us, "opt_hooks_us": hooked - base,
            "dataloader_wrap_us": (with_wrap - without) / len(data) * 1e6, "wait_wrap_us": (wrapped - plain) / n * 1e6}


def step_us(watch: bool, steps: int, out: str) -> float:
    """Microseconds per `p.step()` of a profiler with nothing else in the loop (`--schedule none`), with or without
    the watch: the training thread's whole per-step cost, the watch's row included."""
    import distprof

    with distprof.profile(out=out, schedule="none", watch=watch, trigger=True) as p:
        for _ in range(200):
            p.step()
        t0 = time.perf_counter()
        for _ in range(steps):
            p.step()
        return (time.perf_counter() - t0) / steps * 1e6


def watch_step_cost(rounds: int = 7, steps: int = 20_000) -> tuple[float, float]:
    """Median µs per profiler step without and with --watch, interleaved `rounds` times."""
    with tempfile.TemporaryDirectory() as d:
        off, on = [], []
        for r in range(rounds):
            off.append(step_us(False, steps, f"{d}/off{r}"))
            on.append(step_us(True, steps, f"{d}/on{r}"))
    return statistics.median(off), statistics.median(on)


def _paired(arms: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Per-step CPU time of short blocks of every arm in turn (`rounds` of each): adjacent blocks share the machine's
    state of the moment, so a loaded host's drift cancels in their differences."""
    out: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(rounds):
        for k, fn in arms.items():
            out[k].append(fn())
    return out


def _added(off: list[float], on: list[float]) -> tuple[float, float, float]:
    """Median of the paired differences (µs) and its interquartile range."""
    d = sorted(b - a for a, b in zip(off, on))
    return statistics.median(d) / 1e3, d[len(d) // 4] / 1e3, d[3 * len(d) // 4] / 1e3


def _cpu_ns_per(fn: Callable[[], None], n: int) -> float:
    """The training thread's CPU ns (scheduler statistics: time it ran, not time it waited for a CPU) per call."""
    from distprof.capture.schedstat import ThreadCpu

    cpu = ThreadCpu()
    try:
        c0 = cpu.sample()[0]
        for _ in range(n):
            fn()
        return (cpu.sample()[0] - c0) / n
    finally:
        cpu.close()


def watch_sync_cost(rounds: int = 600, block: int = 20) -> dict[str, float]:
    """What timing the synchronisation points adds to the training thread of a real DDP step (a gloo group of one,
    12 layers, a bucket per layer): the recorder installed once, blocks of `block` steps in turn with its
    backward-end hooks and without them (the watch as it was before them). Installing and removing the whole
    recorder per block would re-specialise the interpreter's caches of the classes it wraps each time, a cost no
    job pays (the watch installs once), so the whole watch is priced by its parts: the row and optimizer hooks
    (micro_watch) plus this."""
    import tempfile as tf

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from distprof.capture.watch import WatchRecorder

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the jobs run (OMP_NUM_THREADS=1): idle OpenMP threads spinning are not the watch's
    with tf.TemporaryDirectory() as d:
        dist.init_process_group("gloo", init_method=f"file://{d}/pg", rank=0, world_size=1)
        rec = WatchRecorder(threading.get_ident())
        try:
            torch.manual_seed(0)
            layers = [m for _ in range(12) for m in (torch.nn.Linear(64, 64), torch.nn.ReLU())]
            model = DDP(torch.nn.Sequential(*layers, torch.nn.Linear(64, 10)), bucket_cap_mb=0.02)
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)
            x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
            loss_fn = torch.nn.CrossEntropyLoss()
            state = {"i": 0, "timed": 0}

            def step() -> None:
                opt.zero_grad(set_to_none=True)
                loss_fn(model(x), y).backward()
                opt.step()
                rec.step_end(state["i"], False)
                state["i"] += 1

            def without() -> float:
                rec.tail.remove()
                rec.tail.watch = lambda o: None  # an instance attribute: no class is touched
                try:
                    return _cpu_ns_per(step, block)
                finally:
                    del rec.tail.watch

            def with_tail() -> float:
                rec.tail.watch(opt)
                before = rec.tail.backwards
                ns = _cpu_ns_per(step, block)
                state["timed"] += rec.tail.backwards - before
                return ns

            rec.install()
            _cpu_ns_per(step, 50)
            t = _paired({"before": without, "watch": with_tail}, rounds)
            res = {"off_us": statistics.median(t["before"]) / 1e3, "on_us": statistics.median(t["watch"]) / 1e3,
                   "tails_per_step": state["timed"] / (rounds * block)}
            res["sync_us"], res["sync_lo_us"], res["sync_hi_us"] = _added(t["before"], t["watch"])
            res.update(tail_cost(), nccl_hook_us=nccl_hook_cost())
        finally:
            rec.remove()
            dist.destroy_process_group()
            torch.set_num_threads(threads)
    micro = micro_watch()
    res.update(row_us=micro["row_us"], opt_hooks_us=micro["opt_hooks_us"])
    res["total_us"] = res["row_us"] + res["opt_hooks_us"] + max(res["sync_us"], res["tail_us"])
    return res


def nccl_hook_cost(n: int = 100_000) -> float:
    """µs per NCCL completion in the hook DeviceComm registers (NCCL's hook thread runs it, not the training
    thread), called here with a WorkInfo-like record; the group is a stand-in that only takes the hook."""
    import datetime as dt

    from distprof.capture.syncpoints import DeviceComm

    got = []

    class Group:
        def _register_on_completion_hook(self, hook):
            got.append(hook)

    class Info:
        time_started = dt.datetime.now()
        active_duration = dt.timedelta(microseconds=1500)

    dev = DeviceComm()
    dev._hook(Group())
    on_done, info = got[0], Info()
    t = time.perf_counter()
    for _ in range(n):
        on_done(info)
        if len(dev._done) > 60_000:
            dev.drain()
    return (time.perf_counter() - t) / n * 1e6


def tail_cost(rounds: int = 600, block: int = 100) -> dict[str, float]:
    """The backward-end timing alone (two hooked parameters, two engine callbacks), per backward pass of a tiny graph
    so that its µs are not lost in a big step's noise; blocks with and without the hooks in turn."""
    import torch

    from distprof.capture.syncpoints import BackwardTail

    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(4)])
    x = torch.randn(2, 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)

    def backward() -> None:
        m(x).sum().backward()

    def hooked() -> float:
        tail = BackwardTail(lambda: 0)
        tail.install()
        tail.watch(opt)
        try:
            return _cpu_ns_per(backward, block)
        finally:
            tail.remove()

    _cpu_ns_per(backward, 500)
    t = _paired({"off": lambda: _cpu_ns_per(backward, block), "on": hooked}, rounds)
    added, lo, hi = _added(t["off"], t["on"])
    return {"tail_us": added, "tail_lo_us": lo, "tail_hi_us": hi, "backward_us": statistics.median(t["off"]) / 1e3}


def print_watch_cost(c: dict[str, float]) -> None:
    print(f"  --watch's synchronisation-point timing on a DDP step's training thread (CPU time from scheduler "
          f"statistics; 1-rank gloo DDP, 12 layers, {c['tails_per_step']:.2f} backward ends timed per step; blocks "
          f"of 20 steps with and without it in turn, median of the adjacent blocks' differences, interquartile range "
          f"in brackets): {c['off_us']:.0f} us per step without, {c['on_us']:.0f} us with: {c['sync_us']:+.1f} us "
          f"[{c['sync_lo_us']:+.0f} .. {c['sync_hi_us']:+.0f}]")
    print(f"  the backward-end timing alone: {c['tail_us']:+.2f} us per backward pass [{c['tail_lo_us']:+.1f} .. "
          f"{c['tail_hi_us']:+.1f}] (a {c['backward_us']:.0f} us backward); per NCCL completion on NCCL's hook "
          f"thread (not the training thread) {c['nccl_hook_us']:.2f} us")
    print(f"  the whole watch per step: row {c['row_us']:.2f} + optimizer hooks {c['opt_hooks_us']:.2f} + "
          f"synchronisation points {max(c['sync_us'], c['tail_us']):.2f} = {c['total_us']:.1f} us = "
          f"{c['total_us'] / 100:.3f} % of a 10 ms step (goal <= 0.5 %: 50 us)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arms", default="abcd", help="which arms to run (e: distprof --schedule none without --watch, "
                                                   "to tell the watch's part of d from the launcher's; f: distprof "
                                                   "--cpu-sample-ms 0, to tell the CPU sampler's part of c); "
                                                   "ratios are printed for the arms present")
    ap.add_argument("--watch-arm", action="store_true", help="only the watch's cost on a DDP step's training thread")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.watch_arm:
        print_watch_cost(watch_sync_cost())
        return
    from distprof.capture.schedule import Action, action_at
    from distprof.config import ScheduleConfig
    from distprof.storage import find_shards, read_shard

    sched = ScheduleConfig(**SCHED)
    rec_a = {"a": [], "b": [], "c": [], "d": [], "e": []}  # outside-window steps of a, c, d; recorded steps of b, c
    recorded = {"b": [], "c": [], "f": []}
    b_stop, b_export, b_load, b_gzip, c_hold, c_stop, c_durable, c_size = [], [], [], [], [], [], [], []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for r in range(args.rounds):
            for arm in args.arms:
                tag = f"{arm}{r}"
                for rank in run(tmp, tag, args, arm):
                    st = rank["steps"]
                    if arm in "acde":  # with --repeat 3 every step from OUTSIDE_FROM on is outside a window
                        rec_a[arm] += st[OUTSIDE_FROM:]
                    if arm == "b":
                        # iteration i runs step i, then prof.step() (which stops the trace after a window's last)
                        recorded["b"] += [t for i, t in enumerate(st) if action_at(sched, i) is Action.RECORD
                                          and i > 0 and action_at(sched, i - 1) is Action.RECORD]
                        closing = [i for i in range(len(st)) if action_at(sched, i) is Action.RECORD_AND_SAVE]
                        for i, e in zip(closing, rank["export"]):
                            b_stop.append(rank["step_call"][i] - e["export_s"] - e["load_s"])
                            b_export.append(e["export_s"])
                            b_load.append(e["load_s"])
                            if e["gzip_bytes"]:
                                b_gzip.append(e["gzip_bytes"])
                    if arm in "cf":
                        # iteration i runs step i; its first forward ends step i-1 (the deferred step)
                        recorded[arm] += [t for i, t in enumerate(st) if action_at(sched, i) is Action.RECORD
                                          and i > 0 and action_at(sched, i - 1) is Action.RECORD]
                if arm == "c":
                    run_dir = tmp / "runs" / tag
                    for p in find_shards(run_dir):
                        s = read_shard(p)
                        tm = s.attrs["timings"]
                        c_hold.append(tm["stop_s"] + tm["ready_s"])
                        c_stop.append(tm["stop_s"])
                        if s.attrs["window"] == 0:
                            c_size.append(p.stat().st_size)
                    for stf in run_dir.glob("rank*.status.json"):
                        c_durable += [w["durable_after_s"] for w in json.loads(stf.read_text())["windows"]]
                print(f"round {r} arm {arm} done", file=sys.stderr, flush=True)
    def med(xs):
        return statistics.median(xs) if xs else float("nan")

    a, c_out, dw, e = med(rec_a["a"]), med(rec_a["c"]), med(rec_a["d"]), med(rec_a["e"])
    rb, rc, rf = med(recorded["b"]), med(recorded["c"]), med(recorded["f"])
    micro = micro_watch()
    off_us, on_us = watch_step_cost()
    load = os.getloadavg()
    rows = [
        ("active window: distprof / bare torch.profiler (recorded steps)", rc / rb, "<= 1.02", rc / rb <= 1.02,
         f"{rc * 1e3:.2f} vs {rb * 1e3:.2f} ms, {len(recorded['c'])}/{len(recorded['b'])} steps"),
        ("outside a window: distprof / no profiler", c_out / a, "<= 1.005", c_out / a <= 1.005,
         f"{c_out * 1e3:.2f} vs {a * 1e3:.2f} ms, {len(rec_a['c'])}/{len(rec_a['a'])} steps"),
        ("--watch / no profiler", dw / a, "<= 1.005", dw / a <= 1.005,
         f"{dw * 1e3:.2f} vs {a * 1e3:.2f} ms, {len(rec_a['d'])} steps"),
        ("window-closing step hold: distprof / torch's own stop", med(c_hold) / med(b_stop), "<= 1.2",
         med(c_hold) / med(b_stop) <= 1.2,
         f"{med(c_hold) * 1e3:.1f} ms (torch stop inside it {med(c_stop) * 1e3:.1f}) vs {med(b_stop) * 1e3:.1f} ms"),
        ("window end -> usable: (export_chrome_trace + orjson) / durable shard",
         (med(b_export) + med(b_load)) / med(c_durable), ">= 3", (med(b_export) + med(b_load)) / med(c_durable) >= 3,
         f"{(med(b_export) + med(b_load)) * 1e3:.0f} ms (export {med(b_export) * 1e3:.0f}, load "
         f"{med(b_load) * 1e3:.0f}) vs {med(c_durable) * 1e3:.0f} ms (background)"),
        ("size: shard / gzipped chrome JSON (window 0)", med(c_size) / med(b_gzip), "<= 0.5",
         med(c_size) / med(b_gzip) <= 0.5, f"{med(c_size) / 1e3:.0f} kB vs {med(b_gzip) / 1e3:.0f} kB"),
        ("--watch / distprof --schedule none without it (the watch's own part)", dw / e, "<= 1.005", dw / e <= 1.005,
         f"{dw * 1e3:.2f} vs {e * 1e3:.2f} ms, {len(rec_a['e'])} steps"),
        ("CPU sampler: distprof / distprof --cpu-sample-ms 0 (recorded steps)", rc / rf, "<= 1.01", rc / rf <= 1.01,
         f"{rc * 1e3:.2f} vs {rf * 1e3:.2f} ms, {len(recorded['f'])} steps"),
    ]
    rows = [r for r in rows if r[1] == r[1]]  # arms not run: NaN
    print(f"capture overhead: 2-rank DDP MLP (hidden {args.hidden}, batch {args.batch}), {args.steps} steps x "
          f"{args.rounds} rounds interleaved; medians over both ranks; load average {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f} on {os.cpu_count()} CPUs")
    print(f"  no profiler: median step {a * 1e3:.2f} ms")
    for name, ratio, goal, ok, detail in rows:
        print(f"  {name:<70} {ratio:7.3f}  goal {goal:<8} {'met' if ok else 'NOT MET'}   ({detail})")
    print(f"  --watch per step on the training thread (in-process): row {micro['row_us']:.2f} us, optimizer hooks "
          f"{micro['opt_hooks_us']:.2f} us; per DataLoader batch {micro['dataloader_wrap_us']:.2f} us, per Work.wait "
          f"{micro['wait_wrap_us']:.2f} us; that is "
          f"{(micro['row_us'] + micro['opt_hooks_us']) / (a * 1e6) * 100:.4f} % of this job's {a * 1e3:.1f} ms step")
    print(f"  a profiler step alone (--schedule none, 7 x 20,000 steps interleaved, medians): {off_us:.2f} us without "
          f"--watch, {on_us:.2f} us with it: +{on_us - off_us:.2f} us per step = "
          f"{(on_us - off_us) / (a * 1e6) * 100:.4f} % of this job's step; the 0.5 % goal allows "
          f"{0.005 * a * 1e6:.0f} us here and 50 us for a 10 ms step")
    print_watch_cost(watch_sync_cost())


if __name__ == "__main__":
    main()
