"""The self-contained HTML report: one file, charts drawn by the plotly.js bundled in the ``plotly`` package.

    html = render_html(report)            # report: the Report from build_report(run)
    write_html(report, "report.html")     # atomic: temporary file + rename

The page needs no network when viewed: plotly.js is inlined (by default gzip + base64, unpacked by the browser's
``DecompressionStream``; ``compress_js=False`` inlines the plain 4.8 MB bundle). Figures are plain dicts
(``{"data": [...], "layout": {...}}``) built from the report; plotly.graph_objects is never imported. The memory
timeline comes from ``report.memory`` (computed by the analysis; a report read back from report.json has none, and the
page says so).

Modules: this one holds the page (its sections in order, the chart sections, the document) and the public API;
``html_tables`` the header, findings and tables, ``html_figures`` the figure dicts (``html_scale`` those of many
ranks, ``html_watch`` and ``html_whatif`` their sections'), ``html_assets`` the CSS, the boot script and the inlined
plotly.js, ``html_text`` escaping and number formatting.

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

from ..analysis.report.model import Report
from ..atomic import atomic_write
from ..errors import ConfigError
from . import html_scale, html_tables, html_watch
from .html_assets import _BOOT_JS, _CSS, _plotly_element
from .html_figures import (fig_annotations, fig_blame, fig_breakdown, fig_imbalance, fig_memory, fig_overlap,
                           fig_steps)
from .html_text import _e, _fmt, _script_json
from .html_whatif import critical_path_caption, fig_critical_path, whatif_table

logger = logging.getLogger(__name__)

__all__ = ["render_html", "write_html", "check_html_path"]


def _chart(fig_id: str, title: str, fig: dict[str, Any] | None, figs: dict[str, Any], caption: str = "",
           empty: str = "No data for this chart.") -> str:
    """A chart's section (its figure added to `figs`, drawn by the boot script), or `empty` when there is none."""
    head = f"<h2>{_e(title)}</h2>" + (f"<p class=\"caption\">{_e(caption)}</p>" if caption else "")
    if fig is None:
        return f"<section class=\"chart-section\">{head}<p class=\"muted\">{_e(empty)}</p></section>"
    figs[fig_id] = fig
    h = int(fig["layout"]["height"])
    return (f"<section class=\"chart-section\">{head}<div class=\"chart\" id=\"{_e(fig_id)}\" "
            f"style=\"min-height:{h}px\"></div></section>")


# ---------------------------------------------------------------------------------------------------------------
# the page


def render_html(report: Report, *, compress_js: bool = True) -> str:
    """The report as one self-contained HTML page (str).

    `compress_js` inlines plotly.js gzip+base64 (about 2.0 MB instead of 4.8 MB; unpacked by the browser's
    DecompressionStream, in every current browser) — False inlines the plain bundle.
    """
    figs: dict[str, Any] = {}
    body = _chart_sections(report, figs)
    body += _table_sections(report)
    body += _closing_sections(report)
    return _page(report, body, figs, compress_js)


def _steps_caption(report: Report) -> str:
    """Caption of the rank x step heatmap: lateness (step time behind its toggle); hosts or blocks with many ranks."""
    if html_scale.many(len(report.run.ranks_present)):
        return ("Each cell is the latest rank of a host (or of a block of ranks) in that step: how much later than the "
                "median of its peers it reached the step's collectives (ms; hover for which rank). A row that stays "
                "red is a slow host. 'step time' shows the slowest rank's step instead.")
    return ("Each cell is how much later than the median of its peers the rank reached the step's collectives (ms; "
            "red late, blue early; hover for its extra work). A row that stays red is a straggler. In synchronous "
            "training every rank's step takes as long: 'step time' shows it, where a hot column is a slow step.")


def _breakdown_caption(report: Report) -> str:
    """Caption of the step-time breakdown, with the shares over all ranks when there are recorded steps."""
    s = report.summary
    caption = (
        "Mean per step; the bars add up to the step time. 'overlapped comm' is compute during which communication "
        "also ran (hidden communication); 'exposed comm' is time the rank only waited for communication."
    )
    if s is not None and s.n_rank_steps:
        caption += (f" Over all ranks: compute {_fmt(s.compute_pct, '{:.0f}')} %, exposed comm "
                    f"{_fmt(s.exposed_comm_pct, '{:.0f}')} %, idle {_fmt(s.idle_pct, '{:.0f}')} %, "
                    f"other {_fmt(s.other_pct, '{:.0f}')} %.")
    return caption


