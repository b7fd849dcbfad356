"""Pipeline parallelism: the stages, how long each waits for the others per step, and which stage holds them.

From the matched point-to-point transfers (``RunSummary.p2p``, inside the steps selection):

* **Pipelines** are the connected groups of ranks that send to each other. A pipeline's **stage order** starts at
  the rank whose first transfer in a step is a send most often (stage 0 sends the first micro-batch's activations)
  and follows, from each stage, the not yet ordered peer it sends to first; it holds for straight pipelines and
  for the ring of an interleaved schedule.
* Per stage and step: ``busy_ms`` — its compute (the step breakdown's ``compute_ms``); ``wait_ms`` — the **bubble**:
  the time it waited on receives for a peer that had not sent yet (``P2PPairs.recv_wait_ns`` summed over the step's
  transfers it received); ``caused_ms`` — the waiting its own sends caused its receivers; ``p2p_ms`` — its time in
  transfers (sends and receives, waits included). Stages are reported with medians over steps.
* ``micro_batches`` — transfers per step from stage 0 to stage 1 (median over steps); with S stages and M
  micro-batches the fill-and-drain bubble of GPipe and 1F1B is ``(S − 1) / (M + S − 1)`` of the step
  (``ideal_bubble_pct``, for comparison).
* ``bottleneck_rank`` — the stage with the most compute per step; ``imbalance_pct`` — its compute over the median
  stage's, minus 1.

The ``pipeline_bubble`` finding reads this (``findings.pipeline``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import numpy as np

from ...record import Record
from ..groupstats import group_median

if TYPE_CHECKING:
    from ..types import RunSummary

__all__ = ["PipelineStage", "Pipeline", "pipelines"]

NS_PER_MS = 1e6


@dataclass
class PipelineStage(Record):
    stage: int
    rank: int
    host: str
    n_steps: int
    step_ms: float  # medians over its steps
    busy_ms: float
    wait_ms: float
    wait_pct: float
    caused_ms: float
    p2p_ms: float  # time in its point-to-point transfers (sends and receives, waits included)
    sends_per_step: float
    recvs_per_step: float


@dataclass
class Pipeline(Record):
    ranks: list[int]  # in stage order
    stages: list[PipelineStage]
    micro_batches: float
    ideal_bubble_pct: float | None
    bubble_pct: float  # mean over stages of wait_pct
    bottleneck_rank: int
    imbalance_pct: float
    median_busy_ms: float
    holds_rank: int  # the stage whose sends the others waited for most
    n_transfers: int


def _components(src: np.ndarray, dst: np.ndarray) -> list[list[int]]:
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in zip(src.tolist(), dst.tolist()):
        parent[find(a)] = find(b)
    groups: dict[int, list[int]] = {}
    for r in list(parent):
        groups.setdefault(find(r), []).append(r)
    return [sorted(g) for g in groups.values() if len(g) >= 2]


def _stage_order(ranks: list[int], src, dst, t_send, t_recv, step_s, step_r) -> list[int]:
    """Stage 0: the rank whose first transfer of a step is a send most often; then each stage's first target."""
    who = np.r_[src, dst]
    step = np.r_[step_s, step_r]
    t = np.r_[t_send, t_recv]
    is_send = np.r_[np.ones(src.size, bool), np.zeros(dst.size, bool)]
    o = np.lexsort((t, step, who))
    who, step, is_send = who[o], step[o], is_send[o]
    first = np.r_[True, (who[1:] != who[:-1]) | (step[1:] != step[:-1])]
    counts = dict(zip(*np.unique(who[first & is_send], return_counts=True)))
    order = [max(ranks, key=lambda r: (int(counts.get(r, 0)), -r))]
    # per sender, its targets by their first send
    o = np.lexsort((t_send, src))
    targets: dict[int, list[int]] = {}
    for a_, d_ in zip(src[o].tolist(), dst[o].tolist()):
        lst = targets.setdefault(a_, [])
        if d_ not in lst:
            lst.append(d_)
    placed = set(order)
    while len(order) < len(ranks):
        nxt = next((d_ for d_ in targets.get(order[-1], []) if d_ not in placed), None)
        if nxt is None:  # a dead end: the rest by rank
            order += [r for r in ranks if r not in placed]
            break
        order.append(nxt)
        placed.add(nxt)
    return order


