"""The terminal report's tables of one row per rank: communication overlap, GPU time, MFU, the imbalance across
ranks and the user annotations.

Bounded whatever the rank count: up to ``MAX_RANK_ROWS`` ranks each get a row; beyond, one line of the distribution
(min, median, p90, max, with the extreme ranks named). Every per-rank
figure stays in report.json. The sections given here are already terminal-safe (:func:`.console_text.terminal_safe`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..analysis.names import display_name
from .console_text import Style, fmt, name, table, wrap

if TYPE_CHECKING:
    from ..analysis.cross.annotations import Annotation
    from ..analysis.cross.imbalance import Imbalance
    from ..analysis.cross.mfu import MfuRow
    from ..analysis.cross.overlap import OverlapRow
    from ..analysis.rank.gpu_time import GpuTime

__all__ = ["MAX_OUTLIERS", "MAX_RANK_ROWS", "annotation_lines", "gpu_time_lines", "imbalance_lines", "many_ranks",
           "mfu_lines", "overlap_lines", "per_rank", "spread_lines"]

#: Ranks listed one row each; beyond, a distribution and the outliers.
MAX_RANK_ROWS = 8
#: Outliers (ranks, hosts, pipelines) named when there are too many to list.
MAX_OUTLIERS = 3
_MAX_ANNOTATIONS = 10
#: How each imbalance metric is printed.
_IMBALANCE_FMT = {"compute_ms": "{:.2f}", "flops": "{:.3g}", "tflops": "{:.4f}", "peak_mem_bytes": "{:.3g}",
                  "step_ms": "{:.2f}"}


def _quantiles(items: Sequence[Any], key: Callable[[Any], Any], spec: str) -> str:
    """'min X (rank a), median Y, p90 Z, max W (rank b)' of key(item) over the items (with a ``rank``) that have it."""
    vals = sorted(((key(x), x.rank) for x in items if key(x) is not None), key=lambda v: v[0])
    if not vals:
        return "no values"
    n = len(vals)

    def at(q: float):
        return vals[min(n - 1, int(q * (n - 1) + 0.5))][0]

    return (f"min {spec.format(vals[0][0])} (rank {vals[0][1]}), median {spec.format(at(0.5))}, p90 "
            f"{spec.format(at(0.9))}, max {spec.format(vals[-1][0])} (rank {vals[-1][1]})")


def per_rank(title: str, header: list[str], items: Sequence[Any], row: Callable[[Any], list[str]]) -> list[str]:
    """A titled table of one row per rank (used up to ``MAX_RANK_ROWS`` ranks; beyond, :func:`spread_lines`)."""
    if not items:
        return []
    return [title] + table(header, [row(x) for x in items])


def overlap_lines(rows: list[OverlapRow]) -> list[str]:
    return per_rank(
        "Communication overlap per rank",
        ["rank", "mode", "comm ms/step", "exposed ms/step", "overlap", "exposed of step"], rows,
        lambda o: [str(o.rank), o.mode, fmt(o.comm_ms_per_step, "{:.2f}"), fmt(o.exposed_comm_ms_per_step, "{:.2f}"),
                   fmt(o.overlap_pct, "{:.1f}%"), fmt(o.exposed_pct, "{:.1f}%")])


def gpu_time_lines(rows: list[GpuTime]) -> list[str]:
    return per_rank(
        "GPU time per rank (HTA's temporal breakdown and comm/comp overlap, all recorded steps)",
        ["rank", "span ms", "idle", "compute", "non-compute", "comm overlap"], rows,
        lambda g: [str(g.rank), fmt(g.span_us / 1e3, "{:.1f}"), fmt(g.idle_pct, "{:.2f}%"),
                   fmt(g.compute_pct, "{:.2f}%"), fmt(g.non_compute_pct, "{:.2f}%"), fmt(g.overlap_pct, "{:.2f}%")])


def mfu_lines(rows: list[MfuRow], st: Style) -> list[str]:
    return per_rank(
        st.bold("MFU"), ["rank", "device", "TFLOP/s", "peak", "MFU", "peak from"], rows,
        lambda m: [str(m.rank), name(m.device), fmt(m.achieved_tflops, "{:.2f}"), fmt(m.peak_tflops, "{:.0f}"),
                   fmt(None if m.mfu is None else 100 * m.mfu, "{:.1f}%"), m.peak_source])


def many_ranks(*sections: Sequence[Any]) -> bool:
    """Whether the per-rank sections have too many ranks for a row each."""
    return max((len(x) for x in sections), default=0) > MAX_RANK_ROWS


def spread_lines(overlap: list[OverlapRow], gpu_time: list[GpuTime], mfu: list[MfuRow], st: Style) -> list[str]:
    """With many ranks, one block in place of the per-rank tables: per measure, its distribution over the ranks
    (min, median, p90, max, the extreme ranks named)."""
    parts = [(rows, key, label, spec) for rows, key, label, spec in (
        (overlap, lambda o: o.exposed_pct, "exposed communication, % of step", "{:.1f}%"),
        (gpu_time, lambda g: g.idle_pct, "GPU idle, % of span (HTA)", "{:.2f}%"),
        (mfu, lambda m: m.mfu, "MFU", "{:.1%}")) if rows]
    if not parts:
        return []
    n = max(len(p[0]) for p in parts)
    out = [st.bold(f"Per rank, over {n} ranks") + " (each rank's row in report.json)"]
    for rows, key, label, spec in parts:
        out += wrap(f"{label}: {_quantiles(rows, key, spec)}", "  ", "    ")
    return out


def imbalance_lines(imb: Imbalance | None) -> list[str]:
    """One row per metric: its min, mean, max (and the rank), lambda, CV and LB over the ranks."""
    if imb is None or not imb.metrics:
        return []
    rows = []
    for metric, m in imb.metrics.items():
        if m.mean is None:
            continue
        spec = _IMBALANCE_FMT.get(metric, "{:.3g}")
        rows.append([metric, fmt(m.min, spec), fmt(m.mean, spec), f"{fmt(m.max, spec)} (rank {m.max_rank})",
                     fmt(None if m.lambda_ is None else 100 * m.lambda_, "{:.1f}%"), fmt(m.cv, "{:.3f}"),
                     fmt(m.lb, "{:.3f}")])
    return ["Imbalance across ranks"] + table(["metric", "min", "mean", "max", "lambda", "CV", "LB"], rows)


def annotation_lines(ann: list[Annotation], st: Style) -> list[str]:
    """The user annotations' ms per step: per rank with few ranks, else their min, mean and max over the ranks."""
    if not ann:
        return []
    ranks = sorted({r for a in ann for r in a.ranks}, key=int)
    each = len(ranks) <= MAX_RANK_ROWS
    header = ["annotation"] + ([f"r{r} ms" for r in ranks] if each else ["min ms", "mean ms", "max ms"])
    rows = []
    for a in ann[:_MAX_ANNOTATIONS]:
        vals = [a.ranks[r].ms_per_step if r in a.ranks else 0.0 for r in ranks]
        calls = [c.count_per_step for c in a.ranks.values()]
        cells = [fmt(v, "{:.2f}") for v in vals] if each else [
            fmt(min(vals), "{:.2f}"), fmt(sum(vals) / len(vals), "{:.2f}"), fmt(max(vals), "{:.2f}")]
        rows.append([display_name(a.name, 40)] + cells + [fmt(max(calls) if calls else None, "{:.1f}"),
                                                          fmt(a.spread_pct, "{:.0f}%")])
    out = [st.bold("User annotations (record_function), ms per step")] + table(header + ["calls/step", "spread"], rows)
    if len(ann) > _MAX_ANNOTATIONS:
        out.append(st.dim(f"  ... {len(ann) - _MAX_ANNOTATIONS} more in report.json"))
    return out
