"""Root cause of a straggler: the ops that took longer on it than on the other ranks in the same steps.

For straggler rank r, every op name n (``cpu_op``, ``user_annotation``, ``kernel``, ``gpu_memcpy``/``gpu_memset``;
not communication — waiting is an effect, not a cause — and not ``ProfilerStep#N``) and every step s that r and at
least one other rank recorded: ``t(r, s, n)`` = total self work of n on r in s (0 when r ran no n in a step it
recorded). ``excess(n) = Σ_s [t(r, s, n) − median_{r' ≠ r} t(r', s, n)]``. Ops with a positive excess are listed,
ranked by it.

Self work (``rank.selftime``): an event's duration less its main thread's waits for communication, less the same of
the events nested in it. So nested regions never count the same time twice: a sleep in the forward of a model whose
forward runs inside ``optimizer.step(closure)`` is listed once, under ``DistributedDataParallel.forward`` (the
innermost region that holds it), not again under ``Optimizer.step#AdamW.step``; a slower ``aten::addmm`` is listed
as itself, not also as the ``aten::linear`` around it. The listed excesses add up to no more than the rank's.

Time with no event at all (a ``time.sleep`` or data loading outside the profiler) shows as the pseudo-op ``[idle]``:
the step breakdown's ``idle_ms`` (main thread, or device, in no event and not waiting for communication).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ...record import Record

if TYPE_CHECKING:
    from ..types import RunSummary

logger = logging.getLogger(__name__)

__all__ = ["root_cause", "IDLE_NAME", "RootCause", "RootCauseOp"]

NS_PER_MS = 1e6
IDLE_NAME = "[idle]"
_MAX_CELLS = 20_000_000  # (name, step, rank) cells compared, at most (names beyond: the stragglers' lightest)
#: Cells per array at once (16 MB; the median over ranks holds about six such arrays). Each chunk walks every rank's
#: summary, so the chunk count multiplies the rank count: 250k cells made 82 chunks x 16,384 ranks (1.3 M passes,
#: ~30 s) at 16,384 ranks; 2 M make 11.
_CHUNK_CELLS = 2_000_000


@dataclass
class RootCauseOp(Record):
    """An op that took longer on the rank than on the others, over the steps compared."""

    name: str
    kind: str  # cpu_op, user_annotation, kernel, gpu_memcpy, gpu_memset; "none" for [idle]
    excess_ms: float  # summed over the steps compared
    excess_ms_per_step: float
    rank_ms_per_step: float  # self work (see the module docstring)
    others_median_ms_per_step: float
    calls_per_step: float


@dataclass
class RootCause(Record):
    """One straggler's root cause: its ops with the largest excess over the other ranks' median, most first."""

    rank: int
    host: str
    n_steps: int  # steps compared (the rank and at least one other recorded them)
    ops: list[RootCauseOp] = field(default_factory=list)


def _candidates(run: RunSummary, ranks: list[int], max_names: int) -> tuple[list[str], dict[str, str]]:
    """Names the stragglers ran (sorted), at most `max_names` (those they spent most time in), and each one's kind."""
    tot: dict[str, float] = {}
    kinds: dict[str, str] = {}
    for r in ranks:
        s = run.ranks.get(r)
        if s is None:
            continue
        d = np.bincount(s.op_totals["name"], weights=s.op_totals["self_ms"], minlength=len(s.op_names))
        for i, name in enumerate(s.op_names.tolist()):
            tot[name] = tot.get(name, 0.0) + float(d[i])
            kinds.setdefault(name, s.op_kinds[i])
    cand = sorted(tot)
    if len(cand) > max_names:  # bound memory: keep the names the stragglers spent most time in
        order = np.argsort(-np.array([tot[n] for n in cand]), kind="stable")[:max_names]
        cand = sorted(cand[i] for i in order)
    return cand, kinds


def _per_rank_cells(run: RunSummary, all_ranks: np.ndarray, pos: dict[str, int], steps: np.ndarray) -> list:
    """Per rank with op totals: (rank column, its summary, each of its op names' candidate index or −1, which of its
    rows are in the compared steps — None for all of them, as a rank's own steps are). Small (a few hundred ints per
    rank): the cells are built from the summaries a chunk of names at a time, not gathered whole (at 16,384 ranks
    every rank's rows of the candidate names were +700 MB)."""
    parts = []
    for j, r in enumerate(all_ranks.tolist()):
        s = run.ranks.get(int(r))
        if s is None or not s.op_totals["name"].size:
            continue
        in_steps = np.isin(s.op_totals["step"], steps)
        parts.append((j, s, np.array([pos.get(x, -1) for x in s.op_names.tolist()], np.int32),
                      None if in_steps.all() else in_steps))
    return parts


