"""``distprof export --format kineto``: file shape, exact aligned times, links, selection — and HTA 0.5.0 itself reading
the export (in a separate venv, tests/hta_env.py)."""

from __future__ import annotations

import gzip
import json
import math
import os
import re
from collections import Counter
from pathlib import Path

import distprof
import numpy as np
import pytest

import hta_env
from synth import MS, US, make_run

from distprof.analysis.summarize.merged import load_run
from distprof.cli import main
from distprof.export import export_kineto
from distprof.storage import schema

RANK_RE = re.compile(r'"rank":\s+(\d+)')  # how HTA 0.5.0 finds a file's rank


def read_trace(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as fh:
        return json.loads(fh.read())


def epoch_ns(trace: dict, ts_us: float) -> int:
    return round(ts_us * 1000) + trace["baseTimeNanoseconds"]


def xs(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


# ---- a GPU-like run: kernels, streams, correlation, an NCCL kernel with collective args -------------------------------

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def _add_gpu_rows(rank, window, tables, strings, attrs):
    """Per step: aten::matmul (cpu_op) around cudaLaunchKernel -> GEMM on stream 7 [s+1, s+3] ms; a second launch ->
    NCCL all-reduce kernel on stream 20 [s+2, s+6] ms with a comms row. Comm/comp overlap is 1/4 of comm time."""

    def sid(s):
        if s not in strings:
            strings.append(s)
        return strings.index(s)

    ev, st = tables["events"], tables["steps"]
    main_tid = 10_000 + 100 * rank
    rows = []  # name, kind, category, tid, device, ts, dur, step, corr
    for k, (step, start) in enumerate(zip(st["step"].tolist(), st["start_ns"].tolist())):
        c = 1000 * (window * 10 + k + 1)
        rows += [
            ("aten::matmul", "cpu_op", schema.CAT_COMPUTE, main_tid, -1, start + 500 * US, 400 * US, step, c),
            ("cudaLaunchKernel", "cuda_runtime", schema.CAT_OTHER, main_tid, -1, start + 600 * US, 50 * US, step, c + 1),
            ("cudaLaunchKernel", "cuda_runtime", schema.CAT_OTHER, main_tid, -1, start + 950 * US, 30 * US, step, c + 2),
            (GEMM, "kernel", schema.CAT_COMPUTE, 7, 0, start + 1 * MS, 2 * MS, step, c + 1),
            (NCCL, "kernel", schema.CAT_COMM, 20, 0, start + 2 * MS, 4 * MS, step, c + 2),
        ]
    n0 = len(ev["ts_ns"])
    add = {
        "name_id": np.array([sid(r[0]) for r in rows], np.uint32),
        "kind": np.array([schema.KIND_CODE[r[1]] for r in rows], np.uint8),
        "category": np.array([r[2] for r in rows], np.uint8),
        "tid": np.array([r[3] for r in rows], np.int64),
        "device": np.array([r[4] for r in rows], np.int16),
        "ts_ns": np.array([r[5] for r in rows], np.int64),
        "dur_ns": np.array([r[6] for r in rows], np.int64),
        "step": np.array([r[7] for r in rows], np.int32),
        "flops": np.zeros(len(rows), np.int64),
        "corr_id": np.array([r[8] for r in rows], np.int64),
    }
    for col in ev:
        ev[col] = np.concatenate([ev[col], add[col]])
    nccl_rows = [n0 + i for i, r in enumerate(rows) if r[0] == NCCL]
    cm = tables["comms"]
    m = len(nccl_rows)
    more = {"row": np.array(nccl_rows, np.int64), "op_id": np.full(m, sid("all_reduce"), np.uint32),
            "role": np.full(m, schema.ROLE_ANNOTATION, np.uint8), "pg": np.zeros(m, np.int32),
            "seq": np.full(m, -1, np.int32), "bytes": np.full(m, 8 * 2**20, np.int64),
            "group_size": np.full(m, 2, np.int32), "nccl_seq": np.arange(m, dtype=np.int64) + 40}
    for col in cm:
        cm[col] = np.concatenate([cm[col], more[col]])
    th = tables["threads"]
    for col, vals in (("tid", [7, 20]), ("name_id", [sid("stream 7"), sid("stream 20 (nccl)")]),
                      ("role", [schema.THREAD_STREAM] * 2), ("pg", [-1, 0])):
        th[col] = np.concatenate([th[col], np.array(vals, dtype=th[col].dtype)])
    attrs.update({"device_type": "cuda", "device": "NVIDIA H100 80GB HBM3", "backend": "nccl"})


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("gpu"), world_size=2, hosts=[0, 1], clocks={1: (2.5, 30.0)},
                    mutate=_add_gpu_rows, run_id="gpu-run")


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("cpu"), world_size=4, hosts=[0, 0, 1, 1], clocks={1: (3.25, 40.0)},
                    late_rank=2, late_ms=20, run_id="cpu-run")


