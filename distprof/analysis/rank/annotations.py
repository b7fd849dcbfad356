"""One rank's user annotations: total time and calls of each ``record_function`` region in the rank's steps.

Which events count: CPU ``user_annotation`` events (``with torch.profiler.record_function("forward"):``) whose name
is not a framework-internal region. Framework names (``names.FRAMEWORK_PREFIXES``) are excluded: the profiler's
``ProfilerStep#N``, the optimizer's ``Optimizer.step#…``/``Optimizer.zero_grad#…``, the DataLoader's
``enumerate(DataLoader)#…`` (the ``input_wait`` finding reports those), DDP/FSDP wrappers
(``DistributedDataParallel.*``, ``FullyShardedDataParallel.*``), torch.compile regions (``Torch-Compiled Region*``,
``CompiledFunction*``, ``## … ##``), and communication (``gloo:*``, ``nccl:*``, ``record_param_comms`` and every
event of category communication). Device-side copies of annotations (``gpu_user_annotation``) are not counted: the
CPU region is the one the user wrote.

Per name: the sum of the durations of its events that start in one of the rank's recorded steps, and their count.
Times are inclusive (children included). ``cross.annotations`` puts the ranks side by side.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from ...storage.schema import CAT_COMM, KIND_CODE
from ..load.rankdata import RankData
from .nameflags import USER_ANNOTATION, has, name_flags

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)

__all__ = ["rank_annotations", "MAX_NAMES_PER_RANK"]

NS_PER_MS = 1e6
_K_ANNOT = KIND_CODE["user_annotation"]
#: User annotation names kept per rank (the largest total time).
MAX_NAMES_PER_RANK = 1000


def rank_annotations(rd: RankData, flags: np.ndarray | None = None, *,
                     max_names: int = MAX_NAMES_PER_RANK) -> dict[str, tuple[float, float]]:
    """One rank's user annotations: name -> (total ms, calls) of its events that start in a step the rank recorded.

    At most `max_names` names (the largest total time) are kept. `flags`: the rank's ``nameflags`` (computed when
    not given).
    """
    ev = rd.events
    st = rd.steps
    if st["step"].size == 0 or ev["ts_ns"].size == 0:
        return {}
    user_name = has(name_flags(rd.names) if flags is None else flags, USER_ANNOTATION)
    name_id = np.asarray(ev["name_id"], np.int64)
    step = np.asarray(ev["step"], np.int64)
    sel = (
        (np.asarray(ev["kind"]) == _K_ANNOT)
        & (np.asarray(ev["device"]) < 0)
        & (np.asarray(ev["category"]) != CAT_COMM)
        & user_name[name_id]
        & (step >= 0)  # an event's step is one its rank recorded, or -1
    )
    if not np.any(sel):
        return {}
    names, ni = np.unique(name_id[sel], return_inverse=True)
    ni = ni.reshape(-1)
    tot = np.bincount(ni, weights=np.asarray(ev["dur_ns"], np.float64)[sel] / NS_PER_MS, minlength=names.size)
    cnt = np.bincount(ni, minlength=names.size).astype(np.float64)
    keep = np.argsort(-tot, kind="stable")[:max_names]
    return {str(rd.names[names[k]]): (float(tot[k]), float(cnt[k])) for k in sorted(keep.tolist())}


