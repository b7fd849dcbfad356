"""`distprof import`: Kineto JSON -> shards; exact ns timestamps, rank discovery, streaming cuts, errors."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import re
from decimal import Decimal
from pathlib import Path

import distprof
import numpy as np
import pytest

from distprof.analysis.report.build import build_report
from distprof.analysis.summarize.merged import load_run
from distprof.cli import main
from distprof.errors import DistprofError
from distprof.importers import kineto
from distprof.importers.kineto import read_kineto
from distprof.importers.run import import_traces
from distprof.storage.reader import find_shards, read_shard

DATA = Path(__file__).parent / "data" / "hta"
NS = DATA / "ns_resolution_trace" / "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
TF = DATA / "trace_filter"


def _decimal_ns(path: Path) -> list[tuple[int, int]]:
    """(ts_ns, dur_ns) of every ph X event, parsed with exact decimals (slow reference)."""
    with gzip.open(path, "rt") as fh:
        doc = json.load(fh, parse_float=Decimal)
    base = int(doc.get("baseTimeNanoseconds", 0))
    return sorted((int(Decimal(e["ts"]) * 1000) + base, int(Decimal(e.get("dur", 0)) * 1000))
                  for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "Trace")


def test_ns_timestamps_exact_on_absolute_float_us():
    tr = read_kineto(NS)
    got = sorted(zip(tr.columns.ts.tolist(), np.asarray(tr.columns.dur).tolist()))
    want = _decimal_ns(NS)
    assert len(got) == len(want) > 40_000
    assert got == want
    assert tr.n_inexact == 0
    # a float64 parse would not be exact here: 1.7e15 µs has a 0.25 µs spacing
    assert any(float(Decimal(t) / 1000) * 1000 != t for t, _ in want[:100])


def test_relative_to_base_time(tmp_path):
    ev = [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 4458701234567.891, "dur": 0.001}]
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps({"traceEvents": ev, "baseTimeNanoseconds": 1711964646000000000}))
    tr = read_kineto(p)
    assert tr.columns.ts.tolist() == [1711964646000000000 + 4458701234567891]
    assert tr.columns.dur.tolist() == [1]


def _rewrite(src: Path, dst: Path, **dump_kw) -> Path:
    with gzip.open(src, "rt") as fh:
        doc = json.load(fh)
    dst.write_text(json.dumps(doc, **dump_kw))
    return dst


@pytest.mark.parametrize("style", [dict(separators=(",", ":")), dict(indent=2)])
def test_compact_and_pretty_json_give_the_same_ranks(tmp_path, style):
    src = tmp_path / "src"
    src.mkdir()
    for r in (0, 1):
        _rewrite(TF / f"sampled_rank-{r}.json.gz", src / f"trace{r}.json", **style)
    res = import_traces([src], tmp_path / "run", progress=False)
    assert res.ranks == [0, 1] and res.world_size == 128
    ref = import_traces([TF], tmp_path / "ref", progress=False)
    for a, b in zip(find_shards(tmp_path / "run"), find_shards(ref.run_dir)):
        ea, eb = read_shard(a).table("events"), read_shard(b).table("events")
        assert np.array_equal(ea["ts_ns"], eb["ts_ns"]) and np.array_equal(ea["dur_ns"], eb["dur_ns"])


def test_small_read_slices_cut_events_correctly(tmp_path, monkeypatch):
    # names with braces, commas and brackets inside strings must not fool the batch cutter
    evil = 'void k<{lambda()#1}>}, {"x": 1}], ["y"]'
    evs = [{"ph": "X", "cat": "cpu_op", "name": evil if i % 3 == 0 else f"op{i}", "pid": 1, "tid": 7,
            "ts": 1000 + i, "dur": 0.5, "args": {"nested": {"a": [1, {"b": "}, {"}]}}} for i in range(300)]
    p = tmp_path / "rank-3.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": evs, "traceName": "x"}, indent=1))
    monkeypatch.setattr(kineto, "READ_BYTES", 97)
    tr = read_kineto(p)
    names = tr.strings.list()
    assert len(tr.columns.ts) == 300
    assert [names[i] for i in tr.columns.name_id[:4]] == [evil, "op1", "op2", evil]
    assert tr.columns.ts.tolist() == [(1000 + i) * 1000 for i in range(300)]
    assert set(tr.columns.dur.tolist()) == {500}
    assert tr.meta["traceName"] == "x"


def test_rank_from_file_name_and_errors(tmp_path):
    ev = [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]
    d = tmp_path / "in"
    d.mkdir()
    (d / "worker-rank_5.json").write_text(json.dumps({"traceEvents": ev}))
    res = import_traces([d], tmp_path / "r1", progress=False)
    assert res.ranks == [5] and res.world_size == 6
    (d / "other.rank5.pt.trace.json").write_text(json.dumps({"traceEvents": ev}))
    with pytest.raises(DistprofError, match="claims rank 5"):
        import_traces([d], tmp_path / "r2", progress=False)
    anon = tmp_path / "anon.json"
    anon.write_text(json.dumps({"traceEvents": ev}))
    res = import_traces([anon], tmp_path / "r3", progress=False)  # one file naming no rank: rank 0 of 1, said once
    assert res.ranks == [0] and res.world_size == 1
    assert [w for w in res.warnings if "no rank" in w] == [
        f"{anon}: no rank in the trace (distributedInfo) nor in the file name: imported as rank 0 of 1 (pass --rank N "
        "to choose another)"]
    with pytest.raises(DistprofError, match=r"anon\.json: no rank.*rename it rank-N"):
        import_traces([anon, tmp_path / "in" / "worker-rank_5.json"], tmp_path / "r6", progress=False)
    assert import_traces([anon], tmp_path / "r4", rank=2, progress=False).ranks == [2]
    with pytest.raises(DistprofError, match="already holds shards"):
        import_traces([anon], tmp_path / "r4", rank=2, progress=False)
    bad = tmp_path / "rank-1.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1')
    with pytest.raises(DistprofError, match="truncated|damaged"):
        import_traces([bad], tmp_path / "r5", progress=False)
    assert not (tmp_path / "r5").exists()  # a failed import leaves no run directory it created


def test_malformed_events_are_counted_and_named(tmp_path, caplog):
    ev = [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1},
          {"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": "soon", "dur": 1},
          {"ph": "X", "cat": "cpu_op", "name": "c", "pid": 1, "ts": 3, "dur": 1}]
    src = tmp_path / "rank-0.json"
    src.write_text(json.dumps({"traceEvents": ev}))
    caplog.set_level("WARNING", logger="distprof")
    import_traces([src], tmp_path / "r", progress=False)
    (msg,) = [r.getMessage() for r in caplog.records if "malformed event" in r.getMessage()]
    assert "rank-0.json: skipped 2 malformed event(s)" in msg and "1 no ts" in msg
    assert len(read_shard(find_shards(tmp_path / "r")[0]).table("events", ["ts_ns"])["ts_ns"]) == 1


_OK = {"ph": "X", "cat": "cpu_op", "name": "ok", "pid": 1, "tid": 1, "ts": 1_700_000_000_000_000, "dur": 5}


def _doc(events, **top) -> str:
    return json.dumps({"distributedInfo": {"rank": 0, "world_size": 1}, **top,
                       "traceEvents": [_OK, {**_OK, "name": "ProfilerStep#1", "cat": "user_annotation"}, *events]})


@pytest.mark.parametrize("event, why", [
    ({"ts": 2**63}, "ts or dur out of range"),  # OverflowError before
    ({"dur": 2**64}, "ts or dur out of range"),
    ({"dur": -4}, "negative dur"),
    ({"tid": 2**63}, "tid, flops or correlation out of range"),
    ({"args": {"flops": 2**63}}, "tid, flops or correlation out of range"),
    ({"args": {"correlation": 2**64 - 1}}, "tid, flops or correlation out of range"),
    ({"cat": "kernel", "pid": 0, "args": {"device": 40000, "stream": 7}}, "device id out of range"),
    ({"cat": "kernel", "args": {"device": -2, "stream": 7}}, "device id out of range"),
    ({"name": "ProfilerStep#x", "cat": "user_annotation"}, "ProfilerStep# name without a step number"),
    ({"name": "ProfilerStep#99999999999", "cat": "user_annotation"}, "ProfilerStep# name without a step number"),
])
def test_out_of_range_values_skip_their_event_counted_never_wrapped(tmp_path, event, why, caplog):
    src = tmp_path / "rank-0.json"
    src.write_text(_doc([{**_OK, "name": "bad", **event}]))
    caplog.set_level("WARNING", logger="distprof")
    res = import_traces([src], tmp_path / "run", progress=False)
    assert any(f"rank-0.json: skipped 1 malformed event(s) (1 {why}" in r.getMessage() for r in caplog.records)
    m = load_run(res.run_dir)
    assert "bad" not in set(m.names[m.events["name_id"]]) and not m.skipped_shards
    assert m.steps["step"].tolist() == [1]


def test_scalar_args_of_metadata_events_are_ignored(tmp_path):
    """AttributeError before: a thread_name metadata event whose args is a number."""
    src = tmp_path / "rank-0.json"
    src.write_text(_doc([{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": 5},
                         {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": ["x"]}]))
    assert import_traces([src], tmp_path / "run", progress=False).n_events == 4


def test_values_out_of_range_in_collective_args_are_left_unknown(tmp_path, caplog):
    ev = {**_OK, "name": "record_param_comms", "args": {"Collective name": "allreduce", "Group size": 2**40,
                                                        "In msg nelems": 2**70, "dtype": "Float", "Seq": 2**64,
                                                        "Process Group Ranks": [0, 2**70]}}
    src = tmp_path / "rank-0.json"
    src.write_text(_doc([ev]))
    caplog.set_level("WARNING", logger="distprof")
    res = import_traces([src], tmp_path / "run", progress=False)
    (msg,) = [r.getMessage() for r in caplog.records if "out-of-range" in r.getMessage()]
    assert "ignored 4 out-of-range value(s)" in msg and "collective group_size out of range" in msg
    cm = load_run(res.run_dir).comms
    assert cm["bytes"].tolist() == [-1] and cm["group_size"].tolist() == [-1] and cm["nccl_seq"].tolist() == [-1]


def test_times_beyond_int64_after_the_base_time_are_skipped(tmp_path, caplog):
    base = 2**62 - 10**12
    src = tmp_path / "rank-0.json"
    src.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 1}, "baseTimeNanoseconds": base,
                               "traceEvents": [{**_OK, "ts": 1.0}, {**_OK, "name": "late", "ts": 2 * 10**9}]}))
    caplog.set_level("WARNING", logger="distprof")
    res = import_traces([src], tmp_path / "run", progress=False)
    assert any("1 ts out of range" in r.getMessage() for r in caplog.records)
    m = load_run(res.run_dir)
    assert m.events["ts_ns"].tolist() == [base + 1000]


@pytest.mark.parametrize("content, match", [
    # measured: a corrupt gzip body raised zlib.error
    (lambda: gzip.compress(_doc([]).encode(), mtime=0)[:30] + b"\xff" * 40 + gzip.compress(b"x")[30:],
     r"rank-0\.json\.gz: cannot read \(corrupt gzip data"),
    (lambda: gzip.compress(_doc([]).encode(), mtime=0)[:-12], r"rank-0\.json\.gz: cannot read \(the gzip stream ends"),
    # measured: a second traceEvents key imported 0 events silently
    (lambda: ('{"traceEvents": [], "x": 1, "traceEvents": ' + json.dumps([_OK]) + "}").encode(),
     r"rank-0\.json\.gz: a second \"traceEvents\" key"),
    # measured: rank -3 imported as rank-0003 (then not found); a rank >= world size counted "5/4 ranks"
    (lambda: _doc([]).replace('"rank": 0', '"rank": -3').encode(), r"distributedInfo\.rank is -3, not a number"),
    (lambda: _doc([]).replace('"rank": 0', '"rank": 5').replace('"world_size": 1', '"world_size": 4').encode(),
     r"distributedInfo\.rank 5 is not below its world_size 4"),
    (lambda: _doc([]).replace('"rank": 0', '"rank": true').encode(), r"distributedInfo\.rank is true"),
    (lambda: _doc([]).replace('"world_size": 1', '"world_size": 1099511627776').encode(),
     r"distributedInfo\.world_size is 1099511627776, not a number 1\.\.1048576"),
    (lambda: _doc([], baseTimeNanoseconds=-5).encode(), r"\"baseTimeNanoseconds\" is -5, not a time"),
])
def test_malformed_files_are_one_line_naming_file_and_field(tmp_path, content, match):
    src = tmp_path / "rank-0.json.gz"
    src.write_bytes(content())
    rc, err = _cli_err(["import", str(src), "-o", str(tmp_path / "run"), "--no-progress"])
    assert rc == 2 and err.count("\n") == 1 and err.startswith("distprof: error: ")
    assert re.search(match, err), err
    assert not (tmp_path / "run").exists()


def test_world_sizes_that_disagree_and_bad_flags_are_refused(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "rank-0.json").write_text(_doc([]).replace('"world_size": 1', '"world_size": 2'))
    (d / "rank-1.json").write_text(_doc([]).replace('"rank": 0', '"rank": 1').replace('"world_size": 1', '"world_size": 8'))
    rc, err = _cli_err(["import", str(d), "-o", str(tmp_path / "run")])
    assert rc == 2 and "rank-1.json: distributedInfo.world_size 8 differs from 2 in rank-0.json" in err
    assert import_traces([d], tmp_path / "ok", world_size=8, progress=False).world_size == 8
    for flags, msg in ((["--world-size", str(2**40)], "--world-size 1099511627776: must be 1..1048576"),
                       (["--rank", str(2**63)], "--rank 9223372036854775808: must be 0..1048575")):
        rc, err = _cli_err(["import", str(d / "rank-0.json"), "-o", str(tmp_path / "r2"), *flags])
        assert rc == 2 and msg in err
    f = tmp_path / "a-file"
    f.write_text("x")
    rc, err = _cli_err(["import", str(d / "rank-0.json"), "-o", str(f)])
    assert rc == 2 and "exists and is not a directory" in err and f.read_text() == "x"


def _cli_err(argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    return rc, err.getvalue()


def test_cli_import_then_report(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["import", str(TF), "-o", str(out), "--no-progress"]) == 0
    assert "imported 2 trace(s)" in capsys.readouterr().out
    run = distprof.load(out)
    assert run.ranks_present == [0, 1] and run.world_size == 128
    assert {h.method for h in run.clock.values()} <= {"reference", "collectives", "none"}
    rep = build_report(run)
    assert [r.rank for r in rep.gpu_time] == [0, 1]
    assert any("clock-sync" in w or "not aligned" in w for w in rep.warnings)
    assert main(["import", str(tmp_path / "nope"), "-o", str(tmp_path / "x")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_cpu_only_gloo_trace(tmp_path):
    import_traces([DATA / "cpu_only"], tmp_path / "run", progress=False)
    s = read_shard(find_shards(tmp_path / "run")[0])
    assert s.attrs["rank"] == 34 and s.attrs["world_size"] == 300 and s.attrs["backend"] == "gloo"
    assert len(s.attrs["process_groups"]) == 11
    names = s.names
    cm = s.table("comms")
    ops = [names[i] for i in cm["op_id"][cm["role"] == 1]]
    assert ops == ["all_reduce"] * 10
    assert set(cm["bytes"][cm["role"] == 1].tolist()) == {321271 * 4, 2082411 * 4}


def test_import_speed_and_memory(tmp_path):
    """Largest shipped trace: well below the JSON's size in extra memory (tracemalloc peak of Python allocations)."""
    import tracemalloc

    tracemalloc.start()
    tr = read_kineto(NS)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert tr.raw_bytes > 15e6
    assert peak < 0.5 * tr.raw_bytes, peak


