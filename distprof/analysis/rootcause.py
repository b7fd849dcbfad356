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
from typing import Any, Sequence

import numpy as np

from ..storage.schema import CAT_COMM, KIND_CODE, KINDS
from .breakdown import step_breakdown, step_name_mask
from .model import MergedRun, Table

logger = logging.getLogger(__name__)

__all__ = ["root_cause", "IDLE_NAME"]

NS_PER_MS = 1e6
IDLE_NAME = "[idle]"
_MAX_CELLS = 20_000_000
_KINDS = np.array(
    [KIND_CODE[k] for k in ("cpu_op", "user_annotation", "kernel", "gpu_memcpy", "gpu_memset")], dtype=np.int64
)


def root_cause(
    run: MergedRun,
    ranks: Sequence[int],
    *,
    breakdown: Table | None = None,
    top_ops: int = 10,
) -> list[dict[str, Any]]:
    """For each rank in `ranks`: its ops with the largest excess over the other ranks' median, same steps.

    Returns one dict per rank: ``rank``, ``host``, ``n_steps`` (steps compared), ``ops`` — a list of
    ``{name, kind, excess_ms, excess_ms_per_step, rank_ms_per_step, others_median_ms_per_step, calls_per_step}``.
    """
    ranks = [int(r) for r in ranks]
    if not ranks:
        return []
    ev = run.events
    bd = breakdown if breakdown is not None else step_breakdown(run)
    all_ranks = np.unique(np.asarray(run.steps["rank"]))
    steps = np.unique(np.asarray(run.steps["step"]))
    nr, ns = all_ranks.size, steps.size
    if nr < 2 or ns == 0:
        return [{"rank": r, "host": run.hosts.get(r, "?"), "n_steps": 0, "ops": []} for r in ranks]
    # which (step, rank) exist
    present = np.zeros((ns, nr), bool)
    present[np.searchsorted(steps, run.steps["step"]), np.searchsorted(all_ranks, run.steps["rank"])] = True

    kind = np.asarray(ev["kind"]).astype(np.int64)
    name_id = np.asarray(ev["name_id"]).astype(np.int64)
    step = np.asarray(ev["step"]).astype(np.int64)
    ev_rank = np.asarray(ev["rank"]).astype(np.int64)
    is_step = step_name_mask(run.names)[name_id] if name_id.size else np.zeros(0, bool)
    sel = np.isin(kind, _KINDS) & (np.asarray(ev["category"]) != CAT_COMM) & ~is_step & np.isin(step, steps)
    sel &= np.isin(ev_rank, all_ranks)
    # names the stragglers ran (only those can have a positive excess)
    mine_sel = sel & np.isin(ev_rank, ranks)
    cand, cand_tot = np.unique(name_id[mine_sel], return_inverse=True)
    if cand.size * ns * nr > _MAX_CELLS:  # bound memory: keep the names the stragglers spent most time in
        tot = np.bincount(cand_tot.reshape(-1), weights=np.asarray(ev["dur_ns"])[mine_sel].astype(float))
        keep = max(1, _MAX_CELLS // (ns * nr))
        cand = np.sort(cand[np.argsort(-tot, kind="stable")[:keep]])
    sel &= np.isin(name_id, cand)
    nid = np.searchsorted(cand, name_id[sel])
    sid = np.searchsorted(steps, step[sel])
    rid = np.searchsorted(all_ranks, ev_rank[sel])
    nn = cand.size
    flat = (nid * ns + sid) * nr + rid
    dur = np.bincount(flat, weights=np.asarray(ev["dur_ns"])[sel].astype(np.float64), minlength=nn * ns * nr)
    calls = np.bincount(flat, minlength=nn * ns * nr).astype(np.float64)
    dur = dur.reshape(nn, ns, nr) / NS_PER_MS
    calls = calls.reshape(nn, ns, nr)
    kind_of = np.zeros(nn, np.int64)
    kind_of[nid] = kind[sel]

    # [idle] pseudo-op from the breakdown
    idle = np.zeros((1, ns, nr))
    if bd["step"].size:
        m = np.isin(bd["step"], steps) & np.isin(bd["rank"], all_ranks)
        idle[0, np.searchsorted(steps, bd["step"][m]), np.searchsorted(all_ranks, bd["rank"][m])] = bd["idle_ms"][m]
    dur = np.concatenate([dur, idle])
    calls = np.concatenate([calls, np.zeros((1, ns, nr))])
    labels = [str(run.names[c]) for c in cand] + [IDLE_NAME]
    kinds = [KINDS[k] if k < len(KINDS) else str(k) for k in kind_of] + ["none"]

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
