"""Renderers: turn a report dict (``distprof.analysis.report.build.build_report``) into text, JSON or an HTML page."""

from __future__ import annotations

from .console import render_console
from .html import render_html, write_html
from .json_renderer import render_json, write_json

__all__ = ["render_console", "render_json", "write_json", "render_html", "write_html"]
