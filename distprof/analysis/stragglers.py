"""Stragglers: who arrives late at collectives, and how much waiting it causes the others.

Instances. Per process group and window, the k-th exec collective (``comms.role == 1``, ``comms.seq == k``) of every
rank is one instance (the rule of ``matching.py``). For rank r in instance i (times on the aligned clock):

* arrival ``a_ri`` = start of its exec event (``gloo:*`` on the worker thread, the NCCL kernel on the stream);
* **lateness** ``ℓ_ri = a_ri − min_r' a_r'i`` — how long the earliest rank waited for r;
* the **last arriver** ``L_i = argmax_r a_ri``; its **blame** ``B_i = Σ_{r≠L_i} (a_{L_i,i} − a_ri)`` — the waiting it
  caused the others (Scalasca's "Wait at N×N", summed over the waiting ranks).

Per rank: ``mean_lateness_ms`` (mean ℓ over the instances it took part in), ``late_fraction`` (share of them where it
arrived last), ``blame_ms`` (Σ B over the instances where it arrived last), ``blame_ms_per_step``,
``lost_ms_per_step`` (per step, the largest lateness among the instances where it arrived last — the wall time the
step lost to it — averaged over its steps).

Clock-free cross-check (no clock alignment involved, durations only): a collective ends at about the same time on all
ranks, so ``clock_free_lateness = max_r' d_r'i − d_ri`` estimates ℓ, and ``clock_free_wait = d_ri − min_r' d_r'i`` is
how long r waited (DeepSpeed's "straggler effect"). ``clock_free.agrees`` says whether both measures pick the same
top rank.

Naming rule (:class:`StragglerRule`): a rank is *named* a straggler only if its mean lateness is at least
``threshold_ms = max(min_lateness_ms, residual_factor × the largest per-host clock residual, step_fraction × median
step time)`` **and** its lateness reaches the threshold in at least ``min_late_fraction`` of its instances. Below that
the differences are indistinguishable from clock error and jitter and no rank is named. Hosts: per instance a host's
arrival is its last rank's; the same rule names slow hosts (only when there are at least two hosts). Every rank of a
slow node is late in most instances, so they are all named although each arrives last only a fraction of the time.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..storage.schema import ROLE_EXEC
from .model import MergedRun, Table

logger = logging.getLogger(__name__)

__all__ = ["StragglerRule", "collective_instances", "find_stragglers", "threshold_ms"]

NS_PER_MS = 1e6


@dataclass(frozen=True)
class StragglerRule:
    min_lateness_ms: float = 1.0
    residual_factor: float = 3.0
    step_fraction: float = 0.02
    min_late_fraction: float = 0.5

    def text(self) -> str:
        return (
            f"named if mean lateness >= max({self.min_lateness_ms:g} ms, {self.residual_factor:g} x max clock "
            f"residual, {self.step_fraction:g} x median step time) and lateness >= that threshold in >= "
            f"{self.min_late_fraction:.0%} of its collective instances"
        )


def collective_instances(run: MergedRun) -> Table:
    """One row per (instance, rank), sorted by (instance, arrival).

    Columns: ``inst`` (0..n−1), ``window``, ``pg``, ``seq``, ``rank``, ``step``, ``arrival_ns``, ``dur_ns``,
    ``lateness_ns``, ``is_last``, ``n_ranks`` (ranks in the instance). Instances seen on fewer than two ranks are
    dropped; a rank seen twice in one instance keeps its first row.
    """
    c = run.comms
    ev = run.events
    role = np.asarray(c["role"])
    seq = np.asarray(c["seq"])
    m = (role == ROLE_EXEC) & (seq >= 0)
    rows = np.asarray(c["row"], np.int64)[m]
    ok = (rows >= 0) & (rows < ev["ts_ns"].shape[0])
    if not np.all(ok):
        logger.warning("%d exec communication rows point outside the events table; ignored", int((~ok).sum()))
    rows = rows[ok]
    window = (np.asarray(c["window"]) if "window" in c else np.zeros(role.size, np.int32))[m][ok].astype(np.int64)
    pg = np.asarray(c["pg"])[m][ok].astype(np.int64)
    seq = seq[m][ok].astype(np.int64)
    rank = np.asarray(c["rank"])[m][ok].astype(np.int64)
    arrival = np.asarray(ev["ts_ns"], np.int64)[rows]
    dur = np.asarray(ev["dur_ns"], np.int64)[rows]
    step = np.asarray(ev["step"], np.int64)[rows]
    if rows.size == 0:
        return _empty_instances()

    keys = np.stack([window, pg, seq], axis=1)
    _, inst = np.unique(keys, axis=0, return_inverse=True)
    inst = inst.reshape(-1)
    # one row per (inst, rank)
    o = np.lexsort((rank, inst))
    dup = np.r_[False, (inst[o][1:] == inst[o][:-1]) & (rank[o][1:] == rank[o][:-1])]
    if np.any(dup):
        logger.warning("%d duplicate (instance, rank) exec collectives ignored", int(dup.sum()))
    keep = np.sort(o[~dup])
    inst, window, pg, seq, rank, arrival, dur, step = (
        x[keep] for x in (inst, window, pg, seq, rank, arrival, dur, step)
    )
    n_per = np.bincount(inst)
    multi = n_per[inst] >= 2
    inst, window, pg, seq, rank, arrival, dur, step = (
        x[multi] for x in (inst, window, pg, seq, rank, arrival, dur, step)
    )
    if inst.size == 0:
        return _empty_instances()
    _, inst = np.unique(inst, return_inverse=True)  # renumber 0..n-1 (keys' order)
    o = np.lexsort((arrival, inst))
    inst, window, pg, seq, rank, arrival, dur, step = (
        x[o] for x in (inst, window, pg, seq, rank, arrival, dur, step)
    )
    first = np.flatnonzero(np.r_[True, inst[1:] != inst[:-1]])
    last = np.r_[first[1:] - 1, inst.size - 1]
    lateness = arrival - arrival[first][inst]
    is_last = np.zeros(inst.size, bool)
    is_last[last] = True
    n_ranks = (last - first + 1)[inst]
    return {
        "inst": inst.astype(np.int64),
        "window": window,
        "pg": pg,
        "seq": seq,
        "rank": rank,
        "step": step,
        "arrival_ns": arrival,
        "dur_ns": dur,
        "lateness_ns": lateness,
        "is_last": is_last,
        "n_ranks": n_ranks.astype(np.int64),
    }


def _empty_instances() -> Table:
    z = np.zeros(0, np.int64)
    return {k: z.copy() for k in ("inst", "window", "pg", "seq", "rank", "step", "arrival_ns", "dur_ns",
                                  "lateness_ns", "n_ranks")} | {"is_last": np.zeros(0, bool)}


def threshold_ms(run: MergedRun, rule: StragglerRule) -> tuple[float, dict[str, float]]:
    """The lateness threshold and its parts (ms)."""
    residuals = [hc.residual_us for hc in run.clock.values() if hc.residual_us is not None]
    residual_ms = max(residuals) / 1e3 if residuals else 0.0
    st = run.steps
    step_ms = (np.asarray(st["end_ns"], np.int64) - np.asarray(st["start_ns"], np.int64)) / NS_PER_MS
    median_step_ms = float(np.median(step_ms)) if step_ms.size else 0.0
    parts = {
        "min_lateness_ms": rule.min_lateness_ms,
        "clock_residual_ms": residual_ms,
        "from_clock_residual_ms": rule.residual_factor * residual_ms,
        "median_step_ms": median_step_ms,
        "from_step_time_ms": rule.step_fraction * median_step_ms,
    }
    thr = max(parts["min_lateness_ms"], parts["from_clock_residual_ms"], parts["from_step_time_ms"])
    return thr, parts


def _grouped_mean(idx: np.ndarray, values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    cnt = np.bincount(idx, minlength=n).astype(np.float64)
    tot = np.bincount(idx, weights=values.astype(np.float64), minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan), cnt


def find_stragglers(run: MergedRun, *, rule: StragglerRule | None = None) -> dict[str, Any]:
    """Rank and host straggler tables, per-step stragglers, and the naming rule (a JSON-ready dict).

    Keys: ``rule`` (text, threshold_ms and its parts), ``n_instances``, ``ranks`` (one dict per rank, ranked by blame),
    ``named`` (ranks named), ``hosts``, ``per_step``, ``changes`` (steps where the step's straggler differs from the
    previous step's), ``clock_free``.
    """
    rule = rule or StragglerRule()
    thr, parts = threshold_ms(run, rule)
    t = collective_instances(run)
    n_inst = int(t["inst"].max()) + 1 if t["inst"].size else 0
    out: dict[str, Any] = {
        "rule": {"text": rule.text(), "threshold_ms": thr, **parts, **asdict(rule)},
        "n_instances": n_inst,
        "ranks": [],
        "named": [],
        "hosts": [],
        "per_step": [],
        "changes": [],
        "clock_free": {"top_rank": None, "top_rank_by_blame": None, "agrees": None},
    }
    if n_inst == 0:
        return out

    lat_ms = t["lateness_ns"] / NS_PER_MS
    ranks, ridx = np.unique(t["rank"], return_inverse=True)
    nr = ranks.size
    inst = t["inst"]
    # blame of the last arriver: Σ over the instance of (ℓ_last − ℓ_r)
    lat_sum = np.bincount(inst, weights=lat_ms, minlength=n_inst)
    lat_max = np.full(n_inst, -np.inf)
    np.maximum.at(lat_max, inst, lat_ms)
    n_in = np.bincount(inst, minlength=n_inst)
    blame_inst = n_in * lat_max - lat_sum
    blame_row = np.where(t["is_last"], blame_inst[inst], 0.0)
    # clock-free: durations only
    dur_ms = t["dur_ns"] / NS_PER_MS
    dmin = np.full(n_inst, np.inf)
    dmax = np.full(n_inst, -np.inf)
    np.minimum.at(dmin, inst, dur_ms)
    np.maximum.at(dmax, inst, dur_ms)
    cf_late = dmax[inst] - dur_ms
    cf_wait = dur_ms - dmin[inst]

    mean_lat, cnt = _grouped_mean(ridx, lat_ms, nr)
    late_frac = np.bincount(ridx, weights=t["is_last"].astype(float), minlength=nr) / np.maximum(cnt, 1)
    often = np.bincount(ridx, weights=(lat_ms >= thr).astype(float), minlength=nr) / np.maximum(cnt, 1)
    blame = np.bincount(ridx, weights=blame_row, minlength=nr)
    max_lat = np.full(nr, 0.0)
    np.maximum.at(max_lat, ridx, lat_ms)
    cf_late_mean, _ = _grouped_mean(ridx, cf_late, nr)
    cf_wait_mean, _ = _grouped_mean(ridx, cf_wait, nr)

    # per (step, rank)
    steps, sidx = np.unique(t["step"], return_inverse=True)
    ns = steps.size
    cell = sidx * nr + ridx
    s_lat, s_cnt = _grouped_mean(cell, lat_ms, ns * nr)
    s_lat = s_lat.reshape(ns, nr)
    s_cnt = s_cnt.reshape(ns, nr)
    s_blame = np.bincount(cell, weights=blame_row, minlength=ns * nr).reshape(ns, nr)
    s_often = np.bincount(cell, weights=(lat_ms >= thr).astype(float), minlength=ns * nr).reshape(ns, nr)
    s_lost = np.zeros(ns * nr)
    np.maximum.at(s_lost, cell, np.where(t["is_last"], lat_ms, 0.0))
    s_lost = s_lost.reshape(ns, nr)
    steps_of_rank = np.maximum((s_cnt > 0).sum(axis=0), 1)
    lost_per_step = s_lost.sum(axis=0) / steps_of_rank
    blame_per_step = blame / steps_of_rank

    named_mask = (mean_lat >= thr) & (often >= rule.min_late_fraction)
    host_of = [run.hosts.get(int(r), "?") for r in ranks]
    rows = []
    for i in range(nr):
        rows.append(
            {
                "rank": int(ranks[i]),
                "host": host_of[i],
                "n_instances": int(cnt[i]),
                "blame_ms": float(blame[i]),
                "blame_ms_per_step": float(blame_per_step[i]),
                "mean_lateness_ms": float(mean_lat[i]),
                "max_lateness_ms": float(max_lat[i]),
                "late_fraction": float(late_frac[i]),
                "often_late_fraction": float(often[i]),
                "lost_ms_per_step": float(lost_per_step[i]),
                "clock_free_lateness_ms": float(cf_late_mean[i]),
                "clock_free_wait_ms": float(cf_wait_mean[i]),
                "named": bool(named_mask[i]),
            }
        )
    rows.sort(key=lambda d: (-d["blame_ms"], -d["mean_lateness_ms"], d["rank"]))
    out["ranks"] = rows
    out["named"] = [d["rank"] for d in rows if d["named"]]

    # clock-free agreement
    cf_top = int(ranks[int(np.nanargmax(cf_late_mean))])
    out["clock_free"] = {
        "top_rank": cf_top,
        "top_rank_by_blame": rows[0]["rank"],
        "agrees": cf_top == rows[0]["rank"],
        "named_confirmed": {
            str(d["rank"]): bool(d["clock_free_lateness_ms"] >= 0.5 * d["mean_lateness_ms"])
            for d in rows
            if d["named"]
        },
    }

    # per step: the rank with the largest mean lateness, if it reaches the threshold in most of the step's instances
    per_step = []
    prev: int | None = None
    changes = []
    for k in range(ns):
        if steps[k] < 0:
            continue
        lat_k = np.where(s_cnt[k] > 0, s_lat[k], -np.inf)
        j = int(np.argmax(lat_k))
        ok = lat_k[j] >= thr and s_often[k, j] / max(s_cnt[k, j], 1) >= rule.min_late_fraction
        who = int(ranks[j]) if ok else None
        per_step.append(
            {
                "step": int(steps[k]),
                "rank": who,
                "lateness_ms": float(lat_k[j]),
                "blame_ms": float(s_blame[k, j]),
                "latest_rank": int(ranks[j]),
            }
        )
        if per_step and len(per_step) > 1 and who != prev:
            changes.append({"step": int(steps[k]), "from_rank": prev, "to_rank": who})
        prev = who
    out["per_step"] = per_step
    out["changes"] = changes

    out["hosts"] = _hosts(run, t, lat_ms, blame_row, thr, rule, n_inst)
    return out


def _hosts(run, t, lat_ms, blame_row, thr, rule, n_inst) -> list[dict[str, Any]]:
    host_names = np.array([run.hosts.get(int(r), "?") for r in t["rank"]], dtype=object)
    hosts, hidx = np.unique(host_names.astype(str), return_inverse=True)
    nh = hosts.size
    grid = np.full((n_inst, nh), -np.inf)
    np.maximum.at(grid, (t["inst"], hidx), lat_ms)
    present = np.isfinite(grid)
    last_host = np.zeros((n_inst, nh), bool)
    last_host[t["inst"][t["is_last"]], hidx[t["is_last"]]] = True
    cnt = present.sum(axis=0)
    mean = np.where(cnt > 0, np.where(present, grid, 0.0).sum(axis=0) / np.maximum(cnt, 1), np.nan)
    often = ((grid >= thr) & present).sum(axis=0) / np.maximum(cnt, 1)
    late_frac = last_host.sum(axis=0) / np.maximum(cnt, 1)
    blame = np.bincount(hidx, weights=blame_row, minlength=nh)
    out = []
    for h in range(nh):
        rks = sorted({int(r) for r, hn in run.hosts.items() if hn == hosts[h]})
        out.append(
            {
                "host": str(hosts[h]),
                "ranks": rks,
                "blame_ms": float(blame[h]),
                "mean_lateness_ms": float(mean[h]),
                "late_fraction": float(late_frac[h]),
                "often_late_fraction": float(often[h]),
                "named": bool(nh >= 2 and mean[h] >= thr and often[h] >= rule.min_late_fraction),
            }
        )
    out.sort(key=lambda d: (-d["blame_ms"], d["host"]))
    return out
