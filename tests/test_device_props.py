"""Device properties: captured from torch (pure function, fake object here), kept by import, written back by export,
used by the MFU peak lookup."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import distprof
import pytest

from distprof.analysis.cross.mfu import device_names, mfu
from distprof.capture.dist_info import RankInfo, kineto_device_properties, rank_info
from distprof.export import export_kineto
from distprof.importers.kineto import read_header
from distprof.importers.run import import_traces
from distprof.storage import read_shard, schema
from distprof.storage.writer import write_shard

HTA = Path(__file__).parent / "data" / "hta"
NCCL_DATA = HTA / "nccl_parser_config" / "nccl_data.json.gz"


def fake_a100(**over):
    """The attributes torch.cuda.get_device_properties exposes, valued as on an A100 (nccl_data's devices)."""
    p = dict(name="NVIDIA A100-PG509-200", major=8, minor=0, total_memory=42297524224, multi_processor_count=108,
             max_threads_per_multi_processor=2048, warp_size=32, regs_per_multiprocessor=65536,
             shared_memory_per_block=49152, shared_memory_per_multiprocessor=167936,
             shared_memory_per_block_optin=166912, max_threads_per_block=1024, regs_per_block=65536,
             is_integrated=0, uuid="GPU-1234", L2_cache_size=41943040, gcnArchName="")
    p.update(over)
    return SimpleNamespace(**p)


def test_kineto_properties_from_torch_object():
    got = kineto_device_properties(fake_a100(), 3)
    # Kineto's keys (not torch's), values as given; the same set and values nccl_data's Kineto wrote for its A100s
    want = {k: v for k, v in read_header(NCCL_DATA)["deviceProperties"][3].items()}
    assert got == want
    assert list(got)[:2] == ["id", "name"] and got["id"] == 3


def test_missing_or_non_integer_attributes_are_left_out():
    p = fake_a100()
    del p.max_threads_per_block, p.regs_per_block  # not every torch build has them
    p.shared_memory_per_block_optin = None
    p.warp_size = True  # not a count
    got = kineto_device_properties(p, 0)
    assert not {"maxThreadsPerBlock", "regsPerBlock", "sharedMemPerBlockOptin", "warpSize"} & set(got)
    assert got["numSms"] == 108 and got["totalGlobalMem"] == 42297524224
    assert kineto_device_properties(SimpleNamespace(), 1) == {"id": 1, "name": ""}


def test_rocm_spelling_and_arch():
    got = kineto_device_properties(fake_a100(name="AMD Radeon Graphics", gcnArchName="gfx90a:sramecc+:xnack-",
                                             warp_size=64), 2, rocm=True)
    assert "sharedMemPerMultiprocessor" not in got
    assert got["maxSharedMemoryPerMultiProcessor"] == 167936  # as Kineto spells it in ROCm traces
    assert got["gcnArchName"] == "gfx90a:sramecc+:xnack-" and got["warpSize"] == 64
    assert "gcnArchName" not in kineto_device_properties(fake_a100(), 0)  # CUDA: Kineto's keys only


def test_cpu_capture_writes_none(tmp_path):
    info = rank_info()
    assert info.device_type == "cpu" and info.device_properties is None
    assert "device_properties" not in info.attrs()


def test_cuda_rank_attrs_round_trip_through_a_shard(tmp_path):
    props = [kineto_device_properties(fake_a100(), 1)]
    info = RankInfo(0, 1, 0, 1, "h", "h", None, None, "NVIDIA A100-PG509-200", "cuda", 1, props)
    attrs = {**info.attrs(), "run_id": "r", "backend": "nccl", "window": 0, "first_step": -1, "last_step": -1}
    tables = {t: schema.empty_table(t) for t in ("events", "comms", "threads", "memory", "steps")}
    path = tmp_path / schema.SHARD_TEMPLATE.format(rank=0, window=0)
    write_shard(path, tables, [], attrs)
    assert read_shard(path).attrs["device_properties"] == props


@pytest.fixture(scope="module")
def nccl_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("props") / "run"
    import_traces([NCCL_DATA], out, rank=0)
    return out


def test_import_keeps_device_properties(nccl_run):
    want = read_header(NCCL_DATA)["deviceProperties"]
    assert len(want) == 8 and all("A100" in d["name"] for d in want)
    s = read_shard(next(nccl_run.glob(schema.SHARD_GLOB)))
    assert s.attrs["device_properties"] == want


def test_export_writes_them_back(nccl_run, tmp_path):
    (f,) = export_kineto(distprof.load(nccl_run), tmp_path / "k", gzip=False, progress=False)
    doc = json.loads(f.path.read_text())
    assert doc["deviceProperties"] == read_header(NCCL_DATA)["deviceProperties"]


def test_mfu_finds_the_peak_through_device_properties(nccl_run):
    run = distprof.load(nccl_run)
    a = run.attrs[0]
    assert mfu(run) and mfu(run)[0].peak_tflops == 312  # the shard's device name is the A100's
    a["device"] = "gpu 0"  # e.g. a trace whose used device had no name: only the properties say what it is
    (row,) = mfu(run)
    assert row.peak_tflops == 312 and row.device == "NVIDIA A100-PG509-200" and row.peak_source == "table"
    a["device_properties"] = []
    assert mfu(run) == []


def test_device_names_prefers_the_ranks_own_device():
    attrs = {"device": "gpu 1", "device_properties": json.dumps([{"id": 0, "name": "NVIDIA A10G"},
                                                                {"id": 1, "name": "NVIDIA H100 80GB HBM3"}])}
    assert device_names(attrs, [1]) == ["gpu 1", "NVIDIA H100 80GB HBM3", "NVIDIA A10G"]
    assert device_names(attrs) == ["gpu 1", "NVIDIA A10G", "NVIDIA H100 80GB HBM3"]
    assert device_names({"device": "cpu"}) == ["cpu"]