def _fill(parts: list, idle: tuple, steps: np.ndarray, a: int, b: int, n_names: int, nr: int
          ) -> tuple[np.ndarray, np.ndarray]:
    """(ms, calls) per (name, step, rank) for names a..b-1 (index n_names is the [idle] pseudo-op). A pass over the
    ranks per chunk of names: numpy calls on a few hundred rows each (16,384 ranks: 26 s with a set test per rank and
    chunk, 11 s with the rows in the steps found once per rank)."""
    ns = steps.size
    dur = np.zeros((b - a, ns, nr))
    calls = np.zeros((b - a, ns, nr))
    for j, s, name_map, in_steps in parts:
        ot = s.op_totals
        ni = name_map[ot["name"]]
        m = (ni >= a) & (ni < b)
        if in_steps is not None:
            m &= in_steps
        if not m.any():
            continue
        si = np.searchsorted(steps, ot["step"][m])
        dur[ni[m] - a, si, j] = ot["self_ms"][m]
        calls[ni[m] - a, si, j] = ot["calls"][m]
    if a <= n_names < b and idle[0].size:
        dur[n_names - a, idle[0], idle[1]] = idle[2]
    return dur, calls


def _target_cells(present: np.ndarray, j: int) -> np.ndarray:
    """Steps rank column `j` and at least one other rank recorded."""
    return present[:, j] & np.delete(present, j, axis=1).any(axis=1)


def _compare_chunks(parts: list, idle: tuple, steps: np.ndarray, present: np.ndarray, targets: dict[int, int],
                    cells: dict[int, np.ndarray], n_labels: int, n_names: int
                    ) -> dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Per target rank, per chunk of names: its ms, the other ranks' median ms and its calls per (name, step) over
    the steps it is compared on (`cells`). Names go in chunks of at most _CHUNK_CELLS (name, step, rank) cells,
    whatever the rank count."""
    ns, nr = present.shape
    got: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {r: [] for r in targets}
    chunk = max(1, _CHUNK_CELLS // (ns * nr))
    for a in range(0, n_labels, chunk):
        b = min(a + chunk, n_labels)
        dur, calls = _fill(parts, idle, steps, a, b, n_names, nr)
        dur = np.where(present[None], dur, np.nan)
        for r, j in targets.items():
            steps_ok = cells[r]
            if not steps_ok.any():
                continue
            with np.errstate(all="ignore"):
                med = np.nanmedian(np.delete(dur[:, steps_ok, :], j, axis=2), axis=2)
            got[r].append((dur[:, steps_ok, j], med, calls[:, steps_ok, j]))
    return got


def _top_excess_ops(got: list[tuple[np.ndarray, np.ndarray, np.ndarray]], n_ok: int, labels: list[str],
                    kinds: list[str], top_ops: int) -> list[RootCauseOp]:
    """A rank's `top_ops` ops with the largest positive excess, from its chunks `got` over its `n_ok` steps."""
    mine = np.concatenate([g[0] for g in got])  # (names, steps)
    med = np.concatenate([g[1] for g in got])
    calls = np.concatenate([g[2] for g in got])
    excess = np.nansum(mine - med, axis=1)
    order = np.argsort(-excess, kind="stable")
    ops = []
    for k in order[:top_ops]:
        if not excess[k] > 0:
            break
        ops.append(RootCauseOp(name=labels[k], kind=kinds[k], excess_ms=float(excess[k]),
                               excess_ms_per_step=float(excess[k] / n_ok), rank_ms_per_step=float(np.nanmean(mine[k])),
                               others_median_ms_per_step=float(np.nanmean(med[k])),
                               calls_per_step=float(calls[k].mean())))
    return ops


def root_cause(
    run: RunSummary,
    ranks: Sequence[int],
    *,
    top_ops: int = 10,
) -> list[RootCause]:
    """For each rank in `ranks`: its ops with the largest excess of self work over the other ranks' median, same
    steps (one :class:`RootCause` per rank). Op times come from each rank's summary (``summary.TOP_OPS`` heaviest
    names per rank; a name outside a rank's list counts as 0 there).
    """
    ranks = [int(r) for r in ranks]
    if not ranks:
        return []
    bd = run.steps
    all_ranks = np.unique(np.asarray(bd["rank"]))
    steps = np.unique(np.asarray(bd["step"]))
    nr, ns = all_ranks.size, steps.size
    if nr < 2 or ns == 0:
        return [RootCause(r, run.hosts.get(r, "?"), 0) for r in ranks]
    # which (step, rank) exist
    present = np.zeros((ns, nr), bool)
    present[np.searchsorted(steps, bd["step"]), np.searchsorted(all_ranks, bd["rank"])] = True

    cand, kind_of = _candidates(run, ranks, max(1, _MAX_CELLS // (ns * nr)))
    labels = cand + [IDLE_NAME]
    kinds = [kind_of.get(n, "none") for n in cand] + ["none"]
    parts = _per_rank_cells(run, all_ranks, {n: i for i, n in enumerate(cand)}, steps)
    idle = (np.searchsorted(steps, bd["step"]), np.searchsorted(all_ranks, bd["rank"]), np.asarray(bd["idle_ms"]))
    targets = {r: int(np.searchsorted(all_ranks, r)) for r in ranks if r in all_ranks}
    cells = {r: _target_cells(present, j) for r, j in targets.items()}
    got = _compare_chunks(parts, idle, steps, present, targets, cells, len(labels), len(cand))
    out = []
    for r in ranks:
        n_ok = int(cells[r].sum()) if r in all_ranks else 0
        ops = _top_excess_ops(got[r], n_ok, labels, kinds, top_ops) if n_ok else []
        out.append(RootCause(r, run.hosts.get(r, "?"), n_ok, ops))
    return out
