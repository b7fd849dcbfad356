"""GPU/communication semantics shared by capture and import (distprof/events)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from distprof.errors import ConfigError
from distprof.events import classify
from distprof.importers.run import import_traces
from distprof.storage import schema
from distprof.storage.reader import find_shards, read_shard

DATA = Path(__file__).parent / "data" / "hta"
K = schema.KIND_CODE


@pytest.mark.parametrize("name,role,op", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float", 1, "all_reduce"),
    ("ncclDevKernel_AllGather_RING_LL", 1, "all_gather"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", 1, "send_recv"),
    ("rcclKernel_ReduceScatter_RING", 1, "reduce_scatter"),
    ("gloo:all_reduce", 1, "all_reduce"),
    ("nccl:all_reduce", 2, "all_reduce"),
    ("c10d::allreduce_", 2, "all_reduce"),
    ("record_param_comms", 3, ""),
    ("void at::native::vectorized_elementwise_kernel<4>", 0, ""),
])
def test_roles_and_ops(name, role, op):
    assert classify.comm_role(name, K["kernel"]) == role
    assert classify.normalize_op(name) == op


def test_library_kernels_and_user_patterns(monkeypatch):
    dispatch = "void deep_ep::intranode::dispatch<8, 768>(int4*, float*)"
    assert classify.comm_role(dispatch, K["kernel"]) == schema.ROLE_EXEC
    assert classify.comm_role(dispatch) == 0  # a CPU event with that name is not a kernel
    assert classify.comm_kernel_op(dispatch) == "all_to_all"
    assert classify.comm_role("my_fused_xchg_kernel", K["kernel"]) == 0  # no collective word: needs a pattern
    monkeypatch.setenv(classify.ENV_COMM_KERNELS, r"fused_xchg=all_to_all; ^myring_")
    assert classify.comm_role("my_fused_xchg_kernel", K["kernel"]) == schema.ROLE_EXEC
    assert classify.comm_kernel_op("my_fused_xchg_kernel") == "all_to_all"
    assert classify.comm_kernel_op("myring_step") == "comm_kernel"
    monkeypatch.setenv(classify.ENV_COMM_KERNELS, "([bad")
    with pytest.raises(ConfigError, match="DISTPROF_COMM_KERNELS"):
        classify.comm_kernel_patterns()


def test_categories():
    kinds = np.array([K["kernel"], K["kernel"], K["gpu_memcpy"], K["gpu_memset"], K["cuda_sync"], K["cuda_runtime"],
                      K["cpu_op"]], np.uint8)
    roles = np.array([0, 1, 0, 0, 0, 0, 0], np.uint8)
    assert classify.categorize(kinds, roles).tolist() == [
        schema.CAT_COMPUTE, schema.CAT_COMM, schema.CAT_MEMCPY, schema.CAT_MEMCPY, schema.CAT_OTHER,
        schema.CAT_OTHER, schema.CAT_COMPUTE]


def test_comm_args():
    a = classify.comm_args({"Collective name": "allreduce", "In msg nelems": 2049000, "Out msg nelems": 2049000,
                            "Group size": 2, "dtype": "Float", "Process Group Name": "0",
                            "Process Group Ranks": "[0, 1]", "Seq": 17})
    assert (a.op, a.bytes, a.group_size, a.pg_name, a.pg_ranks, a.nccl_seq) == \
        ("all_reduce", 2049000 * 4, 2, "0", [0, 1], 17)
    old = classify.comm_args({"Input Dims": [[4, 8]], "Input type": ["float"]})
    assert old.bytes == 128 and old.op is None
    assert classify.comm_args({"External id": 3}) is None


def _shard(tmp_path, src):
    import_traces([src], tmp_path / "run", rank=0, progress=False)
    return read_shard(find_shards(tmp_path / "run")[0])


def test_nccl_trace_comms_from_args(tmp_path):
    s = _shard(tmp_path, DATA / "nccl_parser_config")
    names, ev, cm, th = s.names, s.table("events"), s.table("comms"), s.table("threads")
    ex = cm["role"] == schema.ROLE_EXEC
    rows = cm["row"][ex]
    assert (ev["device"][rows] >= 0).all() and (ev["kind"][rows] == K["kernel"]).all()
    ops = [names[i] for i in cm["op_id"][ex]]
    assert ops.count("all_reduce") == 15 and ops.count("broadcast") == 6
    assert set(cm["group_size"][ex].tolist()) == {2}
    assert set(cm["pg"][ex].tolist()) == {0} and cm["seq"][ex].tolist() == list(range(21))
    assert 2049000 * 4 in set(cm["bytes"][ex].tolist())
    assert (cm["role"] == schema.ROLE_ANNOTATION).sum() == 27
    streams = set(th["tid"][th["role"] == schema.THREAD_STREAM].tolist())
    assert {7, 40} <= streams
    # a kernel's step is the step of its launch (same correlation id), even when it runs past the step's CPU span
    launch = ev["kind"] == K["cuda_runtime"]
    by_corr = dict(zip(ev["corr_id"][launch].tolist(), ev["step"][launch].tolist()))
    kern = np.flatnonzero(ev["kind"] == K["kernel"])
    assert all(ev["step"][k] == by_corr[ev["corr_id"][k]] for k in kern if ev["corr_id"][k] in by_corr)


def test_record_param_comms_seq_reaches_the_kernel(tmp_path):
    def X(cat, name, ts, dur, tid, pid=1, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}

    evs = [X("user_annotation", "ProfilerStep#3", 0, 100, 11),
           X("cpu_op", "record_param_comms", 10, 5, 11, **{"Collective name": "allreduce", "dtype": "BFloat16",
                                                          "In msg nelems": 10, "Out msg nelems": 10, "Seq": 41,
                                                          "Process Group Name": "7", "Group size": 4}),
           X("cuda_runtime", "cudaLaunchKernel", 11, 2, 11, correlation=99),
           X("kernel", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 150, 20, 20, pid=0, device=0, stream=20,
             correlation=99),
           X("kernel", "void gemm", 140, 50, 7, pid=0, device=0, stream=7, correlation=98)]
    p = tmp_path / "rank-2.json"
    p.write_text(json.dumps({"distributedInfo": {"rank": 2, "world_size": 4, "backend": "nccl"},
                             "traceEvents": evs}))
    import_traces([p], tmp_path / "run", progress=False)
    s = read_shard(find_shards(tmp_path / "run")[0])
    cm, ev = s.table("comms"), s.table("events")
    k = np.flatnonzero(cm["role"] == schema.ROLE_EXEC)
    assert len(k) == 1
    assert (cm["nccl_seq"][k[0]], cm["bytes"][k[0]], cm["group_size"][k[0]]) == (41, 20, 4)
    assert s.attrs["process_groups"][cm["pg"][k[0]]]["name"] == "7"
    assert ev["step"][cm["row"][k[0]]] == 3  # launched in step 3, ran after it


def test_rocm_trace(tmp_path):
    s = _shard(tmp_path, DATA / "amd_trace")
    ev = s.table("events")
    dev = ev["device"] >= 0
    assert set(ev["device"][dev].tolist()) == {2}
    assert (ev["kind"][dev & (ev["kind"] == K["kernel"])]).size == 14
    assert s.attrs["device"] == "AMD Radeon Graphics"
    names = s.names
    hip = {names[i] for i in ev["name_id"][ev["kind"] == K["cuda_runtime"]]}
    assert "hipLaunchKernel" in hip and (ev["device"][ev["kind"] == K["cuda_runtime"]] < 0).all()


@pytest.mark.parametrize("name, op", [
    ("void custom::AllReduceOneShot<float>(float*, int)", "all_reduce"),
    ("reduce_scatter_kernel<bf16>", "reduce_scatter"),
    ("my_fused_a2a_kernel", "all_to_all"),
    ("void mylab_ep::intranode::dispatch<8, 256>(int4*, float*)", "all_to_all"),  # an in-house MoE library
    ("void mylab::moe::combine_kernel<__nv_bfloat16>(void*)", "all_to_all"),
    ("notify_dispatch(int const*, int*, int)", "all_to_all"),
])
def test_collective_words_in_kernel_names(name, op):
    assert classify.comm_kernel_op(name) == op and classify.comm_role(name, K["kernel"]) == schema.ROLE_EXEC


def test_collective_words_add_no_false_positive_on_the_real_traces():
    """Every kernel name of the shared real traces: the words find only what NCCL's names already say."""
    import gzip
    import json

    names = set()
    for f in DATA.rglob("*.json.gz"):
        for e in json.load(gzip.open(f))["traceEvents"]:
            if e.get("cat") == "kernel":
                names.add(e["name"])
    assert len(names) > 250
    by_words = {n for n in names if classify.comm_kernel_words(n)}
    nccl = {n for n in names if classify.is_nccl_kernel(n)}
    assert by_words <= nccl, by_words - nccl  # no compute kernel (reduce_kernel, DispatchReduceByKey, ...) is taken
    assert len(by_words) >= 2  # ... and NCCL's own AllReduce / SendRecv kernels are found by their words too
