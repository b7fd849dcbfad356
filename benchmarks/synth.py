"""Realistic synthetic runs at scale, with a known truth: normal shards, as a GPU job would leave them.

    python benchmarks/synth.py --ranks 1024 --events 100000 --hosts 128 -o /tmp/run1024
    python benchmarks/synth.py --ranks 8 --events 20000 --slow-rank 3 --slow-ms 12 -o /tmp/run8

What a rank holds (per recorded step; ``--events`` is the total per rank over every window, approximately):

* main thread: ``ProfilerStep#N``; forward and backward ``cpu_op`` rows from a vocabulary of ``--names`` op names
  (the same sequence on every rank, so ranks are comparable op by op), each launching a kernel (``cudaLaunchKernel``
  runtime call, correlation id) onto compute stream 7; a second CPU thread (the autograd engine's) with a few ops;
* collectives: per step, on each process group (``--tp`` > 1: a tensor-parallel group of consecutive ranks and a
  data-parallel group across them; else one group of every rank), ``--colls`` of them: the ``c10d::`` enqueue, a
  ``record_param_comms`` annotation with the group's name, ranks and message size, the launch, and the NCCL kernel
  on comm stream 20; its start is the rank's arrival, its end the last member's arrival plus the transfer;
* memory: allocator samples (``[memory]``) along the step; per-step peaks;
* clock: each host's clock is offset (up to ±2 s, seeded) and drifts (±20 ppm); host leaders record NTP-style
  ping-pongs with rank 0 at each window's start and end, as the capture does.

``--shape fsdp|tp|pp|ep|llm`` (benchmarks/synth_shapes.py): an LLM job instead, with per-layer collectives
(``--layers``): FSDP2 all-gathers and reduce-scatters, TP all-reduces, 1F1B pipeline send/recv (``--pp``,
``--micro-batches``), MoE all-to-alls (``--ep``), or the 3-D mix; hundreds of collectives per step, about 160 op
names. The default shape is the run described above, unchanged. docs/scaling.md, "Synthetic shapes", compares
both with real traces.

``--slow-rank R --slow-ms X``: rank R's compute takes X ms longer every step (the truth a report must find: R is the
straggler, and its peers wait ≈ X ms per step in its collectives). Generation is vectorised per rank and goes
through the capture's own table builder (``distprof.events.tables.build_tables``) and shard writer, so the shards
are what a capture would write; ≈ 1–2 M events/s on one core here.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from distprof.events.classify import CommArgs  # noqa: E402
from distprof.events.tables import Columns, Strings, build_tables  # noqa: E402
from distprof.storage import schema  # noqa: E402
from distprof.storage.writer import write_shard  # noqa: E402

MS = 1_000_000
US = 1_000
K = schema.KIND_CODE
MAIN_TID, BWD_TID = 1000, 1001
COMPUTE_STREAM, COMM_STREAM = 7, 20
T0_NS = 1_790_856_000 * 10**9  # 2026-09-30 12:00 UTC: a realistic epoch
SHAPES = ("default", "fsdp", "tp", "pp", "ep", "llm")


@dataclass(frozen=True)
class Spec:
    ranks: int
    events: int
    hosts: int
    steps: int  # recorded steps per window
    windows: int
    names: int
    tp: int
    colls: int
    slow_rank: int
    slow_ms: float
    seed: int
    run_id: str
    shape: str = "default"  # default, or an LLM shape of synth_shapes.py (fsdp, tp, pp, ep, llm)
    layers: int = 32  # LLM shapes: transformer layers (split over the pipeline stages)
    pp: int = 1  # LLM shapes: pipeline stages
    ep: int = 1  # LLM shapes: expert-parallel group size (1: no MoE)
    micro: int = 1  # LLM shapes: micro-batches per step (pipeline)

    @property
    def per_step(self) -> int:
        return max(self.events // (self.steps * self.windows), 50)

    @property
    def n_ops(self) -> int:
        """Main-thread ops per step: each one is 3 events (op, launch, kernel) plus ~0.2 memory samples."""
        fixed = 2 + 4 * self.colls * self.groups_per_rank + 16
        return max((self.per_step - fixed) * 10 // 32, 8)

    @property
    def groups_per_rank(self) -> int:
        return 2 if self.tp > 1 else 1


def process_groups(spec: Spec) -> list[dict]:
    """Every process group of the job, as the capture records them (global index = position)."""
    if spec.tp <= 1:
        return [{"index": 0, "name": "0", "desc": "default_pg", "backend": "cuda:nccl",
                 "ranks": list(range(spec.ranks))}]
    tp, n = spec.tp, spec.ranks
    out = [{"index": 0, "name": "0", "desc": "default_pg", "backend": "cuda:nccl", "ranks": list(range(n))}]
    for g in range(n // tp):
        out.append({"index": len(out), "name": f"tp{g}", "desc": "mesh_tp", "backend": "cuda:nccl",
                    "ranks": list(range(g * tp, (g + 1) * tp))})
    for j in range(tp):
        out.append({"index": len(out), "name": f"dp{j}", "desc": "mesh_dp", "backend": "cuda:nccl",
                    "ranks": list(range(j, n, tp))})
    return out


def groups_of(spec: Spec, pgs: list[dict], rank: int) -> list[dict]:
    """The groups a rank's collectives run on (not the default group when tensor-parallel)."""
    mine = [g for g in pgs if rank in g["ranks"]]
    return mine if spec.tp <= 1 else [g for g in mine if g["name"] != "0"]


