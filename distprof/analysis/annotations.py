"""User annotations: time per ``record_function`` region, per rank and step, to compare marked code across ranks.

Which events count: CPU ``user_annotation`` events (``with torch.profiler.record_function("forward"):``) whose name
is not a framework-internal region. Framework names (``FRAMEWORK_PREFIXES``) are excluded: the profiler's
``ProfilerStep#N``, the optimizer's ``Optimizer.step#…``/``Optimizer.zero_grad#…``, the DataLoader's
``enumerate(DataLoader)#…`` (the ``input_wait`` finding reports those), DDP/FSDP wrappers
(``DistributedDataParallel.*``, ``FullyShardedDataParallel.*``), torch.compile regions (``Torch-Compiled Region*``,
``CompiledFunction*``, ``## … ##``), and communication (``gloo:*``, ``nccl:*``, ``record_param_comms`` and every
event of category communication). Device-side copies of annotations (``gpu_user_annotation``) are not counted: the
CPU region is the one the user wrote.

Per (name, rank): ``ms_per_step`` = Σ durations of the name's events that start in one of the rank's recorded steps,
divided by the number of steps the rank recorded (a rank that never ran the region counts 0); ``count_per_step`` the
same for the number of events. Times are inclusive (children included). ``spread_pct`` = 100 · (max − min) / mean of
``ms_per_step`` over the ranks (``None`` with fewer than two ranks or a zero mean). Names are ranked by their mean
``ms_per_step`` over ranks, largest first.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..storage.schema import CAT_COMM, KIND_CODE
from .model import MergedRun

logger = logging.getLogger(__name__)

__all__ = ["annotations", "FRAMEWORK_PREFIXES", "is_user_annotation_name"]

NS_PER_MS = 1e6
FRAMEWORK_PREFIXES = (
    "ProfilerStep#",
    "Optimizer.step#",
    "Optimizer.zero_grad#",
    "enumerate(DataLoader)#",
    "DistributedDataParallel.",
    "FullyShardedDataParallel.",
    "Torch-Compiled Region",
    "CompiledFunction",
    "## ",
    "gloo:",
    "nccl:",
    "record_param_comms",
    "PyTorch Profiler",
)
_K_ANNOT = KIND_CODE["user_annotation"]


def is_user_annotation_name(name: str) -> bool:
    """True unless `name` is a framework-internal region (see ``FRAMEWORK_PREFIXES``)."""
    return not str(name).startswith(FRAMEWORK_PREFIXES)


def annotations(run: MergedRun, *, max_names: int = 50) -> list[dict[str, Any]]:
    """Per user annotation: ``{name, ranks: {"<rank>": {ms_per_step, count_per_step}}, spread_pct}``, largest first.

    At most `max_names` names are returned (the largest); see the module docstring for what counts.
    """
    ev = run.events
    st = run.steps
    if st["step"].size == 0 or ev["ts_ns"].size == 0:
        return []
    user_name = np.fromiter((is_user_annotation_name(n) for n in run.names), dtype=bool, count=len(run.names))
    name_id = np.asarray(ev["name_id"], np.int64)
    sel = (
        (np.asarray(ev["kind"]) == _K_ANNOT)
        & (np.asarray(ev["device"]) < 0)
        & (np.asarray(ev["category"]) != CAT_COMM)
        & user_name[name_id]
        & (np.asarray(ev["step"]) >= 0)
    )
    if not np.any(sel):
        return []
    ranks = np.unique(np.asarray(st["rank"], np.int64))
    # only events in a step their rank recorded
    rs_key = np.asarray(st["rank"], np.int64) * (2**32) + np.asarray(st["step"], np.int64)
    e_rank = np.asarray(ev["rank"], np.int64)[sel]
    e_key = e_rank * (2**32) + np.asarray(ev["step"], np.int64)[sel]
    ok = np.isin(e_key, rs_key)
    nid = name_id[sel][ok]
    e_rank = e_rank[ok]
    dur = np.asarray(ev["dur_ns"], np.float64)[sel][ok] / NS_PER_MS
    if nid.size == 0:
        return []
    names, ni = np.unique(nid, return_inverse=True)
    ni = ni.reshape(-1)
    ri = np.searchsorted(ranks, e_rank)
    nn, nr = names.size, ranks.size
    flat = ni * nr + ri
    tot = np.bincount(flat, weights=dur, minlength=nn * nr).reshape(nn, nr)
    cnt = np.bincount(flat, minlength=nn * nr).reshape(nn, nr).astype(np.float64)
    n_steps = np.bincount(np.searchsorted(ranks, np.asarray(st["rank"], np.int64)), minlength=nr).astype(np.float64)
    per_step = tot / np.maximum(n_steps, 1)[None, :]
    calls = cnt / np.maximum(n_steps, 1)[None, :]
    mean = per_step.mean(axis=1)
    order = np.argsort(-mean, kind="stable")
    if order.size > max_names:
        logger.info("%d user annotations; keeping the %d largest", order.size, max_names)
        order = order[:max_names]
    out = []
    for k in order:
        m = float(mean[k])
        spread = 100.0 * float(per_step[k].max() - per_step[k].min()) / m if nr >= 2 and m > 0 else None
        out.append(
            {
                "name": str(run.names[names[k]]),
                "ranks": {
                    str(int(r)): {"ms_per_step": float(per_step[k, j]), "count_per_step": float(calls[k, j])}
                    for j, r in enumerate(ranks)
                },
                "spread_pct": spread,
            }
        )
    return out
