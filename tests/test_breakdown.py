"""Rank × step breakdown on hand-built MergedRuns (times in ms, exact answers), through the in-memory summary path.

``RunBuilder`` and ``ddp_run`` are shared with the other analysis tests (``from test_breakdown import ...``).
"""

from __future__ import annotations

import numpy as np
import pytest

from distprof.analysis.summarize.engine import summarize_merged
from distprof.analysis.types import HostClock, MergedRun
from distprof.storage import schema

MS = 1_000_000
BASE = 1_790_856_000 * 10**9  # a realistic epoch, so int64 sums would overflow if done carelessly
CPU_OP, ANNOT, PYFUNC, KERNEL, MEMCPY = (schema.KIND_CODE[k] for k in
                                          ("cpu_op", "user_annotation", "python_function", "kernel", "gpu_memcpy"))
OTHER, COMPUTE, COMM, COPY = range(4)


class RunBuilder:
    """Build a MergedRun event by event; times in ms from BASE (floats allowed)."""

    def __init__(self, world_size: int, hosts: list[str] | None = None, device: str = "cpu"):
        self.world_size = world_size
        self.hosts = {r: (hosts[r] if hosts else "host0") for r in range(world_size)}
        self.device = device
        self.names: list[str] = []
        self.ev: list[tuple] = []
        self.cm: list[tuple] = []
        self.st: list[tuple] = []
        self.th: list[tuple] = []
        self.clock: dict[str, HostClock] = {}

    def sid(self, name: str) -> int:
        if name not in self.names:
            self.names.append(name)
        return self.names.index(name)

    def event(self, rank, name, kind, cat, tid, t0_ms, t1_ms, *, step=-1, flops=0, device=-1) -> int:
        ts = BASE + int(round(t0_ms * MS))
        self.ev.append((rank, self.sid(name), kind, cat, tid, device, ts, BASE + int(round(t1_ms * MS)) - ts, step,
                        flops))
        return len(self.ev) - 1

    def comm(self, i_event, *, role, seq=-1, pg=0, op="all_reduce", nbytes=1024):
        rank = self.ev[i_event][0]
        self.cm.append((i_event, rank, self.sid(op), role, pg, seq, nbytes, self.world_size))

    def step(self, rank, step, t0_ms, t1_ms, *, flops=0, peak=0, tid=1, annotate=True):
        self.st.append((rank, step, BASE + int(round(t0_ms * MS)), BASE + int(round(t1_ms * MS)), flops, peak))
        if annotate:
            self.event(rank, f"ProfilerStep#{step}", ANNOT, OTHER, tid, t0_ms, t1_ms, step=step)

    def thread(self, rank, tid, role, pg=-1):
        self.th.append((rank, tid, self.sid("python3" if role == 1 else "pt_gloo_runloop"), role, pg))

    def build(self) -> MergedRun:
        ev = np.array(self.ev, dtype=object).reshape(-1, 10)
        order = np.lexsort((ev[:, 6].astype(np.int64), ev[:, 0].astype(np.int64))) if len(ev) else np.zeros(0, int)
        inv = np.empty(len(order), np.int64)
        inv[order] = np.arange(len(order))
        ev = ev[order]
        cols = ("rank", "name_id", "kind", "category", "tid", "device", "ts_ns", "dur_ns", "step", "flops")
        dts = ("i4", "u4", "u1", "u1", "i8", "i2", "i8", "i8", "i4", "i8")
        events = {c: ev[:, i].astype(d) for i, (c, d) in enumerate(zip(cols, dts))}
        events["corr_id"] = np.zeros(len(ev), np.int64)
        events["window"] = np.zeros(len(ev), np.int32)
        cm = np.array(self.cm, dtype=np.int64).reshape(-1, 8)
        comms = {
            "row": inv[cm[:, 0]] if len(cm) else np.zeros(0, np.int64),
            "rank": cm[:, 1].astype(np.int32),
            "op_id": cm[:, 2].astype(np.uint32),
            "role": cm[:, 3].astype(np.uint8),
            "pg": cm[:, 4].astype(np.int32),
            "seq": cm[:, 5].astype(np.int32),
            "bytes": cm[:, 6],
            "group_size": cm[:, 7].astype(np.int32),
            "nccl_seq": np.full(len(cm), -1, np.int64),
            "window": np.zeros(len(cm), np.int32),
        }
        st = np.array(self.st, dtype=np.int64).reshape(-1, 6)
        steps = {
            "rank": st[:, 0].astype(np.int32),
            "step": st[:, 1].astype(np.int32),
            "start_ns": st[:, 2],
            "end_ns": st[:, 3],
            "flops": st[:, 4],
            "peak_mem_bytes": st[:, 5],
            "n_events": np.zeros(len(st), np.int64),
            "window": np.zeros(len(st), np.int32),
        }
        th = np.array(self.th, dtype=np.int64).reshape(-1, 5)
        threads = {
            "rank": th[:, 0].astype(np.int32),
            "tid": th[:, 1],
            "name_id": th[:, 2].astype(np.uint32),
            "role": th[:, 3].astype(np.uint8),
            "pg": th[:, 4].astype(np.int32),
            "window": np.zeros(len(th), np.int32),
        }
        present = sorted({int(r) for r in steps["rank"]})
        return MergedRun(
            run_id="test-run",
            world_size=self.world_size,
            ranks_present=present,
            ranks_missing=[r for r in range(self.world_size) if r not in present],
            hosts=dict(self.hosts),
            names=np.array(self.names, dtype=object),
            events=events,
            comms=comms,
            steps=steps,
            memory={"ts_ns": np.zeros(0, np.int64), "bytes": np.zeros(0, np.int64),
                    "total_bytes": np.zeros(0, np.int64), "device": np.zeros(0, np.int16),
                    "step": np.zeros(0, np.int32), "rank": np.zeros(0, np.int32), "window": np.zeros(0, np.int32)},
            threads=threads,
            clock=dict(self.clock),
            attrs={r: {"device": self.device, "backend": "gloo", "host": self.hosts[r]} for r in present},
            process_groups=[{"index": 0, "name": "0", "desc": "default_pg", "backend": "gloo",
                             "ranks": list(range(self.world_size))}],
        )


