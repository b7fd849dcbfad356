"""What the watch costs the training thread, priced by its parts (``capture_overhead.py --watch-arm``).

In-process, no job: the row and the optimizer hooks (:func:`micro_watch`), a profiler step alone with and without
--watch (:func:`watch_step_cost`), the synchronisation points' timing on a real DDP step's training thread, in its
CPU time from scheduler statistics (:func:`watch_sync_cost`), and one NCCL completion as the watch's hook handles it
(on NCCL's hook thread, not the training thread). docs/watch.md quotes these figures.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Callable


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


def print_micro(micro: dict[str, float], off_us: float, on_us: float) -> None:
    print(f"  --watch per step on the training thread (in-process): row {micro['row_us']:.2f} us, optimizer hooks "
          f"{micro['opt_hooks_us']:.2f} us; per DataLoader batch {micro['dataloader_wrap_us']:.2f} us, per Work.wait "
          f"{micro['wait_wrap_us']:.2f} us")
    print(f"  a profiler step alone (--schedule none, 7 x 20,000 steps interleaved, medians): {off_us:.2f} us without "
          f"--watch, {on_us:.2f} us with it: +{on_us - off_us:.2f} us per step = {(on_us - off_us) / 100:.4f} % of a "
          f"10 ms step (the 0.5 % goal allows 50 us there)")


def main() -> None:
    """Every part of the watch's price, printed."""
    print("the watch's cost on the training thread, by its parts:")
    print_micro(micro_watch(), *watch_step_cost())
    print_watch_cost(watch_sync_cost())
