"""The self-contained HTML report: one file, charts drawn by the plotly.js bundled in the ``plotly`` package.

    html = render_html(report, run)           # report from build_report(run); run (optional) adds the memory timeline
    write_html(report, "report.html", run)    # atomic: temporary file + rename

The page needs no network when viewed: plotly.js is inlined (by default gzip + base64, unpacked by the browser's
``DecompressionStream``; ``compress_js=False`` inlines the plain 4.8 MB bundle). Figures are plain dicts
(``{"data": [...], "layout": {...}}``) built from the report; plotly.graph_objects is never imported.

Modules: this one holds the HTML (sections, tables, page assembly) and the public API; ``html_figures`` the figure
dicts, ``html_assets`` the CSS, the boot script and the inlined plotly.js, ``html_text`` escaping and number
formatting.

Escaping: every string from the trace (op and annotation names, hosts, run id, warnings, findings) reaches the page
either through ``html.escape`` (HTML text) or inside the figure JSON, where ``<``, ``>``, ``&``, U+2028 and U+2029
are written as ``\\uXXXX`` so nothing can close the ``<script>`` element, and where strings plotly renders as
(pseudo-)HTML — labels, hover text — are entity-escaped first so plotly shows them literally.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ..analysis.names import display_name, rank_ranges
from ..atomic import atomic_write
from ..errors import ConfigError
from . import html_scale, html_watch
from .html_assets import _BOOT_JS, _CSS, _plotly_element
from .html_figures import (  # noqa: F401  (_downsample_minmax: re-exported for the tests)
    _MAX_ANNOTATIONS,
    MEMORY_POINTS_PER_RANK,
    _downsample_minmax,
    _fig_annotations,
    _fig_blame,
    _fig_breakdown,
    _fig_imbalance,
    _fig_memory,
    _fig_overlap,
    _fig_step_heatmap,
)
from .html_text import _e, _fmt, _mean, _num, _script_json
from .html_whatif import critical_path_caption, fig_critical_path, whatif_table

logger = logging.getLogger(__name__)

__all__ = ["render_html", "write_html", "check_html_path", "MEMORY_POINTS_PER_RANK"]

#: Rows of the per-rank and per-host tables when there are more (the worst ones are shown).
_TOP_TABLE_ROWS = 20


# ---------------------------------------------------------------------------------------------------------------
# HTML sections


def _verdict(report: dict[str, Any]) -> str:
    v = report.get("verdict")
    if isinstance(v, str) and v.strip():
        return v
    named = [s for s in report.get("stragglers") or [] if s.get("named")]
    s = report.get("summary") or {}
    if named:
        top = named[0]
        txt = (f"rank {top.get('rank')} on host {top.get('host')} is the straggler: it arrives last in "
               f"{_fmt(100 * (_num(top.get('late_fraction')) or 0), '{:.0f}')} % of collectives, "
               f"{_fmt(top.get('mean_lateness_ms'), '{:.1f}')} ms late on average, and the steps lose "
               f"{_fmt(top.get('cost_ms_per_step'), '{:.1f}')} ms per step to it.")
        if len(named) > 1:
            txt += " Also named: " + ", ".join(f"rank {x.get('rank')}" for x in named[1:]) + "."
        return txt
    if not s.get("n_rank_steps"):
        return "No recorded steps: nothing to analyse."
    parts = []
    if report.get("stragglers"):
        parts.append("No straggler: no rank is late often enough to be told from noise.")
    parts.append(f"{_fmt(s.get('compute_pct'), '{:.0f}')} % of step time is compute, "
                 f"{_fmt(s.get('exposed_comm_pct'), '{:.0f}')} % exposed communication, "
                 f"{_fmt(s.get('idle_pct'), '{:.0f}')} % idle.")
    return " ".join(parts)


def _header(report: dict[str, Any]) -> str:
    run = report.get("run") or {}
    hosts = sorted({str(h) for h in (run.get("hosts") or {}).values()})
    n_present = len(run.get("ranks_present") or [])
    host_txt = ", ".join(hosts[:8]) + (f" (+{len(hosts) - 8} more)" if len(hosts) > 8 else "")
    steps_txt = (f"steps {run.get('first_step')}–{run.get('last_step')} ({run.get('n_steps')} recorded)"
                 if run.get("n_steps") else "no recorded steps")
    windows = run.get("windows") or []
    meta = [
        f"{n_present}/{run.get('world_size', '?')} ranks on {run.get('n_hosts', len(hosts))} host(s): {host_txt}",
        steps_txt + (f" in {len(windows)} window(s)" if windows else ""),
        "backend " + "/".join(str(b) for b in run.get("backend") or ["?"])
        + ", device " + "/".join(str(d) for d in run.get("devices") or ["?"]),
    ]
    par = report.get("parallelism") or {}
    if par.get("styles") or par.get("mesh"):
        meta.append(f"parallelism {par.get('label')}")
    s = report.get("summary") or {}
    if s.get("step_ms_mean") is not None:
        meta.append(f"mean step {_fmt(s.get('step_ms_mean'), '{:.2f}')} ms "
                    f"(max {_fmt(s.get('step_ms_max'), '{:.2f}')})")
    out = [f"<h1>distprof report — run <span class=\"runid\">{_e(run.get('id', '?'))}</span></h1>",
           "<p class=\"meta\">" + " · ".join(_e(m) for m in meta) + "</p>"]
    if run.get("ranks_missing"):
        out.append(f"<p class=\"warn\">Missing ranks (no shard): {_e(rank_ranges(run['ranks_missing']))}</p>")
    out.append("<div class=\"verdict\" id=\"verdict\"><span class=\"label\">Verdict</span> "
               f"{_e(_verdict(report))}</div>")
    return "\n".join(out)


def _findings(report: dict[str, Any]) -> str:
    items = [f for f in report.get("findings") or [] if isinstance(f, dict)]
    if not items:
        msg = ("No findings: no rule fired." if "findings" in report
               else "This report has no findings list (written by an older distprof).")
        return f"<section id=\"findings\"><h2>Findings</h2><p class=\"muted\">{_e(msg)}</p></section>"
    rows = []
    for f in items:
        sev = str(f.get("severity") or "low").lower()
        sev_cls = sev if sev in ("high", "medium", "low") else "low"
        where = []
        if f.get("rank") is not None:
            where.append(f"rank {f['rank']}")
        if f.get("host") is not None:
            where.append(f"host {f['host']}")
        metrics = f.get("metrics") or {}
        met = ", ".join(f"{k} = {_fmt(v, '{:.4g}')}" for k, v in metrics.items() if _num(v) is not None)
        rows.append(
            "<li class=\"finding\">"
            f"<span class=\"badge {sev_cls}\">{_e(sev)}</span> "
            f"<span class=\"ftitle\">{_e(f.get('title') or f.get('id') or '')}</span>"
            + (f" <span class=\"where\">{_e(' · '.join(where))}</span>" if where else "")
            + (f"<div class=\"evidence\">{_e(f.get('evidence'))}</div>" if f.get("evidence") else "")
            + (f"<div class=\"advice\"><b>Advice:</b> {_e(f.get('advice'))}</div>" if f.get("advice") else "")
            + (f"<div class=\"advice\"><b>Estimated gain if fixed:</b> {_fmt(f['estimated_gain_ms_per_step'], '{:.1f}')} "
               f"ms per step (predicted step {_fmt(f.get('predicted_step_ms'), '{:.1f}')} ms)</div>"
               if f.get("estimated_gain_ms_per_step") is not None else "")
            + (f"<details class=\"metrics\"><summary>metrics</summary>{_e(met)}</details>" if met else "")
            + "</li>"
        )
    return "<section id=\"findings\"><h2>Findings</h2><ul class=\"findings\">" + "".join(rows) + "</ul></section>"


#: Rows of the collectives table the page shows (all of them are in report.json).
MAX_COMM_ROWS = 20


def _mb(x: Any) -> str:
    return "–" if x is None else f"{x / 1e6:.2f}"


def _collectives_table(report: dict[str, Any]) -> str:
    rows = report.get("collectives") or []
    if not rows:
        return ""
    body = [[_e(r["group"]) + (f" ×{r['n_groups']}" if r.get("n_groups", 1) > 1 else ""), _e(r.get("group_size")),
             _e(r["op"]), _fmt(r["calls_per_step"], "{:.1f}"), _mb(r.get("bytes_per_step")),
             _fmt(r["ms_per_step"], "{:.2f}"), _fmt(r["exposed_ms_per_step"], "{:.2f}"),
             "–" if r.get("slowest_rank") is None else
             _e(f"rank {r['slowest_rank']} ({100 * (r.get('slowest_share') or 0):.0f} %)")]
            for r in rows[:MAX_COMM_ROWS]]
    more = (f"<p class=\"muted\">{len(rows) - MAX_COMM_ROWS} more rows in report.json.</p>"
            if len(rows) > MAX_COMM_ROWS else "")
    return _table(["group", "ranks per group", "op", "calls/step", "MB/step", "ms/step", "exposed ms/step",
                   "last to arrive"], body, "num") + more


def _pipeline_tables(report: dict[str, Any]) -> str:
    out = []
    for p in (report.get("pipelines") or [])[:4]:
        ideal = p.get("ideal_bubble_pct")
        out.append(f"<p>Stages {_e(' → '.join(str(r) for r in p['ranks'][:32]))}: {_e(p['micro_batches'])} "
                   f"micro-batches per step, bubble {_fmt(p['bubble_pct'], '{:.0f}')} % of step time"
                   + (f" (fill and drain alone: {_fmt(ideal, '{:.0f}')} %)" if ideal is not None else "") + ".</p>")
        out.append(_table(["stage", "rank", "step ms", "compute ms", "waits ms", "waits %", "others wait for it ms"],
                          [[_e(s["stage"]), _e(s["rank"]), _fmt(s["step_ms"], "{:.1f}"), _fmt(s["busy_ms"], "{:.1f}"),
                            _fmt(s["wait_ms"], "{:.1f}"), _fmt(s["wait_pct"], "{:.0f}"), _fmt(s["caused_ms"], "{:.1f}")]
                           for s in p["stages"][:64]], "num"))
    return "".join(out)


def _table(header: list[str], rows: list[list[str]], cls: str = "") -> str:
    """rows hold already-escaped cell HTML."""
    th = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table class=\"{cls}\"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _clock_table(report: dict[str, Any]) -> str:
    clock = report.get("clock") or {}
    if not clock:
        return "<p class=\"muted\">No clock alignment information.</p>"
    lead = ""
    if len(clock) > _TOP_TABLE_ROWS:  # the hosts aligned worst (largest residual), after the summary
        res = sorted((_num((c or {}).get("residual_us")) or 0.0 for c in clock.values()))
        methods: dict[str, int] = {}
        for c in clock.values():
            methods[str((c or {}).get("method"))] = methods.get(str((c or {}).get("method")), 0) + 1
        lead = (f"<p class=\"caption\">{len(clock)} hosts (" + ", ".join(f"{n} by {m}" for m, n in methods.items())
                + f"); residual µs: median {res[len(res) // 2]:.1f}, max {res[-1]:.1f}. The {_TOP_TABLE_ROWS} hosts "
                "with the largest residual (all in report.json):</p>")
        clock = dict(sorted(clock.items(), key=lambda kv: -(_num((kv[1] or {}).get("residual_us")) or 0.0))
                     [:_TOP_TABLE_ROWS])
    rows = []
    for host, c in clock.items():
        c = c or {}
        off = _num(c.get("offset_ns"))
        rows.append([
            _e(host), _e(c.get("method")), _e(_fmt(None if off is None else off / 1e6, "{:+.3f}")),
            _e(_fmt(c.get("drift_ppm"), "{:.2f}")), _e(_fmt(c.get("residual_us"), "{:.1f}")),
            _e(_fmt(c.get("residual_max_us"), "{:.1f}")), _e(c.get("n_samples")),
            _e(rank_ranges(c.get("ranks") or [])),
        ])
    return lead + _table(["host", "method", "offset ms", "drift ppm", "residual µs (median)", "residual µs (max)",
                          "samples", "ranks"], rows, "num")


def _root_cause(report: dict[str, Any]) -> str:
    rc = report.get("root_cause") or []
    if not rc:
        return "<p class=\"muted\">No named straggler, so no root-cause analysis.</p>"
    out = []
    for item in rc:
        rows = [[f'<span title="{_e(op.get("name"))}">{_e(display_name(str(op.get("name"))))}</span>',
                 _e(op.get("kind")), _e(_fmt(op.get("excess_ms_per_step"), "{:.3f}")),
                 _e(_fmt(op.get("rank_ms_per_step"), "{:.3f}")),
                 _e(_fmt(op.get("others_median_ms_per_step"), "{:.3f}")),
                 _e(_fmt(op.get("calls_per_step"), "{:.1f}"))] for op in item.get("ops") or []]
        out.append(f"<h3>rank {_e(item.get('rank'))} on host {_e(item.get('host'))}"
                   f" <span class=\"muted\">({_e(item.get('n_steps'))} steps)</span></h3>")
        out.append(_table(["op", "kind", "excess ms/step", "its ms/step", "others' median ms/step", "calls/step"],
                          rows, "num") if rows else "<p class=\"muted\">No op took longer than on its peers.</p>")
    return "\n".join(out)


def _annotation_table(report: dict[str, Any]) -> str:
    ann = [a for a in report.get("annotations") or [] if isinstance(a, dict)]
    if not ann:
        return ""
    rows = []
    for a in ann[:_MAX_ANNOTATIONS]:
        vals = [_num((v or {}).get("ms_per_step")) for v in (a.get("ranks") or {}).values()]
        cnt = [_num((v or {}).get("count_per_step")) for v in (a.get("ranks") or {}).values()]
        rows.append([_e(a.get("name")), _e(_fmt(_mean(vals), "{:.3f}")), _e(_fmt(_mean(cnt), "{:.1f}")),
                     _e(_fmt(a.get("spread_pct"), "{:.1f}"))])
    more = (f"<p class=\"muted\">{len(ann) - _MAX_ANNOTATIONS} more not shown.</p>"
            if len(ann) > _MAX_ANNOTATIONS else "")
    return _table(["region", "mean ms/step", "calls/step", "spread % (max−min over mean)"], rows, "num") + more


def _gpu_time_table(report: dict[str, Any]) -> str:
    gs = [g for g in report.get("gpu_time") or [] if isinstance(g, dict)]
    if not gs:
        return ""
    lead = ""
    if html_scale.many(len(gs)):  # the ranks that idle most, after the distribution
        idle = sorted(_num(g.get("idle_pct")) or 0.0 for g in gs)
        lead = (f"<p class=\"caption\">{len(gs)} device ranks; idle % of span: min {idle[0]:.2f}, median "
                f"{idle[len(idle) // 2]:.2f}, p90 {idle[int(0.9 * (len(idle) - 1))]:.2f}, max {idle[-1]:.2f}. "
                f"The {_TOP_TABLE_ROWS} ranks that idle most (all in report.json):</p>")
        gs = sorted(gs, key=lambda g: -(_num(g.get("idle_pct")) or 0.0))[:_TOP_TABLE_ROWS]
    rows = [[_e(g.get("rank")), _e(_fmt(_num(g.get("span_us")) and _num(g.get("span_us")) / 1e3, "{:.1f}")),
             _e(_fmt(g.get("idle_pct"), "{:.2f}")), _e(_fmt(g.get("compute_pct"), "{:.2f}")),
             _e(_fmt(g.get("non_compute_pct"), "{:.2f}")), _e(_fmt(g.get("overlap_pct"), "{:.2f}"))] for g in gs]
    return lead + _table(["rank", "GPU span ms", "idle %", "compute %", "non-compute %", "comm overlap %"], rows)


def _warnings(report: dict[str, Any]) -> str:
    w = [str(x) for x in report.get("warnings") or []]
    notes = [report["mfu_note"]] if report.get("mfu_note") else []
    if not w and not notes:
        return "<p class=\"muted\">No warnings.</p>"
    return ("<ul class=\"warnings\">" + "".join(f"<li>{_e(x)}</li>" for x in w)
            + "".join(f"<li class=\"muted\">{_e(x)}</li>" for x in notes) + "</ul>")


def _chart(fig_id: str, title: str, fig: dict[str, Any] | None, figs: dict[str, Any], caption: str = "",
           empty: str = "No data for this chart.") -> str:
    head = f"<h2>{_e(title)}</h2>" + (f"<p class=\"caption\">{_e(caption)}</p>" if caption else "")
    if fig is None:
        return f"<section class=\"chart-section\">{head}<p class=\"muted\">{_e(empty)}</p></section>"
    figs[fig_id] = fig
    h = int(fig["layout"].get("height", 320))
    return (f"<section class=\"chart-section\">{head}<div class=\"chart\" id=\"{_e(fig_id)}\" "
            f"style=\"min-height:{h}px\"></div></section>")


# ---------------------------------------------------------------------------------------------------------------
# the page


def render_html(report: dict[str, Any], run: Any = None, *, compress_js: bool = True) -> str:
    """The report as one self-contained HTML page (str).

    `run` (the RunSummary the report was built from) adds the memory timeline; without it the page says so.
    `compress_js` inlines plotly.js gzip+base64 (about 2.0 MB instead of 4.8 MB; unpacked by the browser's
    DecompressionStream, in every current browser) — False inlines the plain bundle.
    """
    figs: dict[str, Any] = {}
    body = _chart_sections(report, run, figs)
    body += _table_sections(report)
    body += _closing_sections(report)
    return _page(report, body, figs, compress_js)


def _steps_caption(report: dict[str, Any]) -> str:
    """Caption of the step heatmap: cells are ranks, or (many ranks) the slowest rank of a host or block."""
    if html_scale.many(len((report.get("run") or {}).get("ranks_present") or [])):
        return ("Each cell is the slowest rank of a host (or of a block of ranks) in that step (ms); hover for which. "
                "A row that stays hot is a slow host; a hot column is a slow step everywhere.")
    return ("Each cell is one rank's step (ms); hover for its breakdown. A row that stays hot is a slow rank; "
            "a hot column is a slow step everywhere.")


def _breakdown_caption(report: dict[str, Any]) -> str:
    """Caption of the step-time breakdown, with the shares over all ranks when there are recorded steps."""
    summary = report.get("summary") or {}
    caption = (
        "Mean per step; the bars add up to the step time. 'overlapped comm' is compute during which communication "
        "also ran (hidden communication); 'exposed comm' is time the rank only waited for communication."
    )
    if summary.get("n_rank_steps"):
        caption += (f" Over all ranks: compute {_fmt(summary.get('compute_pct'), '{:.0f}')} %, exposed comm "
                    f"{_fmt(summary.get('exposed_comm_pct'), '{:.0f}')} %, idle "
                    f"{_fmt(summary.get('idle_pct'), '{:.0f}')} %, "
                    f"other {_fmt(summary.get('other_pct'), '{:.0f}')} %.")
    return caption


def _chart_sections(report: dict[str, Any], run: Any, figs: dict[str, Any]) -> list[str]:
    """The page's top: header, findings and the charts (their figures added to `figs`, in page order)."""
    mem_fig, mem_note = _fig_memory(run, report)
    return [
        _header(report),
        _findings(report),
        _chart("fig-steps", "Step time per rank and step", _fig_step_heatmap(report), figs, _steps_caption(report)),
        html_watch.section(report, figs, _chart),
        "<div class=\"grid\">",
        _chart("fig-breakdown", "Where step time goes, per rank", _fig_breakdown(report), figs,
               _breakdown_caption(report)),
        _chart("fig-blame", "Straggler blame per rank, grouped by host", _fig_blame(report), figs,
               "Bars: how long the other ranks waited for this rank at collectives, per step (red = named "
               "straggler). Diamonds: mean lateness against the naming floor (dashed).",
               "No collective was matched across ranks: no straggler analysis."),
        "</div>",
        _chart("fig-imbalance", "Work and memory per rank", _fig_imbalance(report), figs,
               "Per-rank means per step (TFLOP/s: FLOPs over wall time; torch counts FLOPs of a few ops only); "
               "the dashed line marks the mean over ranks."),
        "<div class=\"grid\">",
        _chart("fig-overlap", "Communication overlap per rank", _fig_overlap(report), figs,
               "Share of communication hidden under compute, and exposed communication as a share of step time."),
        _chart("fig-annotations", "User annotations (record_function regions) per rank", _fig_annotations(report),
               figs, "Milliseconds per step inside each region, per rank.",
               "No user annotations in this run." if "annotations" in report
               else "This report has no annotations table (written by an older distprof)."),
        "</div>",
        _chart("fig-memory", "Memory timeline per rank", mem_fig, figs, mem_note if mem_fig else "", mem_note),
        _chart("fig-critical-path", "Critical path of one step, across ranks", fig_critical_path(report),
               figs, critical_path_caption(report), "No step graph: no matched collective or transfer."),
    ]


