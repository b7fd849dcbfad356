"""DDP MLP (the seed's model) that records each iteration's wall time and its training thread's CPU time; used by
capture_overhead.py.

    _timed_train.py STEPS BATCH HIDDEN OUT [--torch WAIT,WARMUP,ACTIVE,REPEAT] [--toggle-from N --block K]

CPU time is the scheduler's run time of the training thread (``/proc/thread-self/schedstat``, read with distprof's
``capture.schedstat.ThreadCpu``): what the thread ran, not the time a loaded machine's other processes held it off a
core, which wall time includes.

``--torch``: the loop runs under a bare ``torch.profiler.profile`` (CPU, record_shapes, profile_memory, with_flops:
distprof's defaults) with that schedule and ``prof.step()`` after each iteration; each window's trace is exported
with ``export_chrome_trace`` and loaded back with orjson (what a user of the bare profiler does to look at it) inside
on_trace_ready, timed apart (wall and CPU), so torch's own stop = the closing ``prof.step()`` minus the whole callback.

Under ``distprof.launch``: every call of distprof's torch profiler's ``step()`` is timed (wall and CPU) until
``--toggle-from`` (a window's closing call is distprof's whole hold: torch's stop and distprof's on_trace_ready);
at the end the writer thread's CPU time and the shards it wrote are recorded. From ``--toggle-from`` on, blocks of
``--block`` steps take distprof's per-step work off the training thread and put it back in turn (:class:`Toggle`),
so that steps with and without it run minutes apart at most — in the same process, on the same machine state.

OUT.rank{r}.json: {"wall": [s per iteration], "cpu_ns": [per iteration], "arm": ["on"/"off"/"" per iteration],
"calls": [{"i", "step_num", "wall_s", "cpu_ns"} per timed profiler step], "export": [{window, export_s, load_s,
cpu_ns, ready_s, ready_cpu_ns, events, json_bytes, gzip_bytes}], "written": [distprof's shards], "writer_cpu_ns",
"side_cpu_ns": {thread name: CPU ns over the toggled steps}, "toggled_steps"}.
"""

import argparse
import gzip
import json
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from distprof.capture.schedstat import ThreadCpu


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    for name in ("steps", "batch", "hidden"):
        ap.add_argument(name, type=int)
    ap.add_argument("out")
    ap.add_argument("--torch", default=None, help="WAIT,WARMUP,ACTIVE,REPEAT: a bare torch.profiler")
    ap.add_argument("--toggle-from", type=int, default=-1)
    ap.add_argument("--block", type=int, default=8)
    return ap.parse_args()


class Cpu:
    """The calling thread's CPU ns: scheduler statistics, else the thread CPU clock (the same kernel counter)."""

    def __init__(self) -> None:
        self._stat = ThreadCpu()

    def ns(self) -> int:
        s = self._stat.sample(faults=False)
        return s[0] if s is not None else time.thread_time_ns()


def thread_cpu_ns(prefix: str) -> dict[str, int]:
    """CPU ns so far of this process's threads whose name begins with `prefix` (their scheduler statistics)."""
    out = {}
    for t in threading.enumerate():
        if t.name.startswith(prefix) and t.native_id is not None:
            try:
                with open(f"/proc/self/task/{t.native_id}/schedstat", "rb") as fh:
                    out[t.name] = out.get(t.name, 0) + int(fh.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return out


def make_step(batch: int, hidden: int):
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(1024, hidden), nn.ReLU(), nn.Linear(hidden, 1024), nn.ReLU(),
                              nn.Linear(1024, 10)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, 1024), torch.randint(0, 10, (batch,))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


class Bare:
    """A bare torch.profiler with distprof's options; each window exported and loaded back in on_trace_ready."""

    def __init__(self, spec: str, out: str, rank: int, cpu: Cpu) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        wait, warmup, active, repeat = (int(v) for v in spec.split(","))
        self.out, self.rank, self.cpu = out, rank, cpu
        self.exports: list[dict] = []
        self.prof = profile(activities=[ProfilerActivity.CPU], on_trace_ready=self._ready, record_shapes=True,
                            profile_memory=True, with_flops=True,
                            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=repeat))

    def _ready(self, p) -> None:
        import orjson

        path = f"{self.out}.rank{self.rank}.w{len(self.exports)}.json"
        c0, t0 = self.cpu.ns(), time.perf_counter()
        p.export_chrome_trace(path)
        t1 = time.perf_counter()
        with open(path, "rb") as fh:
            raw = fh.read()
        trace = orjson.loads(raw)
        t2, c2 = time.perf_counter(), self.cpu.ns()
        events = sum(1 for e in trace.get("traceEvents", ())
                     if e.get("ph") == "X" or (e.get("ph") == "i" and e.get("name") == "[memory]"))
        gz = len(gzip.compress(raw, 6)) if not self.exports else None  # window 0's size, not a user's cost
        # the whole callback: torch's own stop = the closing prof.step() less it
        self.exports.append({"window": len(self.exports), "export_s": t1 - t0, "load_s": t2 - t1, "cpu_ns": c2 - c0,
                             "ready_s": time.perf_counter() - t0, "ready_cpu_ns": self.cpu.ns() - c0,
                             "events": events, "json_bytes": len(raw), "gzip_bytes": gz})