# ---- format, without HTA -------------------------------------------------------------------------------------------


def test_cpu_export_shape_and_exact_aligned_times(cpu_run, tmp_path):
    merged = load_run(cpu_run.run_dir, progress=False)  # every event in memory: the truth
    files = export_kineto(distprof.load(cpu_run.run_dir, progress=False), tmp_path / "k", progress=False)
    assert [f.path.name for f in files] == [f"rank-{r}.json.gz" for r in range(4)]
    assert not list((tmp_path / "k").glob("*.tmp"))
    traces = {f.rank: read_trace(f.path) for f in files}
    bases = {t["baseTimeNanoseconds"] for t in traces.values()}
    assert len(bases) == 1, "every rank of one export must share one base"
    ev = merged.events
    for r, t in traces.items():
        assert list(t)[:2] == ["schemaVersion", "distributedInfo"] and list(t)[-1] == "traceEvents"
        di = t["distributedInfo"]
        assert (di["backend"], di["rank"], di["world_size"]) == ("gloo", r, 4)
        assert di["pg_config"] == [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "gloo", "pg_size": 4,
                                    "ranks": [0, 1, 2, 3]}]
        assert t["deviceProperties"] == []
        # HTA finds the rank with a regex on the first line that has it: it must be this rank's
        raw = gzip.open(files[r].path, "rt").read()
        first = next(ln for ln in raw.splitlines() if RANK_RE.search(ln))
        assert int(RANK_RE.search(first).group(1)) == r
        # every event, to the nanosecond, in Kineto's shape
        m = ev["rank"] == r
        want = Counter(zip((str(merged.names[i]) for i in ev["name_id"][m]), ev["ts_ns"][m].tolist(),
                           ev["dur_ns"][m].tolist(), (schema.KINDS[k] for k in ev["kind"][m])))
        got = Counter((e["name"], epoch_ns(t, e["ts"]), round(e["dur"] * 1000), e["cat"]) for e in xs(t))
        assert got == want
        for e in xs(t):
            assert e["pid"] == 4000 + r and isinstance(e["tid"], int) and "stream" not in e["args"]
        assert not any("External id" in e["args"] for e in xs(t)), "synth records no correlation ids: none invented"
        names = {e["tid"]: e["args"]["name"] for e in t["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
        tm = cpu_run.extra["tid_main"][r]
        assert names[tm] == "python3" and names[tm + 1] == names[tm + 2] == "pt_gloo_runloop"
        # collectives carry Kineto's collective args and distprof's instance key
        ar = [e for e in xs(t) if e["name"] == "gloo:all_reduce"]
        assert ar and all(e["args"]["Collective name"] == "allreduce" and e["args"]["Process Group Name"] == "0"
                          and e["args"]["Group size"] == 4 and e["args"]["distprof role"] == "exec" for e in ar)
        assert sorted({e["args"]["In msg bytes"] for e in ar}) == [524_288, 1_048_576]
        assert sorted((e["args"]["distprof window"], e["args"]["distprof seq"]) for e in ar) == \
            [(0, s) for s in range(len(ar))]
        enq = [e for e in xs(t) if e["name"] == "c10d::allreduce_"]
        assert enq and all(e["args"]["distprof role"] == "enqueue" for e in enq)
    # aligned: the same step starts at (nearly) the same exported time on every rank, although host 1's clock is 3.25 s
    # off; the truth is in the synthetic run
    for step in (2, 3, 4):
        starts = {r: epoch_ns(t, next(e["ts"] for e in xs(t) if e["name"] == f"ProfilerStep#{step}"))
                  for r, t in traces.items()}
        for r, s in starts.items():
            truth = int(cpu_run.to_recorded(0, cpu_run.steps[r]["start"][cpu_run.steps[r]["step"] == step][0]))
            assert abs(s - truth) < 200 * US, (step, r, s - truth)


def test_gpu_export_links_kernels_streams_and_launches(gpu_run, tmp_path):
    merged = distprof.load(gpu_run.run_dir, progress=False)
    files = export_kineto(merged, tmp_path / "k", gzip=False, progress=False)
    assert [f.path.name for f in files] == ["rank-0.json", "rank-1.json"]
    for f in files:
        t = read_trace(f.path)
        assert t["deviceProperties"] == [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]
        assert t["distributedInfo"]["backend"] == "nccl"
        x = xs(t)
        kernels = [e for e in x if e["cat"] == "kernel"]
        assert Counter(e["args"]["stream"] for e in kernels) == {7: 3, 20: 3}
        assert all(e["pid"] == 0 and e["tid"] == e["args"]["stream"] and e["args"]["device"] == 0 for e in kernels)
        launches = {e["args"]["correlation"]: e for e in x if e["cat"] == "cuda_runtime"}
        ops = {e["args"]["External id"]: e for e in x if e["name"] == "aten::matmul"}
        assert len(ops) == 3
        for k in kernels:
            rt = launches[k["args"]["correlation"]]  # every kernel has its launch
            assert rt["pid"] == 4000 + f.rank and rt["ts"] < k["ts"]
            if k["name"] == GEMM:
                # the launch's External id is that of the innermost op around it (aten::matmul), and so the kernel's
                op = ops[rt["args"]["External id"]]
                assert k["args"]["External id"] == rt["args"]["External id"]
                assert op["ts"] <= rt["ts"] and rt["ts"] + rt["dur"] <= op["ts"] + op["dur"]
            else:
                # launched after aten::matmul ended, inside only ProfilerStep#N, which has no correlation id here
                assert "External id" not in rt["args"] and "External id" not in k["args"]
        nccl = [e for e in kernels if e["name"] == NCCL]
        assert [e["args"]["Seq"] for e in nccl] == [40, 41, 42]
        assert all(e["args"]["Collective name"] == "allreduce" and e["args"]["In msg bytes"] == 8 * 2**20
                   and e["args"]["Process Group Ranks"] == "[0, 1]" for e in nccl)
        flows = [e for e in t["traceEvents"] if e.get("cat") == "ac2g"]
        assert Counter(e["ph"] for e in flows) == {"s": 6, "f": 6}
        gpu_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in t["traceEvents"]
                     if e["ph"] == "M" and e["name"] in ("process_name", "thread_name") and e["pid"] == 0}
        assert gpu_names[(0, 0)] == "GPU 0" and gpu_names[(0, 20)] == "stream 20 (nccl)"


def test_cli_selects_ranks_and_steps(cpu_run, tmp_path, capsys):
    out = tmp_path / "sel"
    assert main(["export", str(cpu_run.run_dir), "--format", "kineto", "-o", str(out), "--ranks", "1,3",
                 "--steps", "3:3", "--no-gzip", "--no-progress"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["rank-1.json", "rank-3.json"]
    printed = capsys.readouterr().out
    assert "rank 1:" in printed and "rank 3:" in printed and "HTA: TraceAnalysis" in printed
    for r in (1, 3):
        t = read_trace(out / f"rank-{r}.json")
        steps = {e["name"] for e in xs(t) if e["name"].startswith("ProfilerStep#")}
        assert steps == {"ProfilerStep#3"}
        assert t["distributedInfo"]["rank"] == r


def test_cli_user_errors(cpu_run, tmp_path, capsys):
    assert main(["export", str(cpu_run.run_dir), "-o", str(tmp_path / "x"), "--ranks", "2,9", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("distprof: error: --ranks: rank(s) 9 not in run") and "0-3" in err
    assert not (tmp_path / "x").exists() or not list((tmp_path / "x").iterdir())
    assert main(["export", str(cpu_run.run_dir), "--ranks", "x", "--no-progress"]) == 2
    assert main(["export", str(tmp_path / "nope"), "--no-progress"]) == 2
    f = tmp_path / "file"
    f.write_text("")
    assert main(["export", str(cpu_run.run_dir), "-o", str(f), "--no-progress"]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_failed_write_leaves_no_file(cpu_run, tmp_path, monkeypatch):
    import orjson

    merged = distprof.load(cpu_run.run_dir, progress=False)
    real = orjson.dumps
    calls = {"n": 0}

    def flaky(obj, *a, **k):
        calls["n"] += 1
        if calls["n"] > 50:
            raise RuntimeError("disk full")
        return real(obj, *a, **k)

    monkeypatch.setattr(orjson, "dumps", flaky)
    with pytest.raises(RuntimeError, match="disk full"):
        export_kineto(merged, tmp_path / "k", progress=False)
    assert list((tmp_path / "k").iterdir()) == []


def test_synthesises_missing_profiler_steps(cpu_run, tmp_path):
    from distprof.export.kineto import rank_trace

    merged = load_run(cpu_run.run_dir, progress=False)
    keep = np.array([not str(merged.names[i]).startswith("ProfilerStep#") for i in merged.events["name_id"]])
    merged.events = {c: v[keep] for c, v in merged.events.items()}
    merged.comms = {c: v[:0] for c, v in merged.comms.items()}  # rows would point at the wrong events now
    base = int(merged.steps["start_ns"].min()) // 10**9 * 10**9
    header, events = rank_trace(merged, 2, base)  # what export_kineto writes for each rank
    t = {**header, "traceEvents": list(events)}
    steps = sorted((e["name"], epoch_ns(t, e["ts"]), e["tid"]) for e in xs(t) if e["name"].startswith("ProfilerStep#"))
    m = merged.steps["rank"] == 2
    assert steps == sorted((f"ProfilerStep#{s}", a, cpu_run.extra["tid_main"][2])
                           for s, a in zip(merged.steps["step"][m].tolist(), merged.steps["start_ns"][m].tolist()))


# ---- HTA 0.5.0 reads the export ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def hta_python():
    try:
        py, built_s = hta_env.ensure_venv()
    except hta_env.HtaEnvError as e:
        if e.offline and not (os.environ.get("CI") or os.environ.get("DISTPROF_REQUIRE_HTA")):
            pytest.skip(f"HTA venv not available (PyPI unreachable; CI builds it): {e}")
        raise
    return py


def _hta_default_rows(trace: dict) -> int:
    """Rows HTA keeps by default on a CPU-only trace: events with a duration whose (ceil-rounded) start is before the
    start of the last ProfilerStep (HTA drops the last, possibly incomplete, step)."""
    x = [e for e in xs(trace) if e["cat"] != "Trace"]
    last = max(math.ceil(e["ts"]) for e in x if e["name"].startswith("ProfilerStep#"))
    return sum(1 for e in x if math.ceil(e["ts"]) < last)


@pytest.mark.slow
def test_hta_loads_every_rank_and_event_of_a_cpu_export(cpu_run, tmp_path, hta_python):
    merged = load_run(cpu_run.run_dir, progress=False)
    files = export_kineto(distprof.load(cpu_run.run_dir, progress=False), tmp_path / "k", progress=False)
    full = hta_env.run_probe(tmp_path / "k", include_last_step=True)
    assert full["versions"]["HolisticTraceAnalysis"] == "0.5.0"
    assert full["ranks"] == [0, 1, 2, 3]
    ev = merged.events
    for r in range(4):
        got = full["per_rank"][str(r)]
        want = Counter(schema.KINDS[k] for k in ev["kind"][ev["rank"] == r])
        assert got["by_cat"] == dict(want), r
        assert got["distributedInfo"]["rank"] == r and got["distributedInfo"]["world_size"] == 4
        assert got["iterations"] == [2, 3, 4]
        assert got["gpu_rows"] == 0
    default = hta_env.run_probe(tmp_path / "k")
    for f in files:
        got = default["per_rank"][str(f.rank)]
        assert got["rows"] == _hta_default_rows(read_trace(f.path)) < full["per_rank"][str(f.rank)]["rows"]
        assert got["iterations"] == [2, 3]
    assert "temporal_breakdown" not in default  # no GPU kernels, nothing to break down


@pytest.mark.slow
def test_hta_figures_on_a_gpu_like_export(gpu_run, tmp_path, hta_python):
    merged = distprof.load(gpu_run.run_dir, progress=False)
    export_kineto(merged, tmp_path / "k", progress=False)
    for include_last, n_steps in ((False, 2), (True, 3)):
        res = hta_env.run_probe(tmp_path / "k", include_last_step=include_last)
        assert res["ranks"] == [0, 1]
        tb = {row["rank"]: row for row in res["temporal_breakdown"]}
        ov = {row["rank"]: row["comp_comm_overlap_pctg"] for row in res["comm_comp_overlap"]}
        for r in (0, 1):
            pr = res["per_rank"][str(r)]
            assert pr["kernels_per_stream"] == {"7": n_steps, "20": n_steps}
            assert pr["correlated_kernels"] == 2 * n_steps
            # every step: GEMM [s+1, s+3] ms, NCCL [s+2, s+6] ms -> 1 of 4 comm ms under compute
            assert ov[r] == pytest.approx(25.0, abs=0.1)
            st = merged.steps
            starts = sorted(st["start_ns"][st["rank"] == r].tolist())[:n_steps]
            span_us = (starts[-1] + 6 * MS - (starts[0] + 1 * MS)) / 1e3
            assert tb[r]["kernel_time(us)"] == pytest.approx(span_us, abs=2)
            assert tb[r]["compute_time(us)"] == pytest.approx(2000 * n_steps, abs=n_steps + 1)
            assert tb[r]["non_compute_time(us)"] == pytest.approx(3000 * n_steps, abs=n_steps + 1)
            assert tb[r]["idle_time(us)"] == pytest.approx(span_us - 5000 * n_steps, abs=2 * n_steps + 2)


def _shipped(sub: str, names: list[str]) -> Path | None:
    d = Path(__file__).parent / "data" / "hta" / sub
    return d if all((d / n).exists() for n in names) else None


# HTA's figures on the originals (HTA 0.5 run on them, see tests/data/hta/README.md): rank -> (idle %, overlap %)
ROUND_TRIPS = {
    "trace_filter": (["sampled_rank-0.json.gz", "sampled_rank-1.json.gz"], {0: (53.56, 11.81), 1: (54.72, 20.05)}),
    "nccl_parser_config": (["nccl_data.json.gz"], {0: (77.78, 14.31)}),
}


@pytest.mark.parametrize("sub", sorted(ROUND_TRIPS))
@pytest.mark.slow
def test_hta_round_trip_of_real_gpu_traces(sub, tmp_path, hta_python):
    """Real A100/NCCL traces: distprof import -> export -> HTA gives HTA's own figures and rows on the originals, so
    kernels, streams, correlation ids and the CPU/GPU split survive."""
    names, documented = ROUND_TRIPS[sub]
    src = _shipped(sub, names)
    if src is None:
        pytest.skip(f"{sub}/{names} not found in tests/data/hta")
    run_dir, out = tmp_path / "run", tmp_path / "k"
    assert main(["import", *(str(src / n) for n in names), "-o", str(run_dir), "--no-progress"]) == 0
    assert main(["export", str(run_dir), "-o", str(out), "--no-progress"]) == 0
    orig_dir = tmp_path / "orig"  # HTA on the originals, in a directory of their own
    orig_dir.mkdir()
    for n in names:
        (orig_dir / n).symlink_to(src / n)
    orig, got = hta_env.run_probe(orig_dir), hta_env.run_probe(out)
    assert got["ranks"] == orig["ranks"] == sorted(documented)
    idle = {row["rank"]: row["idle_time_pctg"] for row in got["temporal_breakdown"]}
    ov = {row["rank"]: row["comp_comm_overlap_pctg"] for row in got["comm_comp_overlap"]}
    for r in documented:
        g, o = got["per_rank"][str(r)], orig["per_rank"][str(r)]
        assert g["rows"] == o["rows"] and g["by_cat"] == o["by_cat"]
        assert g["kernels_per_stream"] == o["kernels_per_stream"] and g["iterations"] == o["iterations"]
        assert idle[r] == pytest.approx(documented[r][0], abs=0.5) and ov[r] == pytest.approx(documented[r][1], abs=0.5)
    assert got["temporal_breakdown"] == orig["temporal_breakdown"]
    assert got["comm_comp_overlap"] == orig["comm_comp_overlap"]
