"""Renderers: turn a report dict (``distprof.analysis.report.build_report``) into text or a file."""

from __future__ import annotations

from .console import render_console
from .json_renderer import render_json, write_json

__all__ = ["render_console", "render_json", "write_json"]
