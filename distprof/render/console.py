"""Terminal summary of a report: run, clocks, step breakdown, stragglers, root cause, overlap, imbalance, MFU.

Plain text; ANSI bold/colour only when asked (``color=True``) — the CLI asks only when stdout is a TTY.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["render_console"]

_MAX_RANK_ROWS = 8


def _f(x: Any, fmt: str = "{:.1f}", none: str = "-") -> str:
    return none if x is None else fmt.format(x)


def _table(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return indent + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return [line(header)] + [line(r) for r in rows]


class _Style:
    def __init__(self, color: bool):
        self.color = color

    def _w(self, code: str, s: str) -> str:
        return f"\x1b[{code}m{s}\x1b[0m" if self.color else s

    def bold(self, s: str) -> str:
        return self._w("1", s)

    def red(self, s: str) -> str:
        return self._w("1;31", s)

    def dim(self, s: str) -> str:
        return self._w("2", s)


def render_console(report: dict[str, Any], *, color: bool = False, top: int = 3) -> str:
    """The terminal summary as one string (ends with a newline)."""
    st = _Style(color)
    out: list[str] = []
    run = report.get("run", {})
    n_present = len(run.get("ranks_present", []))
    steps_txt = (
        f"steps {run.get('first_step')}-{run.get('last_step')} ({run.get('n_steps')} steps)"
        if run.get("n_steps")
        else "no steps"
    )
    out.append(
        st.bold(f"distprof report: run {run.get('id')}")
        + f" - {n_present}/{run.get('world_size')} ranks on {run.get('n_hosts')} host(s), {steps_txt}, "
        f"{'/'.join(run.get('backend', []))}, {'/'.join(run.get('devices', []))}"
    )
    if run.get("ranks_missing"):
        out.append(st.red(f"  missing ranks: {run['ranks_missing']}"))

    clock = report.get("clock", {})
    if clock:
        out.append(st.bold("Clock alignment"))
        for host, c in clock.items():
            res = c.get("residual_us")
            out.append(
                f"  {host}: offset {c.get('offset_ns', 0) / 1e6:+.3f} ms, drift {_f(c.get('drift_ppm'), '{:.2f}')} ppm,"
                f" residual {_f(res, '{:.0f}')} us ({c.get('method')})"
            )

    s = report.get("summary", {})
    if s.get("n_rank_steps"):
        out.append(st.bold("Step time"))
        out.append(
            f"  mean {_f(s.get('step_ms_mean'))} ms (max {_f(s.get('step_ms_max'))}):"
            f" compute {_f(s.get('compute_pct'))}%, exposed comm {_f(s.get('exposed_comm_pct'))}%,"
            f" memcpy {_f(s.get('memcpy_pct'))}%, idle {_f(s.get('idle_pct'))}%, other {_f(s.get('other_pct'))}%"
        )
        out.append(
            f"  communication {_f(s.get('comm_pct'))}% of step time, {_f(s.get('overlap_pct'))}% of it overlapped"
            " by compute"
        )

    out += _stragglers(report, st, top)
    out += _root_cause(report)
    out += _overlap(report)
    out += _imbalance(report)

    mfu = report.get("mfu") or []
    if mfu:
        out.append(st.bold("MFU"))
        rows = [
            [str(m["rank"]), m.get("device", ""), _f(m.get("achieved_tflops"), "{:.2f}"),
             _f(m["peak_tflops"], "{:.0f}"), _f(None if m.get("mfu") is None else 100 * m["mfu"], "{:.1f}%"),
             m.get("peak_source", "")]
            for m in mfu
        ]
        out += _table(["rank", "device", "TFLOP/s", "peak", "MFU", "peak from"], rows)
    elif report.get("mfu_note"):
        out.append(st.dim(f"MFU: {report['mfu_note']}"))

    for w in report.get("warnings", []):
        out.append(st.red(f"warning: {w}"))
    return "\n".join(out) + "\n"


def _stragglers(report: dict[str, Any], st: _Style, top: int) -> list[str]:
    info = report.get("straggler_info", {})
    ranks = report.get("stragglers", [])
    rule = info.get("rule", {})
    out = [st.bold(f"Stragglers ({info.get('n_instances', 0)} collective instances,"
                   f" threshold {_f(rule.get('threshold_ms'), '{:.2f}')} ms)")]
    if not ranks:
        out.append("  no collective matched across ranks")
        return out
    named = [d for d in ranks if d.get("named")]
    if not named:
        worst = max(ranks, key=lambda d: d.get("mean_lateness_ms") or 0)
        out.append(
            f"  no straggler: no rank is late by >= {_f(rule.get('threshold_ms'), '{:.2f}')} ms in most collectives"
            f" (worst: rank {worst['rank']}, {_f(worst.get('mean_lateness_ms'), '{:.2f}')} ms mean lateness)"
        )
    rows = []
    for d in ranks[:_MAX_RANK_ROWS]:
        rows.append([
            str(d["rank"]), str(d["host"]), _f(d["lost_ms_per_step"], "{:.2f}"), _f(d["blame_ms_per_step"], "{:.2f}"),
            _f(d["mean_lateness_ms"], "{:.2f}"), _f(100 * d["late_fraction"], "{:.0f}%"),
            _f(d["clock_free_lateness_ms"], "{:.2f}"), "STRAGGLER" if d["named"] else "",
        ])
    lines = _table(["rank", "host", "lost ms/step", "others' wait ms/step", "mean late ms", "last",
                    "clock-free late ms", ""], rows)
    out += [st.red(x) if x.rstrip().endswith("STRAGGLER") else x for x in lines]
    if len(ranks) > _MAX_RANK_ROWS:
        out.append(st.dim(f"  ... {len(ranks) - _MAX_RANK_ROWS} more ranks in report.json"))
    hosts = [h for h in info.get("hosts", []) if h.get("named")]
    for h in hosts:
        out.append(st.red(f"  slow host {h['host']} (ranks {h['ranks']}): {_f(h['mean_lateness_ms'], '{:.2f}')} ms"
                          f" mean lateness, last in {100 * h['late_fraction']:.0f}% of collectives"))
    cf = info.get("clock_free", {})
    if cf.get("agrees") is False:
        out.append(st.dim(f"  clock-free check: top rank by durations is {cf.get('top_rank')},"
                          f" by aligned arrivals {cf.get('top_rank_by_blame')}"))
    changes = info.get("changes", [])
    if changes:
        txt = ", ".join(f"step {c['step']}: {c['from_rank']} -> {c['to_rank']}" for c in changes[:10])
        more = f" (+{len(changes) - 10} more)" if len(changes) > 10 else ""
        out.append(f"  straggler changes: {txt}{more}".replace("None", "none"))
    out.append(st.dim(f"  rule: {rule.get('text', '')}"))
    return out


def _root_cause(report: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for rc in report.get("root_cause", []):
        out.append(f"Root cause, rank {rc['rank']} ({rc['host']}, {rc['n_steps']} steps vs. the other ranks' median):")
        if not rc["ops"]:
            out.append("  no op took longer than on the other ranks")
        for op in rc["ops"][:5]:
            out.append(
                f"  +{op['excess_ms_per_step']:.2f} ms/step  {op['name']} ({op['kind']}):"
                f" {op['rank_ms_per_step']:.2f} vs {op['others_median_ms_per_step']:.2f} ms/step"
            )
    return out


def _overlap(report: dict[str, Any]) -> list[str]:
    ov = report.get("overlap") or []
    if not ov:
        return []
    rows = [
        [str(o["rank"]), o["mode"], _f(o["comm_ms_per_step"], "{:.2f}"), _f(o["exposed_comm_ms_per_step"], "{:.2f}"),
         _f(o["overlap_pct"], "{:.1f}%"), _f(o["exposed_pct"], "{:.1f}%")]
        for o in ov[:16]
    ]
    out = ["Communication overlap per rank"]
    out += _table(["rank", "mode", "comm ms/step", "exposed ms/step", "overlap", "exposed of step"], rows)
    if len(ov) > 16:
        out.append(f"  ... {len(ov) - 16} more ranks in report.json")
    return out


def _imbalance(report: dict[str, Any]) -> list[str]:
    metrics = (report.get("imbalance") or {}).get("metrics") or {}
    if not metrics:
        return []
    fmt = {"compute_ms": "{:.2f}", "flops": "{:.3g}", "tflops": "{:.4f}", "peak_mem_bytes": "{:.3g}",
           "step_ms": "{:.2f}"}
    rows = []
    for name, m in metrics.items():
        if m.get("mean") is None:
            continue
        f = fmt.get(name, "{:.3g}")
        rows.append([
            name, _f(m["min"], f), _f(m["mean"], f), f"{_f(m['max'], f)} (rank {m['max_rank']})",
            _f(None if m["lambda"] is None else 100 * m["lambda"], "{:.1f}%"), _f(m["cv"], "{:.3f}"),
            _f(m["lb"], "{:.3f}"),
        ])
    return ["Imbalance across ranks"] + _table(["metric", "min", "mean", "max", "lambda", "CV", "LB"], rows)
