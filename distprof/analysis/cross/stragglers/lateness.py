"""A rank's lateness in a step: the one lateness the analysis names stragglers by and reports.

A rank's **lateness in a step** is its largest lateness ℓ (:mod:`.instances`) at the step's collectives, less the
others' *chance lateness* — the median of the other ranks' lateness in that step where that is positive — in full
while its own is at most ``CHANCE_FULL`` × that, fading linearly to nothing at ``CHANCE_NONE`` ×, and never below
zero for a rank that was late. Every rank is late by chance at some of a step's many collectives (the largest of
noisy values); what the others share of it cancels. A lateness far above chance is a real delay at one collective,
to which the largest of the step's noisy arrivals adds nothing: taking chance off it as well understated it (FSDP2,
2 ranks, a 3.2 ms delay before forward with 12 collectives per step: 0.88 × the delay in the median run, where the
peer's chance was 0.5–0.9 ms; 1.06 × without). An early peer adds nothing: with two ranks, one late by X makes the
other early by X, and the late one's lateness stays X (not 2X); the early one's is −X.

A rank that starts its backward X ms late is then ≈X late per step however many bucket all-reduces follow, also when
its peers' later buckets start late themselves because their communication thread was still waiting in the first.
The same cells, keyed by (step, host), give the host table (:mod:`.hosts`).
"""

from __future__ import annotations

import numpy as np

from ...groupstats import unique_inverse
from ...narrow import narrow
from .peers import excess_by

__all__ = ["CHANCE_FULL", "CHANCE_NONE", "Cells", "StepLateness", "step_lateness"]

#: Chance is taken off in full from a lateness of at most this many times it ...
CHANCE_FULL = 2.0
#: ... and not at all from one of this many times it or more (linearly between).
CHANCE_NONE = 4.0


class Cells:
    """Sparse (step key, group) cells of instance rows, for grouped max/sum without dense grids.

    ``idx``: per row, its cell; ``n``: the number of cells; ``group``, ``step``: per cell, its group index and step
    key (cells sorted by (step key, group)).
    """

    def __init__(self, skey: np.ndarray, gidx: np.ndarray, ng: int):
        skeys, sidx = _distinct(skey)
        code = sidx.astype(np.int64, copy=False)  # in place below: these run over every instance row
        del sidx
        code *= ng
        code += gidx
        ucode, idx = unique_inverse(code, narrow=True)
        del code
        self.idx = narrow(idx)
        self.n = ucode.size
        self.group = (ucode % ng).astype(np.int64)
        self.step = skeys[ucode // ng]

    def max(self, v: np.ndarray) -> np.ndarray:
        out = np.full(self.n, -np.inf)
        np.maximum.at(out, self.idx, v)
        return out

    def sum(self, v: np.ndarray) -> np.ndarray:
        return np.bincount(self.idx, weights=v, minlength=self.n)

    def argmax(self, v: np.ndarray) -> np.ndarray:
        """Per cell: the row with the largest v (the first such row; a cell with a NaN: its first NaN row, as NaN
        sorts last). Two passes over the rows, no sort (1,024 LLM-shaped ranks: 0.2 s of the analysis by a sort)."""
        v = np.asarray(v, np.float64)
        with np.errstate(invalid="ignore"):  # NaN where the cell holds one: np.maximum propagates it, as intended
            top = self.max(v)[self.idx]
        hit = v == top
        hit |= np.isnan(top) & np.isnan(v)
        del top
        rows = np.flatnonzero(hit)
        out = np.full(self.n, v.size, np.int64)  # every cell has a row: each is overwritten
        np.minimum.at(out, self.idx[rows], rows)
        return out


def _distinct(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(key, return_inverse=True)``, without its sort where `key` is already sorted (the host table's
    cells are keyed by instance, the rows' order: at 1,024 LLM-shaped ranks the sort's copies of 1.39 M rows set the
    straggler analysis's peak)."""
    key = np.asarray(key).reshape(-1)
    if key.size and bool(np.all(key[1:] >= key[:-1])):
        new = np.r_[True, key[1:] != key[:-1]]
        return key[new], np.cumsum(new) - 1
    return unique_inverse(key)


class StepLateness:
    """Per (step, group) cell: ``raw`` the largest ℓ at the step's collectives (ms), ``lateness`` the lateness in the
    step (see the module docstring), ``row`` the instance row of the largest ℓ."""

    def __init__(self, raw: np.ndarray, lateness: np.ndarray, row: np.ndarray):
        self.raw, self.lateness, self.row = raw, lateness, row


def step_lateness(cells: Cells, lat_ms: np.ndarray) -> StepLateness:
    """The lateness in each (step, group) cell from each instance row's ℓ (ms)."""
    raw = cells.max(lat_ms)
    late = np.maximum(raw, 0.0)
    chance = late - excess_by(cells.step, late)  # the median of the other groups' positive lateness in the step
    times = np.divide(late, chance, out=np.full_like(late, CHANCE_NONE), where=chance > 0)
    share = np.clip((CHANCE_NONE - times) / (CHANCE_NONE - CHANCE_FULL), 0.0, 1.0)
    return StepLateness(raw, raw - np.minimum(chance * share, late), cells.argmax(lat_ms))
