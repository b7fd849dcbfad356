"""The fast tier (`pytest -m "not slow"`) starts no job: conftest.torchrun() fails a test not marked slow, before it
starts anything, and says how to mark it."""

from __future__ import annotations

import pytest

from conftest import require_slow, torchrun


def test_torchrun_in_a_test_not_marked_slow_fails_saying_how_to_mark_it(tmp_path, request):
    with pytest.raises(pytest.fail.Exception, match=r"starts a torchrun job but is not marked slow: add @pytest.mark"):
        torchrun(2, ["no_such_script.py"], cwd=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing was started
    request.node.add_marker(pytest.mark.slow)
    require_slow("a torchrun job")  # marked slow: allowed
