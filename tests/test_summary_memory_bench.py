"""benchmarks/summary_memory.py --phases: every phase of build_report is traced once, in call order, and the
report's own functions are back in place afterwards."""

from __future__ import annotations

import tracemalloc

from conftest import bench_module

import distprof
from distprof.analysis.graph import whatif
from distprof.analysis.report import build
from synth import make_run  # tests/synth.py (benchmarks/ has a synth.py too: the benchmark is loaded by path)

summary_memory = bench_module("summary_memory")


def test_each_phase_is_traced_in_order_and_the_functions_restored(tmp_path):
    run = distprof.load(make_run(tmp_path, world_size=2).run_dir)
    before = {n: getattr(build, n) for n in summary_memory.PHASES if hasattr(build, n)}
    tracemalloc.start()
    try:
        got = summary_memory.phase_peaks(run)
    finally:
        tracemalloc.stop()
    names = [g[0] for g in got]
    assert names.index("find_stragglers") < names.index("step_graph") < names.index("whatif_table")
    assert "what-if schedule" in names and names.count("find_stragglers") == 1
    for name, held, peak, after, cpu in got:
        assert 0 <= held <= peak and after <= peak and cpu >= 0, name
    assert {n: getattr(build, n) for n in before} == before
    assert whatif.schedule.__module__.endswith("schedule")
