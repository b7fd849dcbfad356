"""Model FLOPs utilisation: achieved TFLOP/s (torch's FLOP counts / step wall time) over the device's peak.

Peaks are dense BF16 tensor-core TFLOP/s from vendor data sheets (no sparsity), matched by case-insensitive substring
of the shard's ``device`` attribute, most specific entry first; when that name is not in the table (an imported
trace's ``gpu 0``, a generic ROCm name), the names in the shard's ``device_properties`` are tried, the rank's own
device (the one its kernels ran on) first. ``--peak-tflops`` overrides for every rank; a rank
whose device is not in the table (every CPU) has no MFU unless overridden. torch counts FLOPs only for a few ops
(``aten::mm/addmm/bmm/baddbmm/conv2d/mul/add``), so MFU here is a lower bound.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from ...record import Record
from ..types import device_properties
from .imbalance import per_rank_metrics

if TYPE_CHECKING:
    from ..types import RunSummary

logger = logging.getLogger(__name__)

__all__ = ["PEAK_TFLOPS", "peak_tflops_for", "device_names", "mfu", "MfuRow"]


@dataclass
class MfuRow(Record):
    """One rank's model FLOPs utilisation (a rank without a known peak has none)."""

    rank: int
    device: str  # the device name the peak was found for
    peak_tflops: float
    peak_source: str  # "override" (--peak-tflops), "run" (the shards), "table" (PEAK_TFLOPS)
    achieved_tflops: float | None
    mfu: float | None  # achieved / peak, a fraction

#: (substring of the device name, dense BF16 TFLOP/s). Ordered: more specific names first.
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100 PCIE", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM
    ("H800", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("V100", 125.0),  # FP16 tensor cores (no BF16)
    ("MI300X", 1307.0),
    ("MI250X", 383.0),
    ("MI250", 362.0),
)


def peak_tflops_for(device: str | None) -> float | None:
    """Peak TFLOP/s for a device name, or None when unknown (CPU included)."""
    if not device:
        return None
    d = str(device).upper()
    for key, peak in PEAK_TFLOPS:
        if key in d:
            return peak
    return None


def device_names(attrs: dict[str, Any], used: Iterable[int] = ()) -> list[str]:
    """Names that may identify a rank's device: its ``device`` attribute, then the ``name`` of each
    ``device_properties`` entry, those whose ``id`` is in `used` first. Distinct, in that order."""
    out = [str(attrs.get("device") or "")]
    entries = device_properties(attrs)
    used = set(used)
    entries.sort(key=lambda p: p.get("id") not in used)  # stable: the rank's devices first
    out += [str(p.get("name") or "") for p in entries]
    return [n for i, n in enumerate(out) if n and n not in out[:i]]


def mfu(run: RunSummary, *, peak_tflops: float | None = None) -> list[MfuRow]:
    """One row per rank where a peak is known.

    Peak source, first match: ``override`` (`peak_tflops`), ``run`` (``run.device_peak_tflops``), ``table``.
    """
    pr = per_rank_metrics(run.steps)
    out = []
    for i, r in enumerate(pr["rank"].tolist()):
        attrs = run.attrs.get(r, {})
        device = str(attrs.get("device", "") or "")
        if peak_tflops is not None:
            peak, src = float(peak_tflops), "override"
        elif r in run.device_peak_tflops:
            peak, src = float(run.device_peak_tflops[r]), "run"
        else:
            peak, src = None, "table"
            used = run.ranks[r].used_devices if r in run.ranks else []
            for name in device_names(attrs, used):
                peak = peak_tflops_for(name)
                if peak is not None:
                    device = name
                    break
        if peak is None or peak <= 0:
            continue
        achieved = float(pr["tflops"][i])
        ok = bool(np.isfinite(achieved))
        out.append(MfuRow(rank=int(r), device=device, peak_tflops=peak, peak_source=src,
                          achieved_tflops=achieved if ok else None, mfu=achieved / peak if ok else None))
    return out