def ddp_run(
    world_size: int = 4,
    *,
    n_steps: int = 3,
    late_rank: int | None = None,
    late_ms: float = 0.0,
    jitter_ms: tuple[float, ...] | None = None,
    buckets: int = 2,
    allreduce_ms: float = 2.0,
    fwd_ms: float = 10.0,
    bwd_ms: float = 5.0,
    batch: dict[int, float] | None = None,
    hosts: list[str] | None = None,
    late_kind: str = "idle",
    late_at: dict[tuple[int, int], float] | None = None,
    noise_ms: float = 0.0,
    seed: int = 0,
) -> MergedRun:
    """A DDP-like gloo CPU run built like the real thing.

    Per step and rank: forward compute ``fwd_ms``; on `late_rank` a gap of ``late_ms`` before backward (no events:
    ``late_kind="idle"``, or an ``aten::slow`` compute op: ``"compute"``); per bucket ``bwd_ms`` of compute then the
    c10d enqueue (60 µs); each bucket's gloo:all_reduce starts on worker thread (bucket % 2) at enqueue + 20 µs and
    ends ``allreduce_ms`` after the last rank started; the main thread waits without events; optimizer 1 ms.
    Rank r's compute is stretched by ``batch[r]`` and its arrivals shifted by ``jitter_ms[r]``.
    Steps are in lockstep: each starts 1 ms after the previous one ended on every rank.
    ``late_at`` {(step index, rank): ms} sets the delay per step instead (overrides late_rank/late_ms).
    ``noise_ms``: every rank's forward starts |N(0, noise_ms)| later in every step (scheduling noise; seeded).
    """
    rng = np.random.default_rng(seed)
    b = RunBuilder(world_size, hosts)
    jitter = jitter_ms or (0.0,) * world_size
    scale = {r: 1.0 for r in range(world_size)}
    scale.update(batch or {})
    seq = 0
    t = 0.0
    for r in range(world_size):
        b.thread(r, 1, schema.THREAD_MAIN)
        b.thread(r, 2, schema.THREAD_COMM, 0)
        b.thread(r, 3, schema.THREAD_COMM, 0)
    for s in range(n_steps):
        step_id = 10 + s
        arrive = np.zeros((buckets, world_size))
        main_end = np.zeros(world_size)
        for r in range(world_size):
            tt = t + jitter[r] + (abs(rng.normal(0, noise_ms)) if noise_ms else 0.0)
            f = fwd_ms * scale[r]
            b.event(r, "DistributedDataParallel.forward", ANNOT, OTHER, 1, tt, tt + f, step=step_id)
            b.event(r, "aten::addmm", CPU_OP, COMPUTE, 1, tt, tt + f, step=step_id, flops=int(1e9 * scale[r]))
            tt += f
            delay = late_ms if r == late_rank else 0.0
            if late_at is not None:
                delay = late_at.get((s, r), 0.0)
            if delay:
                if late_kind == "compute":
                    b.event(r, "aten::slow", CPU_OP, COMPUTE, 1, tt, tt + delay, step=step_id)
                tt += delay
            for k in range(buckets):
                d = bwd_ms * scale[r]
                b.event(r, "aten::mm", CPU_OP, COMPUTE, 1, tt, tt + d, step=step_id, flops=int(2e9 * scale[r]))
                tt += d
                i = b.event(r, "c10d::allreduce_", CPU_OP, COMM, 1, tt, tt + 0.06, step=step_id)
                b.comm(i, role=schema.ROLE_ENQUEUE)
                arrive[k, r] = tt + 0.02
                tt += 0.06
            main_end[r] = tt
        ends = arrive.max(axis=1) + allreduce_ms
        for k in range(buckets):
            for r in range(world_size):
                i = b.event(r, "gloo:all_reduce", ANNOT, COMM, 2 + k % 2, arrive[k, r], ends[k], step=step_id)
                b.comm(i, role=schema.ROLE_EXEC, seq=seq)
            seq += 1
        step_end = 0.0
        for r in range(world_size):
            o0 = max(main_end[r], ends.max()) + 0.01
            b.event(r, "Optimizer.step#SGD.step", ANNOT, OTHER, 1, o0, o0 + 1.0, step=step_id)
            b.event(r, "aten::add_", CPU_OP, COMPUTE, 1, o0, o0 + 1.0, step=step_id, flops=1000)
            b.step(r, step_id, t, o0 + 1.0, flops=int((1e9 + 2e9 * buckets) * scale[r]) + 1000)
            step_end = max(step_end, o0 + 1.0)
        t = step_end + 1.0
    return b.build()