@pytest.mark.parametrize("compact", [True, False])
def test_textual_decimal_shift_edge_cases(tmp_path, compact):
    # (ts literal, dur literal, expected ts ns, expected dur ns): pass 1 shifts 3-decimal literals into integer ns,
    # everything else (integers µs, other decimals, exponents) takes the exact fallback
    cases = [("1.5", "0.001", 1500, 1), ("12", "3", 12000, 3000), ("0.001", "0.000", 1, 0), ("-3.25", "-0.500", -3250, -500),
             ("1e3", "2E0", 1_000_000, 2000), ("12.3456", "0.0015", 12346, 2), ("12.3455", "0.0025", 12346, 2),
             ("0.010", "0.100", 10, 100), ("4458701234567.891", "120.000", 4458701234567891, 120000),
             ("1712345678901234.567", "1.0", 1712345678901234567, 1000)]
    sep = "" if compact else "\n   "
    body = []
    for i, (t, d, _, _) in enumerate(cases):
        # "ts" in different positions, and a "ts" inside args that must neither break parsing nor leak into columns
        head = f'"ts":{sep}{t},' if i % 2 else ""
        tail = "" if i % 2 else f',{sep}"ts" :  {t}'
        body.append(f'{{{head}"ph":"X","cat":"cpu_op","name":"ev{i}","pid":1,"tid":1,"dur":{sep}{d},'
                    f'"args":{{"ts": 99.999, "dur": 7, "note": "\\"ts\\": 1.234"}}{tail}}}')
    p = tmp_path / "rank-0.json"
    p.write_text('{"traceEvents": [' + (",\n" if not compact else ",").join(body) + "]}")
    tr = read_kineto(p)
    names = tr.strings.list()
    got = {names[n]: (t, d) for n, t, d in zip(tr.columns.name_id, tr.columns.ts.tolist(), tr.columns.dur.tolist())}
    # ev3 parses exactly (-3250, -500) but a negative duration is skipped and counted, never kept
    assert got == {f"ev{i}": (t, d) for i, (_, _, t, d) in enumerate(cases) if d >= 0}
    assert tr.skipped == {"negative dur": 1}
    assert tr.n_inexact == 0


