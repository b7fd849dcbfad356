"""Slow hosts: a host's arrival is its last rank's, and the ranks' rule, applied to hosts, names slow ones.

Per instance, a host's lateness is its latest rank's arrival minus the median of the other hosts' arrivals; its
lateness in a step follows as for ranks (:mod:`.lateness`) and the same rule and floor (:mod:`.rule`) name slow hosts,
only when there are at least two hosts. A host's blame is the waits of the other hosts' ranks for its ranks, each
waiting rank's overlapping waits once (:mod:`.blame`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...groupstats import group_median
from ...narrow import narrow
from .blame import union_ms
from .lateness import Cells, step_lateness
from .peers import excess_by
from .result import StragglerHost
from .rule import late_in_steps

if TYPE_CHECKING:
    from ...types import RunSummary
    from .blame import Waits
    from .instances import Table
    from .rule import StragglerRule

__all__ = ["host_table"]

NS_PER_MS = 1e6


def _host_lateness_ms(t: Table, ih: Cells) -> np.ndarray:
    """Per (instance, host) cell: the host's arrival (its last rank's) minus the median of the other hosts' arrivals
    in the instance (ms; 0 where the instance saw one host)."""
    a_host = ih.max(t["behind_first_ns"].astype(np.float64))  # arrivals after the instance's first
    inst_of = ih.step
    n_hosts = np.bincount(inst_of)[inst_of]
    return np.where(n_hosts >= 2, excess_by(inst_of, a_host) / NS_PER_MS, 0.0)


def _host_blame(w: Waits, host_at: np.ndarray, n_hosts: int) -> np.ndarray:
    """Per host: the union, per waiting rank of another host and step, of its waits for the host's ranks (ms).
    `host_at`: per rank id, its host's index (each interval's host is one gather: sorting the intervals' ranks to
    find them held 1.2 M-row copies at 1,024 LLM-shaped ranks)."""
    if w.lo.size == 0:
        return np.zeros(n_hosts)
    hc = host_at[w.culprit]
    other = host_at[w.waiter] != hc
    (_, hk, _), ms = union_ms((w.waiter[other], hc[other], w.skey[other]), w.lo[other], w.hi[other])
    return np.bincount(hk, weights=ms, minlength=n_hosts)


def host_table(run: RunSummary, t: Table, skey: np.ndarray, w: Waits, thr: float, rule: StragglerRule,
               ranks: np.ndarray, ridx: np.ndarray) -> list[StragglerHost]:
    """Host table, one row per host, named first, then by blame (instance rows ``t`` sorted by instance, their step
    keys, the waits; `ranks` the distinct ranks and `ridx` each row's index among them)."""
    host_of = {int(r): str(h) for r, h in run.hosts.items()}
    hosts, of_rank = np.unique(np.array([host_of.get(int(r), "?") for r in ranks.tolist()], dtype=str),
                               return_inverse=True)  # each distinct rank's host looked up once
    of_rank = narrow(of_rank.reshape(-1))  # int32: hosts are few
    hidx = of_rank[ridx]  # per instance row
    nh = hosts.size
    ih = Cells(t["inst"], hidx, nh)  # (instance, host) cells
    del hidx
    h_lat = _host_lateness_ms(t, ih)
    inst = t["inst"]
    inst_first_row = np.flatnonzero(np.r_[True, inst[1:] != inst[:-1]])  # rows are sorted by instance
    cells = Cells(skey[inst_first_row][ih.step], ih.group, nh)  # (step, host) cells
    sl = step_lateness(cells, h_lat)
    n, late_steps, passes = late_in_steps(cells, sl.lateness, nh, thr, rule)
    median = group_median(cells.group, sl.lateness, nh)
    n_inst_h = np.maximum(np.bincount(ih.group, minlength=nh), 1)
    late_frac = np.bincount(ih.group, weights=ih.max(t["is_last"].astype(float)), minlength=nh) / n_inst_h
    host_at = np.zeros(int(ranks.max()) + 1, of_rank.dtype)  # per rank id (the waits' ranks are the rows')
    host_at[ranks] = of_rank
    blame = _host_blame(w, host_at, nh)
    ranks_of: dict = {}
    for r, hn in host_of.items():  # each host's ranks in one pass (a pass per host was hosts x ranks)
        ranks_of.setdefault(hn, []).append(r)
    out = [StragglerHost(host=str(hosts[h]), ranks=sorted(ranks_of.get(hosts[h], [])),
                         blame_ms=float(blame[h]), lateness_ms=float(median[h]), late_fraction=float(late_frac[h]),
                         late_step_fraction=float(late_steps[h]), named=bool(nh >= 2 and passes[h]))
           for h in range(nh)]
    out.sort(key=lambda d: (not d.named, -d.blame_ms, d.host))
    return out
