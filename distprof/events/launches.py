"""Which CPU call launched a device event: the one home of the launch ↔ kernel link.

A kernel, memcpy or memset on a device stream and the runtime or driver call that launched it (``cudaLaunchKernel``,
``cuLaunchKernel``, ``hipLaunchKernel``, a PrivateUse1 runtime's) carry the same correlation id. Table building
(a device event's step is its launch's; the communication ops around a kernel's launch), the timeline (flow arrows)
and the Kineto export (``ac2g`` flows, External ids) all ask :func:`launch_rows`.
"""

from __future__ import annotations

import numpy as np

from ..storage import schema

__all__ = ["LAUNCH_KINDS", "launch_rows"]

#: Kinds of the host-side calls that launch device work.
LAUNCH_KINDS = tuple(schema.KIND_CODE[k] for k in ("cuda_runtime", "cuda_driver", "privateuse1_runtime",
                                                    "privateuse1_driver"))


def launch_rows(kind: np.ndarray, device: np.ndarray, corr: np.ndarray, targets: np.ndarray,
                group: np.ndarray | None = None) -> np.ndarray:
    """For each row of `targets`, the row of the host call that launched it — a ``LAUNCH_KINDS`` row on the host
    (``device`` < 0) with the same non-zero correlation id, and the same `group` value when given (e.g. rank and
    window: correlation ids restart per process and trace); the last such row when an id repeats. −1 when none."""
    kind, device = np.asarray(kind), np.asarray(device)
    corr = np.asarray(corr, np.int64)
    targets = np.asarray(targets, np.int64)
    out = np.full(targets.size, -1, np.int64)
    if not targets.size:
        return out
    cand = np.flatnonzero(np.isin(kind, LAUNCH_KINDS) & (device < 0) & (corr != 0))
    if not cand.size:
        return out
    g = np.zeros(corr.size, np.int64) if group is None else np.asarray(group, np.int64)
    # sort candidates by (group, corr, row): the last row of a key is the one kept
    o = np.lexsort((cand, corr[cand], g[cand]))
    cand = cand[o]
    ck_g, ck_c = g[cand], corr[cand]
    tg, tc = g[targets], corr[targets]
    # search (group, corr) pairs: group-major, then corr within the group
    lo = np.searchsorted(ck_g, tg, side="left")
    hi = np.searchsorted(ck_g, tg, side="right")
    pos = np.empty(targets.size, np.int64)
    for gv in np.unique(tg).tolist():
        m = tg == gv
        a, b = int(lo[m][0]), int(hi[m][0])
        pos[m] = a + np.searchsorted(ck_c[a:b], tc[m], side="right") - 1
        pos[m] = np.where(pos[m] >= a, pos[m], -1)
    ok = (pos >= 0) & (tc != 0)
    ok[ok] = ck_c[pos[ok]] == tc[ok]
    out[ok] = cand[pos[ok]]
    return out
