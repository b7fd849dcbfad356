"""Terminal lines for the cross-rank critical path, the what-if table and a finding's estimated gain (report.json
``critical_path``, ``whatif``, ``findings[].estimated_gain_ms_per_step``). A handful of lines whatever the rank count.
"""

from __future__ import annotations

from typing import Any

__all__ = ["critical_path_lines", "whatif_lines", "gain_text", "WHATIF_ROWS"]

#: What-if rows shown (all are in report.json).
WHATIF_ROWS = 5


def _f(x: Any, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def gain_text(f: dict[str, Any]) -> str | None:
    """'Estimated gain if fixed: X ms per step (step A -> B ms)', or None where no change models the finding."""
    g, p = f.get("estimated_gain_ms_per_step"), f.get("predicted_step_ms")
    if g is None or p is None:
        return None
    return f"Estimated gain if fixed: {g:.1f} ms per step (step {p + g:.1f} -> {p:.1f} ms, replay of the step graph)"


def critical_path_lines(report: dict[str, Any], bold) -> list[str]:
    cp = report.get("critical_path") or {}
    if not cp.get("n_steps"):
        return []
    ranks = cp.get("ranks") or []
    on = ", ".join(f"rank {r['rank']} {_f(r.get('ms_per_step'))} ms ({_f(r.get('share_pct'), '{:.0f}')} %)"
                   for r in ranks[:4])
    more = cp.get("n_ranks_on_path", 0) - min(len(ranks), 4)
    comm = cp.get("comm") or []
    ctext = ", ".join(f"{c['op']} {_f(c.get('ms_per_step'))} ms" for c in comm[:2])
    out = [bold("Critical path") + f" (per step, median {_f(cp.get('length_ms_median'))} ms): runs through "
           + (on or "no rank's work") + (f" and {more} more rank(s)" if more > 0 else "")]
    if ctext:
        out.append(f"  transfers on it: {ctext}")
    return out


def whatif_lines(report: dict[str, Any], bold) -> list[str]:
    rows = [w for w in report.get("whatif") or [] if w.get("predicted_step_ms") is not None]
    if not rows:
        return []
    out = [bold("What if") + f" (step now {_f(rows[0].get('measured_step_ms'))} ms; replay of the step graph)"]
    for w in rows[:WHATIF_ROWS]:
        out.append(f"  {w['description'][:60]:<60}  {_f(w['predicted_step_ms']):>7} ms  "
                   f"gain {_f(w['gain_ms_per_step']):>6} ms ({_f(w.get('gain_pct'), '{:.0f}')} %)")
    return out
