"""Synthetic distprof runs for tests: realistic little shards with known truth.

    from synth import make_run      # pytest puts tests/ on sys.path (rootdir-less 'prepend' import mode)
    run = make_run(tmp_path, world_size=4, hosts=[0, 0, 1, 1], clocks={1: (3.25, 40.0)}, late_rank=2, late_ms=30)
    merged = distprof.analysis.load_run(run.run_dir)
    run.true_time(rank, merged_or_raw_ts)      # undo the simulated clock of `rank`'s host

The factory simulates a DDP-like CPU/gloo job in *true* time (ns since the epoch), then writes what each rank would
record: every timestamp passes through its host's simulated clock exactly as distprof.capture.sim does
(``t + round(offset_s·1e9 + drift_ppm·1e-6·(t − t0_ns))``) and ``sim_clock`` states it.

What one recorded step looks like on rank r (main thread ``tid_main``, gloo worker threads ``tid_worker0/1``)::

    ProfilerStep#N (user_annotation) ─────────────────────────────────────────────────────────────────
      DistributedDataParallel.forward (user_annotation)
        aten::addmm ×n_layers (cpu_op, compute, flops 2·B·H·H)  aten::relu
      aten::mse_loss
      [late_ms gap or "aten::mm" op on the late rank, before backward — see late_kind]
      backward: per bucket b: aten::mm ×2 (compute, flops) then c10d::allreduce_ (cpu_op, comm, enqueue, 60 µs)
      (main thread waits without events until every bucket's gloo:all_reduce has ended on this rank)
      Optimizer.step#SGD.step (user_annotation)  aten::add_ ×n_layers (compute, flops = numel)
    worker: gloo:all_reduce (user_annotation, comm, exec) per bucket, starting enqueue+20 µs (after the
      previous bucket on this rank), ending when every rank of the group has entered + allreduce_ms (+ end jitter)
      -> waiting for the slowest rank is inside the gloo duration, as with real gloo.

Returned :class:`SynthRun` carries the truth: clocks, per-rank host, the collective instances in true time (2-D arrays
instance × rank), step spans in true time, and helpers to convert between true and recorded clocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from distprof.storage import schema
from distprof.storage.writer import write_shard

MS = 1_000_000
US = 1_000
DAY_NS = 86_400 * 10**9
#: 2026-09-30 12:00:00 UTC — a fixed, realistic epoch so drift terms are large (t − t0 ≈ 12 h).
DEFAULT_START_NS = (1_790_856_000 // 86_400) * DAY_NS + 12 * 3600 * 10**9

ClockSpec = tuple[float, float]  # (offset_s, drift_ppm)


@dataclass
class SynthRun:
    """What :func:`make_run` wrote, and the truth behind it. Times in ns; "true" = the reference (real) clock."""

    run_dir: Path
    run_id: str
    world_size: int
    hosts: list[int]  # rank -> host index (host name: f"sim-host{h}")
    clocks: dict[int, ClockSpec]  # host index -> (offset_s, drift_ppm); absent = (0, 0)
    t0_ns: int
    windows: list[tuple[int, int]]  # (first_step, last_step) per window index
    paths: list[Path]
    #: collective instances, one row each, in window/seq order: "window", "seq", "bytes" (n,), "start", "end",
    #: "enqueue" (n, world_size) true ns; missing ranks' columns are still simulated (they just were not written).
    collectives: dict[str, np.ndarray]
    #: per rank: {"step": (n,), "start": (n,), "end": (n,)} true ns of the ProfilerStep spans.
    steps: dict[int, dict[str, np.ndarray]]
    late_rank: int | None = None
    late_ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def host_name(self, rank: int) -> str:
        return f"sim-host{self.hosts[rank]}"

    def clock_of(self, rank: int) -> ClockSpec:
        return self.clocks.get(self.hosts[rank], (0.0, 0.0))

    def to_recorded(self, rank: int, t_true: np.ndarray | int) -> np.ndarray:
        """True time -> what `rank` records (same formula as distprof.capture.sim.SimClock.apply)."""
        off, drift = self.clock_of(rank)
        return _apply_clock(np.asarray(t_true, dtype=np.int64), off, drift, self.t0_ns)

    def true_time(self, rank: int, t_rec: np.ndarray | int) -> np.ndarray:
        """Recorded time on `rank` -> true time (exact inverse up to 1 ns rounding)."""
        off, drift = self.clock_of(rank)
        t_rec = np.asarray(t_rec, dtype=np.int64)
        d = drift * 1e-6
        # t_rec = t + off + d (t - t0)  =>  t - t0 = (t_rec - t0 - off) / (1 + d)
        rel = (t_rec - self.t0_ns).astype(np.float64)
        return self.t0_ns + np.rint((rel - off * 1e9) / (1.0 + d)).astype(np.int64)

    def correction_ns(self, rank: int, t_rec: np.ndarray | int) -> np.ndarray:
        """What alignment must add to recorded times of `rank` (true − recorded), relative to host 0's clock.

        The reference is the host of rank 0; when it has a clock of its own, the target is *its* clock.
        """
        true = self.true_time(rank, t_rec)
        return self.to_recorded(0, true) - np.asarray(t_rec, dtype=np.int64)


def _apply_clock(t: np.ndarray, offset_s: float, drift_ppm: float, t0_ns: int) -> np.ndarray:
    if offset_s == 0.0 and drift_ppm == 0.0:
        return t.copy() if t.ndim else np.int64(t)
    corr = offset_s * 1e9 + drift_ppm * 1e-6 * (t - t0_ns).astype(np.float64)
    return t + np.rint(corr).astype(np.int64)


def schedule_windows(schedule: Mapping[str, int], n_windows: int | None = None) -> list[tuple[int, int]]:
    """(first_step, last_step) of each window, torch.profiler.schedule semantics (repeat=0: `n_windows`, default 1)."""
    wait, warmup, active = schedule.get("wait", 1), schedule.get("warmup", 1), schedule.get("active", 3)
    skip, repeat = schedule.get("skip_first", 0), schedule.get("repeat", 1)
    cycle = wait + warmup + active
    n = repeat if repeat > 0 else (n_windows or 1)
    out = []
    for w in range(n):
        first = skip + w * cycle + wait + warmup
        out.append((first, first + active - 1))
    return out


class _Recorder:
    """Accumulates one rank-window's rows (true time); sorted and converted when finished."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.ev: list[tuple] = []  # name_id, kind, category, tid, ts, dur, flops
        self.comm: list[tuple] = []  # event index, op_id, role, pg, seq, bytes, group_size
        self.mem: list[tuple] = []  # ts, bytes

    def sid(self, s: str) -> int:
        if s not in self.names:
            self.names[s] = len(self.names)
        return self.names[s]

    def event(self, name: str, kind: str, cat: int, tid: int, ts: int, dur: int, flops: int = 0) -> int:
        self.ev.append((self.sid(name), schema.KIND_CODE[kind], cat, tid, int(ts), int(dur), int(flops)))
        return len(self.ev) - 1


