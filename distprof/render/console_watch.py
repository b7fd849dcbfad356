"""The terminal report's watch section (``--watch`` runs): the whole run in a few lines — step time and own work
per rank (or their spread over many ranks), each drift's start and end, and the window each drift triggered."""

from __future__ import annotations

from typing import Any

__all__ = ["watch_lines", "MAX_DRIFT_LINES"]

#: Drifts listed (the largest first); the rest are counted.
MAX_DRIFT_LINES = 8
_PER_RANK_LINES = 8


def _ms(x: Any) -> str:
    return "-" if x is None else f"{float(x):.1f}"


def watch_lines(watch: dict[str, Any] | None, st) -> list[str]:
    if not watch:
        return []
    out = [st.bold(f"Whole run (--watch): {watch.get('n_ranks')} rank(s), steps {watch.get('first_step')}-"
                   f"{watch.get('last_step')}") + " - own work = step time minus time blocked in communication"]
    per = watch.get("per_rank") or []
    if len(per) <= _PER_RANK_LINES:
        out += [f"  rank {p['rank']}: {p.get('steps')} steps, median step {_ms(p.get('step_ms_median'))} ms, own "
                f"{_ms(p.get('own_ms_median'))} ms, blocked {_ms(p.get('comm_ms_median'))} ms, data "
                f"{_ms(p.get('data_ms_median'))} ms, optimizer {_ms(p.get('opt_ms_median'))} ms" for p in per]
    else:
        own = sorted((p.get("own_ms_median") or 0.0, p["rank"]) for p in per)
        out.append(f"  own work per step, median over the run: lowest {_ms(own[0][0])} ms (rank {own[0][1]}), median "
                   f"{_ms(own[len(own) // 2][0])} ms, highest {_ms(own[-1][0])} ms (rank {own[-1][1]})")
    drifts = watch.get("drifts") or []
    trig = {(t.get("rank"), (t.get("drift") or {}).get("first_step")): t for t in watch.get("triggers") or []}
    if not drifts:
        out.append(st.dim(f"  no rank drifted ({(watch.get('rule') or {}).get('text', '')})"))
    for d in drifts[:MAX_DRIFT_LINES]:
        end = "to the end" if d.get("open") else f"to step {d.get('last_step')}"
        line = (f"  drift: rank {d['rank']} from step {d['first_step']} {end} ({d.get('flagged_steps')} steps): own "
                f"work {_ms(d.get('own_ms'))} ms vs the others' {_ms(d.get('peers_ms'))} ms "
                f"(+{_ms(d.get('excess_ms'))} ms")
        line += f", +{d['excess_pct']:.0f} %)" if d.get("excess_pct") is not None else ")"
        t = trig.get((d["rank"], d["first_step"]))
        if t is not None and t.get("window") is not None:
            line += (f" -> window {t['window']} (steps {t.get('window_first_step')}-{t.get('window_last_step')}, "
                     f"{t.get('state')})")
        elif t is not None:
            line += f" -> no window ({t.get('state')}: {t.get('message') or ''})"
        out.append(st.red(line) if t is not None else line)
    if len(drifts) > MAX_DRIFT_LINES:
        out.append(st.dim(f"  ... {len(drifts) - MAX_DRIFT_LINES} more drifts in report.json (watch.drifts)"))
    for t in watch.get("triggers") or []:
        if t.get("drift") is None:  # the live rule saw a drift the whole series does not hold (a short one)
            out.append(f"  window {t.get('window')} was asked for by the watch for rank {t.get('rank')} from step "
                       f"{t.get('first_step')} ({t.get('state')})")
    for s in watch.get("skipped") or []:
        out.append(st.red(f"  skipped: {s}"))
    return out
