"""Text helpers shared by the HTML report modules: escaping for HTML and for plotly, JSON safe inside ``<script>``,
and number formatting that tolerates missing or non-finite values.

Every string from the trace (op and annotation names, hosts, run id, warnings, findings) reaches the page either
through ``_e`` (HTML text) or inside the figure JSON (``_script_json``), where ``<``, ``>``, ``&``, U+2028 and U+2029
are written as ``\\uXXXX`` so nothing can close the ``<script>`` element; strings plotly renders as (pseudo-)HTML —
labels, hover text — go through ``_pl`` first so plotly shows them literally.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any, Iterable

from ..record import jsonable

# ---------------------------------------------------------------------------------------------------------------
# escaping


def _e(x: Any) -> str:
    """HTML text or attribute value (the JS line separators as character references too: harmless in HTML, but
    the page then holds none anywhere)."""
    s = html.escape("" if x is None else str(x), quote=True)
    return s.replace("\u2028", "&#x2028;").replace("\u2029", "&#x2029;")


def _pl(x: Any) -> str:
    """A string plotly will render (labels, category names, hover text): plotly parses a little HTML (<b>, <br>,
    <a href>) and decodes entities, so escaping &, < and > makes it show the text literally."""
    return str(x).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_JSON_SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _script_json(obj: Any) -> str:
    """JSON safe to embed in a <script> element: <, >, & and the JS line separators only occur inside JSON strings,
    where their \\u escapes mean the same, so nothing in the data can end the element or start a comment. Values
    are made plain first (``record.jsonable``: numpy values converted, NaN and ±inf as null)."""
    text = json.dumps(jsonable(obj), allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    for ch, rep in _JSON_SCRIPT_ESCAPES.items():
        text = text.replace(ch, rep)
    return text


# ---------------------------------------------------------------------------------------------------------------
# numbers


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _fmt(x: Any, fmt: str = "{:.1f}", none: str = "–") -> str:
    v = _num(x)
    return none if v is None else fmt.format(v)


def _mean(vals: Iterable[float | None]) -> float | None:
    v = [x for x in vals if x is not None]
    return sum(v) / len(v) if v else None
