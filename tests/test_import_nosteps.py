"""Traces without ``ProfilerStep#N`` and traces without a rank (`distprof import`, distprof/importers/units.py).

Real traces from TraceLens (tests/data/tracelens: an MI210 GPU-only trace, an SGLang decode, a vLLM CUDA-graph capture,
H100 and MI300 inference traces with no rank) and small synthetic traces for each unit: the whole trace, top-level user
regions, graph replays.
"""

from __future__ import annotations

import json
from pathlib import Path

import distprof
import numpy as np
import pytest

from distprof.analysis.report.build import build_report
from distprof.errors import ConfigError
from distprof.importers.run import import_traces
from distprof.storage.reader import find_shards, read_shard

TL = Path(__file__).parent / "data" / "tracelens"
GPU_ONLY = TL / "gpu_only_trace.json.gz"
SGLANG = TL / "sglang_Qwen3-8B_decode.json.gz"
BERT = TL / "gaunernst_bert-small-uncased__1016001.json.gz"
VLLM = TL / "graph_capture_rank_0.1773709742341309550.pt.trace.json.gz"
FALCON = TL / "Falconsai_nsfw_image_detection__1016002.json.gz"
LAUNCHED_BEFORE = "launched before the recording began"


def _plain(rep):
    """The report as JSON-like data."""
    return rep.to_json()


def _shard(run_dir: Path):
    (path,) = find_shards(run_dir)
    return read_shard(path)


def _report(run_dir: Path) -> dict:
    return _plain(build_report(distprof.load(run_dir, progress=False)))


# ---- real traces -----------------------------------------------------------------------------------------------------


def test_the_report_says_which_unit_its_steps_are(tmp_path):
    import_traces([GPU_ONLY], tmp_path / "r", progress=False)
    rep = build_report(distprof.load(tmp_path / "r", progress=False))
    assert rep.run.step_unit == "whole_trace" and rep.to_json()["run"]["step_unit"] == "whole_trace"
    from distprof.render import render_console, render_html

    assert "steps 0-0 (1 steps) of the whole trace (no ProfilerStep# in it)" in render_console(rep)
    assert "a step is the whole trace (no ProfilerStep# in it)" in render_html(rep, compress_js=False)


@pytest.mark.parametrize("trace, n_gpu, note", [
    (GPU_ONLY, 562, "rank 0 of 1"),  # MI210, kernels and runtime only, no rank anywhere
    (SGLANG, 558, None),  # one hipGraphLaunch, one top-level region (step[DECODE] inside execute_...): whole trace
])
def test_real_trace_without_steps_is_one_step(tmp_path, trace, n_gpu, note):
    res = import_traces([trace], tmp_path / "r", progress=False)
    assert res.ranks == [0] and res.world_size == 1
    assert any(f"{trace}: no ProfilerStep# in the trace: the whole trace" in w and "one step (step 0)" in w
               for w in res.warnings), res.warnings
    assert any(note in w and "no rank in the trace" in w for w in res.warnings) if note else \
        not any("no rank" in w for w in res.warnings)
    sh = _shard(tmp_path / "r")
    assert sh.attrs["step_unit"] == "whole_trace"
    assert (sh.attrs["first_step"], sh.attrs["last_step"]) == (0, 0)
    st, ev = sh.table("steps"), sh.table("events")
    assert st["step"].tolist() == [0]
    end = ev["ts_ns"] + ev["dur_ns"]
    assert st["start_ns"][0] == ev["ts_ns"].min() and st["end_ns"][0] >= end.max()
    assert (ev["step"] == 0).all()  # every event, every GPU event included (its launch is in the step)
    assert int((ev["device"] >= 0).sum()) >= n_gpu

    rep = _report(tmp_path / "r")
    assert not rep["verdict"].startswith("No recorded steps")
    assert rep["run"]["n_steps"] == 1 and rep["summary"]["n_steps"] == 1
    assert rep["findings"], "one step of real GPU work: the rules have something to say"
    (gt,) = rep["gpu_time"]
    assert gt["n_gpu_events"] == n_gpu and gt["span_us"] > 0
    assert rep["steps"][0]["step_ms"] > 0 and rep["steps"][0]["compute_ms"] > 0
    assert not any(LAUNCHED_BEFORE in w for w in rep["warnings"]), rep["warnings"]


def test_rankless_trace_with_steps_is_rank_0_of_1(tmp_path):
    res = import_traces([BERT], tmp_path / "r", progress=False)
    assert res.ranks == [0] and res.world_size == 1
    notes = [w for w in res.warnings if "no rank" in w]
    assert notes == [f"{BERT}: no rank in the trace (distributedInfo) nor in the file name: imported as rank 0 of 1 "
                     "(pass --rank N to choose another)"]
    assert not any("ProfilerStep" in w for w in res.warnings)
    sh = _shard(tmp_path / "r")
    assert sh.attrs["step_unit"] == "profiler_step" and sh.table("steps")["step"].tolist() == [6]
    assert sh.attrs["device"] == "NVIDIA H100 80GB HBM3"
    rep = _report(tmp_path / "r")
    assert rep["run"]["first_step"] == 6 and rep["findings"] and rep["gpu_time"][0]["n_gpu_events"] == 61