def test_rewrite_keeps_strings_and_makes_integers():
    out = kineto._rewrite(b'{"name": "a\\"ts\\": 1.234", "ts": 0.045, "dur": 2.500, "args": {"ts": 7.000}}')
    assert orjson_loads(out) == {"name": 'a"ts": 1.234', "ts_ns": 45, "dur_ns": 2500, "args": {"ts_ns": 7000}}
    assert kineto._rewrite(b'{"ts": 12, "dur": 1e3}') == b'{"ts": 12, "dur": 1e3}'
    assert orjson_loads(kineto._rewrite(b'{"ts": -0.000, "dur": 1.25}')) == {"ts_ns": 0, "dur_d": "1.25"}


def orjson_loads(b: bytes):
    import orjson

    return orjson.loads(b)


def test_unsorted_trace_sorted_in_place_with_comm_args_following(tmp_path):
    # events written out of time order (as Kineto does: CPU ops, then GPU kernels); the collective's args must stay
    # with its event after the in-place sort
    ev = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": 100 - i, "dur": 1} for i in range(50)]
    ev.insert(17, {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 60.5,
                   "dur": 1, "args": {"Collective name": "allreduce", "In msg nelems": 8, "dtype": "Float"}})
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    tr = read_kineto(p)
    ts = tr.columns.ts
    assert np.all(ts[1:] >= ts[:-1])
    ((i, a),) = tr.columns.comm_meta.items()
    assert tr.strings.list()[tr.columns.name_id[i]] == "record_param_comms" and ts[i] == 60500
    assert a.op == "all_reduce" and a.bytes == 32


