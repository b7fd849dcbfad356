"""Cost, what severity follows: the wall time the steps would gain if the named ranks arrived with the others.

``cost_ms_per_step`` — per step, the largest lead of the rank over the latest rank that is not named, averaged over
its steps. For one straggler this is ``lost_ms_per_step`` (its lead over the second-latest arrival); ranks late
together share the cost instead of hiding it in each other's leads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .instances import Table

__all__ = ["cost_ms"]

NS_PER_MS = 1e6


def cost_ms(t: Table, named_row: np.ndarray) -> np.ndarray:
    """Per instance row: how much later the rank arrived than the latest rank that is neither it nor named (ms)."""
    inst, a = t["inst"], t["behind_first_ns"]  # arrival after the instance's first (rows sorted by arrival)
    n_inst = int(inst.max()) + 1
    ok = ~named_row
    # rows are sorted by (inst, arrival): the latest and second-latest unnamed arrival per instance. In place where
    # it can be: these run over every instance row (1.39 M at 1,024 LLM-shaped ranks, 11 MB each)
    a_ok = np.where(ok, a, -1)
    top1 = np.full(n_inst, -1, np.int64)
    np.maximum.at(top1, inst, a_ok)
    ref = top1[inst]
    is_top = ok & (a == ref)
    first_top = is_top & ~np.r_[False, is_top[1:] & is_top[:-1] & (inst[1:] == inst[:-1])]
    del is_top
    a_ok[first_top] = -1
    top2 = np.full(n_inst, -1, np.int64)
    np.maximum.at(top2, inst, a_ok)
    del a_ok
    ref[first_top] = top2[inst[first_top]]
    out = a - ref
    np.maximum(out, 0, out=out)
    out[ref < 0] = 0
    return out / NS_PER_MS
