"""The HTML report's text sections: the header and verdict, the findings, and the tables (collectives, pipeline
stages, clock alignment, root cause, annotations, GPU time, warnings). Pure functions of the :class:`Report`, each
returning HTML; every string from the trace goes through ``_e``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..analysis.findings.finding import Finding
from ..analysis.names import display_name, rank_ranges
from ..analysis.rank.gpu_time import GpuTime
from ..analysis.report.model import STEP_UNITS, ClockRow, Report
from . import html_scale
from .html_text import _e, _fmt, _mean, _num

__all__ = ["header", "findings", "collectives_table", "pipeline_tables", "clock_table", "root_cause",
           "annotation_table", "gpu_time_table", "warnings", "MAX_ANNOTATIONS", "MAX_COMM_ROWS"]

#: Rows of the per-rank and per-host tables when there are more (the worst ones are shown).
_TOP_TABLE_ROWS = 20
#: Rows of the collectives table the page shows (all of them are in report.json).
MAX_COMM_ROWS = 20
#: Annotations shown (table and figure).
MAX_ANNOTATIONS = 30


def table(head: list[str], rows: list[list[str]], cls: str = "") -> str:
    """rows hold already-escaped cell HTML."""
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table class=\"{cls}\"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


# ---------------------------------------------------------------------------------------------------------------
# header, verdict, findings


def verdict(report: Report) -> str:
    """The report's verdict; one built from the stragglers and the step summary when it has none."""
    if report.verdict.strip():
        return report.verdict
    named = [s for s in report.stragglers or [] if s.named]
    s = report.summary
    if named:
        top = named[0]
        txt = (f"rank {top.rank} on host {top.host} is the straggler: it arrives last in "
               f"{_fmt(100 * (_num(top.late_fraction) or 0), '{:.0f}')} % of collectives, "
               f"{_fmt(top.lateness_ms, '{:.1f}')} ms late per step (median), and the steps lose "
               f"{_fmt(top.cost_ms_per_step, '{:.1f}')} ms per step to it.")
        if len(named) > 1:
            txt += " Also named: " + ", ".join(f"rank {x.rank}" for x in named[1:]) + "."
        return txt
    if s is None or not s.n_rank_steps:
        return "No recorded steps: nothing to analyse."
    parts = []
    if report.stragglers:
        parts.append("No straggler: no rank is late often enough to be told from noise.")
    parts.append(f"{_fmt(s.compute_pct, '{:.0f}')} % of step time is compute, "
                 f"{_fmt(s.exposed_comm_pct, '{:.0f}')} % exposed communication, "
                 f"{_fmt(s.idle_pct, '{:.0f}')} % idle.")
    return " ".join(parts)


def _meta(report: Report) -> list[str]:
    """The header's facts: ranks and hosts, steps, backend and device, parallelism, mean step."""
    run = report.run
    hosts = sorted({str(h) for h in run.hosts.values()})
    host_txt = ", ".join(hosts[:8]) + (f" (+{len(hosts) - 8} more)" if len(hosts) > 8 else "")
    steps_txt = (f"steps {run.first_step}–{run.last_step} ({run.n_steps} recorded)"
                 if run.n_steps else "no recorded steps")
    if run.step_unit:
        steps_txt += f"; a step is {STEP_UNITS.get(run.step_unit, run.step_unit)}"
    meta = [
        f"{len(run.ranks_present)}/{run.world_size} ranks on {run.n_hosts} host(s): {host_txt}",
        steps_txt + (f" in {len(run.windows)} window(s)" if run.windows else ""),
        "backend " + "/".join(str(b) for b in run.backend or ["?"])
        + ", device " + "/".join(str(d) for d in run.devices or ["?"]),
    ]
    par = report.parallelism
    if par is not None:  # "no parallelism recognised" included
        meta.append(f"parallelism {par.label}")
    s = report.summary
    if s is not None and s.step_ms_mean is not None:
        meta.append(f"mean step {_fmt(s.step_ms_mean, '{:.2f}')} ms (max {_fmt(s.step_ms_max, '{:.2f}')})")
    return meta


def header(report: Report) -> str:
    run = report.run
    out = [f"<h1>distprof report — run <span class=\"runid\">{_e(run.id)}</span></h1>",
           "<p class=\"meta\">" + " · ".join(_e(m) for m in _meta(report)) + "</p>"]
    if run.ranks_missing:
        out.append(f"<p class=\"warn\">Missing ranks (no shard): {_e(rank_ranges(run.ranks_missing))}</p>")
    out.append("<div class=\"verdict\" id=\"verdict\"><span class=\"label\">Verdict</span> "
               f"{_e(verdict(report))}</div>")
    return "\n".join(out)


