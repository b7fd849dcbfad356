"""The self-contained HTML page of ``distprof diff`` (a ``RunDiff``; tables and CSS bars, no script): verdict,
splits, comparisons. Every string from the runs goes through ``html_text._e``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..atomic import atomic_write
from .html_assets import _CSS
from .html_text import _e, _fmt

if TYPE_CHECKING:
    from ..analysis.report.diff import Part, RunDiff

__all__ = ["render_diff_html", "write_diff_html"]


def _table(parts: list[Part]) -> str:
    scale = max([abs(p.delta or 0.0) for p in parts] + [1e-9])
    rows = []
    for p in parts:
        d = p.delta or 0.0
        w = 100.0 * abs(d) / scale
        bar = (f"<div style=\"background:{'#d62728' if d > 0 else '#2ca02c'};height:0.8em;width:{w:.1f}%\"></div>")
        cls = ' class="sig"' if p.significant else ""
        sig = "yes" if p.significant else "inside the noise"
        rows.append(f"<tr{cls}><td>{_e(p.label)}</td>"
                    f"<td>{_fmt(p.a, '{:.2f}')}</td><td>{_fmt(p.b, '{:.2f}')}</td>"
                    f"<td>{_fmt(d, '{:+.2f}')}</td><td>±{_fmt(p.band, '{:.2f}')}</td>"
                    f"<td>{_fmt(p.share_pct, '{:.0f} %')}</td>"
                    f"<td>{sig}</td><td style=\"width:20%\">{bar}</td></tr>")
    return ("<table class=\"num\"><thead><tr><th></th><th>A</th><th>B</th><th>change</th><th>noise band</th>"
            "<th>share of change</th><th>significant</th><th></th></tr></thead><tbody>" + "".join(rows)
            + "</tbody></table>")


def render_diff_html(d: RunDiff) -> str:
    titles = {"phase": "By phase", "rank": "By rank: time on the cross-rank critical path",
              "collective": "By collective: exposed communication per group and op"}
    body = [f"<h1>distprof diff</h1><p>A = {_e(d.a_id)} ({_e(d.a_world)} ranks), "
            f"B = {_e(d.b_id)} ({_e(d.b_world)} ranks)</p>",
            f"<div class=\"verdict\" id=\"verdict\"><span class=\"label\">Verdict</span> {_e(d.verdict)}</div>",
            "<section id=\"step\"><h2>Step time (ms per step)</h2>" + _table([d.step]) + "</section>"]
    for k, sp in d.splits.items():
        body.append(f"<section id=\"split-{_e(k)}\"><h2>{_e(titles.get(k, k))}</h2><p class=\"caption\">The parts "
                    f"add up to the change, {_fmt(sp.total, '{:+.2f}')} ms per step.</p>" + _table(sp.parts)
                    + "</section>")
    if d.ops:
        body.append("<section id=\"ops\"><h2>Ops (own time, ms per step; ops nest, so they do not add up)</h2>"
                    + _table(d.ops) + "</section>")
    comp = d.memory + d.flops
    if comp:
        body.append("<section id=\"memory-flops\"><h2>Memory and FLOPs</h2>" + _table(comp) + "</section>")
    body.append(f"<footer>Noise band: {_e(d.rules.z)} standard errors of the difference from the "
                f"step-to-step spread, at least {_e(d.rules.floor_pct)} % of A's value. docs/whatif.md</footer>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>distprof diff</title>"
            f"<style>{_CSS} tr.sig td {{font-weight:600}}</style></head><body><main>" + "\n".join(body)
            + "</main></body></html>\n")


def write_diff_html(d: RunDiff, path: str | os.PathLike) -> Path:
    path = Path(path)
    with atomic_write(path) as fh:
        fh.write(render_diff_html(d).encode("utf-8"))
    return path
