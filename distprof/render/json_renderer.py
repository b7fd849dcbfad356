"""report.json: the report dict as JSON (format in docs/report-format.md), written atomically."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from ..atomic import atomic_write

logger = logging.getLogger(__name__)

__all__ = ["render_json", "write_json"]


def render_json(report: dict[str, Any], *, indent: int | None = 1) -> str:
    """The report as JSON text (strict JSON: no NaN)."""
    return json.dumps(report, indent=indent, allow_nan=False, ensure_ascii=False) + "\n"


def write_json(report: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write the report to `path` (temporary file + rename, so a reader never sees half a file)."""
    path = Path(path)
    text = render_json(report)
    with atomic_write(path) as fh:
        fh.write(text.encode("utf-8"))
    logger.info("wrote %s (%d bytes)", path, len(text))
    return path