def _finding(f: Finding) -> str:
    """One finding as a list item."""
    sev = str(f.severity or "low").lower()
    sev_cls = sev if sev in ("high", "medium", "low") else "low"
    where = []
    if f.rank is not None:
        where.append(f"rank {f.rank}")
    if f.host is not None:
        where.append(f"host {f.host}")
    met = ", ".join(f"{k} = {_fmt(v, '{:.4g}')}" for k, v in f.metrics.items() if _num(v) is not None)
    gain = _num(f.estimated_gain_ms_per_step)
    return (
        "<li class=\"finding\">"
        f"<span class=\"badge {sev_cls}\">{_e(sev)}</span> "
        f"<span class=\"ftitle\">{_e(f.title or f.id or '')}</span>"
        + (f" <span class=\"where\">{_e(' · '.join(where))}</span>" if where else "")
        + (f"<div class=\"evidence\">{_e(f.evidence)}</div>" if f.evidence else "")
        + (f"<div class=\"advice\"><b>Advice:</b> {_e(f.advice)}</div>" if f.advice else "")
        + (f"<div class=\"advice\"><b>Estimated gain if fixed:</b> {_fmt(gain, '{:.1f}')} "
           f"ms per step (predicted step {_fmt(f.predicted_step_ms, '{:.1f}')} ms)</div>"
           if gain is not None else "")
        + (f"<details class=\"metrics\"><summary>metrics</summary>{_e(met)}</details>" if met else "")
        + "</li>"
    )


def findings(report: Report) -> str:
    if not report.findings:
        return "<section id=\"findings\"><h2>Findings</h2><p class=\"muted\">No findings: no rule fired.</p></section>"
    return ("<section id=\"findings\"><h2>Findings</h2><ul class=\"findings\">"
            + "".join(_finding(f) for f in report.findings) + "</ul></section>")


# ---------------------------------------------------------------------------------------------------------------
# tables


def _mb(x: Any) -> str:
    v = _num(x)
    return "–" if v is None else f"{v / 1e6:.2f}"


def collectives_table(report: Report) -> str:
    rows = report.collectives or []
    if not rows:
        return ""
    body = [[_e(r.group) + (f" ×{r.n_groups}" if r.n_groups > 1 else ""), _e(r.group_size),
             _e(r.op), _fmt(r.calls_per_step, "{:.1f}"), _mb(r.bytes_per_step),
             _fmt(r.ms_per_step, "{:.2f}"), _fmt(r.exposed_ms_per_step, "{:.2f}"),
             "–" if r.slowest_rank is None else
             _e(f"rank {r.slowest_rank} ({100 * (_num(r.slowest_share) or 0):.0f} %)")]
            for r in rows[:MAX_COMM_ROWS]]
    more = (f"<p class=\"muted\">{len(rows) - MAX_COMM_ROWS} more rows in report.json.</p>"
            if len(rows) > MAX_COMM_ROWS else "")
    return table(["group", "ranks per group", "op", "calls/step", "MB/step", "ms/step", "exposed ms/step",
                  "last to arrive"], body, "num") + more


def pipeline_tables(report: Report) -> str:
    out = []
    for p in (report.pipelines or [])[:4]:
        ideal = _num(p.ideal_bubble_pct)
        out.append(f"<p>Stages {_e(' → '.join(str(r) for r in p.ranks[:32]))}: {_e(p.micro_batches)} "
                   f"micro-batches per step, bubble {_fmt(p.bubble_pct, '{:.0f}')} % of step time"
                   + (f" (fill and drain alone: {_fmt(ideal, '{:.0f}')} %)" if ideal is not None else "") + ".</p>")
        out.append(table(["stage", "rank", "step ms", "compute ms", "waits ms", "waits %", "others wait for it ms"],
                         [[_e(s.stage), _e(s.rank), _fmt(s.step_ms, "{:.1f}"), _fmt(s.busy_ms, "{:.1f}"),
                           _fmt(s.wait_ms, "{:.1f}"), _fmt(s.wait_pct, "{:.0f}"), _fmt(s.caused_ms, "{:.1f}")]
                          for s in p.stages[:64]], "num"))
    return "".join(out)


def _residual(c: ClockRow) -> float:
    return _num(c.residual_us) or 0.0


