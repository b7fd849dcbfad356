"""Stragglers: who arrives late at collectives, and how much waiting it causes the others.

Instances. Per process group and window, the k-th exec collective (``comms.role == 1``, ``comms.seq == k``) of every
rank is one instance (the rule of ``matching.py``). For rank r in instance i (times on the aligned clock):

* arrival ``a_ri`` = start of its exec event (``gloo:*`` on the worker thread, the NCCL kernel on the stream);
* **lateness** ``ℓ_ri = a_ri − min_r' a_r'i`` — how long the earliest rank waited for r;
* the **last arriver** ``L_i = argmax_r a_ri``; its **blame** ``B_i = Σ_{r≠L_i} (a_{L_i,i} − a_ri)`` — the waiting it
  caused the others (Scalasca's "Wait at N×N", summed over the waiting ranks).

A rank's lateness **in a step** is its largest ℓ over the step's instances (a collective outside every step is a
step of its own). Per rank: ``mean_lateness_ms`` = mean over its steps of that step lateness — a rank that starts its
backward X ms late is ≈X late per step however many bucket all-reduces follow, even when its peers' later buckets
start late themselves (their worker thread was still busy waiting in the first one); ``mean_instance_lateness_ms``
= mean ℓ over its instances; ``late_fraction`` = share of its instances where it arrived last; ``blame_ms`` = Σ B over
the instances where it arrived last; ``blame_ms_per_step``; ``lost_ms_per_step`` = mean over its steps of its largest
lateness among the instances where it arrived last (the wall time the step lost to it).

Clock-free cross-check (no clock alignment involved, durations only): a collective ends at about the same time on all
ranks, so ``max_r' d_r'i − d_ri`` estimates ℓ (``clock_free_lateness_ms``: per step the largest, averaged over steps
like ``mean_lateness_ms``), and ``clock_free_wait = d_ri − min_r' d_r'i`` is
how long r waited (DeepSpeed's "straggler effect"). ``clock_free.agrees`` says whether both measures pick the same
top rank.

Naming rule (:class:`StragglerRule`): a rank is *named* a straggler only if its mean lateness is at least
``threshold_ms = max(min_lateness_ms, residual_factor × the largest per-host clock residual, step_fraction × median
step time)`` **and** its step lateness reaches the threshold in at least ``min_late_fraction`` of its steps. Below that
the differences are indistinguishable from clock error and jitter and no rank is named. Hosts: per instance a host's
arrival is its last rank's; the same rule names slow hosts (only when there are at least two hosts). Every rank of a
slow node is late in most steps, so they are all named although each arrives last only a fraction of the time.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .matching import match_run
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
            f"residual, {self.step_fraction:g} x median step time) and its lateness reaches that threshold in >= "
            f"{self.min_late_fraction:.0%} of its steps (lateness in a step = latest arrival at the step's "
            "collectives minus the earliest rank's)"
        )


def collective_instances(run: MergedRun) -> Table:
    """One row per (instance, rank), sorted by (instance, arrival); instances as ``matching.match_run`` finds them.

    Columns: ``inst`` (0..n−1), ``window``, ``pg``, ``seq``, ``rank``, ``step``, ``arrival_ns``, ``dur_ns``,
    ``lateness_ns``, ``is_last``, ``n_ranks`` (ranks in the instance). Instances seen on fewer than two ranks are
    dropped; a rank seen twice in one instance keeps its first row.
    """
    m = match_run(run).members
    if m["inst"].size == 0:
        return _empty_instances()
    inst = np.asarray(m["inst"], np.int64)
    rank = np.asarray(m["rank"], np.int64)
    # members are sorted by (inst, rank): drop repeated ranks
    dup = np.r_[False, (inst[1:] == inst[:-1]) & (rank[1:] == rank[:-1])]
    if np.any(dup):
        logger.warning("%d duplicate (instance, rank) exec collectives ignored", int(dup.sum()))
    keep = ~dup
    n_per = np.bincount(inst[keep])
    keep &= n_per[inst] >= 2
    inst = inst[keep]
    if inst.size == 0:
        return _empty_instances()
    rows = np.asarray(m["row"], np.int64)[keep]
    arrival = np.asarray(m["start_ns"], np.int64)[keep]
    cols = {
        "window": np.asarray(m["window"], np.int64)[keep],
        "pg": np.asarray(m["pg"], np.int64)[keep],
        "seq": np.asarray(m["seq"], np.int64)[keep],
        "rank": rank[keep],
        "step": np.asarray(run.events["step"], np.int64)[rows],
        "arrival_ns": arrival,
        "dur_ns": np.asarray(m["end_ns"], np.int64)[keep] - arrival,
    }
    _, inst = np.unique(inst, return_inverse=True)  # renumber 0..n-1
    inst = inst.reshape(-1)
    o = np.lexsort((arrival, inst))
    inst = inst[o]
    cols = {k: v[o] for k, v in cols.items()}
    first = np.flatnonzero(np.r_[True, inst[1:] != inst[:-1]])
    last = np.r_[first[1:] - 1, inst.size - 1]
    is_last = np.zeros(inst.size, bool)
    is_last[last] = True
    return {
        "inst": inst.astype(np.int64),
        **cols,
        "lateness_ns": cols["arrival_ns"] - cols["arrival_ns"][first][inst],
        "is_last": is_last,
        "n_ranks": (last - first + 1)[inst].astype(np.int64),
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
    ridx = ridx.reshape(-1)
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

    # (step, rank) cells: a rank's lateness in a step is its largest lateness over the step's instances; a collective
    # outside every step (step −1) is a step of its own
    skey = np.where(t["step"] >= 0, t["step"], -1 - inst)
    cells = _Cells(skey, ridx, nr)
    c_lat = cells.max(lat_ms)
    c_cf = cells.max(cf_late)
    c_blame = cells.sum(blame_row)
    c_lost = cells.max(np.where(t["is_last"], lat_ms, 0.0))
    c_rank = cells.rank

    steps_of_rank = np.bincount(c_rank, minlength=nr).astype(np.float64)
    den = np.maximum(steps_of_rank, 1)
    mean_lat = np.bincount(c_rank, weights=c_lat, minlength=nr) / den
    often = np.bincount(c_rank, weights=(c_lat >= thr).astype(float), minlength=nr) / den
    lost_per_step = np.bincount(c_rank, weights=c_lost, minlength=nr) / den
    cf_late_mean = np.bincount(c_rank, weights=c_cf, minlength=nr) / den
    inst_lat, cnt = _grouped_mean(ridx, lat_ms, nr)
    late_frac = np.bincount(ridx, weights=t["is_last"].astype(float), minlength=nr) / np.maximum(cnt, 1)
    blame = np.bincount(ridx, weights=blame_row, minlength=nr)
    max_lat = np.zeros(nr)
    np.maximum.at(max_lat, ridx, lat_ms)
    cf_wait_mean, _ = _grouped_mean(ridx, cf_wait, nr)

    named_mask = (mean_lat >= thr) & (often >= rule.min_late_fraction)
    rows = []
    for i in range(nr):
        rows.append(
            {
                "rank": int(ranks[i]),
                "host": run.hosts.get(int(ranks[i]), "?"),
                "n_instances": int(cnt[i]),
                "n_steps": int(steps_of_rank[i]),
                "blame_ms": float(blame[i]),
                "blame_ms_per_step": float(blame[i] / den[i]),
                "mean_lateness_ms": float(mean_lat[i]),
                "mean_instance_lateness_ms": float(inst_lat[i]),
                "max_lateness_ms": float(max_lat[i]),
                "late_fraction": float(late_frac[i]),
                "late_step_fraction": float(often[i]),
                "lost_ms_per_step": float(lost_per_step[i]),
                "clock_free_lateness_ms": float(cf_late_mean[i]),
                "clock_free_wait_ms": float(cf_wait_mean[i]),
                "named": bool(named_mask[i]),
            }
        )
    rows.sort(key=lambda d: (-d["blame_ms"], -d["mean_lateness_ms"], d["rank"]))
    out["ranks"] = rows
    out["named"] = [d["rank"] for d in rows if d["named"]]

    cf_top = int(ranks[int(np.argmax(cf_late_mean))])
    out["clock_free"] = {
        "top_rank": cf_top,
        "top_rank_by_blame": rows[0]["rank"],
        "agrees": cf_top == rows[0]["rank"],
        "named_confirmed": {
            str(d["rank"]): bool(d["clock_free_lateness_ms"] >= 0.5 * d["mean_lateness_ms"]) for d in rows if d["named"]
        },
    }

    # per step: the latest rank, named when its lateness reaches the threshold
    real = cells.step >= 0
    o = np.lexsort((-c_lat[real], cells.step[real]))
    st_, lat_, rk_, bl_ = cells.step[real][o], c_lat[real][o], c_rank[real][o], c_blame[real][o]
    first = np.flatnonzero(np.r_[True, st_[1:] != st_[:-1]]) if st_.size else np.zeros(0, np.int64)
    per_step, changes = [], []
    prev: int | None = None
    for n, k in enumerate(first.tolist()):
        who = int(ranks[rk_[k]]) if lat_[k] >= thr else None
        per_step.append({"step": int(st_[k]), "rank": who, "lateness_ms": float(lat_[k]),
                         "blame_ms": float(bl_[k]), "latest_rank": int(ranks[rk_[k]])})
        if n and who != prev:
            changes.append({"step": int(st_[k]), "from_rank": prev, "to_rank": who})
        prev = who
    out["per_step"] = per_step
    out["changes"] = changes
    out["hosts"] = _hosts(run, t, skey, lat_ms, blame_row, thr, rule, n_inst)
    return out


class _Cells:
    """Sparse (step key, group) cells of the instance rows, for grouped max/sum without dense grids."""

    def __init__(self, skey: np.ndarray, gidx: np.ndarray, ng: int):
        _, sidx = np.unique(skey, return_inverse=True)
        self._skeys = np.unique(skey)
        code = sidx.reshape(-1).astype(np.int64) * ng + gidx
        ucode, self.idx = np.unique(code, return_inverse=True)
        self.idx = self.idx.reshape(-1)
        self.n = ucode.size
        self.rank = (ucode % ng).astype(np.int64)  # the group index (rank or host)
        self.step = self._skeys[ucode // ng]

    def max(self, v: np.ndarray) -> np.ndarray:
        out = np.full(self.n, -np.inf)
        np.maximum.at(out, self.idx, v)
        return out

    def sum(self, v: np.ndarray) -> np.ndarray:
        return np.bincount(self.idx, weights=v, minlength=self.n)


def _hosts(run, t, skey, lat_ms, blame_row, thr, rule, n_inst) -> list[dict[str, Any]]:
    host_names = np.array([str(run.hosts.get(int(r), "?")) for r in np.unique(t["rank"])], dtype=object)
    ranks = np.unique(t["rank"])
    hosts, h_of_rank = np.unique(host_names.astype(str), return_inverse=True)
    hidx = h_of_rank.reshape(-1)[np.searchsorted(ranks, t["rank"])]
    nh = hosts.size
    # a host's lateness in an instance is its last rank's; in a step, the largest over the step's instances
    ih = _Cells(t["inst"], hidx, nh)
    ih_lat = ih.max(lat_ms)
    ih_last = ih.max(t["is_last"].astype(float))
    inst_of_cell = ih.step
    first_row = np.unique(t["inst"], return_index=True)[1]
    cells = _Cells(skey[first_row][inst_of_cell], ih.rank, nh)
    c_lat = cells.max(ih_lat)
    n_steps = np.maximum(np.bincount(cells.rank, minlength=nh), 1)
    mean = np.bincount(cells.rank, weights=c_lat, minlength=nh) / n_steps
    often = np.bincount(cells.rank, weights=(c_lat >= thr).astype(float), minlength=nh) / n_steps
    n_inst_h = np.maximum(np.bincount(ih.rank, minlength=nh), 1)
    late_frac = np.bincount(ih.rank, weights=ih_last, minlength=nh) / n_inst_h
    blame = np.bincount(hidx, weights=blame_row, minlength=nh)
    out = []
    for h in range(nh):
        out.append(
            {
                "host": str(hosts[h]),
                "ranks": sorted(int(r) for r, hn in run.hosts.items() if hn == hosts[h]),
                "blame_ms": float(blame[h]),
                "mean_lateness_ms": float(mean[h]),
                "late_fraction": float(late_frac[h]),
                "late_step_fraction": float(often[h]),
                "named": bool(nh >= 2 and mean[h] >= thr and often[h] >= rule.min_late_fraction),
            }
        )
    out.sort(key=lambda d: (-d["blame_ms"], d["host"]))
    return out
