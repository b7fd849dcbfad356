"""The terminal report's watch section (``--watch`` runs): the whole run in a few lines — step time and own work
per rank (or their spread over many ranks), each drift's start and end, and the window each drift triggered."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..analysis.report.watch_section import WatchDrift, WatchRank, WatchSection, WatchTrigger
    from .console_text import Style

__all__ = ["watch_lines", "MAX_DRIFT_LINES"]

#: Drifts listed (the largest first); the rest are counted.
MAX_DRIFT_LINES = 8
_PER_RANK_LINES = 8


def _ms(x: Any) -> str:
    return "-" if x is None else f"{float(x):.1f}"


def watch_lines(watch: WatchSection | None, st: Style) -> list[str]:
    """The watch section's lines (none without a --watch series)."""
    if watch is None:
        return []
    out = [st.bold(f"Whole run (--watch): {watch.n_ranks} rank(s), steps {watch.first_step}-{watch.last_step}")
           + " - own work = step time minus time blocked in communication"]
    out += _per_rank_lines(watch.per_rank)
    out += _drift_lines(watch, st)
    for t in watch.triggers:
        if t.drift is None:  # the live rule saw a drift the whole series does not hold (a short one)
            out.append(f"  window {t.window} was asked for by the watch for rank {t.rank} from step "
                       f"{t.first_step} ({t.state})")
    out += [st.red(f"  skipped: {s}") for s in watch.skipped]
    return out


def _per_rank_lines(per: list[WatchRank]) -> list[str]:
    """A line per rank with few ranks, else the spread of their own work."""
    if len(per) <= _PER_RANK_LINES:
        return [f"  rank {p.rank}: {p.steps} steps, median step {_ms(p.step_ms_median)} ms, own "
                f"{_ms(p.own_ms_median)} ms, blocked {_ms(p.comm_ms_median)} ms, data "
                f"{_ms(p.data_ms_median)} ms, optimizer {_ms(p.opt_ms_median)} ms" for p in per]
    own = sorted((p.own_ms_median or 0.0, p.rank) for p in per)
    return [f"  own work per step, median over the run: lowest {_ms(own[0][0])} ms (rank {own[0][1]}), median "
            f"{_ms(own[len(own) // 2][0])} ms, highest {_ms(own[-1][0])} ms (rank {own[-1][1]})"]


def _drift_lines(watch: WatchSection, st: Style) -> list[str]:
    """A line per drift (the largest first, at most MAX_DRIFT_LINES), red where it asked for a window."""
    drifts = watch.drifts
    if not drifts:
        return [st.dim(f"  no rank drifted ({watch.rule.text})")]
    trig = {(t.rank, t.drift.first_step if t.drift else None): t for t in watch.triggers}
    out = []
    for d in drifts[:MAX_DRIFT_LINES]:
        t = trig.get((d.rank, d.first_step))  # the window this drift asked for, if it did
        line = _drift_text(d) + _trigger_text(t)
        out.append(st.red(line) if t is not None else line)
    if len(drifts) > MAX_DRIFT_LINES:
        out.append(st.dim(f"  ... {len(drifts) - MAX_DRIFT_LINES} more drifts in report.json (watch.drifts)"))
    return out


def _drift_text(d: WatchDrift) -> str:
    end = "to the end" if d.open else f"to step {d.last_step}"
    line = (f"  drift: rank {d.rank} from step {d.first_step} {end} ({d.flagged_steps} steps): own "
            f"work {_ms(d.own_ms)} ms vs the others' {_ms(d.peers_ms)} ms (+{_ms(d.excess_ms)} ms")
    return line + (f", +{d.excess_pct:.0f} %)" if d.excess_pct is not None else ")")


def _trigger_text(t: WatchTrigger | None) -> str:
    if t is None:
        return ""
    if t.window is not None:
        return f" -> window {t.window} (steps {t.window_first_step}-{t.window_last_step}, {t.state})"
    return f" -> no window ({t.state}: {t.message or ''})"
