"""report.json's text made by joining its values' texts (render/json_renderer.py: _text) is json.dumps's text with
indent=1, byte for byte, at any depth — for any plain JSON value, and for what json itself refuses."""

from __future__ import annotations

import json
import math
from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distprof.render.json_renderer import _text


def _json(x, depth: int) -> str:
    """The definition: json.dumps at indent 1, each line after the first `depth` levels deeper."""
    return json.dumps(x, indent=1, allow_nan=False, ensure_ascii=False).replace("\n", "\n" + " " * depth)


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
                    st.floats(allow_nan=False, allow_infinity=False), st.text())
VALUES = st.recursive(SCALARS, lambda kids: st.one_of(
    st.lists(kids, max_size=5), st.tuples(kids, kids),
    st.dictionaries(st.text(max_size=8), kids, max_size=5),
    st.dictionaries(st.one_of(st.integers(), st.booleans(), st.none(), st.text(max_size=3)), kids, max_size=3)),
    max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(VALUES, st.integers(min_value=0, max_value=3))
def test_the_joined_text_is_json_s_own(x, depth):
    assert _text(x, depth) == _json(x, depth)


@pytest.mark.parametrize("x", [
    [{"rank": 0, "lateness_ms": 1.5, "host": "node-ü\x1b[31m", "named": True, "note": None}] * 3,
    {"a": [], "b": {}, "c": [[], [{}]], "d": (1, (2,))},
    OrderedDict(a=1), [OrderedDict(b=[1.0, -0.0, 1e16, 5e-324])],  # subclasses: json's own path
    [True, 1, 1.0, False, 0, 0.0],
])
def test_report_shaped_values(x):
    for depth in (0, 1, 2):
        assert _text(x, depth) == _json(x, depth)


@pytest.mark.parametrize("bad", [math.nan, [math.inf], {"k": [-math.inf]}, [object()], {(1, 2): 3}])
def test_what_json_refuses_it_refuses(bad):
    with pytest.raises((ValueError, TypeError)) as got:
        _text(bad, 1)
    with pytest.raises(got.type):
        _json(bad, 1)
