"""Renderers: turn a :class:`~distprof.analysis.report.model.Report` (``build_report``) into text, JSON or an HTML
page. Each takes the Report and nothing else, and reads it by attribute.

    render_console(report, color=False)   # the terminal summary (console.py; every string terminal-safe)
    write_json(report, "report.json")     # report.to_json(), atomically (json_renderer.py)
    write_html(report, "report.html")     # one self-contained page (html.py)
"""

from __future__ import annotations

from .console import render_console
from .html import render_html, write_html
from .json_renderer import render_json, write_json

__all__ = ["render_console", "render_json", "write_json", "render_html", "write_html"]
