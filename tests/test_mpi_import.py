"""``mpiexec -n 2 distprof import`` on real MPI (mpi4py + MPICH's mpiexec) and real Kineto traces: the shards a serial
import writes (every table and attribute but the timing), the same summary and warnings printed once, and a bad file
refused in the one line (and exit code) of the serial import, with nothing left behind and no hang.

Skips where mpiexec or mpi4py is missing, except under CI (CI=true), where they must be there.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import job_env
from distprof.importers.run import deal
from distprof.storage import schema
from test_mpi_report import _mpiexec

pytestmark = pytest.mark.timeout(300)

DATA = Path(__file__).parent / "data" / "hta"
WORLD = 128  # the job of trace_filter's two ranks
#: file -> (source trace, rank it claims, gzipped): three real traces, re-ranked copies of the small pair; sizes on
#: disk make `deal` give MPI process 0 ranks 0, 1, 4 and process 1 ranks 2, 3, 5
SET = {
    "rank-0.json.gz": ("trace_filter/sampled_rank-0.json.gz", 0, True),
    "rank-1.json.gz": ("trace_filter/sampled_rank-1.json.gz", 1, True),
    "rank-2.json.gz": ("nccl_parser_config/nccl_data.json.gz", 2, True),
    "rank-3.json.gz": ("ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", 3, True),
    "rank-4.json": ("trace_filter/sampled_rank-0.json.gz", 4, False),
    "rank-5.json.gz": ("trace_filter/sampled_rank-1.json.gz", 5, True),
}
_TIMING = re.compile(r" in [\d.]+ s \([\d,]+ events/s\)")


def _reranked(src: Path, rank: int) -> bytes:
    """The trace's text with its distributedInfo saying `rank` of WORLD (the part before traceEvents is edited as
    text; the events stay as Kineto wrote them)."""
    raw = gzip.decompress(src.read_bytes())
    cut = raw.index(b'"traceEvents"')
    head = re.sub(rb'("rank": )\d+', rb"\g<1>%d" % rank, raw[:cut], count=1)
    head = re.sub(rb'("world_size": )\d+', rb"\g<1>%d" % WORLD, head, count=1)
    return head + raw[cut:]


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("traces")
    for name, (src, rank, gz) in SET.items():
        text = _reranked(DATA / src, rank)
        (d / name).write_bytes(gzip.compress(text, mtime=0) if gz else text)
    return d


def _import(args, *, mpi: str | None, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "distprof", "import", *map(str, args), "--no-progress"]
    if mpi:
        cmd = [mpi, "-n", "2", *cmd]
    return subprocess.run(cmd, check=False, cwd=cwd, env=job_env(), capture_output=True, text=True, timeout=240)


def _contents(path: Path) -> dict:
    """Every dataset (values, dtype) and attribute of a shard, by HDF5 path; the timings left out (the `timings`
    attribute, the stored summary's `cpu_s`)."""
    out: dict = {}

    def attrs(name: str, obj) -> None:
        for k, v in obj.attrs.items():
            if (name, k) == ("/", schema.ATTRS_JSON):  # the root attributes' JSON object, timings left out
                out.update({f"/@{a}": x for a, x in json.loads(v).items() if a != "timings"})
            elif k != "timings" and (name, k) != ("summary", "cpu_s"):
                out[f"{name}@{k}"] = v.tolist() if isinstance(v, np.ndarray) else v

    with h5py.File(path, "r") as f:
        attrs("/", f)

        def visit(name, obj):
            attrs(name, obj)
            if isinstance(obj, h5py.Dataset):
                out[name] = (str(obj.dtype), obj[()].tolist())

        f.visititems(visit)
    return out


def test_deal_largest_first_to_the_least_loaded(traces):
    assert deal([5, 1, 9, 3, 3], 2) == [[1, 2], [0, 3, 4]]  # 9 | 5, 3, 3 | then 1 to the 9
    assert deal([1, 1, 1], 4) == [[0], [1], [2], []]
    assert deal([f.stat().st_size for f in sorted(traces.iterdir())], 2) == [[0, 1, 4], [2, 3, 5]]


@pytest.mark.slow
def test_parallel_import_writes_the_serial_shards_and_prints_once(traces, tmp_path):
    mpi = _mpiexec()
    s_dir, m_dir = tmp_path / "serial" / "run", tmp_path / "mpi" / "run"  # the run id is the directory's name
    serial = _import([traces, "-o", s_dir], mpi=None, cwd=tmp_path)
    par = _import([traces, "-o", m_dir], mpi=mpi, cwd=tmp_path)
    assert serial.returncode == 0 and par.returncode == 0, par.stderr[-3000:]
    names = sorted(p.name for p in s_dir.iterdir())
    assert names == [f"rank{r:05d}.w0000.h5" for r in range(6)]
    assert sorted(p.name for p in m_dir.iterdir()) == names  # no temporary directory left either
    for n in names:
        a, b = _contents(s_dir / n), _contents(m_dir / n)
        assert a.keys() == b.keys() and len(a) > 40 and json.loads(a["/@config"])["source"] == "kineto"
        for k in a:
            assert a[k] == b[k], (n, k)
    # one summary and one copy of each warning (MPI rank 0 only), as the serial import prints them
    assert par.stdout.count("imported 6 trace(s)") == 1
    assert _TIMING.sub("", par.stdout).replace(str(m_dir), "RUN") == _TIMING.sub("", serial.stdout).replace(
        str(s_dir), "RUN")
    assert par.stderr == serial.stderr and "6 of 128 ranks imported" in par.stderr


@pytest.mark.slow
def test_bad_files_fail_as_the_serial_import_does(traces, tmp_path):
    """Two damaged files, one on each MPI process: the error is the serial import's (its first bad file), one line,
    exit code 2, no run directory left; likewise a rank claimed twice (found in the headers, before any parsing)."""
    mpi = _mpiexec()
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in traces.iterdir():
        text = f.read_bytes()
        if f.name == "rank-2.json.gz":  # MPI process 1: the events stop in the middle of one
            raw = gzip.decompress(text)
            text = gzip.compress(raw[: len(raw) // 2], mtime=0)
        elif f.name == "rank-4.json":  # MPI process 0: an event is broken
            text = text.replace(b'"ph": "X"', b'"ph": "X" "', 1)
        (bad / f.name).write_bytes(text)
    dup = tmp_path / "dup"
    dup.mkdir()
    for f in traces.iterdir():
        (dup / f.name).write_bytes(f.read_bytes())
    (dup / "rank-6.json").write_bytes((traces / "rank-4.json").read_bytes())
    for src, want in ((bad, r"rank-2\.json\.gz: .*(truncated|damaged)"), (dup, r"rank-6\.json: claims rank 4")):
        out = {}
        for tag, how in (("serial", None), ("mpi", mpi)):
            p = _import([src, "-o", tmp_path / f"run-{src.name}-{tag}"], mpi=how, cwd=tmp_path)
            assert "Traceback" not in p.stderr and p.stdout == "", p.stderr[-3000:]
            assert not (tmp_path / f"run-{src.name}-{tag}").exists()
            out[tag] = p
        assert out["mpi"].returncode == out["serial"].returncode == 2
        (line,) = out["serial"].stderr.splitlines()
        assert re.search(want, line) and line.startswith("distprof: error: "), line
        assert out["mpi"].stderr.splitlines() == [line]


def test_srun_tasks_without_mpi_world_leave_the_import_to_task_0(traces, tmp_path, monkeypatch, caplog):
    """`srun -n 2 distprof import` without an MPI world: task 1 writes nothing and says why (two serial imports
    raced for the same run directory); task 0 imports every file."""
    from distprof.analysis.summarize.engine import MPI_ENV_VARS
    from distprof.cli import main

    for k in MPI_ENV_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_PROCID", "1")
    out = tmp_path / "run"
    assert main(["import", str(traces), "-o", str(out), "--no-progress"]) == 0
    assert not out.exists()
    assert any("parallel import); task 0 does the work alone" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert main(["import", str(traces), "-o", str(out), "--no-progress"]) == 0
    assert len(list(out.glob("rank*.h5"))) == len(SET)