class _RankSteps:
    """Sums over (rank, step) cells of the steps table, for values given per transfer."""

    def __init__(self, st) -> None:
        self.rank = np.asarray(st["rank"], np.int64)
        self.step = np.asarray(st["step"], np.int64)
        code = (self.rank << 32) + (self.step & 0xFFFFFFFF)
        self.order = np.argsort(code, kind="stable")
        self.code = code[self.order]

    def sum(self, rank: np.ndarray, step: np.ndarray, values: np.ndarray | None = None) -> np.ndarray:
        code = (np.asarray(rank, np.int64) << 32) + (np.asarray(step, np.int64) & 0xFFFFFFFF)
        pos = np.searchsorted(self.code, code)
        ok = (pos < self.code.size) & (step >= 0)
        ok[ok] = self.code[pos[ok]] == code[ok]
        out = np.zeros(self.code.size)
        w = np.ones(code.size) if values is None else np.asarray(values, np.float64)
        np.add.at(out, pos[ok], w[ok])
        res = np.empty_like(out)
        res[self.order] = out
        return res


def _transfers(run: RunSummary) -> dict[str, np.ndarray] | None:
    """The matched pairs inside the steps selection and in a step on either end: src, dst, ts / tr (send / receive
    start), ss / sr (send / receive step), wait (ms the receive waited), d_send / d_recv (ms in each end). None
    when there is none."""
    p = run.p2p
    if not len(p):
        return None
    sel = np.ones(len(p), bool)
    if run.steps_selection is not None:
        lo, hi = run.steps_selection
        sel = (p.send_step >= lo) & (p.send_step <= hi)
    sel &= (p.send_step >= 0) | (p.recv_step >= 0)
    if not sel.any():
        return None
    ts, tr = p.send_start_ns[sel], p.recv_start_ns[sel]
    return {"src": p.src[sel], "dst": p.dst[sel], "ts": ts, "tr": tr, "ss": p.send_step[sel], "sr": p.recv_step[sel],
            "wait": p.recv_wait_ns[sel] / NS_PER_MS, "d_send": (p.send_end_ns[sel] - ts) / NS_PER_MS,
            "d_recv": (p.recv_end_ns[sel] - tr) / NS_PER_MS}