def _chart_sections(report: Report, figs: dict[str, Any]) -> list[str]:
    """The page's top: header, findings and the charts (their figures added to `figs`, in page order)."""
    mem_fig, mem_note = fig_memory(report)
    return [
        html_tables.header(report),
        html_tables.findings(report),
        _chart("fig-steps", "Lateness per rank and step", fig_steps(report), figs, _steps_caption(report)),
        html_watch.section(report, figs, _chart),
        "<div class=\"grid\">",
        _chart("fig-breakdown", "Where step time goes, per rank", fig_breakdown(report), figs,
               _breakdown_caption(report)),
        _chart("fig-blame", "Straggler blame per rank, grouped by host", fig_blame(report), figs,
               "Bars: how long each other rank waited for this rank at collectives, per step (a waiting rank's "
               "overlapping waits counted once; red = named straggler). Diamonds: its lateness against the naming "
               "floor (dashed).",
               "No collective was matched across ranks: no straggler analysis."),
        "</div>",
        _chart("fig-imbalance", "Work and memory per rank", fig_imbalance(report), figs,
               "Per-rank means per step (TFLOP/s: FLOPs over wall time; torch counts FLOPs of a few ops only); "
               "the dashed line marks the mean over ranks."),
        "<div class=\"grid\">",
        _chart("fig-overlap", "Communication overlap per rank", fig_overlap(report), figs,
               "Share of communication hidden under compute, and exposed communication as a share of step time."),
        _chart("fig-annotations", "User annotations (record_function regions) per rank", fig_annotations(report),
               figs, "Milliseconds per step inside each region, per rank.",
               "No user annotations in this run." if report.annotations is not None
               else "This report has no annotations table (written by an older distprof)."),
        "</div>",
        _chart("fig-memory", "Memory timeline per rank", mem_fig, figs, mem_note if mem_fig else "", mem_note),
        _chart("fig-critical-path", "Critical path of one step, across ranks", fig_critical_path(report),
               figs, critical_path_caption(report), "No step graph: no matched collective or transfer."),
    ]


def _table_sections(report: Report) -> list[str]:
    """The sections of the tables the report has rows for (what if, GPU time, collectives, pipelines, annotations);
    a table without rows has no section."""
    sections = [
        ("whatif", "What if", "The step time each change would give, from a replay of the cross-rank step graph "
         "(docs/whatif.md).", whatif_table(report)),
        ("gpu-time", "GPU time per rank", "HTA's temporal breakdown of each rank's GPU span (idle: no kernel or copy "
         "on any stream; non-compute: only communication or memory ran) and the share of communication-kernel time "
         "hidden under compute kernels.", html_tables.gpu_time_table(report)),
        ("collectives", "Collectives per group and op", "Per rank and recorded step: calls, bytes, time in the "
         "collective and the part of it the rank only waited (exposed); the rank that arrived last most often.",
         html_tables.collectives_table(report)),
        ("pipelines", "Pipeline stages", "Per stage (medians over steps): compute, the time it waited on receives "
         "for a peer that had not sent yet (the bubble), and how long the others waited for its sends.",
         html_tables.pipeline_tables(report)),
        ("annotation-table", "Annotation spread", "", html_tables.annotation_table(report)),
    ]
    return [f"<section id=\"{sec_id}\"><h2>{title}</h2>" + (f"<p class=\"caption\">{caption}</p>" if caption else "")
            + f"{table}</section>" for sec_id, title, caption, table in sections if table]


def _closing_sections(report: Report) -> list[str]:
    """The page's end: root cause of the named stragglers, clock alignment, warnings and the footer."""
    rule_text = "" if report.straggler_info is None else report.straggler_info.rule.text
    return [
        f"<section id=\"root-cause\"><h2>Root cause of named stragglers</h2>"
        f"<p class=\"caption\">Ops that took longer on the straggler than the median of its peers (inclusive "
        f"times).</p>{html_tables.root_cause(report)}</section>",
        f"<section id=\"clock\"><h2>Clock alignment</h2><p class=\"caption\">How each host's clock was mapped onto "
        f"the reference rank's; the residual is the collective causality violation left after alignment.</p>"
        f"{html_tables.clock_table(report)}"
        + (f"<p class=\"caption\">Straggler rule: {_e(rule_text)}</p>" if rule_text else "")
        + "</section>",
        f"<section id=\"warnings\"><h2>Warnings</h2>{html_tables.warnings(report)}</section>",
        f"<footer>distprof {_e(report.distprof_version)} · report format {_e(report.report_version)} · "
        f"self-contained page: charts by the inlined plotly.js, no network needed</footer>",
    ]


def _page(report: Report, body: list[str], figs: dict[str, Any], compress_js: bool) -> str:
    """The whole document around the `body` sections: head with the CSS, the figures' JSON, plotly.js, boot script."""
    page = [
        "<!DOCTYPE html>",
        "<html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        f"<title>distprof report — {_e(report.run.id)}</title>",
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


def write_html(report: Report, path: str | os.PathLike, *, compress_js: bool = True) -> Path:
    """Write the HTML report to `path` (temporary file + rename, so nobody sees half a file); returns the path."""
    path = check_html_path(path)
    text = render_html(report, compress_js=compress_js)
    with atomic_write(path) as fh:
        fh.write(text.encode("utf-8"))
    logger.info("wrote %s (%d bytes)", path, len(text.encode("utf-8")))
    return path