def clock_table(report: Report) -> str:
    clock = report.clock or {}
    if not clock:
        return "<p class=\"muted\">No clock alignment information.</p>"
    lead = ""
    if len(clock) > _TOP_TABLE_ROWS:  # the hosts aligned worst (largest residual), after the summary
        res = sorted(_residual(c) for c in clock.values())
        methods = Counter(str(c.method) for c in clock.values())  # in the order first seen
        lead = (f"<p class=\"caption\">{len(clock)} hosts (" + ", ".join(f"{n} by {m}" for m, n in methods.items())
                + f"); residual µs: median {res[len(res) // 2]:.1f}, max {res[-1]:.1f}. The {_TOP_TABLE_ROWS} hosts "
                "with the largest residual (all in report.json):</p>")
        clock = dict(sorted(clock.items(), key=lambda kv: -_residual(kv[1]))[:_TOP_TABLE_ROWS])
    rows = []
    for host, c in clock.items():
        off = _num(c.offset_ns)
        rows.append([
            _e(host), _e(c.method), _e(_fmt(None if off is None else off / 1e6, "{:+.3f}")),
            _e(_fmt(c.drift_ppm, "{:.2f}")), _e(_fmt(c.residual_us, "{:.1f}")),
            _e(_fmt(c.residual_max_us, "{:.1f}")), _e(c.n_samples), _e(rank_ranges(c.ranks)),
        ])
    return lead + table(["host", "method", "offset ms", "drift ppm", "residual µs (median)", "residual µs (max)",
                         "samples", "ranks"], rows, "num")


def root_cause(report: Report) -> str:
    rc = report.root_cause or []
    if not rc:
        return "<p class=\"muted\">No named straggler, so no root-cause analysis.</p>"
    out = []
    for item in rc:
        rows = [[f'<span title="{_e(op.name)}">{_e(display_name(str(op.name)))}</span>',
                 _e(op.kind), _e(_fmt(op.excess_ms_per_step, "{:.3f}")), _e(_fmt(op.rank_ms_per_step, "{:.3f}")),
                 _e(_fmt(op.others_median_ms_per_step, "{:.3f}")), _e(_fmt(op.calls_per_step, "{:.1f}"))]
                for op in item.ops]
        out.append(f"<h3>rank {_e(item.rank)} on host {_e(item.host)}"
                   f" <span class=\"muted\">({_e(item.n_steps)} steps)</span></h3>")
        out.append(table(["op", "kind", "excess ms/step", "its ms/step", "others' median ms/step", "calls/step"],
                         rows, "num") if rows else "<p class=\"muted\">No op took longer than on its peers.</p>")
    return "\n".join(out)


def annotation_table(report: Report) -> str:
    ann = report.annotations or []
    if not ann:
        return ""
    rows = []
    for a in ann[:MAX_ANNOTATIONS]:
        vals = [_num(v.ms_per_step) for v in a.ranks.values()]
        cnt = [_num(v.count_per_step) for v in a.ranks.values()]
        rows.append([_e(a.name), _e(_fmt(_mean(vals), "{:.3f}")), _e(_fmt(_mean(cnt), "{:.1f}")),
                     _e(_fmt(a.spread_pct, "{:.1f}"))])
    more = (f"<p class=\"muted\">{len(ann) - MAX_ANNOTATIONS} more not shown.</p>"
            if len(ann) > MAX_ANNOTATIONS else "")
    return table(["region", "mean ms/step", "calls/step", "spread % (max−min over mean)"], rows, "num") + more


def _idle(g: GpuTime) -> float:
    return _num(g.idle_pct) or 0.0


def gpu_time_table(report: Report) -> str:
    gs = report.gpu_time or []
    if not gs:
        return ""
    lead = ""
    if html_scale.many(len(gs)):  # the ranks that idle most, after the distribution
        idle = sorted(_idle(g) for g in gs)
        lead = (f"<p class=\"caption\">{len(gs)} device ranks; idle % of span: min {idle[0]:.2f}, median "
                f"{idle[len(idle) // 2]:.2f}, p90 {idle[int(0.9 * (len(idle) - 1))]:.2f}, max {idle[-1]:.2f}. "
                f"The {_TOP_TABLE_ROWS} ranks that idle most (all in report.json):</p>")
        gs = sorted(gs, key=lambda g: -_idle(g))[:_TOP_TABLE_ROWS]
    rows = [[_e(g.rank), _e(_fmt(_num(g.span_us) and _num(g.span_us) / 1e3, "{:.1f}")),
             _e(_fmt(g.idle_pct, "{:.2f}")), _e(_fmt(g.compute_pct, "{:.2f}")),
             _e(_fmt(g.non_compute_pct, "{:.2f}")), _e(_fmt(g.overlap_pct, "{:.2f}"))] for g in gs]
    return lead + table(["rank", "GPU span ms", "idle %", "compute %", "non-compute %", "comm overlap %"], rows)


def warnings(report: Report) -> str:
    w = [str(x) for x in report.warnings]
    notes = [report.mfu_note] if report.mfu_note else []
    if not w and not notes:
        return "<p class=\"muted\">No warnings.</p>"
    return ("<ul class=\"warnings\">" + "".join(f"<li>{_e(x)}</li>" for x in w)
            + "".join(f"<li class=\"muted\">{_e(x)}</li>" for x in notes) + "</ul>")