def _row(bd, rank, step):
    i = int(np.flatnonzero((bd["rank"] == rank) & (bd["step"] == step))[0])
    return {k: v[i] for k, v in bd.items()}


def one_rank_cpu_step() -> MergedRun:
    """The hand-computed step of the module docstring of breakdown.py (see test below)."""
    b = RunBuilder(1)
    b.thread(0, 1, schema.THREAD_MAIN)
    b.thread(0, 2, schema.THREAD_COMM, 0)
    b.step(0, 5, 0, 100, flops=7)
    b.event(0, "DistributedDataParallel.forward", ANNOT, OTHER, 1, 0, 30, step=5)
    b.event(0, "aten::addmm", CPU_OP, COMPUTE, 1, 5, 25, step=5)
    b.event(0, "aten::relu", CPU_OP, COMPUTE, 1, 10, 15, step=5)  # nested: counts once
    b.event(0, "run_backward", PYFUNC, OTHER, 1, 30, 90, step=5)  # python_function: ignored
    b.event(0, "aten::mm", CPU_OP, COMPUTE, 1, 40, 60, step=5)
    i = b.event(0, "c10d::allreduce_", CPU_OP, COMM, 1, 60, 61, step=5)
    b.comm(i, role=schema.ROLE_ENQUEUE)
    i = b.event(0, "gloo:all_reduce", ANNOT, COMM, 2, 55, 85, step=5)
    b.comm(i, role=schema.ROLE_EXEC, seq=0)
    b.event(0, "Optimizer.step#SGD.step", ANNOT, OTHER, 1, 90, 98, step=5)
    b.event(0, "aten::add_", CPU_OP, COMPUTE, 1, 91, 97, step=5)
    return b.build()


def test_cpu_step_hand_computed():
    # S = [0,100). C = [5,25) ∪ [40,60) ∪ [91,97) = 46. K = [55,85) = 30; K∩C = [55,60) = 5.
    # Main thread in any cpu_op/annotation: [0,30) ∪ [40,61) ∪ [90,98) -> idle I = [30,40) ∪ [61,90) ∪ [98,100).
    # E = K minus main-thread non-comm cpu_ops = [60,85) -> exposed = E \ C = 25 (incl. the c10d enqueue [60,61)).
    # idle = I \ C \ E = [30,40) ∪ [85,90) ∪ [98,100) = 17. other = 100-46-25-17 = 12 (annotation-only time).
    bd = summarize_merged(one_rank_cpu_step()).steps
    r = _row(bd, 0, 5)
    assert r["step_ms"] == 100
    assert r["compute_ms"] == pytest.approx(46)
    assert r["comm_ms"] == pytest.approx(30)
    assert r["overlapped_ms"] == pytest.approx(5)
    assert r["exposed_comm_ms"] == pytest.approx(25)
    assert r["idle_ms"] == pytest.approx(17)
    assert r["other_ms"] == pytest.approx(12)
    assert r["memcpy_ms"] == 0
    assert r["flops"] == 7