class Toggle:
    """distprof's per-step work on the training thread, taken off and put back: its optimizer-step hooks and the
    deferred step boundary (the stepper: the profiler's whole step, the watch's row included) and, with --watch, the
    watch recorder's wrappers and hooks. Off, nothing of distprof runs on the training thread; its side threads go
    on (their CPU time is recorded apart). Blocks alternate off/on, on/off (ABBA: a steady drift cancels)."""

    def __init__(self, prof, start: int, block: int) -> None:
        self.prof, self.start, self.block = prof, start, block
        self.state = "on"

    def arm_at(self, i: int) -> str:
        if i < self.start:
            return ""
        b = (i - self.start) // self.block
        order = ("off", "on") if (b // 2) % 2 == 0 else ("on", "off")
        return order[b % 2]

    def switch(self, arm: str) -> None:
        if arm in ("", self.state):
            return
        stepper, watch = self.prof._stepper, self.prof._watch
        if arm == "off":
            stepper.fire()  # the pending step ends here, as the next forward would have ended it
            stepper.remove()
            if watch is not None:
                watch.recorder.remove()
        else:
            if watch is not None:
                watch.recorder.install()
            stepper.install()
        self.state = arm


class TimedCalls:
    """Wall and CPU time of each call of distprof's torch profiler's step() (on the instance; removed by `stop`)."""

    def __init__(self, prof, cpu: Cpu, it: list[int]) -> None:
        self.prof, self.calls = prof, []
        tp, orig = prof._prof, prof._prof.step

        def step(*a, **k):
            c0, t0 = cpu.ns(), time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                self.calls.append({"i": it[0], "step_num": prof.step_num, "wall_s": time.perf_counter() - t0,
                                   "cpu_ns": cpu.ns() - c0})

        tp.step = step

    def stop(self) -> None:
        tp = self.prof._prof
        if tp is not None and "step" in tp.__dict__:
            del tp.step


def wait_written(prof, timeout_s: float = 60.0) -> None:
    """Until every window queued so far is written or lost (the writer runs in the background)."""
    if prof._writer is not None and not prof._writer.drain(timeout_s):
        print(f"windows not written within {timeout_s:.0f} s", file=sys.stderr)


def train(args, rank: int) -> dict:
    step, cpu = make_step(args.batch, args.hidden), Cpu()
    bare = Bare(args.torch, args.out, rank, cpu) if args.torch else None
    launched = sys.modules.get("distprof.capture.profiler")  # under distprof.launch: its profiler runs
    prof = launched.active() if launched is not None else None
    it = [0]
    timed = TimedCalls(prof, cpu, it) if prof is not None else None
    toggle = Toggle(prof, args.toggle_from, args.block) if prof is not None and args.toggle_from >= 0 else None
    wall, cpu_ns, arms, calls, side0 = [], [], [], [], {}
    if bare is not None:
        bare.prof.start()
    for i in range(args.steps):
        it[0] = i
        arm = toggle.arm_at(i) if toggle else ""
        if toggle and i == toggle.start:
            timed.stop()
            side0 = thread_cpu_ns("distprof-")
        if toggle:
            toggle.switch(arm)
        c0, t0 = cpu.ns(), time.perf_counter()
        step()
        if bare is not None:
            c1, t1 = cpu.ns(), time.perf_counter()
            bare.prof.step()
            calls.append({"i": i, "wall_s": time.perf_counter() - t1, "cpu_ns": cpu.ns() - c1})
        wall.append(time.perf_counter() - t0)
        cpu_ns.append(cpu.ns() - c0)
        arms.append(arm)
    if toggle:
        toggle.switch("on")
    out = {"wall": wall, "cpu_ns": cpu_ns, "arm": arms, "calls": calls, "export": [], "written": [],
           "writer_cpu_ns": 0, "side_cpu_ns": {}, "toggled_steps": sum(1 for a in arms if a)}
    if bare is not None:
        bare.prof.stop()
        out["export"] = bare.exports
    if prof is not None:
        side1 = thread_cpu_ns("distprof-")
        out["side_cpu_ns"] = {k: v - side0.get(k, 0) for k, v in side1.items()} if side0 else {}
        if timed is not None:
            timed.stop()
            out["calls"] = timed.calls
        wait_written(prof)
        out["written"] = prof.windows_written
        out["writer_cpu_ns"] = thread_cpu_ns("distprof-writer").get("distprof-writer", 0)
    return out


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = train(args, rank)
    with open(f"{args.out}.rank{rank}.json", "w") as fh:
        json.dump(out, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