def test_build_tables_presorted_equals_sorting(tmp_path):
    """build_tables takes presorted columns as they are: the same tables as from the columns in any order."""
    import copy

    from distprof.events.tables import Columns, build_tables

    tr = read_kineto(DATA / "nccl_parser_config" / "nccl_data.json.gz")
    c = tr.columns
    n = len(c.ts)
    perm = np.random.default_rng(0).permutation(n)
    inv = np.empty(n, np.int64)
    inv[perm] = np.arange(n)
    fields = ("name_id", "kind", "tid", "device", "ts", "dur", "flops", "corr")
    shuffled = Columns(**{f: np.asarray(getattr(c, f))[perm] for f in fields},
                       comm_meta={int(inv[i]): a for i, a in c.comm_meta.items()})
    kw = dict(main_tid=tr.main_tid, thread_names=tr.thread_names, stream_names=tr.stream_names,
              add_process_groups=True)
    a = build_tables(c, copy.deepcopy(tr.strings), **kw)
    b = build_tables(shuffled, copy.deepcopy(tr.strings), **kw)
    assert len(a.tables["comms"]["row"]) > 50 and len(a.tables["steps"]["step"]) > 1
    for t in a.tables:
        for k in a.tables[t]:
            assert np.array_equal(a.tables[t][k], b.tables[t][k]), (t, k)
    assert np.array_equal(a.order, np.arange(n))