def _step_cells(run: RunSummary, t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per row of the steps table: its rank, step and compute ms, and the transfers `t` summed over it — wait (on
    its receives), caused (by its sends), p2p (ms in both ends), send and recv (counts)."""
    st = run.steps
    cells = _RankSteps(st)
    src, dst, ss, sr = t["src"], t["dst"], t["ss"], t["sr"]
    return {"rank": cells.rank, "step_ms": np.asarray(st["step_ms"], np.float64),
            "busy": np.asarray(st["compute_ms"], np.float64), "wait": cells.sum(dst, sr, t["wait"]),
            "caused": cells.sum(src, ss, t["wait"]),
            "p2p": cells.sum(src, ss, t["d_send"]) + cells.sum(dst, sr, t["d_recv"]),
            "send": cells.sum(src, ss), "recv": cells.sum(dst, sr)}


#: The stage figures that are medians over a rank's steps, by the step cells' column each is taken of.
MEDIANS = {"step_ms": "step_ms", "busy_ms": "busy", "wait_ms": "wait", "caused_ms": "caused", "p2p_ms": "p2p",
           "sends_per_step": "send", "recvs_per_step": "recv"}


class _RankMedians:
    """Per rank of the step cells: its number of steps and the median over them of each stage figure (np.median's
    values, NaN where a rank's steps hold one), all ranks at once: one sort per figure, where a call of np.median per
    stage and figure took 0.28 s of the pipelines' 0.6 s at 1,024 ranks in 256 pipelines."""

    def __init__(self, c: dict[str, np.ndarray]):
        self.ranks, idx = np.unique(c["rank"], return_inverse=True)
        idx = idx.reshape(-1)
        n = self.ranks.size
        self.n_steps = np.bincount(idx, minlength=n)
        cols = {fig: c[col] for fig, col in MEDIANS.items()}
        cols["wait_frac"] = c["wait"] / np.maximum(c["step_ms"], 1e-9)
        self.median = {fig: _median_by(idx, np.asarray(v, np.float64), n) for fig, v in cols.items()}

    def index(self, rank: int) -> int | None:
        """The row of `rank`, None when it has no steps."""
        i = int(np.searchsorted(self.ranks, rank))
        return i if i < self.ranks.size and self.ranks[i] == rank else None


def _median_by(idx: np.ndarray, v: np.ndarray, n: int) -> np.ndarray:
    """Per group of `idx`: np.median of its values (NaN when one of them is)."""
    med = group_median(idx, v, n)
    med[np.bincount(idx[np.isnan(v)], minlength=n) > 0] = np.nan
    return med


def _stages(run: RunSummary, order: list[int], med: _RankMedians) -> list[PipelineStage]:
    """The stages of one pipeline, in stage `order`, from the ranks' medians (ranks without steps are left out)."""
    stages = []
    for k, r in enumerate(order):
        i = med.index(r)
        if i is None:
            continue
        figs = {fig: float(med.median[fig][i]) for fig in MEDIANS}
        stages.append(PipelineStage(stage=k, rank=int(r), host=str(run.hosts.get(int(r), "?")),
                                    n_steps=int(med.n_steps[i]), wait_pct=100.0 * float(med.median["wait_frac"][i]),
                                    **figs))
    return stages


def _pipeline(ranks: list[int], order: list[int], stages: list[PipelineStage], t: dict[str, np.ndarray]) -> Pipeline:
    """One pipeline from its stages: micro-batches, ideal and measured bubble, bottleneck, the stage that holds it."""
    src, dst, ss = t["src"], t["dst"], t["ss"]
    s0, s1 = order[0], order[1]
    first_hop = ss[(src == s0) & (dst == s1) & (ss >= 0)]
    mb = float(np.median(np.unique(first_hop, return_counts=True)[1])) if first_hop.size else 0.0
    n_st = len(stages)
    ideal = 100.0 * (n_st - 1) / (mb + n_st - 1) if mb > 0 else None
    busy = np.array([s.busy_ms for s in stages])
    bott = stages[int(np.argmax(busy))]
    med_busy = float(np.median(busy))
    holds = max(stages, key=lambda s: (s.caused_ms, -s.stage))
    return Pipeline(
        ranks=[s.rank for s in stages], stages=stages, micro_batches=mb, ideal_bubble_pct=ideal,
        bubble_pct=float(np.mean([s.wait_pct for s in stages])), bottleneck_rank=bott.rank,
        imbalance_pct=100.0 * (bott.busy_ms / med_busy - 1) if med_busy > 0 else 0.0, median_busy_ms=med_busy,
        holds_rank=holds.rank,
        n_transfers=int(np.count_nonzero(np.isin(src, ranks))))


def pipelines(run: RunSummary) -> list[Pipeline]:
    """The run's pipelines (see the module docstring); [] when no ranks send to each other."""
    t = _transfers(run)
    if t is None:
        return []
    med = _RankMedians(_step_cells(run, t))
    out = []
    for ranks, mine in _by_component(t):
        order = _stage_order(ranks, mine["src"], mine["dst"], mine["ts"], mine["tr"], mine["ss"], mine["sr"])
        stages = _stages(run, order, med)
        if len(stages) >= 2:
            out.append(_pipeline(ranks, order, stages, mine))
    return out


def _by_component(t: dict[str, np.ndarray]) -> Iterator[tuple[list[int], dict[str, np.ndarray]]]:
    """Each pipeline's ranks and its own transfers (a transfer's ends are in one component): each pipeline reads
    its own rows, not every pipeline's (256 pipelines of 1,024 ranks: 10 of a 28 s report when each read all)."""
    comps = _components(t["src"], t["dst"])
    if not comps:
        return
    comp = np.full(max(max(g) for g in comps) + 1, -1, np.int64)
    for k, ranks in enumerate(comps):
        comp[ranks] = k
    of = comp[t["src"]]  # matched pairs: both ends are known ranks of one component
    o = np.argsort(of, kind="stable")
    bounds = np.searchsorted(of[o], np.arange(len(comps) + 1))
    for k, ranks in enumerate(comps):
        rows = o[bounds[k]:bounds[k + 1]]
        yield ranks, {key: v[rows] for key, v in t.items()}
