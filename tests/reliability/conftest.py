"""Fixtures of the reliability suite (helpers: reliability_helpers.py, bad shards: shard_factory.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def good_run_dir(tmp_path_factory) -> Path:
    from shard_factory import good_run

    return good_run(tmp_path_factory.mktemp("good"))
