"""Slow hosts: a host's arrival is its last rank's, and the ranks' naming rule, applied to hosts, names slow ones.

Per instance, a host's lateness is its latest rank's arrival minus the median of the other hosts' arrivals; the same
rule (excess, consistency, bound: :mod:`.consistency`) names slow hosts, only when there are at least two hosts.
Every rank of a slow node is late in most steps, so all of them are named although each arrives last only part of the
time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .cells import Cells, excess
from .consistency import consistency
from .peers import excess_by
from .result import StragglerHost

if TYPE_CHECKING:
    from ...types import RunSummary
    from .instances import Table
    from .rule import StragglerRule

__all__ = ["host_table"]

NS_PER_MS = 1e6


def _host_lateness_ms(t: Table, ih: Cells) -> np.ndarray:
    """Per (instance, host) cell: the host's arrival (its last rank's) minus the median of the other hosts' arrivals
    in the instance (ms; 0 where the instance saw one host)."""
    a_host = ih.max(t["arrival_ns"] - t["arrival_ns"][t["pos"] == 0][t["inst"]])
    inst_of = ih.step
    n_hosts = np.bincount(inst_of)[inst_of]
    return np.where(n_hosts >= 2, excess_by(inst_of, a_host) / NS_PER_MS, 0.0)


def host_table(run: RunSummary, t: Table, skey: np.ndarray, blame_row: np.ndarray, thr: float,
               rule: StragglerRule) -> list[StragglerHost]:
    """Host table, one row per host, named first, then by blame (instance rows ``t``, their step keys and blame)."""
    host_of = np.array([str(run.hosts.get(int(r), "?")) for r in t["rank"]], dtype=object).astype(str)
    hosts, hidx = np.unique(host_of, return_inverse=True)
    hidx = hidx.reshape(-1)
    nh = hosts.size
    blame = np.bincount(hidx, weights=blame_row, minlength=nh)
    ih = Cells(t["inst"], hidx, nh)  # (instance, host) cells
    h_lat = _host_lateness_ms(t, ih)
    last_host = ih.max(t["is_last"].astype(float))
    inst_first_row = np.unique(t["inst"], return_index=True)[1]
    cells = Cells(skey[inst_first_row][ih.step], ih.group, nh)  # (step, host) cells
    c_lat = cells.max(h_lat)
    cons = consistency(cells, excess(cells, c_lat), nh, thr, rule, 0.0)
    den = np.maximum(cons.n_steps, 1)
    mean = np.bincount(cells.group, weights=c_lat, minlength=nh) / den
    late_steps = np.bincount(cells.group, weights=(c_lat >= thr).astype(float), minlength=nh) / den
    n_inst_h = np.maximum(np.bincount(ih.group, minlength=nh), 1)
    late_frac = np.bincount(ih.group, weights=last_host, minlength=nh) / n_inst_h
    out = [
        StragglerHost(
            host=str(hosts[h]), ranks=sorted(int(r) for r, hn in run.hosts.items() if hn == hosts[h]),
            blame_ms=float(blame[h]), mean_lateness_ms=float(mean[h]), mean_excess_ms=float(cons.mean_excess[h]),
            excess_bound_ms=None if np.isnan(cons.excess_bound[h]) else float(cons.excess_bound[h]),
            late_fraction=float(late_frac[h]), late_step_fraction=float(late_steps[h]),
            named=bool(nh >= 2 and mean[h] >= thr and cons.passes[h]))
        for h in range(nh)
    ]
    out.sort(key=lambda d: (not d.named, -d.blame_ms, d.host))
    return out
