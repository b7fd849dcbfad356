"""Two GPUs in one trace that both use stream 7: separate tracks everywhere (threads table, analyses, timeline, export).

Kineto numbers streams per device, so stream 7 of GPU 0 and stream 7 of GPU 1 are different queues. The trace below
(written by the test) has one rank driving both devices; its kernels overlap in time across the devices, and a CPU
thread that also has OS tid 7.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import distprof
import numpy as np
import pytest

from distprof.analysis.rank import intervals as iv
from distprof.analysis.cross.gpu_time import gpu_time
from distprof.analysis.summarize.merged import load_run
from distprof.events.tables import Columns, Strings, build_tables, track_keys
from distprof.export import export_kineto
from distprof.importers.run import import_traces
from distprof.export import timeline as tl
from distprof.storage import read_shard, schema

BASE_NS = 1_700_000_000_000_000_000
CPU_PID = 4242
MAIN = 4242
#: (name, device, start µs, duration µs, correlation): kernels on stream 7 of each device, overlapping across devices.
KERNELS = [
    ("gemm_a", 0, 20, 100, 11),
    ("gemm_b", 1, 70, 130, 12),
    ("gemm_c", 0, 170, 50, 13),
]
STREAM_NAMES = {0: "stream 7 gpu0-compute", 1: "stream 7 gpu1-compute"}


def _trace() -> dict:
    ev: list[dict] = [
        {"ph": "M", "name": "thread_name", "pid": CPU_PID, "tid": MAIN, "args": {"name": "python3"}},
        {"ph": "M", "name": "thread_name", "pid": CPU_PID, "tid": 7, "args": {"name": "pt_autograd_0"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": STREAM_NAMES[0]}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": STREAM_NAMES[1]}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": CPU_PID, "tid": MAIN,
         "ts": 0.0, "dur": 300.0, "args": {"External id": 1}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": CPU_PID, "tid": MAIN, "ts": 10.0, "dur": 15.0,
         "args": {"External id": 2}},
        {"ph": "X", "cat": "cpu_op", "name": "autograd::engine", "pid": CPU_PID, "tid": 7, "ts": 30.0, "dur": 40.0,
         "args": {"External id": 3}},
    ]
    for k, (name, dev, ts, dur, corr) in enumerate(KERNELS):
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": CPU_PID, "tid": MAIN,
                   "ts": 11.0 + 4 * k, "dur": 3.0, "args": {"correlation": corr}})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": dev, "tid": 7, "ts": float(ts), "dur": float(dur),
                   "args": {"device": dev, "stream": 7, "correlation": corr}})
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
            "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}, {"id": 1, "name": "NVIDIA H100 80GB HBM3"}],
            "baseTimeNanoseconds": BASE_NS, "traceEvents": ev}


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("multidev")
    src = d / "rank-0.json"
    src.write_text(json.dumps(_trace()))
    import_traces([src], d / "run")
    return d / "run"


def _thread_rows(run_dir: Path) -> set[tuple[int, int, str, int]]:
    s = read_shard(next(run_dir.glob(schema.SHARD_GLOB)))
    th = s.table("threads")
    return {(int(d), int(t), s.names[n], int(r))
            for d, t, n, r in zip(th["device"], th["tid"], th["name_id"], th["role"])}


def test_threads_table_has_one_row_per_device_stream(imported):
    rows = _thread_rows(imported)
    assert (0, 7, STREAM_NAMES[0], schema.THREAD_STREAM) in rows
    assert (1, 7, STREAM_NAMES[1], schema.THREAD_STREAM) in rows
    assert (-1, 7, "pt_autograd_0", schema.THREAD_OTHER) in rows  # OS tid 7 is a third track
    assert (-1, MAIN, "python3", schema.THREAD_MAIN) in rows
    assert len(rows) == 4
    s = read_shard(next(imported.glob(schema.SHARD_GLOB)))
    ev = s.table("events")
    k = ev["kind"] == schema.KIND_CODE["kernel"]
    assert sorted(zip(ev["device"][k].tolist(), ev["tid"][k].tolist())) == [(0, 7), (0, 7), (1, 7)]


def test_per_device_busy_time(imported):
    run = load_run(imported)  # every event, to check the device times by hand
    ev = run.events
    k = ev["kind"] == schema.KIND_CODE["kernel"]
    busy = {}
    for d in (0, 1):
        m = k & (ev["device"] == d)
        busy[d] = iv.union(ev["ts_ns"][m], ev["ts_ns"][m] + ev["dur_ns"][m]).total
    assert busy == {0: 150_000, 1: 130_000}  # gemm_a + gemm_c on GPU 0; gemm_b on GPU 1
    (g,) = gpu_time(distprof.load(imported))
    # the rank's GPU timeline is every stream of every device together: busy from 20 to 220 µs without a gap
    assert g.span_us == pytest.approx(200.0) and g.idle_us == pytest.approx(0.0)
    assert g.compute_us == pytest.approx(200.0)


def test_timeline_two_stream_tracks(imported):
    run = distprof.load(imported)
    evs = list(tl.iter_trace_events(run, tl.plan_timeline(run)))
    names = {e["tid"]: e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    kern = {e["name"]: e for e in evs if e["ph"] == "X" and e["name"].startswith("gemm")}
    assert kern["gemm_a"]["tid"] == kern["gemm_c"]["tid"] != kern["gemm_b"]["tid"]
    assert STREAM_NAMES[0] in names[kern["gemm_a"]["tid"]] and STREAM_NAMES[1] in names[kern["gemm_b"]["tid"]]
    # on one shared track the overlapping kernels would be misnested and clipped; apart they keep their lengths
    assert [kern[n]["dur"] for n in ("gemm_a", "gemm_b", "gemm_c")] == pytest.approx([100.0, 130.0, 50.0])
    cpu7 = [t for t, n in names.items() if "pt_autograd_0" in n]
    assert len(cpu7) == 1 and cpu7[0] not in (kern["gemm_a"]["tid"], kern["gemm_b"]["tid"])


def test_export_round_trip_keeps_device_and_stream(imported, tmp_path):
    run = distprof.load(imported)
    (f,) = export_kineto(run, tmp_path / "kineto", gzip=False, progress=False)
    doc = json.loads(f.path.read_text())
    kern = {e["name"]: e for e in doc["traceEvents"] if e.get("cat") == "kernel"}
    for name, dev, ts, dur, corr in KERNELS:
        e = kern[name]
        assert (e["pid"], e["tid"], e["args"]["device"], e["args"]["stream"]) == (dev, 7, dev, 7)
        assert e["args"]["correlation"] == corr
        assert round(e["ts"] * 1000) + doc["baseTimeNanoseconds"] == BASE_NS + ts * 1000
    tnames = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
              if e["ph"] == "M" and e["name"] == "thread_name"}
    assert tnames[(0, 7)] == STREAM_NAMES[0] and tnames[(1, 7)] == STREAM_NAMES[1]
    assert tnames[(CPU_PID, 7)] == "pt_autograd_0"
    # and back: the exported file imports to the same tracks and kernels
    import_traces([f.path], tmp_path / "again")
    assert _thread_rows(tmp_path / "again") == _thread_rows(imported)
    a, b = (read_shard(next(d.glob(schema.SHARD_GLOB))).table("events") for d in (imported, tmp_path / "again"))
    ka, kb = (t["kind"] == schema.KIND_CODE["kernel"] for t in (a, b))
    for col in ("device", "tid", "ts_ns", "dur_ns", "corr_id"):
        assert np.array_equal(a[col][ka], b[col][kb]), col


def test_gz_export_names_both_gpus(imported, tmp_path):
    (f,) = export_kineto(distprof.load(imported), tmp_path / "k", progress=False)
    with gzip.open(f.path, "rt") as fh:
        doc = json.load(fh)
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs[0] == "GPU 0" and procs[1] == "GPU 1"


def test_build_tables_keys_tracks_by_device():
    """The capture path (extract -> build_tables) gets the same keying: one row per (device, stream)."""
    strings = Strings()
    n_k, n_c = strings.id("k"), strings.id("aten::add")
    kind_k, kind_c = schema.KIND_CODE["kernel"], schema.KIND_CODE["cpu_op"]
    cols = Columns(
        name_id=np.array([n_c, n_k, n_k, n_k], np.uint32),
        kind=np.array([kind_c, kind_k, kind_k, kind_k], np.uint8),
        tid=np.array([7, 7, 7, 3], np.int64),
        device=np.array([-1, 1, 0, 1], np.int16),
        ts=np.array([0, 10, 20, 30], np.int64),
        dur=np.array([5, 5, 5, 5], np.int64),
        flops=np.zeros(4, np.int64), corr=np.zeros(4, np.int64),
    )
    th = build_tables(cols, strings, main_tid=7, stream_names={(1, 7): "s7 of gpu1"}).tables["threads"]
    names = strings.list()
    got = [(int(d), int(t), names[n], int(r)) for d, t, n, r in zip(th["device"], th["tid"], th["name_id"], th["role"])]
    assert got == [(-1, 7, "thread 7", schema.THREAD_MAIN), (0, 7, "stream 7", schema.THREAD_STREAM),
                   (1, 3, "stream 3", schema.THREAD_STREAM), (1, 7, "s7 of gpu1", schema.THREAD_STREAM)]
    d, t, inv = track_keys(cols.device, cols.tid)
    assert list(zip(d[inv].tolist(), t[inv].tolist())) == [(-1, 7), (1, 7), (0, 7), (1, 3)]
