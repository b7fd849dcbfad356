"""Terminal lines for the cross-rank critical path, the what-if table and a finding's estimated gain (report.json
``critical_path``, ``whatif``, ``findings[].estimated_gain_ms_per_step``). A handful of lines whatever the rank count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from .console_text import fmt, wrap

if TYPE_CHECKING:
    from ..analysis.findings.finding import Finding
    from ..analysis.graph.path_report import CriticalPathReport
    from ..analysis.graph.whatif import WhatIf

__all__ = ["critical_path_lines", "whatif_lines", "gain_text", "WHATIF_ROWS"]

#: What-if rows shown (all are in report.json).
WHATIF_ROWS = 5
#: Ranks and transfers on the critical path named.
_PATH_RANKS = 4
_PATH_COMMS = 2


def gain_text(f: Finding) -> str | None:
    """'Estimated gain if fixed: X ms per step (step A -> B ms)', or None where no change models the finding."""
    g, p = f.estimated_gain_ms_per_step, f.predicted_step_ms
    if g is None or p is None:
        return None
    return f"Estimated gain if fixed: {g:.1f} ms per step (step {p + g:.1f} -> {p:.1f} ms, replay of the step graph)"


def critical_path_lines(cp: CriticalPathReport | None, bold: Callable[[str], str]) -> list[str]:
    """The ranks the critical path runs through most, and the transfers on it (nothing for a run without steps)."""
    if cp is None or not cp.n_steps:
        return []
    on = ", ".join(f"rank {r.rank} {fmt(r.ms_per_step)} ms ({fmt(r.share_pct, '{:.0f}')}%)"
                   for r in cp.ranks[:_PATH_RANKS])
    more = (cp.n_ranks_on_path or 0) - min(len(cp.ranks), _PATH_RANKS)
    ctext = ", ".join(f"{c.op} {fmt(c.ms_per_step)} ms" for c in cp.comm[:_PATH_COMMS])
    head = "Critical path"
    out = wrap(f"{head} (per step, median {fmt(cp.length_ms_median)} ms): runs through "
               + (on or "no rank's work") + (f" and {more} more rank(s)" if more > 0 else ""), "", "  ")
    out[0] = bold(head) + out[0][len(head):]
    if ctext:
        out.append(f"  transfers on it: {ctext}")
    return out


def whatif_lines(whatif: list[WhatIf] | None, bold: Callable[[str], str]) -> list[str]:
    """The changes the replay could predict, the largest gain first: the predicted step and the gain."""
    rows = [w for w in whatif or [] if w.predicted_step_ms is not None]
    if not rows:
        return []
    out = [bold("What if") + f" (step now {fmt(rows[0].measured_step_ms)} ms; replay of the step graph)"]
    for w in rows[:WHATIF_ROWS]:
        out.append(f"  {_cut(w.description, 60):<60}  {fmt(w.predicted_step_ms):>7} ms  "
                   f"gain {fmt(w.gain_ms_per_step):>6} ms ({fmt(w.gain_pct, '{:.0f}')} %)")
    return out


def _cut(text: str, width: int) -> str:
    """`text` in at most `width` characters, cut at a word with an ellipsis (the whole text is in report.json)."""
    if len(text) <= width:
        return text
    return text[:width - 1].rsplit(" ", 1)[0].rstrip(" ,:;(") + "..."
