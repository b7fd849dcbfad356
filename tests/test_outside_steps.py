"""What belongs to no step, and communication known from where a kernel was launched: on small Kineto traces written
here and imported (the same table builder serves the capture).

* a kernel whose launch is not in the trace (launched before the recording began; its correlation id precedes every
  recorded launch) belongs to no step — HTA drops it too — and the report says how many and how long;
* work after the last step of a window (a checkpoint after the loop) is outside every step, and named when large;
* a kernel launched inside a communication op (``c10d::*``, ``record_param_comms``) executes it, whatever its name.
"""

from __future__ import annotations

import json
from pathlib import Path

import distprof
from distprof.analysis.cross.gpu_time import gpu_time
from distprof.analysis.report.build import build_report
from distprof.importers.run import import_traces
from distprof.storage import read_shard, schema

BASE_NS = 1_700_000_000_000_000_000
PID, MAIN = 4242, 4242


def _x(cat, name, ts, dur, tid=MAIN, pid=PID, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": float(ts), "dur": float(dur),
            "args": args}


def _kernel(name, ts, dur, corr):
    return _x("kernel", name, ts, dur, tid=7, pid=0, device=0, stream=7, correlation=corr)


def _import(tmp_path: Path, events: list[dict], world: int = 1) -> Path:
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": world},
           "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "baseTimeNanoseconds": BASE_NS,
           "traceEvents": [{"ph": "M", "name": "thread_name", "pid": PID, "tid": MAIN, "args": {"name": "python3"}},
                           *events]}
    (tmp_path / "rank-0.json").write_text(json.dumps(doc))
    import_traces([tmp_path / "rank-0.json"], tmp_path / "run", progress=False)
    return tmp_path / "run"


def _steps(n=2, step_us=1000.0):
    return [_x("user_annotation", f"ProfilerStep#{i + 1}", i * step_us, step_us) for i in range(n)]


def test_kernels_launched_before_the_recording_belong_to_no_step(tmp_path):
    ev = _steps()
    # 3 kernels still running from before the recording: correlation ids 1-3, no launch recorded
    ev += [_kernel("gemm_old", 5 + 20 * i, 15, corr=1 + i) for i in range(3)]
    for i, t in enumerate((100.0, 1100.0)):  # one launched kernel per step
        ev += [_x("cuda_runtime", "cudaLaunchKernel", t, 5, correlation=10 + i), _kernel("gemm", t + 10, 300, 10 + i)]
    run_dir = _import(tmp_path, ev)
    s = read_shard(next(run_dir.glob(schema.SHARD_GLOB)))
    e = s.table("events")
    names = s.names[e["name_id"]]
    assert set(e["step"][names == "gemm_old"].tolist()) == {-1}
    assert e["step"][names == "gemm"].tolist() == [1, 2]
    run = distprof.load(run_dir)
    (g,) = gpu_time(run)
    assert g.n_gpu_events == 2  # the unlaunched kernels count in no step
    (hta,) = gpu_time(run, drop_last_step=True, whole_us=True)  # HTA's choices drop them too
    assert hta.n_gpu_events == 1
    rep = build_report(run)
    assert any("3 GPU event(s) (0.0 ms) on rank(s) 0 were launched before the recording began" in w
               for w in rep.warnings)


def test_work_after_the_last_step_is_outside_every_step_and_named(tmp_path):
    ev = _steps(3, 1000.0) + [_x("cpu_op", "aten::mm", 100 + 1000 * i, 500) for i in range(3)]
    ev += [_x("cpu_op", "aten::save", 3200, 4000)]  # a 4 ms checkpoint after the loop
    run = distprof.load(_import(tmp_path, ev))
    assert run.steps["step_ms"].max() == 1.0  # no step absorbs it
    (note,) = [w for w in build_report(run).warnings if "after the last step" in w]
    assert "4.2 ms" in note and "rank(s) 0" in note  # from the last step's end to the end of the checkpoint


def test_small_work_after_the_last_step_is_not_named(tmp_path):
    ev = _steps(3, 1000.0) + [_x("cpu_op", "aten::item", 3050, 100)]
    assert not [w for w in build_report(distprof.load(_import(tmp_path, ev))).warnings
                if "after the last step" in w]


def test_a_kernel_launched_inside_a_collective_is_communication(tmp_path):
    """A custom collective kernel with a name no rule knows: its launch inside c10d::allreduce_ and
    record_param_comms makes it the collective's execution, with the op and group from their arguments."""
    ev = _steps(1, 1000.0)
    ev += [_x("cpu_op", "c10d::allreduce_", 100, 60),
           _x("cpu_op", "record_param_comms", 102, 50, **{"Collective name": "allreduce", "Process Group Name": "0",
                                                          "Process Group Ranks": "[0, 1]", "dtype": "Float",
                                                          "In msg nelems": 1024, "Out msg nelems": 1024,
                                                          "Group size": 2}),
           _x("cuda_runtime", "cudaLaunchKernel", 110, 5, correlation=21), _kernel("vendorlib_kern_v3", 130, 200, 21),
           _x("cuda_runtime", "cudaLaunchKernel", 400, 5, correlation=22), _kernel("gemm", 410, 300, 22)]
    s = read_shard(next(_import(tmp_path, ev, world=2).glob(schema.SHARD_GLOB)))
    e, cm = s.table("events"), s.table("comms")
    names = s.names[e["name_id"]]
    k = int(next(i for i, n in enumerate(names) if n == "vendorlib_kern_v3"))
    assert e["category"][k] == schema.CAT_COMM
    (j,) = [i for i, r in enumerate(cm["row"].tolist()) if r == k]
    assert cm["role"][j] == schema.ROLE_EXEC and s.names[cm["op_id"][j]] == "all_reduce"
    assert cm["bytes"][j] == 4096 and cm["seq"][j] == 0
    assert e["category"][names == "gemm"].tolist() == [schema.CAT_COMPUTE]


def test_a_multi_rank_gpu_trace_without_recognised_communication_is_warned(tmp_path):
    """An expert-parallel job whose dispatch kernels no rule knows: said, with the variable that fixes it."""
    ev = _steps(2, 1000.0)
    for i, t in enumerate((100.0, 1100.0)):
        ev += [_x("cuda_runtime", "cudaLaunchKernel", t, 5, correlation=10 + i), _kernel("xyz_route_tokens", t + 10,
                                                                                         600, 10 + i)]
    rep = build_report(distprof.load(_import(tmp_path, ev, world=64)))
    (w,) = [w for w in rep.warnings if "no communication was recognised" in w]
    assert "64-rank" in w and "DISTPROF_COMM_KERNELS" in w
