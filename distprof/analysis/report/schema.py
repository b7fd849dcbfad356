"""What identifies a report.json (format name and version) and how report values become plain JSON."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["REPORT_FORMAT", "REPORT_VERSION", "to_jsonable"]


REPORT_FORMAT = "distprof-report"


REPORT_VERSION = "1.0"


def to_jsonable(x: Any) -> Any:
    """Plain Python values only: numpy scalars and arrays converted, NaN and ±inf become None, keys become str."""
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return [to_jsonable(v) for v in x.tolist()]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x