def test_gpu_step_hand_computed():
    # Device rank: compute = compute kernels only (not the CPU ops that launch them); exposed = comm \ compute.
    b = RunBuilder(1, device="NVIDIA H100 80GB HBM3")
    b.thread(0, 1, schema.THREAD_MAIN)
    b.step(0, 1, 0, 50)
    b.event(0, "aten::mm", CPU_OP, COMPUTE, 1, 0, 45, step=1)  # CPU side: not device compute
    b.event(0, "gemm", KERNEL, COMPUTE, 7, 2, 20, step=1, device=0)
    b.event(0, "gemm", KERNEL, COMPUTE, 7, 30, 40, step=1, device=0)
    b.event(0, "Memcpy HtoD", MEMCPY, COPY, 7, 20, 22, step=1, device=0)
    i = b.event(0, "ncclDevKernel_AllReduce", KERNEL, COMM, 9, 15, 35, step=1, device=0)
    b.comm(i, role=schema.ROLE_EXEC, seq=0)
    bd = summarize_merged(b.build()).steps
    r = _row(bd, 0, 1)
    # C = [2,20) ∪ [30,40) = 28; M = [20,22) -> memcpy 2; K = [15,35) = 20, K∩C = [15,20) ∪ [30,35) = 10
    # exposed = K \ (C ∪ M) = [22,30) = 8; device busy = [2,40) -> idle = [0,2) ∪ [40,50) = 12; other = 0
    assert (r["compute_ms"], r["memcpy_ms"], r["comm_ms"], r["overlapped_ms"]) == pytest.approx((28, 2, 20, 10))
    assert (r["exposed_comm_ms"], r["idle_ms"], r["other_ms"]) == pytest.approx((8, 12, 0))


def test_ddp_partition_sums_to_step_time():
    run = ddp_run(4, late_rank=2, late_ms=20)
    bd = summarize_merged(run).steps
    assert bd["step"].size == 12
    parts = bd["compute_ms"] + bd["memcpy_ms"] + bd["exposed_comm_ms"] + bd["idle_ms"] + bd["other_ms"]
    assert np.allclose(parts, bd["step_ms"])
    # the late rank sleeps 20 ms with no event: idle; the others wait for it: exposed communication
    late = bd["rank"] == 2
    assert np.all(bd["idle_ms"][late] >= 20 - 1e-6)
    assert bd["exposed_comm_ms"][~late].min() > bd["exposed_comm_ms"][late].max() + 15


def test_main_thread_found_without_threads_table():
    run = one_rank_cpu_step()
    run.threads = {k: v[:0] for k, v in run.threads.items()}
    r = _row(summarize_merged(run).steps, 0, 5)
    assert r["idle_ms"] == pytest.approx(17)  # the ProfilerStep# thread is the main thread
    # without the worker tids in /threads, the thread of the exec event is still not "compute on another thread"
    assert r["overlapped_ms"] == pytest.approx(5)


def test_empty_run():
    b = RunBuilder(2)
    bd = summarize_merged(b.build()).steps
    assert bd["step"].size == 0 and set(bd) >= {"compute_ms", "idle_ms"}


def test_durations_on_a_drifting_host_match_the_true_clock(tmp_path):
    """A host whose clock runs 40 ppm fast and 3.25 s off: its ranks' step breakdown on the aligned clock equals the
    breakdown of the same simulated job recorded by true clocks, to well under a microsecond per part (the durations
    are measured on the rank's own clock and scaled by the host's fitted drift)."""
    import distprof
    from synth import make_run

    kw = dict(world_size=4, hosts=[0, 0, 1, 1], late_rank=2, late_ms=30)
    drifting = distprof.load(make_run(tmp_path / "d", clocks={1: (3.25, 40.0)}, **kw).run_dir).steps
    truth = distprof.load(make_run(tmp_path / "t", **kw).run_dir).steps
    host1 = np.isin(truth["rank"], [2, 3])
    assert (drifting["rank"] == truth["rank"]).all() and (drifting["step"] == truth["step"]).all()
    for col in ("step_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "idle_ms", "other_ms"):
        err = np.abs(drifting[col] - truth[col])[host1]
        assert err.max() < 2e-4, (col, err.max())  # < 0.2 µs on ~45 ms steps; a raw duration would be 1.8 µs off