def make_run(
    out_dir: str | Path,
    *,
    world_size: int = 4,
    hosts: Sequence[int] | None = None,
    clocks: Mapping[int, ClockSpec] | Sequence[ClockSpec] | None = None,
    t0_ns: int | None = None,
    start_ns: int = DEFAULT_START_NS,
    schedule: Mapping[str, int] | None = None,
    n_windows: int | None = None,
    run_id: str = "synth-run",
    n_layers: int = 3,
    batch: int = 32,
    hidden: int = 256,
    fwd_ms: float = 4.0,
    bwd_ms: float = 8.0,
    opt_ms: float = 1.0,
    buckets: Sequence[int] = (1_048_576, 524_288),
    allreduce_ms: float = 3.0,
    end_jitter_us: float = 30.0,
    start_jitter_us: float = 50.0,
    compute_scale: Mapping[int, float] | None = None,
    late_rank: int | None = None,
    late_ms: float = 0.0,
    late_steps: Sequence[int] | None = None,
    late_kind: str = "compute",
    bytes_override: Mapping[tuple[int, int, int], int] | None = None,
    op_override: Mapping[tuple[int, int, int], str] | None = None,
    drop_collectives: Sequence[tuple[int, int, int]] = (),
    clock_sync: bool = True,
    sync_rounds: int = 16,
    sync_owd_us: float = 65.0,
    sync_noise_us: float = 2.0,
    sync_bias_us: float = 0.0,
    sync_outlier_frac: float = 0.25,
    sync_outlier_us: tuple[float, float] = (300.0, 4000.0),
    memory: bool = True,
    missing_ranks: Sequence[int] = (),
    missing_shards: Sequence[tuple[int, int]] = (),
    attrs_override: Mapping[int, Mapping[str, Any]] | Callable[[int, int], Mapping[str, Any]] | None = None,
    mutate: Callable[[int, int, dict, list, dict], None] | None = None,
    codec: str = "zstd",
    seed: int = 0,
) -> SynthRun:
    """Write a synthetic run into ``out_dir/run_id`` and return its truth.

    Layout and clocks
      world_size        ranks 0..world_size-1.
      hosts             host index per rank (default: all on host 0). Host h is named ``sim-host<h>``.
      clocks            per host: (offset_s, drift_ppm), as a {host: spec} mapping or a list indexed by host.
                        Recorded time = t + offset_s·1e9 + drift_ppm·1e-6·(t − t0_ns). Host of rank 0 is the
                        clock reference (rank 0 has clock_role "reference"); it may have a clock of its own.
      t0_ns             drift origin (default: midnight UTC of start_ns's day, like the capture).
      start_ns          true time of the first simulated step (default 2026-09-30 12:00 UTC).
    Schedule
      schedule          {"wait","warmup","active","repeat","skip_first"} (default wait=1, warmup=1, active=3,
                        repeat=1); stored in attrs["config"]["schedule"]; windows follow torch's semantics.
      n_windows         number of windows when repeat=0.
    Workload (per step, per rank; all durations true-clock)
      n_layers, batch, hidden   sizes behind the FLOP counts (addmm 2·B·H·H, backward mm 2·B·H·H each).
      fwd_ms, bwd_ms, opt_ms    compute time of forward, backward (split over buckets), optimizer.
      buckets           message size in bytes of each DDP bucket: one all_reduce per bucket per step (pg 0).
      allreduce_ms      transfer time once every rank has entered.
      end_jitter_us     per-rank extra on collective end times (uniform 0..x; keeps causality).
      start_jitter_us   per-rank jitter of step starts (uniform 0..x).
      compute_scale     {rank: factor} multiplies that rank's compute durations (a slow rank).
    Stragglers
      late_rank, late_ms   this rank arrives late by late_ms at the backward collectives of each recorded step in
                        late_steps (default: all): its peers' gloo:all_reduce last ≈late_ms longer.
      late_kind         "compute": the delay is an extra ``aten::mm`` op (category compute, flops 0) on the main
                        thread before backward; "idle": a gap with no events (e.g. data loading outside the profiler).
    Faults (keys are (rank, window, k): k = the k-th collective of the window in true order, = seq when none dropped)
      bytes_override    {(rank, window, seq): bytes} a rank records a different size (mismatch).
      op_override       {(rank, window, seq): op} a rank records a different op (e.g. "broadcast").
      drop_collectives  [(rank, window, seq)] the rank has no exec/comms row for it (seq numbers after it shift,
                        as the capture would count them).
      missing_ranks     ranks whose shards are not written at all.
      missing_shards    [(rank, window)] single shards not written.
      attrs_override    {rank: {attr: value}} or f(rank, window) -> {attr: value}: root attributes to override
                        (e.g. {"run_id": "other"}, {"schema_version": "2.0"}).
      mutate            f(rank, window, tables, strings, attrs) called just before writing; may edit in place.
    Clock sync
      clock_sync        write /clock/samples for host leaders (False: no samples, no clock_role — like an
                        imported trace or a failed sync).
      sync_rounds       ping-pongs per phase (window start, window end).
      sync_owd_us, sync_noise_us   one-way delay and its jitter (|normal| µs, each leg).
      sync_bias_us      systematic asymmetry: the outbound leg is longer by this much (offset error = bias/2).
      sync_outlier_frac, sync_outlier_us   share of pings with one leg (random) delayed by uniform(lo, hi) µs.
    Other
      memory            write /memory (allocations in forward, frees after backward; relative totals).
      codec             "zstd" (default) or "gzip".
      seed              RNG seed; runs are deterministic.
    """
    rng = np.random.default_rng(seed)
    out = Path(out_dir) / run_id
    out.mkdir(parents=True, exist_ok=True)
    hosts = list(hosts) if hosts is not None else [0] * world_size
    if len(hosts) != world_size:
        raise ValueError(f"hosts has {len(hosts)} entries for world_size={world_size}")
    if clocks is None:
        clock_map: dict[int, ClockSpec] = {}
    elif isinstance(clocks, Mapping):
        clock_map = {int(h): (float(c[0]), float(c[1])) for h, c in clocks.items()}
    else:
        clock_map = {h: (float(c[0]), float(c[1])) for h, c in enumerate(clocks)}
    if t0_ns is None:
        t0_ns = (start_ns // DAY_NS) * DAY_NS
    sched = {"wait": 1, "warmup": 1, "active": 3, "repeat": 1, "skip_first": 0, **(schedule or {})}
    windows = schedule_windows(sched, n_windows)
    cycle = sched["wait"] + sched["warmup"] + sched["active"]
    scale = {r: 1.0 for r in range(world_size)}
    scale.update(compute_scale or {})
    bytes_override = dict(bytes_override or {})
    op_override = dict(op_override or {})
    dropped = set(map(tuple, drop_collectives))
    late_set = set(late_steps) if late_steps is not None else None

    # Clock roles: reference = rank 0; leader = lowest rank of every other host.
    ref_host = hosts[0]
    leader_of_host = {}
    for r, h in enumerate(hosts):
        leader_of_host.setdefault(h, r)
    leader_of_host[ref_host] = 0

    def to_rec(rank: int, t):
        off, drift = clock_map.get(hosts[rank], (0.0, 0.0))
        return _apply_clock(np.asarray(t, dtype=np.int64), off, drift, t0_ns)

    flop_mm = 2 * batch * hidden * hidden
    act_bytes = batch * hidden * 4
    tid_main = [10_000 + 100 * r for r in range(world_size)]
    tid_workers = [(t + 1, t + 2) for t in tid_main]
    tid_tcp = [t + 3 for t in tid_main]

    coll_rows: dict[str, list] = {"window": [], "seq": [], "bytes": [], "start": [], "end": [], "enqueue": []}
    step_truth = {r: {"step": [], "start": [], "end": []} for r in range(world_size)}
    recs: dict[tuple[int, int], _Recorder] = {}
    win_span: dict[tuple[int, int], list[int]] = {}

    step_ns = int((fwd_ms + bwd_ms + opt_ms + allreduce_ms) * MS)
    cursor = np.full(world_size, start_ns, dtype=np.int64)  # next step start per rank (true)
    prev_last = -1
    for w, (first, last) in enumerate(windows):
        # Idle steps before the window (wait + warmup, or the gap to the next cycle) just advance time.
        gap_steps = first - prev_last - 1
        cursor = cursor + gap_steps * step_ns + int(0.5 * MS)  # + clock-sync / window-open cost
        prev_last = last
        for r in range(world_size):
            recs[(r, w)] = _Recorder()
            win_span[(r, w)] = [int(cursor[r]), 0]
        seq = np.zeros(world_size, dtype=np.int64)  # recorded seq per rank (drops shift later ones)
        k_inst = 0  # true instance number in this window (keys of the fault options)
        for step in range(first, last + 1):
            starts = cursor + rng.uniform(0, start_jitter_us * US, world_size).astype(np.int64)
            # --- forward, loss, optional delay, backward compute + enqueue per bucket (per rank) ---
            t = starts.copy()
            enq = np.zeros((len(buckets), world_size), dtype=np.int64)
            for r in range(world_size):
                rec = recs[(r, w)]
                tm, s = tid_main[r], scale[r]
                fwd_start = int(t[r]) + 5 * US
                tt = fwd_start
                for _ in range(n_layers):
                    d = int(fwd_ms * MS * s / n_layers * 0.9)
                    rec.event("aten::addmm", "cpu_op", schema.CAT_COMPUTE, tm, tt, d, flop_mm)
                    if memory:
                        rec.mem.append((tt + 1 * US, act_bytes))
                    tt += d
                    d2 = int(fwd_ms * MS * s / n_layers * 0.1)
                    rec.event("aten::relu", "cpu_op", schema.CAT_COMPUTE, tm, tt, d2)
                    tt += d2
                rec.event("DistributedDataParallel.forward", "user_annotation", schema.CAT_OTHER, tm, fwd_start,
                          tt - fwd_start)
                rec.event("aten::mse_loss", "cpu_op", schema.CAT_COMPUTE, tm, tt, 50 * US)
                tt += 60 * US
                if late_rank == r and late_ms > 0 and (late_set is None or step in late_set):
                    if late_kind == "compute":
                        rec.event("aten::mm", "cpu_op", schema.CAT_COMPUTE, tm, tt, int(late_ms * MS))
                    elif late_kind != "idle":
                        raise ValueError(f"late_kind={late_kind!r}: choose 'compute' or 'idle'")
                    tt += int(late_ms * MS)
                for b in range(len(buckets)):
                    per = int(bwd_ms * MS * s / len(buckets) / 2)
                    for _ in range(2):
                        rec.event("aten::mm", "cpu_op", schema.CAT_COMPUTE, tm, tt, per, flop_mm)
                        tt += per
                    enq[b, r] = tt
                    tt += 60 * US
                t[r] = tt
            # --- collectives: start per rank on its worker, end once all entered ---
            exec_start = np.zeros((len(buckets), world_size), dtype=np.int64)
            exec_end = np.zeros_like(exec_start)
            prev_end = np.zeros(world_size, dtype=np.int64)
            for b, nbytes in enumerate(buckets):
                st = np.maximum(enq[b] + 20 * US, prev_end + 5 * US)
                end_common = st.max() + int(allreduce_ms * MS / len(buckets))
                en = end_common + rng.uniform(0, end_jitter_us * US, world_size).astype(np.int64)
                exec_start[b], exec_end[b] = st, en
                prev_end = en
                coll_rows["window"].append(w)
                coll_rows["seq"].append(0)  # renumbered per window below
                coll_rows["bytes"].append(nbytes)
                coll_rows["start"].append(st.copy())
                coll_rows["end"].append(en.copy())
                coll_rows["enqueue"].append(enq[b].copy())
                for r in range(world_size):
                    rec = recs[(r, w)]
                    i_enq = rec.event("c10d::allreduce_", "cpu_op", schema.CAT_COMM, tid_main[r], enq[b, r], 60 * US)
                    rec.comm.append((i_enq, rec.sid("all_reduce"), schema.ROLE_ENQUEUE, 0, -1, nbytes, world_size))
                    key = (r, w, k_inst)
                    if key in dropped:
                        continue
                    op = op_override.get(key, "all_reduce")
                    i_ex = rec.event(f"gloo:{op}", "user_annotation", schema.CAT_COMM, tid_workers[r][b % 2],
                                     st[r], en[r] - st[r])
                    rec.comm.append((i_ex, rec.sid(op), schema.ROLE_EXEC, 0, int(seq[r]),
                                     int(bytes_override.get(key, nbytes)), world_size))
                    seq[r] += 1
                k_inst += 1
            # --- optimizer after the last collective ended on this rank ---
            for r in range(world_size):
                rec = recs[(r, w)]
                tm = tid_main[r]
                o_start = max(int(t[r]), int(exec_end[:, r].max())) + 10 * US
                tt = o_start
                for _ in range(n_layers):
                    d = int(opt_ms * MS * scale[r] / n_layers)
                    rec.event("aten::add_", "cpu_op", schema.CAT_COMPUTE, tm, tt, d, hidden * hidden)
                    tt += d
                rec.event("Optimizer.step#SGD.step", "user_annotation", schema.CAT_OTHER, tm, o_start, tt - o_start)
                if memory:
                    for _ in range(n_layers):
                        rec.mem.append((tt - 2 * US, -act_bytes))
                end = tt + 20 * US
                rec.event(f"ProfilerStep#{step}", "user_annotation", schema.CAT_OTHER, tm, int(starts[r]),
                          end - int(starts[r]))
                step_truth[r]["step"].append(step)
                step_truth[r]["start"].append(int(starts[r]))
                step_truth[r]["end"].append(end)
                cursor[r] = end + 10 * US
                win_span[(r, w)][1] = end
        cursor[:] = cursor.max()  # window close is collective-ish: ranks leave together

    collectives = {
        "window": np.array(coll_rows["window"], dtype=np.int32),
        "seq": np.array(coll_rows["seq"], dtype=np.int32),
        "bytes": np.array(coll_rows["bytes"], dtype=np.int64),
        "start": np.array(coll_rows["start"], dtype=np.int64).reshape(-1, world_size),
        "end": np.array(coll_rows["end"], dtype=np.int64).reshape(-1, world_size),
        "enqueue": np.array(coll_rows["enqueue"], dtype=np.int64).reshape(-1, world_size),
    }
    # Fix the truth seq numbering: instances are numbered per window in order.
    for w in range(len(windows)):
        m = collectives["window"] == w
        collectives["seq"][m] = np.arange(int(m.sum()), dtype=np.int32)
    steps_truth = {r: {k: np.array(v, dtype=np.int64 if k != "step" else np.int32) for k, v in d.items()}
                   for r, d in step_truth.items()}

    pgs = [{"index": 0, "name": "0", "desc": "default_pg", "backend": "gloo", "ranks": list(range(world_size))}]
    local_ranks: dict[int, int] = {}
    local_world = {h: hosts.count(h) for h in set(hosts)}
    for r, h in enumerate(hosts):
        local_ranks[r] = sum(1 for q in range(r) if hosts[q] == h)
    missing_ranks = set(missing_ranks)
    missing = set(map(tuple, missing_shards))
    paths: list[Path] = []
    for (r, w), rec in recs.items():
        if r in missing_ranks or (r, w) in missing:
            continue
        h = hosts[r]
        off, drift = clock_map.get(h, (0.0, 0.0))
        # events: sort by true start (sorting survives the monotonic clock map)
        ev = np.array(rec.ev, dtype=np.int64).reshape(-1, 7)
        order = np.argsort(ev[:, 4], kind="stable")
        inv = np.empty_like(order)
        inv[order] = np.arange(len(order))
        ev = ev[order]
        ts_true = ev[:, 4]
        ts_rec = to_rec(r, ts_true)
        end_rec = to_rec(r, ts_true + ev[:, 5])
        steps_r = steps_truth[r]
        in_w = (steps_r["step"] >= windows[w][0]) & (steps_r["step"] <= windows[w][1])
        s_start, s_end, s_id = steps_r["start"][in_w], steps_r["end"][in_w], steps_r["step"][in_w]
        idx = np.searchsorted(s_start, ts_true, side="right") - 1
        inside = (idx >= 0) & (ts_true < s_end[np.clip(idx, 0, None)])
        ev_step = np.where(inside, s_id[np.clip(idx, 0, None)], -1).astype(np.int32)
        flops = ev[:, 6]
        events = {
            "name_id": ev[:, 0].astype(np.uint32),
            "kind": ev[:, 1].astype(np.uint8),
            "category": ev[:, 2].astype(np.uint8),
            "tid": ev[:, 3].astype(np.int64),
            "device": np.full(len(ev), -1, dtype=np.int16),
            "ts_ns": ts_rec,
            "dur_ns": (end_rec - ts_rec).astype(np.int64),
            "step": ev_step,
            "flops": flops.astype(np.int64),
            "corr_id": np.zeros(len(ev), dtype=np.int64),
        }
        cm = np.array(rec.comm, dtype=np.int64).reshape(-1, 7)
        comms = {
            "row": inv[cm[:, 0]].astype(np.int64),
            "op_id": cm[:, 1].astype(np.uint32),
            "role": cm[:, 2].astype(np.uint8),
            "pg": cm[:, 3].astype(np.int32),
            "seq": cm[:, 4].astype(np.int32),
            "bytes": cm[:, 5].astype(np.int64),
            "group_size": cm[:, 6].astype(np.int32),
            "nccl_seq": np.full(len(cm), -1, dtype=np.int64),
        }
        corder = np.argsort(comms["row"], kind="stable")
        comms = {k: v[corder] for k, v in comms.items()}
        step_flops = np.array([flops[ev_step == s].sum() for s in s_id], dtype=np.int64)
        step_nev = np.array([(ev_step == s).sum() for s in s_id], dtype=np.int64)
        tables: dict[str, dict[str, np.ndarray]] = {
            "events": events,
            "comms": comms,
            "steps": {
                "step": s_id.astype(np.int32),
                "start_ns": to_rec(r, s_start),
                "end_ns": to_rec(r, s_end),
                "flops": step_flops,
                "peak_mem_bytes": np.zeros(len(s_id), dtype=np.int64),
                "n_events": step_nev,
            },
            "threads": {
                "tid": np.array([tid_main[r], *tid_workers[r], tid_tcp[r]], dtype=np.int64),
                "name_id": np.array([rec.sid("python3"), rec.sid("pt_gloo_runloop"), rec.sid("pt_gloo_runloop"),
                                     rec.sid("gloo_tcp_loop")], dtype=np.uint32),
                "role": np.array([schema.THREAD_MAIN, schema.THREAD_COMM, schema.THREAD_COMM, schema.THREAD_OTHER],
                                 dtype=np.uint8),
                "pg": np.array([-1, 0, 0, -1], dtype=np.int32),
            },
        }
        if memory:
            mm = np.array(sorted(rec.mem), dtype=np.int64).reshape(-1, 2)
            mts = mm[:, 0]
            midx = np.searchsorted(s_start, mts, side="right") - 1
            mstep = np.where(midx >= 0, s_id[np.clip(midx, 0, None)], -1).astype(np.int32)
            total = np.cumsum(mm[:, 1])
            tables["memory"] = {
                "ts_ns": to_rec(r, mts),
                "bytes": mm[:, 1].copy(),
                "total_bytes": total,
                "device": np.full(len(mm), -1, dtype=np.int16),
                "step": mstep,
            }
            tables["steps"]["peak_mem_bytes"] = np.array(
                [total[mstep == s].max() if (mstep == s).any() else 0 for s in s_id], dtype=np.int64)
        w_start, w_end = win_span[(r, w)]
        # /clock/local: (time, monotonic, perf_counter) at window start/end
        boot = start_ns - 3600 * 10**9
        loc_true = np.array([w_start - 200 * US, w_end + 200 * US], dtype=np.int64)
        tables["clock/local"] = {
            "phase": np.array([0, 1], dtype=np.uint8),
            "time_ns": to_rec(r, loc_true),
            "monotonic_ns": loc_true - boot,
            "perf_counter_ns": loc_true - boot + 17,
        }
        role = "reference" if r == 0 else ("leader" if leader_of_host[h] == r else "member")
        if clock_sync and role == "leader":
            tables["clock/samples"] = _pingpongs(
                rng, r, 0, hosts, clock_map, t0_ns, (w_start - 2 * MS, w_end + 1 * MS), sync_rounds, sync_owd_us,
                sync_noise_us, sync_bias_us, sync_outlier_frac, sync_outlier_us)
        strings = list(rec.names)
        attrs: dict[str, Any] = {
            "run_id": run_id,
            "rank": r,
            "world_size": world_size,
            "local_rank": local_ranks[r],
            "local_world_size": local_world[h],
            "host": f"sim-host{h}",
            "real_host": "synth",
            "pid": 4000 + r,
            "device": "cpu",
            "device_type": "cpu",
            "backend": "gloo",
            "torch_version": "2.13.0+cpu",
            "distprof_version": "0.1.0",
            "python_version": "3.11.7",
            "process_groups": pgs,
            "config": {"out": str(out_dir), "run_id": run_id, "schedule": sched, "flops": True, "memory": memory,
                       "shapes": True, "stack": False, "step_on": "optimizer", "strict": False, "codec": codec,
                       "sync_rounds": sync_rounds, "sync_timeout_s": 30.0},
            "window": w,
            "first_step": windows[w][0],
            "last_step": windows[w][1],
            "steps_covered": [int(s) for s in s_id],
            "complete": True,
            "window_start_ns": int(to_rec(r, w_start)),
            "window_end_ns": int(to_rec(r, w_end)),
            "timings": {"stop_s": 0.01, "extract_s": 0.01, "write_s": 0.01, "queued_s": 0.0,
                        "n_events": int(len(ev))},
            "errors": [],
            "memory_total_relative": True,
            "sim_clock": {"offset_s": off, "drift_ppm": drift, "t0_ns": t0_ns} if (off or drift) else None,
        }
        if clock_sync:
            attrs.update({"clock_role": role, "clock_leader": leader_of_host[h], "clock_reference": 0})
        if callable(attrs_override):
            attrs.update(attrs_override(r, w) or {})
        elif attrs_override and r in attrs_override:
            attrs.update(attrs_override[r])
        if mutate is not None:
            mutate(r, w, tables, strings, attrs)
            if isinstance(attrs.get("timings"), dict):  # the count the shard's check compares /events with
                attrs["timings"]["n_events"] = int(len(tables["events"]["ts_ns"]))
        path = out / schema.SHARD_TEMPLATE.format(rank=r, window=w)
        write_shard(path, tables, strings, attrs, codec=codec)
        paths.append(path)

    return SynthRun(
        run_dir=out, run_id=run_id, world_size=world_size, hosts=hosts, clocks=clock_map, t0_ns=t0_ns,
        windows=windows, paths=sorted(paths), collectives=collectives, steps=steps_truth, late_rank=late_rank,
        late_ms=late_ms, extra={"cycle": cycle, "schedule": sched, "tid_main": tid_main, "tid_workers": tid_workers},
    )


def _pingpongs(rng, rank, peer, hosts, clock_map, t0_ns, phase_times, rounds, owd_us, noise_us, bias_us,
               outlier_frac, outlier_us) -> dict[str, np.ndarray]:
    """NTP-style samples of `rank` against `peer`, recorded on each side's simulated clock."""
    rows = {"phase": [], "peer": [], "t_send_ns": [], "t_remote_ns": [], "t_recv_ns": []}
    lo, hi = outlier_us
    for phase, t_begin in enumerate(phase_times):
        t = int(t_begin)
        for _ in range(rounds):
            d1 = owd_us + bias_us + abs(rng.normal(0, noise_us))
            d2 = owd_us + abs(rng.normal(0, noise_us))
            if rng.random() < outlier_frac:
                extra = rng.uniform(lo, hi)
                if rng.random() < 0.5:
                    d1 += extra
                else:
                    d2 += extra
            send = t
            remote = send + int(round(d1 * US))
            recv = remote + int(round(d2 * US))
            rows["phase"].append(phase)
            rows["peer"].append(peer)
            rows["t_send_ns"].append(send)
            rows["t_remote_ns"].append(remote)
            rows["t_recv_ns"].append(recv)
            t = recv + 10 * US
    own = clock_map.get(hosts[rank], (0.0, 0.0))
    ref = clock_map.get(hosts[peer], (0.0, 0.0))
    return {
        "phase": np.array(rows["phase"], dtype=np.uint8),
        "peer": np.array(rows["peer"], dtype=np.int32),
        "t_send_ns": _apply_clock(np.array(rows["t_send_ns"], dtype=np.int64), *own, t0_ns),
        "t_remote_ns": _apply_clock(np.array(rows["t_remote_ns"], dtype=np.int64), *ref, t0_ns),
        "t_recv_ns": _apply_clock(np.array(rows["t_recv_ns"], dtype=np.int64), *own, t0_ns),
    }