def _table_sections(report: dict[str, Any]) -> list[str]:
    """The sections of the tables the report has rows for (what if, GPU time, collectives, pipelines, annotations);
    a table without rows has no section."""
    sections = [
        ("whatif", "What if", "The step time each change would give, from a replay of the cross-rank step graph "
         "(docs/whatif.md).", whatif_table(report)),
        ("gpu-time", "GPU time per rank", "HTA's temporal breakdown of each rank's GPU span (idle: no kernel or copy "
         "on any stream; non-compute: only communication or memory ran) and the share of communication-kernel time "
         "hidden under compute kernels.", _gpu_time_table(report)),
        ("collectives", "Collectives per group and op", "Per rank and recorded step: calls, bytes, time in the "
         "collective and the part of it the rank only waited (exposed); the rank that arrived last most often.",
         _collectives_table(report)),
        ("pipelines", "Pipeline stages", "Per stage (medians over steps): compute, the time it waited on receives "
         "for a peer that had not sent yet (the bubble), and how long the others waited for its sends.",
         _pipeline_tables(report)),
        ("annotation-table", "Annotation spread", "", _annotation_table(report)),
    ]
    return [f"<section id=\"{sec_id}\"><h2>{title}</h2>" + (f"<p class=\"caption\">{caption}</p>" if caption else "")
            + f"{table}</section>" for sec_id, title, caption, table in sections if table]


