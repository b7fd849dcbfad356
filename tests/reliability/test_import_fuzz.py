"""``distprof import`` fuzzed with hypothesis: Kineto-like traces with hostile values, broken encodings and odd file
names. Every input either imports (and then reports cleanly, every shard passing the checks) or is refused in one line
naming the file or the flag; never a traceback, never a rank outside the world size.

Generated traces: 150 cases by default, 1,200 when CI=true (CI sets it); mutated real traces (tests/data/hta): 25 and
300. Deterministic (derandomize): the same cases on every run.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import tempfile
from pathlib import Path

import pytest
from reliability_helpers import one_error_line, run_cli
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

FULL = os.environ.get("CI", "").lower() in ("true", "1", "yes")
N_CASES = 1200 if FULL else 150

# ---- values ---------------------------------------------------------------------------------------------------------

EDGE_INTS = [0, 1, -1, -3, 2**15, 2**31 - 1, 2**31, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -2**63, -2**63 - 1,
             10**30]
small_int = st.integers(-3, 40)
edge_int = st.sampled_from(EDGE_INTS)
junk = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6),
                 st.lists(st.integers(-2, 2), max_size=2), st.dictionaries(st.text(max_size=2), small_int, max_size=1))
number = st.one_of(small_int, small_int, edge_int, junk)
T0_US = 1_700_000_000_000_000  # an epoch time in µs, as Kineto writes it
ts = st.one_of(st.integers(0, 10**6).map(lambda x: T0_US + x),
               st.integers(0, 10**9).map(lambda x: (T0_US * 1000 + x) / 1000),  # three decimals, Kineto's ns form
               st.integers(0, 10**6).map(lambda x: x + 0.5), edge_int, junk)
dur = st.one_of(st.integers(0, 10**4), st.integers(0, 10**6).map(lambda x: x / 1000), edge_int, junk)

HOSTILE = ["\x1b]0;TITLE\x07", "\nVerdict: No straggler", "a\rb", "\x00", "\u202eevil", "x" * 500, "<script>",
           "ProfilerStep#", "ProfilerStep#-1", "ProfilerStep#99999999999", "ProfilerStep#1e3"]
NAMES = ["aten::mm", "aten::addmm", "ProfilerStep#1", "ProfilerStep#2", "gloo:all_reduce", "c10d::allreduce_",
         "record_param_comms", "ncclKernel_AllReduce_RING_LL_Sum_float", "ncclDevKernel_SendRecv", "nccl:all_reduce",
         "cudaLaunchKernel", "DataLoader __next__", "thread_name", "Memcpy HtoD"]
CATS = ["cpu_op", "user_annotation", "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver",
        "python_function", "gpu_user_annotation", "Trace", "cpu_instant_event", "ac2g", "weird", ""]
ARG_VALUES = {
    "flops": number, "correlation": number, "device": number, "stream": number, "name": st.one_of(
        st.sampled_from(NAMES + HOSTILE), junk),
    "Collective name": st.one_of(st.sampled_from(["allreduce", "broadcast", "allgather", "send", "nope"]), junk),
    "In msg nelems": number, "Out msg nelems": number, "dtype": st.one_of(st.sampled_from(["Float", "Half", "x"]),
                                                                          junk),
    "Group size": number, "Seq": number, "Process Group Name": st.one_of(st.sampled_from(["0", "1"]), junk),
    "Process Group Ranks": st.one_of(st.lists(number, max_size=4), st.sampled_from(["[0, 1]", "[0, 99]", "[x]"]),
                                     junk),
    "Input Dims": st.one_of(st.lists(st.lists(number, max_size=3), max_size=2), junk),
    "Input type": st.one_of(st.lists(st.sampled_from(["float", "c10::Half", "x"]), max_size=2), junk),
}
args = st.one_of(junk, st.fixed_dictionaries({}, optional=ARG_VALUES))

trace_event = st.fixed_dictionaries({}, optional={
    "ph": st.one_of(st.sampled_from(["X", "X", "X", "X", "i", "I", "M", "B", "E", "f", "s"]), junk),
    "cat": st.one_of(st.sampled_from(CATS), junk),
    "name": st.one_of(st.sampled_from(NAMES), st.sampled_from(HOSTILE), st.text(max_size=12), junk),
    "pid": st.one_of(st.integers(0, 3), number),
    "tid": st.one_of(st.integers(1, 5), number),
    "ts": ts,
    "dur": dur,
    "s": st.sampled_from(["g", "t", "p"]),
    "args": args,
})

dist_info = st.fixed_dictionaries({}, optional={
    "rank": st.one_of(st.integers(0, 3), st.integers(0, 3), number),
    "world_size": st.one_of(st.integers(4, 8), st.integers(1, 8), number),
    "backend": st.one_of(st.sampled_from(["nccl", "gloo"]), junk),
    "pg_config": st.one_of(junk, st.lists(st.fixed_dictionaries({}, optional={
        "pg_name": st.one_of(st.sampled_from(["0", "1"]), junk),
        "ranks": st.one_of(st.lists(number, max_size=4), st.sampled_from(["[0, 1]", "[0, 1, 2, 3]", "[x]"]), junk),
        "backend_config": junk}), max_size=2)),
    "nccl_version": junk,
})

document = st.fixed_dictionaries({"traceEvents": st.lists(trace_event, max_size=25)}, optional={
    "distributedInfo": st.one_of(dist_info, dist_info, junk),
    "deviceProperties": st.one_of(junk, st.lists(st.fixed_dictionaries({}, optional={
        "id": number, "name": st.one_of(st.sampled_from(["NVIDIA A100-SXM4-80GB", "gpu"]), junk),
        "numSms": number, "totalGlobalMem": number}), max_size=2)),
    "baseTimeNanoseconds": st.one_of(st.just(1_711_964_646_000_000_000), st.just(0), number),
    "schemaVersion": junk,
    "traceName": st.one_of(st.sampled_from(HOSTILE), junk),
})

#: how the document becomes bytes: as written, gzipped, or damaged on the way
ENCODINGS = ["json"] * 8 + ["gzip"] * 4 + ["corrupt_gzip", "truncated_gzip", "truncated_json", "second_trace_events",
                                           "top_level_list", "garbage_prefix"]
FILE_NAMES = ["rank-{i}.json"] * 6 + ["rank_{i}.pt.trace.json.gz", "sampled_rank-{i}.json.gz", "rank-{j}.json",
                                       "trace{i}.json"]


def _encode(doc: dict, how: str, cut: float) -> bytes:
    text = json.dumps(doc)
    if how == "second_trace_events":
        text = text[:-1] + ', "traceEvents": [' + json.dumps({"ph": "X", "name": "late"}) + "]}"
    elif how == "top_level_list":
        text = "[" + text + "]"
    elif how == "garbage_prefix":
        text = "\x00\x01garbage" + text
    elif how == "truncated_json":
        text = text[: int(len(text) * cut)]
    raw = text.encode()
    if how in ("gzip", "corrupt_gzip", "truncated_gzip"):
        raw = gzip.compress(raw, mtime=0)
        if how == "corrupt_gzip":
            i = 10 + int((len(raw) - 11) * cut)
            raw = raw[:i] + bytes([raw[i] ^ 0x5A]) + raw[i + 1:]
        elif how == "truncated_gzip":
            raw = raw[: int(len(raw) * cut)]
    return raw


trace_file = st.tuples(document, st.sampled_from(ENCODINGS), st.floats(0.05, 0.95), st.sampled_from(FILE_NAMES))
flags = st.lists(st.sampled_from([["--rank", "0"], ["--rank", "2"], ["--rank", str(2**63)], ["--world-size", "4"],
                                  ["--world-size", str(2**40)], ["--one-host"], ["--codec", "gzip"]]),
                 max_size=2, unique_by=lambda f: f[0])
flags = st.one_of(st.just([]), st.just([]), flags)

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.mark.timeout(1800 if FULL else 300)
@settings(max_examples=N_CASES, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate, Phase.shrink],  # no 'explain': a minute per failure
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(files=st.lists(trace_file, min_size=1, max_size=2), extra=flags)
def test_import_never_tracebacks_and_what_it_writes_reports_cleanly(files, extra):
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        tmp = Path(tmp)
        paths = []
        for i, (doc, how, cut, pattern) in enumerate(files):
            p = tmp / pattern.format(i=i, j=i + 5)
            if p in paths:
                p = p.with_name(f"dup{i}-" + p.name)
            p.write_bytes(_encode(doc, how, cut))
            paths.append(p)
        run = tmp / "run"
        rc, out, err = run_cli(["import", *paths, "-o", run, "--no-progress", *[x for f in extra for x in f]])
        if rc != 0:
            assert rc == 2 and out == ""
            line = one_error_line(err)
            event("refused: " + re.sub(r"\d+|'.*'|\".*\"", "#", line.split(": ", 3)[-1])[:50])
            assert any(p.name in line for p in paths) or re.search(r"--rank|--world-size|no trace", line), line
            assert not run.exists()  # a refused import leaves no run directory behind
            return
        assert all(ln.startswith("distprof: WARNING: ") for ln in err.splitlines()), err
        event("imported")
        m = re.match(r"imported (\d+) trace\(s\), ranks (\d+)\.\.(\d+) of (\d+),", out)
        assert m and int(m[1]) == len(paths) and int(m[3]) < int(m[4]), out
        rc, out, err = run_cli(["report", run, "--json", tmp / "r.json", "--no-progress"])
        assert rc == 0, err
        rep = json.loads((tmp / "r.json").read_text())
        assert rep["skipped_shards"] == []  # every shard the importer writes passes storage.validate
        ws = rep["run"]["world_size"]
        assert set(rep["run"]["ranks_present"]) <= set(range(ws)) and len(rep["run"]["ranks_present"]) == len(paths)
        assert not _CONTROL.search(out), "control characters reach the terminal"


# ---- real traces, mutated ---------------------------------------------------------------------------------------

DATA = Path(__file__).resolve().parents[1] / "data" / "hta"
REAL = {"amd": DATA / "amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz",
        "cpu": DATA / "cpu_only" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
        "sampled": DATA / "trace_filter" / "sampled_rank-1.json.gz"}
_REAL_DOCS: dict[str, dict] = {}
N_MUTATED = 300 if FULL else 25
KEYS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "s", "id", "bp"]
mutation = st.tuples(st.integers(0, 10**6), st.sampled_from(["set", "set", "set", "del_key", "del_event", "dup_event",
                                                             "set_arg", "set_top"]),
                     st.sampled_from(KEYS), st.one_of(number, ts, st.sampled_from(HOSTILE + NAMES + CATS), args))


def _real(name: str) -> dict:
    if name not in _REAL_DOCS:
        with gzip.open(REAL[name], "rt") as fh:
            _REAL_DOCS[name] = json.load(fh)
    return json.loads(json.dumps(_REAL_DOCS[name]))  # a private copy


def _mutate(doc: dict, muts) -> dict:
    ev = doc["traceEvents"]
    for pos, op, key, value in muts:
        if not ev:
            break
        e = ev[pos % len(ev)]
        if op == "set" and isinstance(e, dict):
            e[key] = value
        elif op == "del_key" and isinstance(e, dict):
            e.pop(key, None)
        elif op == "del_event":
            ev.pop(pos % len(ev))
        elif op == "dup_event":
            ev.insert(pos % len(ev), json.loads(json.dumps(e)))
        elif op == "set_arg" and isinstance(e, dict):
            if not isinstance(e.get("args"), dict):
                e["args"] = {}
            e["args"][sorted(ARG_VALUES)[pos % len(ARG_VALUES)]] = value
        elif op == "set_top":
            doc[["distributedInfo", "deviceProperties", "baseTimeNanoseconds"][pos % 3]] = value
    return doc


@pytest.mark.timeout(1800 if FULL else 300)
@settings(max_examples=N_MUTATED, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate, Phase.shrink],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(source=st.sampled_from(sorted(REAL)), muts=st.lists(mutation, min_size=1, max_size=12),
       gz=st.booleans())
def test_mutated_real_traces_import_or_are_refused_in_one_line(source, muts, gz):
    doc = _mutate(_real(source), muts)
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        tmp = Path(tmp)
        p = tmp / ("rank-1.json.gz" if gz else "rank-1.json")
        p.write_bytes(_encode(doc, "gzip" if gz else "json", 0.5))
        rc, out, err = run_cli(["import", p, "-o", tmp / "run", "--no-progress"])
        if rc != 0:
            assert rc == 2 and p.name in one_error_line(err)
            event("refused")
            return
        event("imported")
        rc, out, err = run_cli(["report", tmp / "run", "--json", tmp / "r.json", "--no-progress"])
        assert rc == 0, err
        rep = json.loads((tmp / "r.json").read_text())
        (rank,) = rep["run"]["ranks_present"]  # from distributedInfo, else the file name
        assert rep["skipped_shards"] == [] and 0 <= rank < rep["run"]["world_size"]
        assert not _CONTROL.search(out), "control characters reach the terminal"
