"""How work is dealt out to MPI processes: one rule for the report engine (ranks by event count) and the import
(trace files by size)."""

from __future__ import annotations

from typing import Sequence

__all__ = ["deal"]


def deal(costs: Sequence[int], n_procs: int) -> list[list[int]]:
    """Indices of `costs` dealt out to `n_procs` processes: largest first, each to the least-loaded one (ties: the
    lower index); every share in index order."""
    shares: list[list[int]] = [[] for _ in range(n_procs)]
    load = [0] * n_procs
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        p = min(range(n_procs), key=lambda k: (load[k], k))
        shares[p].append(i)
        load[p] += costs[i]
    return [sorted(s) for s in shares]