def _closing_sections(report: dict[str, Any]) -> list[str]:
    """The page's end: root cause of the named stragglers, clock alignment, warnings and the footer."""
    rule_text = ((report.get("straggler_info") or {}).get("rule") or {}).get("text") or ""
    return [
        f"<section id=\"root-cause\"><h2>Root cause of named stragglers</h2>"
        f"<p class=\"caption\">Ops that took longer on the straggler than the median of its peers (inclusive "
        f"times).</p>{_root_cause(report)}</section>",
        f"<section id=\"clock\"><h2>Clock alignment</h2><p class=\"caption\">How each host's clock was mapped onto "
        f"the reference rank's; the residual is the collective causality violation left after alignment.</p>"
        f"{_clock_table(report)}"
        + (f"<p class=\"caption\">Straggler rule: {_e(rule_text)}</p>" if rule_text else "")
        + "</section>",
        f"<section id=\"warnings\"><h2>Warnings</h2>{_warnings(report)}</section>",
        f"<footer>distprof {_e(report.get('distprof_version', ''))} · report format "
        f"{_e(report.get('report_version', ''))} · self-contained page: charts by the inlined plotly.js, "
        f"no network needed</footer>",
    ]


def _page(report: dict[str, Any], body: list[str], figs: dict[str, Any], compress_js: bool) -> str:
    """The whole document around the `body` sections: head with the CSS, the figures' JSON, plotly.js, boot script."""
    run_id = (report.get("run") or {}).get("id", "?")
    page = [
        "<!DOCTYPE html>",
        "<html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        f"<title>distprof report — {_e(run_id)}</title>",
        f"<style>{_CSS}</style>",
        "</head><body><main>",
        "\n".join(body),
        "</main>",
        f"<script type=\"application/json\" id=\"dp-figures\">{_script_json(figs)}</script>",
        _plotly_element(compress_js),
        f"<script>{_BOOT_JS}</script>",
        "</body></html>",
        "",
    ]
    return "\n".join(page)


def check_html_path(path: str | os.PathLike) -> Path:
    """`path` as a Path if an HTML report can be written there, else ConfigError (checked before the analysis)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"--html {path}: is a directory; give a file name such as {path / 'report.html'}")
    if not path.parent.is_dir():
        raise ConfigError(f"--html {path}: folder {path.parent} does not exist; create it or choose another path")
    return path


def write_html(report: dict[str, Any], path: str | os.PathLike, run: Any = None, *,
               compress_js: bool = True) -> Path:
    """Write the HTML report to `path` (temporary file + rename, so nobody sees half a file); returns the path."""
    path = check_html_path(path)
    text = render_html(report, run, compress_js=compress_js)
    with atomic_write(path) as fh:
        fh.write(text.encode("utf-8"))
    logger.info("wrote %s (%d bytes)", path, len(text.encode("utf-8")))
    return path