@pytest.mark.parametrize("sub", ["ns_resolution_trace", "nccl_parser_config", "amd_trace", "cpu_only"])
def test_real_traces_import_without_malformed_warnings(tmp_path, caplog, sub):
    """Kineto's own markers (the profiler span, global 'Iteration Start'/'Record Window End' instants with string
    pid/tid) are expected, not malformed events."""
    caplog.set_level("WARNING", logger="distprof")
    import_traces([DATA / sub], tmp_path / "r", rank=0, progress=False)
    assert not [r for r in caplog.records if "malformed" in r.getMessage()]


def test_json_without_an_event_boundary_is_refused_not_read_whole(tmp_path, monkeypatch):
    """A file that never reaches "traceEvents" (or an event that never ends) was read into memory whole."""
    monkeypatch.setattr(kineto, "MAX_PENDING_BYTES", 1 << 20)
    for name, text in (("rank-0.json", '{"meta": "' + "x" * (3 << 20) + '", "traceEvents": []}'),
                       ("rank-1.json", '{"traceEvents": [{"name": "' + "y" * (3 << 20) + '"}]}'),
                       ("rank-2.json", '{"traceEvents": [], "tail": "' + "z" * (3 << 20) + '"}')):
        p = tmp_path / name
        p.write_text(text)
        with pytest.raises(DistprofError, match=rf"{name}: over 1 MB of JSON without the end of an event"):
            read_kineto(p)


def test_inexact_timestamps_warned_once(tmp_path, caplog):
    """Exponent-notation timestamps beyond 2^43 µs: one warning per file (the reader used to log its own as well)."""
    ev = ",".join(f'{{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1.70000000000000{k}e15, '
                  '"dur": 1}' for k in range(3))
    p = tmp_path / "rank-0.json"
    p.write_text('{"traceEvents": [' + ev + "]}")
    with caplog.at_level("WARNING"):
        res = import_traces([p], tmp_path / "run", progress=False)
    hits = [r.getMessage() for r in caplog.records if "not exact to the ns" in r.getMessage()]
    assert len(hits) == 1 and res.warnings.count(hits[0]) == 1 and "3 timestamp(s)" in hits[0], hits