def host_of(spec: Spec, rank: int) -> int:
    per = max(spec.ranks // max(spec.hosts, 1), 1)
    return min(rank // per, spec.hosts - 1)


def clocks(spec: Spec) -> tuple[np.ndarray, np.ndarray]:
    """Per host: (offset ns, drift ppm); host 0 is the reference."""
    rng = np.random.default_rng(spec.seed + 7)
    off = np.rint(rng.uniform(-2e9, 2e9, spec.hosts)).astype(np.int64)
    drift = rng.uniform(-20.0, 20.0, spec.hosts)
    off[0], drift[0] = 0, 0.0
    return off, drift


def recorded(t: np.ndarray, host: int, off: np.ndarray, drift: np.ndarray) -> np.ndarray:
    t = np.asarray(t, np.int64)
    return t + off[host] + np.rint(drift[host] * 1e-6 * (t - T0_NS).astype(np.float64)).astype(np.int64)


def timeline(spec: Spec) -> dict[str, np.ndarray]:
    """The job's true times, every rank at once (ranks × steps): step starts, compute ends, collective arrivals and
    ends. The data-parallel all-reduces keep every rank in lockstep."""
    rng = np.random.default_rng(spec.seed)
    n, s_total = spec.ranks, spec.steps * spec.windows
    compute_ms = 30.0 + rng.normal(0, 0.3, (n, s_total))
    if 0 <= spec.slow_rank < n:
        compute_ms[spec.slow_rank] += spec.slow_ms
    n_c = spec.colls * spec.groups_per_rank
    arrive = np.zeros((n, s_total, n_c), np.int64)
    end = np.zeros((n, s_total, n_c), np.int64)
    start = np.zeros((n, s_total), np.int64)
    t = np.full(n, T0_NS + 5 * MS, np.int64)
    gap = 3 * MS  # wait + warm-up steps between windows are not recorded: a gap
    for s in range(s_total):
        if s and s % spec.steps == 0:
            t = t + 3 * 35 * MS + gap
        start[:, s] = t
        comp_end = t + np.rint(compute_ms[:, s] * MS).astype(np.int64)
        for c in range(n_c):
            arr = comp_end + c * 400 * US + rng.integers(0, 40 * US, n)
            arrive[:, s, c] = arr
            end[:, s, c] = arr.max() + 300 * US + c * 10 * US  # every group of one step waits for the latest rank
        t = end[:, s, :].max(axis=1) + 1 * MS + rng.integers(0, 50 * US, n)
    return {"start": start, "arrive": arrive, "end": end}


def _rank_columns(spec: Spec, rank: int, window: int, truth, pgs, strings: Strings):
    """One rank-window's events (true clock) as build_tables columns and the memory samples."""
    rng = np.random.default_rng(spec.seed * 100_003 + rank * 101 + window)
    s_lo, s_hi = window * spec.steps, (window + 1) * spec.steps
    n_ops = spec.n_ops
    order = np.random.default_rng(spec.seed + 11).permutation(spec.names)[:n_ops] if n_ops <= spec.names else \
        np.random.default_rng(spec.seed + 11).integers(0, spec.names, n_ops)
    op_ids = np.array([strings.id(f"aten::op_{i:04d}") for i in range(spec.names)], np.uint32)[order % spec.names]
    k_ids = np.array([strings.id(f"void kernel_{i:04d}<float, 128>(float const*, float*, int)")
                      for i in range(spec.names)], np.uint32)[order % spec.names]
    launch_id = strings.id("cudaLaunchKernel")
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("name_id", "kind", "tid", "device", "ts", "dur", "flops",
                                                         "corr")}
    meta: dict[int, CommArgs] = {}
    mem_ts, mem_b = [], []
    n_before = 0
    corr = 1
    my_groups = groups_of(spec, pgs, rank)

    def add(name_id, kind, tid, device, ts, dur, flops=0, corr_=0):
        nonlocal n_before
        m = len(np.atleast_1d(ts))
        for k, v in (("name_id", name_id), ("kind", kind), ("tid", tid), ("device", device), ("ts", ts),
                     ("dur", dur), ("flops", flops), ("corr", corr_)):
            cols[k].append(np.broadcast_to(np.asarray(v), (m,)).astype(np.int64))
        n_before += m
        return n_before - m

    for s in range(s_lo, s_hi):
        t0 = int(truth["start"][rank, s])
        arrivals = truth["arrive"][rank, s]
        ends = truth["end"][rank, s]
        comp_end = int(arrivals.min()) - 50 * US
        step_end = int(ends.max()) + 800 * US
        add(strings.id(f"ProfilerStep#{s + 2}"), K["user_annotation"], MAIN_TID, -1, t0, step_end - t0)
        # compute: ops back to back on the main thread, each launching its kernel
        w = rng.lognormal(0.0, 0.6, n_ops)
        span = comp_end - t0 - 100 * US
        d = np.maximum((w / w.sum() * span).astype(np.int64), 2 * US)
        ts = t0 + 50 * US + np.r_[0, np.cumsum(d)[:-1]]
        c_ids = np.arange(corr, corr + n_ops, dtype=np.int64)
        corr += n_ops
        add(op_ids, K["cpu_op"], MAIN_TID, -1, ts, d - US, flops=(d * 1000) * (order % 3 == 0), corr_=c_ids)
        add(launch_id, K["cuda_runtime"], MAIN_TID, -1, ts + d // 2, np.minimum(d // 4, 8 * US), corr_=c_ids)
        k_start = ts + d // 2 + 5 * US
        k_dur = np.maximum((d * rng.uniform(0.6, 0.95, n_ops)).astype(np.int64), US)
        add(k_ids, K["kernel"], COMPUTE_STREAM, 0, k_start, k_dur, corr_=c_ids)
        # the autograd engine's thread: a few ops
        bw = t0 + span // 2 + np.arange(8) * (span // 20)
        add(strings.id("autograd::engine::evaluate_function: AddmmBackward0"), K["cpu_op"], BWD_TID, -1, bw, span // 40)
        # memory: allocations along the step
        n_m = max(n_ops // 5, 4)
        mem_ts.append(np.sort(rng.integers(t0, comp_end, n_m)))
        mem_b.append(np.where(np.arange(n_m) % 2 == 0, 1, -1) * (1 << 20) * rng.integers(1, 64, n_m))
        # collectives: enqueue, record_param_comms, launch, NCCL kernel (start = arrival, end = group's end)
        for c in range(arrivals.size):
            g = my_groups[c % len(my_groups)]
            nbytes = int(1 << (18 + (c % 6)))
            a, e = int(arrivals[c]), int(ends[c])
            enq = a - 30 * US
            cid = corr
            corr += 1
            add(strings.id("c10d::allreduce_"), K["cpu_op"], MAIN_TID, -1, enq, 25 * US)
            i = add(strings.id("record_param_comms"), K["cpu_op"], MAIN_TID, -1, enq + 2 * US, 20 * US)
            meta[i] = CommArgs(op="all_reduce", pg_name=g["name"], pg_desc=g["desc"], pg_ranks=g["ranks"],
                               bytes=nbytes, group_size=len(g["ranks"]))
            add(launch_id, K["cuda_runtime"], MAIN_TID, -1, enq + 5 * US, 6 * US, corr_=cid)
            i = add(strings.id("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"),
                    K["kernel"], COMM_STREAM, 0, a, e - a, corr_=cid)
            meta[i] = CommArgs(op="all_reduce", bytes=nbytes)
        add(strings.id("Optimizer.step#AdamW.step"), K["user_annotation"], MAIN_TID, -1, int(ends.max()) + 50 * US,
            600 * US)
    c = {k: np.concatenate(v) for k, v in cols.items()}
    return c, meta, np.concatenate(mem_ts), np.concatenate(mem_b)


def _pingpongs(rng, host: int, phase_times, off, drift, rounds: int = 16) -> dict[str, np.ndarray]:
    rows = []
    for phase, t in enumerate(phase_times):
        t = int(t)
        for _ in range(rounds):
            d1 = 65 * US + int(abs(rng.normal(0, 2 * US))) + (int(rng.uniform(300, 4000) * US) if rng.random() < .2 else 0)
            d2 = 65 * US + int(abs(rng.normal(0, 2 * US)))
            rows.append((phase, t, t + d1, t + d1 + d2))
            t += d1 + d2 + 10 * US
    a = np.array(rows, np.int64)
    return {"phase": a[:, 0].astype(np.uint8), "peer": np.zeros(len(a), np.int32),
            "t_send_ns": recorded(a[:, 1], host, off, drift), "t_remote_ns": a[:, 2],
            "t_recv_ns": recorded(a[:, 3], host, off, drift)}


def write_rank(spec: Spec, out: Path, rank: int, truth, pgs, off, drift, columns=None, summarize=None) -> int:
    """Write every window's shard of one rank; returns the events written. `columns` (an LLM shape's) replaces
    :func:`_rank_columns` and returns a sixth item: build_tables keywords (streams, point-to-point calls)."""
    host = host_of(spec, rank)
    leader = min(r for r in range(spec.ranks) if host_of(spec, r) == host)
    role = "reference" if rank == 0 else ("leader" if rank == leader else "member")
    n_total = 0
    mine = [g for g in pgs if rank in g["ranks"]]
    for w in range(spec.windows):
        strings = Strings()
        extra = {"stream_names": {(0, COMPUTE_STREAM): "stream 7", (0, COMM_STREAM): "stream 20 nccl"}}
        if columns is None:
            c, meta, m_ts, m_b = _rank_columns(spec, rank, w, truth, pgs, strings)
        else:
            c, meta, m_ts, m_b, extra = columns(spec, rank, w, truth, pgs, strings)
        ts = recorded(c["ts"], host, off, drift)
        calls = extra.get("p2p_calls")
        if calls is not None:  # the calls' times, like the events', on the host's clock
            extra = dict(extra, p2p_calls=replace(calls, t_ns=recorded(calls.t_ns, host, off, drift)))
        cols = Columns(name_id=c["name_id"].astype(np.uint32), kind=c["kind"].astype(np.uint8), tid=c["tid"],
                       device=c["device"].astype(np.int16), ts=ts, dur=c["dur"], flops=c["flops"], corr=c["corr"],
                       comm_meta=meta)
        built = build_tables(cols, strings, main_tid=MAIN_TID, thread_names={MAIN_TID: "python3",
                                                                             BWD_TID: "pt_autograd_0"},
                             process_groups=[dict(g, index=i) for i, g in enumerate(mine)], **extra)
        tables = built.tables
        o = np.argsort(m_ts, kind="stable")
        m_ts, m_b = recorded(m_ts[o], host, off, drift), m_b[o]
        total = np.cumsum(m_b) + (4 << 30)
        tables["memory"] = {"ts_ns": m_ts, "bytes": m_b, "total_bytes": total, "device": np.zeros(len(m_ts), np.int16),
                            "step": built.assign_step(m_ts)}
        st = tables["steps"]
        starts, ends = built.step_span
        for i in range(len(st["step"])):
            lo, hi = np.searchsorted(m_ts, [starts[i], ends[i]])
            st["peak_mem_bytes"][i] = int(total[lo:hi].max()) if hi > lo else 0
        w_start, w_end = int(ts.min()), int((ts + c["dur"]).max())
        phase_true = [truth["start"][rank, w * spec.steps] - 2 * MS, truth["end"][rank, (w + 1) * spec.steps - 1].max()]
        if role == "leader" and host != 0:
            tables["clock/samples"] = _pingpongs(np.random.default_rng(rank * 7 + w), host, phase_true, off, drift)
        tables["clock/local"] = {"phase": np.array([0, 1], np.uint8), "time_ns": np.array([w_start, w_end]),
                                 "monotonic_ns": np.array([w_start, w_end]) - T0_NS,
                                 "perf_counter_ns": np.array([w_start, w_end]) - T0_NS}
        steps = st["step"].tolist()
        attrs = {
            "run_id": spec.run_id, "rank": rank, "world_size": spec.ranks, "local_rank": rank - leader,
            "local_world_size": sum(1 for r in range(spec.ranks) if host_of(spec, r) == host),
            "host": f"node{host:04d}", "real_host": "synth", "pid": 10_000 + rank, "device": "NVIDIA H100 80GB HBM3",
            "device_type": "cuda", "backend": "cuda:nccl", "torch_version": "2.13.0", "distprof_version": "0.1.0",
            "python_version": "3.11.7", "process_groups": [dict(g, index=i) for i, g in enumerate(mine)],
            "config": {"schedule": {"wait": 1, "warmup": 2, "active": spec.steps, "repeat": spec.windows,
                                    "skip_first": 0}},
            "window": w, "first_step": steps[0], "last_step": steps[-1], "steps_covered": steps, "complete": True,
            "window_start_ns": w_start, "window_end_ns": w_end, "errors": [], "memory_total_relative": False,
            "timings": {"n_events": int(len(tables["events"]["ts_ns"]))},
            "clock_role": role, "clock_leader": leader, "clock_reference": 0,
        }
        write_shard(out / schema.SHARD_TEMPLATE.format(rank=rank, window=w), tables, strings.list(), attrs,
                    summarize=summarize)
        n_total += len(tables["events"]["ts_ns"])
    return n_total


def generate(spec: Spec, out: Path, *, ranks: range | None = None, progress: bool = False,
             summaries: bool = False) -> int:
    """Write the run into `out` (created); `ranks` restricts which ranks' shards this call writes. `summaries`:
    store each shard's per-rank summary in it, as a capture does (``--summaries``)."""
    summarize = None
    if summaries:
        from distprof.source_summary import summarize_shard as summarize
    out.mkdir(parents=True, exist_ok=True)
    columns = None
    if spec.shape == "default":
        truth = timeline(spec)
        pgs = process_groups(spec)
    else:
        truth, pgs, columns = shapes().plan(spec, T0_NS)
    off, drift = clocks(spec)
    n = 0
    t0 = time.perf_counter()
    for i, r in enumerate(ranks or range(spec.ranks)):
        n += write_rank(spec, out, r, truth, pgs, off, drift, columns, summarize)
        if progress and (i + 1) % 64 == 0:
            el = time.perf_counter() - t0
            print(f"  {i + 1} ranks, {n:,} events, {n / el / 1e6:.2f} M events/s", file=sys.stderr)
    return n


def shapes():
    """benchmarks/synth_shapes.py, the LLM shapes (loaded from beside this file, whatever sys.path holds: the tests
    have a synth module of their own)."""
    mod = sys.modules.get("synth_shapes")
    if mod is None:
        spec = importlib.util.spec_from_file_location("synth_shapes", Path(__file__).with_name("synth_shapes.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules["synth_shapes"] = mod
        spec.loader.exec_module(mod)
    return mod


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--events", type=int, default=100_000, help="events per rank, all windows (approximate)")
    p.add_argument("--hosts", type=int, default=None, help="hosts (default: ranks / 8, at least 1)")
    p.add_argument("--steps", type=int, default=5, help="recorded steps per window")
    p.add_argument("--windows", type=int, default=2)
    p.add_argument("--names", type=int, default=None,
                   help="distinct op (and kernel) names (default 3000; LLM shapes: 160, as real traces have)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel group size (default 1: one data-parallel "
                   "group; LLM shapes: the shape's)")
    p.add_argument("--colls", type=int, default=4, help="collectives per step and group (default shape)")
    p.add_argument("--shape", choices=SHAPES, default="default",
                   help="default: --colls all-reduces per group and step; fsdp: per-layer all-gathers and reduce-"
                        "scatters (FSDP2); tp: per-layer tensor-parallel all-reduces, DDP across; pp: 1F1B pipeline "
                        "send/recv, DDP across; ep: MoE all-to-alls, DDP across; llm: TP x PP x FSDP (+ EP with --ep)")
    p.add_argument("--layers", type=int, default=32, help="LLM shapes: transformer layers (over all stages)")
    p.add_argument("--pp", type=int, default=None, help="LLM shapes: pipeline stages")
    p.add_argument("--ep", type=int, default=None, help="LLM shapes: expert-parallel group size (1: no MoE)")
    p.add_argument("--micro-batches", type=int, default=None, help="LLM shapes: micro-batches per step (pipeline)")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-id", default="synth")
    p.add_argument("--summaries", action="store_true",
                   help="store each rank's summary in its shard, as a capture does (used with --windows 1)")
    p.add_argument("-o", "--out", required=True, help="run directory to write (the report reads it)")
    return p.parse_args(argv)


def spec_from(args: argparse.Namespace) -> Spec:
    hosts = args.hosts or max(args.ranks // 8, 1)
    shape = getattr(args, "shape", "default")
    if shape == "default":
        return Spec(ranks=args.ranks, events=args.events, hosts=min(hosts, args.ranks), steps=args.steps,
                    windows=args.windows, names=args.names or 3000, tp=args.tp or 1, colls=args.colls,
                    slow_rank=args.slow_rank, slow_ms=args.slow_ms, seed=args.seed, run_id=args.run_id)
    tp, pp, ep, micro = shapes().mesh_defaults(shape, args.ranks, args.tp, args.pp, args.ep, args.micro_batches)
    return Spec(ranks=args.ranks, events=args.events, hosts=min(hosts, args.ranks), steps=args.steps,
                windows=args.windows, names=args.names or 160, tp=tp, colls=args.colls, slow_rank=args.slow_rank,
                slow_ms=args.slow_ms, seed=args.seed, run_id=args.run_id, shape=shape, layers=args.layers, pp=pp,
                ep=ep, micro=micro)


def main(argv=None) -> None:
    args = parse_args(argv)
    spec = spec_from(args)
    t0 = time.perf_counter()
    n = generate(spec, Path(args.out), progress=True, summaries=args.summaries)
    el = time.perf_counter() - t0
    print(f"synth: {spec.ranks} ranks x {spec.windows} windows, {n:,} events ({n / spec.ranks:,.0f} per rank) "
          f"in {el:.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
