"""Shards with valid layout but hostile values, fuzzed with hypothesis: random columns of one rank's shard overwritten
with extreme, constant, random or permuted values of the column's own dtype. report, timeline and export either use
the shard or skip it with one named reason; the other ranks are always analysed; never a traceback.

60 cases by default, 400 when CI=true. Deterministic (derandomize).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from reliability_helpers import run_cli
from shard_factory import BAD_NAME, copy_run

from distprof.storage import schema

FULL = os.environ.get("CI", "").lower() in ("true", "1", "yes")
N_CASES = 400 if FULL else 60
TABLES = ("events", "comms", "threads", "steps", "memory", "clock/samples", "clock/local")
COLUMNS = [(t, c) for t in TABLES for c in schema.TABLES[t]]
FILLS = ("max", "min", "random", "minus_one", "small", "zero", "permuted", "shifted")


def _values(dt: np.dtype, n: int, fill: str, seed: int, old: np.ndarray) -> np.ndarray:
    info = np.iinfo(dt)
    rng = np.random.default_rng(seed)
    if fill == "max":
        return np.full(n, info.max, dt)
    if fill == "min":
        return np.full(n, info.min, dt)
    if fill == "random":
        return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    if fill == "minus_one":
        return np.full(n, -1 if info.min < 0 else info.max, dt)
    if fill == "small":
        return rng.integers(max(info.min, -3), min(info.max, 3), n, dtype=dt, endpoint=True)
    if fill == "zero":
        return np.zeros(n, dt)
    if fill == "permuted":
        return rng.permutation(old)
    return (old.astype(np.int64) + int(rng.integers(-10**12, 10**12))).clip(info.min, info.max).astype(dt)


mutation = st.tuples(st.sampled_from(COLUMNS), st.sampled_from(FILLS), st.integers(0, 2**32 - 1))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from shard_factory import good_run

    return good_run(tmp_path_factory.mktemp("base"))


@pytest.mark.timeout(1800 if FULL else 300)
@settings(max_examples=N_CASES, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate, Phase.shrink],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(muts=st.lists(mutation, min_size=1, max_size=3), command=st.sampled_from(["report", "timeline", "export"]))
def test_hostile_column_values_are_used_or_skipped_never_a_traceback(base, muts, command):
    tmp = Path(tempfile.mkdtemp(prefix="shardfuzz-"))
    try:
        run = copy_run(base, tmp / "run")
        with h5py.File(run / BAD_NAME, "r+") as f:
            for (table, col), fill, seed in muts:  # a field of the table's compound dataset, rewritten in place
                if table not in f or col not in f[table].dtype.names or not f[table].shape[0]:
                    continue
                ds = f[table]
                rec = ds[()]
                rec[col] = _values(schema.TABLES[table][col], len(rec), fill, seed, rec[col])
                ds[...] = rec
        out = {"report": ["--json", tmp / "r.json"], "timeline": ["-o", tmp / "t.json"], "export": ["-o", tmp / "k"]}
        rc, stdout, err = run_cli([command, run, "--no-progress", *out[command]])
        assert rc == 0, err
        skipped = [ln for ln in err.splitlines() if BAD_NAME in ln and ln.startswith("distprof: WARNING: skipped")]
        event("skipped" if skipped else "used")
        assert len(skipped) <= 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
