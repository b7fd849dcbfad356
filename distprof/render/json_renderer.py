"""report.json: a Report as JSON (format in docs/report-format.md), written atomically.

The text is ``Report.to_json()`` dumped with ``indent=1``, strict JSON (no NaN) and non-ASCII kept as it is. The
same functions write ``distprof diff``'s document, which is plain JSON already (``RunDiff.to_dict()``).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..atomic import atomic_write
from ..record import Record

if TYPE_CHECKING:
    from ..analysis.report.model import Report

logger = logging.getLogger(__name__)

__all__ = ["render_json", "write_json"]


def render_json(report: Report | dict[str, Any], *, indent: int | None = 1) -> str:
    """The report (or a plain JSON document) as JSON text (strict JSON: no NaN)."""
    doc = report.to_json() if isinstance(report, Record) else report
    return json.dumps(doc, indent=indent, allow_nan=False, ensure_ascii=False) + "\n"


def write_json(report: Report | dict[str, Any], path: str | os.PathLike) -> Path:
    """Write the report to `path` (temporary file + rename, so a reader never sees half a file)."""
    path = Path(path)
    text = render_json(report)
    with atomic_write(path) as fh:
        fh.write(text.encode("utf-8"))
    logger.info("wrote %s (%d bytes)", path, len(text))
    return path
