"""build_report(run, release=True): the caller hands the run over, and each per-rank table goes once its last reader
is done (RunSummary.release_memory_curves / release_rows). The report is the same as when everything is kept, and
a read of a released table after that fails loudly instead of reading an empty one."""

from __future__ import annotations

import copy
import pickle

import orjson
import pytest
from conftest import bench_module
from synth import make_run

import distprof
from distprof.analysis.report.build import build_report
from distprof.analysis.types import Released


def _ddp(tmp_path):
    """4 ranks on 2 hosts, rank 2 late, with memory curves and CPU samples."""
    return make_run(tmp_path / "ddp", world_size=4, hosts=[0, 0, 1, 1], clocks={1: (3.25, 40.0)}, late_rank=2,
                    late_ms=30).run_dir


def _pipeline(tmp_path):
    """16 ranks of the pipeline shape: point-to-point transfers beside the collectives."""
    synth = bench_module("synth")
    args = synth.parse_args(["--shape", "pp", "--ranks", "16", "--layers", "4", "--steps", "2", "--windows", "1",
                             "--events", "3000", "--run-id", "pp", "-o", str(tmp_path / "pp")])
    synth.generate(synth.spec_from(args), tmp_path / "pp")
    return tmp_path / "pp"


def _doc(report) -> bytes:
    return orjson.dumps(report.to_json(), option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)


@pytest.mark.parametrize("make", [_ddp, _pipeline], ids=["ddp", "pipeline"])
def test_release_gives_the_report_kept_tables_give(tmp_path, make):
    run_dir = make(tmp_path)
    kept = build_report(distprof.load(run_dir, progress=False))
    run = distprof.load(run_dir, progress=False)
    assert any(s.memory_series for s in run.ranks.values())  # something to release of each kind
    assert len(run.collective_rows["rank"]) and len(run.collectives)
    released = build_report(run, release=True)
    assert _doc(released) == _doc(kept)
    assert released.whatif and released.critical_path.n_steps and released.memory.curves  # compared: not empty
    # everything the report let go says so when read
    one = run.ranks[min(run.ranks)]
    for table in (run.collective_rows, run.collectives, one.collectives, one.p2p, one.memory_series):
        assert isinstance(table, Released)
    with pytest.raises(RuntimeError, match=r"RunSummary\.collective_rows was released"):
        run.collective_rows["rank"]
    with pytest.raises(RuntimeError, match="RunSummary.collectives was released"):
        run.collectives.members
    with pytest.raises(RuntimeError, match="memory_series was released"):
        sorted(one.memory_series)
    # what the run keeps: the matched transfers, and which ranks ran collectives
    assert run.ranks_with_collectives == frozenset(run.ranks)


def test_kept_by_default(tmp_path):
    run = distprof.load(_ddp(tmp_path), progress=False)
    build_report(run)
    assert not isinstance(run.collective_rows, Released) and len(run.collectives)
    assert all(not isinstance(s.memory_series, Released) for s in run.ranks.values())


def test_released_fails_on_every_read_but_introspection():
    r = Released("x")
    for read in (lambda: r["a"], lambda: len(r), lambda: list(r), lambda: "a" in r, lambda: r.members):
        with pytest.raises(RuntimeError, match="x was released once its last reader was done"):
            read()
    assert repr(r) == "Released('x')"
    assert not hasattr(r, "__array_interface__") and not hasattr(r, "_repr_html_")  # probes: absent, not an error
    assert copy.deepcopy(r).what == "x" and pickle.loads(pickle.dumps(r)).what == "x"
