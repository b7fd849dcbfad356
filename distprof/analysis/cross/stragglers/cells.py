"""(step, rank) cells: a rank's lateness in a step, and its excess over the other ranks' in that step.

A rank's lateness **in a step** is its largest ℓ over the step's instances. A rank that starts its backward X ms
late is then ≈X late per step however many bucket all-reduces follow — also when its peers' later buckets start late
themselves because their worker thread was still waiting in the first one.

A rank's **excess** in a step ``e_rs = ℓ_rs − median_{r'≠r} ℓ_r's``: its step lateness beyond the typical other
rank's. The latest of a step's many collectives is late by chance on every rank (the maximum of noisy values); the
excess takes that bias out, and its sign says who was late. With **two ranks** this is explicit: the excess is one
rank's step lateness minus the other's (``e_0s = −e_1s``), so one rank late is the other early and only one of them
can be in excess; with one collective per step it is twice the arrival gap.

The same cells, keyed by (instance, host) or (step, host), give the host table (:mod:`.hosts`).
"""

from __future__ import annotations

import numpy as np

from .peers import excess_by

__all__ = ["Cells", "excess"]


class Cells:
    """Sparse (step key, group) cells of instance rows, for grouped max/sum without dense grids.

    ``idx``: per row, its cell; ``n``: the number of cells; ``group``, ``step``: per cell, its group index and step
    key (cells sorted by (step key, group)).
    """

    def __init__(self, skey: np.ndarray, gidx: np.ndarray, ng: int):
        skeys, sidx = np.unique(skey, return_inverse=True)
        code = sidx.reshape(-1).astype(np.int64) * ng + gidx
        ucode, idx = np.unique(code, return_inverse=True)
        self.idx = idx.reshape(-1)
        self.n = ucode.size
        self.group = (ucode % ng).astype(np.int64)
        self.step = skeys[ucode // ng]

    def max(self, v: np.ndarray) -> np.ndarray:
        out = np.full(self.n, -np.inf)
        np.maximum.at(out, self.idx, v)
        return out

    def sum(self, v: np.ndarray) -> np.ndarray:
        return np.bincount(self.idx, weights=v, minlength=self.n)


def excess(cells: Cells, c_lat: np.ndarray) -> np.ndarray:
    """Per (step, group) cell: its lateness minus the median of the other groups' lateness in that step."""
    return excess_by(cells.step, c_lat)
