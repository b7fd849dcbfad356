"""Root cause of a straggler: the ops that took longer on it than on the other ranks in the same steps.

For straggler rank r, every op name n (``cpu_op``, ``user_annotation``, ``kernel``, ``gpu_memcpy``/``gpu_memset``;
not communication — waiting is an effect, not a cause — and not ``ProfilerStep#N``) and every step s that r and at
least one other rank recorded: ``t(r, s, n)`` = total duration of n on r in s (0 when r ran no n in a step it
recorded). ``excess(n) = Σ_s [t(r, s, n) − median_{r' ≠ r} t(r', s, n)]``. Ops with a positive excess are listed,
ranked by it. Times are inclusive: a parent op and its children are listed separately.

Time with no event at all (a ``time.sleep`` or data loading outside the profiler) shows as the pseudo-op ``[idle]``:
the step breakdown's ``idle_ms`` (main thread, or device, in no event and not waiting for communication).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np


if TYPE_CHECKING:
    from .runsummary import RunSummary

logger = logging.getLogger(__name__)

__all__ = ["root_cause", "IDLE_NAME"]

NS_PER_MS = 1e6
IDLE_NAME = "[idle]"
_MAX_CELLS = 20_000_000


def _candidates(run: RunSummary, ranks: list[int], max_names: int) -> tuple[list[str], dict[str, str]]:
    """Names the stragglers ran (sorted), at most `max_names` (those they spent most time in), and each one's kind."""
    tot: dict[str, float] = {}
    kinds: dict[str, str] = {}
    for r in ranks:
        s = run.ranks.get(r)
        if s is None:
            continue
        d = np.bincount(s.op_totals["name"], weights=s.op_totals["dur_ms"], minlength=len(s.op_names))
        for i, name in enumerate(s.op_names.tolist()):
            tot[name] = tot.get(name, 0.0) + float(d[i])
            kinds.setdefault(name, s.op_kinds[i])
    cand = sorted(tot)
    if len(cand) > max_names:  # bound memory: keep the names the stragglers spent most time in
        order = np.argsort(-np.array([tot[n] for n in cand]), kind="stable")[:max_names]
        cand = sorted(cand[i] for i in order)
    return cand, kinds


def root_cause(
    run: RunSummary,
    ranks: Sequence[int],
    *,
    top_ops: int = 10,
) -> list[dict[str, Any]]:
    """For each rank in `ranks`: its ops with the largest excess over the other ranks' median, same steps.

    Returns one dict per rank: ``rank``, ``host``, ``n_steps`` (steps compared), ``ops`` — a list of
    ``{name, kind, excess_ms, excess_ms_per_step, rank_ms_per_step, others_median_ms_per_step, calls_per_step}``.
    Op times come from each rank's summary (``summary.TOP_OPS`` heaviest names per rank; a name outside a rank's
    list counts as 0 there).
    """
    ranks = [int(r) for r in ranks]
    if not ranks:
        return []
    bd = run.steps
    all_ranks = np.unique(np.asarray(bd["rank"]))
    steps = np.unique(np.asarray(bd["step"]))
    nr, ns = all_ranks.size, steps.size
    if nr < 2 or ns == 0:
        return [{"rank": r, "host": run.hosts.get(r, "?"), "n_steps": 0, "ops": []} for r in ranks]
    # which (step, rank) exist
    present = np.zeros((ns, nr), bool)
    present[np.searchsorted(steps, bd["step"]), np.searchsorted(all_ranks, bd["rank"])] = True

    cand, kind_of = _candidates(run, ranks, max(1, _MAX_CELLS // (ns * nr)))
    nn = len(cand)
    pos = {n: i for i, n in enumerate(cand)}
    dur = np.zeros((nn, ns, nr))
    calls = np.zeros((nn, ns, nr))
    for j, r in enumerate(all_ranks.tolist()):
        s = run.ranks.get(int(r))
        if s is None or not s.op_totals["name"].size:
            continue
        ni = np.array([pos.get(x, -1) for x in s.op_names.tolist()], np.int64)[s.op_totals["name"]]
        ok = (ni >= 0) & np.isin(s.op_totals["step"], steps)
        si = np.searchsorted(steps, s.op_totals["step"][ok])
        dur[ni[ok], si, j] = s.op_totals["dur_ms"][ok]
        calls[ni[ok], si, j] = s.op_totals["calls"][ok]

    # [idle] pseudo-op from the breakdown
    idle = np.zeros((1, ns, nr))
    if bd["step"].size:
        idle[0, np.searchsorted(steps, bd["step"]), np.searchsorted(all_ranks, bd["rank"])] = bd["idle_ms"]
    dur = np.concatenate([dur, idle])
    calls = np.concatenate([calls, np.zeros((1, ns, nr))])
    labels = cand + [IDLE_NAME]
    kinds = [kind_of.get(n, "none") for n in cand] + ["none"]

    dur = np.where(present[None], dur, np.nan)
    out = []
    for r in ranks:
        if r not in all_ranks:
            out.append({"rank": r, "host": run.hosts.get(r, "?"), "n_steps": 0, "ops": []})
            continue
        j = int(np.searchsorted(all_ranks, r))
        others = np.delete(present, j, axis=1)
        steps_ok = present[:, j] & others.any(axis=1)
        n_ok = int(steps_ok.sum())
        if n_ok == 0:
            out.append({"rank": r, "host": run.hosts.get(r, "?"), "n_steps": 0, "ops": []})
            continue
        mine = dur[:, steps_ok, j]  # (names, steps)
        with np.errstate(all="ignore"):
            med = np.nanmedian(np.delete(dur[:, steps_ok, :], j, axis=2), axis=2)
        excess = np.nansum(mine - med, axis=1)
        order = np.argsort(-excess, kind="stable")
        ops = []
        for k in order[:top_ops]:
            if not excess[k] > 0:
                break
            ops.append(
                {
                    "name": labels[k],
                    "kind": kinds[k],
                    "excess_ms": float(excess[k]),
                    "excess_ms_per_step": float(excess[k] / n_ok),
                    "rank_ms_per_step": float(np.nanmean(mine[k])),
                    "others_median_ms_per_step": float(np.nanmean(med[k])),
                    "calls_per_step": float(calls[k, steps_ok, j].mean()),
                }
            )
        out.append({"rank": r, "host": run.hosts.get(r, "?"), "n_steps": n_ok, "ops": ops})
    return out