def test_rank_flag_still_names_a_rankless_file(tmp_path):
    res = import_traces([BERT], tmp_path / "r", rank=3, world_size=4, progress=False)
    assert res.ranks == [3] and res.world_size == 4
    assert not any("no rank" in w for w in res.warnings)


def test_several_rankless_files_still_need_names(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    for name in ("a.json.gz", "b.json.gz"):
        (d / name).write_bytes(GPU_ONLY.read_bytes())
    with pytest.raises(ConfigError, match=r"a\.json\.gz: no rank in the trace.*rename it rank-N\.json\.gz"):
        import_traces([d], tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()


def test_cli_says_the_rank_and_the_unit_once(tmp_path, capsys):
    from distprof.cli import main

    assert main(["import", str(GPU_ONLY), "-o", str(tmp_path / "r"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert err.count("imported as rank 0 of 1") == 1 and err.count("analysed as one step") == 1


@pytest.mark.parametrize("trace", [VLLM, FALCON], ids=["vllm_graph_capture", "mi300_rankless"])
def test_more_real_traces_import_and_report(tmp_path, trace):
    res = import_traces([trace], tmp_path / "r", progress=False)
    assert res.ranks == [0] and res.world_size == 1
    sh = _shard(tmp_path / "r")
    rep = _report(tmp_path / "r")
    assert not rep["verdict"].startswith("No recorded steps") and rep["findings"] and rep["gpu_time"]
    assert not any(LAUNCHED_BEFORE in w for w in rep["warnings"])
    if trace == VLLM:  # rank 0 from its name; one top-level region (capture_32_FULL) and no replay: whole trace
        assert sh.attrs["step_unit"] == "whole_trace" and rep["gpu_time"][0]["n_gpu_events"] == 10
    else:  # no rank anywhere, one ProfilerStep; Kineto's device 2 is the only device the trace lists (id 0)
        assert sh.attrs["step_unit"] == "profiler_step" and sh.attrs["device"] == "AMD Instinct MI300X VF"
        assert any("imported as rank 0 of 1" in w for w in res.warnings)


# ---- synthetic traces: one per unit ----------------------------------------------------------------------------------

T0 = 1_000_000  # µs


def _x(cat, name, ts, dur, tid=1, pid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": T0 + ts, "dur": dur, "args": args}


def _launch(ts, corr, name="cudaLaunchKernel"):
    return _x("cuda_runtime", name, ts, 5, correlation=corr)


def _kernel(ts, dur, corr, name="gemm"):
    return _x("kernel", name, ts, dur, tid=7, pid=0, device=0, stream=7, correlation=corr)


def _write(tmp_path: Path, events: list, name="rank-0.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return p


def _steps_of(run_dir: Path) -> tuple[dict, dict, dict]:
    """The shard's attributes, steps table and events table."""
    sh = _shard(run_dir)
    return sh.attrs, sh.table("steps"), sh.table("events")


def test_top_level_user_regions_are_the_steps(tmp_path):
    ev = [
        _x("user_annotation", "decode", 0, 1000), _x("user_annotation", "attention", 100, 100),  # nested: not a step
        _x("cpu_op", "aten::mm", 400, 200), _launch(500, 1), _kernel(600, 100, 1),
        _launch(1500, 2), _kernel(1600, 100, 2),  # launched between the regions: in no step
        _x("user_annotation", "decode", 2000, 1000), _launch(2500, 3), _kernel(2600, 200, 3),
        _x("user_annotation", "other thread", 0, 5000, tid=2),  # one region on another thread: not the steps
        _kernel(10, 20, 99),  # its launch is not in the trace: really launched before the recording began
    ]
    res = import_traces([_write(tmp_path, ev)], tmp_path / "r", progress=False)
    attrs, st, e = _steps_of(tmp_path / "r")
    assert attrs["step_unit"] == "user_region" and attrs["pid"] == 1
    assert st["step"].tolist() == [0, 1]
    assert (st["start_ns"] - T0 * 1000).tolist() == [0, 2_000_000]
    assert (st["end_ns"] - T0 * 1000).tolist() == [1_000_000, 3_000_000]
    k = e["device"] >= 0
    assert dict(zip(e["corr_id"][k].tolist(), e["step"][k].tolist())) == {1: 0, 2: -1, 3: 1, 99: -1}
    assert any("its 2 top-level user regions on thread 1 (first: 'decode') are the steps 0..1" in w
               for w in res.warnings)
    rep = _report(tmp_path / "r")
    assert rep["run"]["n_steps"] == 2
    # the kernel launched between the regions has its launch in the trace: only the one without is named
    (w,) = [w for w in rep["warnings"] if LAUNCHED_BEFORE in w]
    assert w.startswith("1 GPU event(s) (0.0 ms) on rank(s) 0 were")


def test_graph_replays_are_the_steps(tmp_path):
    ev = [_x("cpu_op", "setup", 0, 300), _launch(100, 1), _kernel(200, 50, 1, "fill")]
    for i, at in enumerate((1000, 2000, 3000)):
        c = 10 + i
        ev += [_x("cuda_runtime", "hipGraphLaunch", at, 20, correlation=c),
               _kernel(at + 50, 300, c), _kernel(at + 400, 100, c, "softmax")]
    ev.append(_x("cpu_op", "sample", 3500, 100))
    res = import_traces([_write(tmp_path, ev)], tmp_path / "r", progress=False)
    attrs, st, e = _steps_of(tmp_path / "r")
    assert attrs["step_unit"] == "graph_replay"
    assert st["step"].tolist() == [0, 1, 2]
    assert (st["start_ns"] - T0 * 1000).tolist() == [1_000_000, 2_000_000, 3_000_000]
    assert (st["end_ns"] - T0 * 1000).tolist() == [2_000_000, 3_000_000, 3_600_000]
    k = e["device"] >= 0
    assert sorted(zip(e["corr_id"][k].tolist(), e["step"][k].tolist())) == [
        (1, -1), (10, 0), (10, 0), (11, 1), (11, 1), (12, 2), (12, 2)]
    assert any("its 3 graph replays (hipGraphLaunch on thread 1) are the steps 0..2" in w for w in res.warnings)
    rep = _report(tmp_path / "r")
    assert rep["run"]["n_steps"] == 3 and len(rep["steps"]) == 3
    assert not any(LAUNCHED_BEFORE in w for w in rep["warnings"])


def test_one_region_or_one_replay_is_the_whole_trace(tmp_path):
    ev = [_x("user_annotation", "outer", 10, 500), _x("user_annotation", "inner", 20, 100),
          _x("user_annotation", "inner", 200, 100), _x("user_annotation", "marker", 800, 0),  # no length: no step
          _x("cuda_runtime", "cudaGraphLaunch", 30, 5, correlation=4),
          _kernel(40, 50, 4), _kernel(900, 100, 4)]
    res = import_traces([_write(tmp_path, ev)], tmp_path / "r", progress=False)
    attrs, st, e = _steps_of(tmp_path / "r")
    assert attrs["step_unit"] == "whole_trace"
    assert (st["start_ns"] - T0 * 1000).tolist() == [10_000] and (st["end_ns"] - T0 * 1000).tolist() == [1_000_000]
    assert (e["step"] == 0).all()
    assert any("the whole trace (1.0 ms) is analysed as one step (step 0)" in w for w in res.warnings)


def test_profiler_steps_are_kept_as_they_are(tmp_path):
    ev = [_x("user_annotation", "ProfilerStep#4", 0, 1000), _x("user_annotation", "ProfilerStep#5", 1000, 1000),
          _x("user_annotation", "region", 100, 100), _x("user_annotation", "region", 1100, 100),
          _launch(500, 1), _kernel(600, 100, 1)]
    res = import_traces([_write(tmp_path, ev)], tmp_path / "r", progress=False)
    attrs, st, _ = _steps_of(tmp_path / "r")
    assert attrs["step_unit"] == "profiler_step" and st["step"].tolist() == [4, 5]
    assert not any("ProfilerStep#" in w for w in res.warnings)


def test_launch_after_the_last_step_is_not_called_launched_before(tmp_path):
    ev = [_x("user_annotation", "ProfilerStep#1", 0, 1000), _x("user_annotation", "ProfilerStep#2", 1000, 1000),
          _launch(500, 1), _kernel(600, 100, 1), _launch(1500, 2), _kernel(1600, 100, 2),
          _launch(2500, 3), _kernel(2600, 100, 3),  # after the last step: its launch is in the trace
          _kernel(5, 10, 77), _kernel(20, 10, 78)]  # no launch recorded: before the recording began
    import_traces([_write(tmp_path, ev)], tmp_path / "r", progress=False)
    _, _, e = _steps_of(tmp_path / "r")
    k = e["device"] >= 0
    assert np.count_nonzero(e["step"][k] < 0) == 3
    (w,) = [w for w in _report(tmp_path / "r")["warnings"] if LAUNCHED_BEFORE in w]
    assert w.startswith("2 GPU event(s) (0.0 ms) on rank(s) 0 were")


def test_an_empty_trace_gets_no_steps(tmp_path):
    res = import_traces([_write(tmp_path, [])], tmp_path / "r", progress=False)
    attrs, st, _ = _steps_of(tmp_path / "r")
    assert len(st["step"]) == 0 and attrs["step_unit"] == "profiler_step"
    assert not any("ProfilerStep" in w for w in res.warnings)
