"""The merged timeline (distprof/export/timeline.py) and ``distprof timeline``."""

from __future__ import annotations

import json
import shlex
from collections import defaultdict
from pathlib import Path

import distprof
import numpy as np
import pytest

from distprof.analysis.summarize.merged import load_run
from distprof.analysis.cross.stragglers import collective_instances
from distprof.cli import main
from distprof.errors import ConfigError
from distprof.export import timeline as tl

DEMO = Path("/tmp/dp-demo/demo4")
NCCL_DATA = Path(__file__).parent / "data" / "hta" / "nccl_parser_config" / "nccl_data.json.gz"
WINDOWS = {"wait": 1, "warmup": 1, "active": 3, "repeat": 2}


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    from synth import make_run

    out = tmp_path_factory.mktemp("tl")
    # two hosts, host 1 off by 3.25 s and drifting 40 ppm; rank 2 arrives 30 ms late at every step's collectives
    return make_run(out, world_size=4, hosts=[0, 0, 1, 1], clocks={1: (3.25, 40.0)}, late_rank=2, late_ms=30,
                    schedule=WINDOWS)


@pytest.fixture(scope="module")
def merged(synth):
    """Every event in memory: the truth the streamed timeline is checked against."""
    return load_run(synth.run_dir, progress=False)


@pytest.fixture(scope="module")
def summary(synth):
    """What the timeline is planned and written from (one rank's events at a time)."""
    return distprof.load(synth.run_dir, progress=False)


@pytest.fixture(scope="module")
def trace(summary, tmp_path_factory):
    path = tmp_path_factory.mktemp("tlout") / "merged.json.gz"
    plan = tl.plan_timeline(summary)
    res = tl.write_timeline(summary, plan, path, progress=False)
    assert res.path == path and res.n_events == plan.n_events
    return tl.read_timeline(path)


# ---- helpers ---------------------------------------------------------------------------------------------------------


def validate(doc: dict) -> dict:
    """Checks every viewer needs; returns the events split by phase."""
    assert isinstance(doc["traceEvents"], list)
    by: dict[str, list] = defaultdict(list)
    for e in doc["traceEvents"]:
        by[e["ph"]].append(e)
        if e["ph"] == "M":
            assert "ts" not in e and isinstance(e["pid"], int) and e["pid"] >= 1
            continue
        for k in ("ph", "ts", "pid", "tid", "name"):
            assert k in e, (k, e)
        assert isinstance(e["pid"], int) and e["pid"] >= 1 and isinstance(e["tid"], int) and e["tid"] >= 1
        assert e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0 and "cat" in e
    assert set(by) <= {"M", "X", "i", "C", "s", "f"}
    # flows: ids unique, every start has exactly one finish, both bound to a slice starting there on that track
    starts = [e["id"] for e in by["s"]]
    ends = [e["id"] for e in by["f"]]
    assert len(set(starts)) == len(starts) and sorted(starts) == sorted(ends)
    slice_at = {(e["pid"], e["tid"], e["ts"]) for e in by["X"]}
    for e in by["s"] + by["f"]:
        assert (e["pid"], e["tid"], e["ts"]) in slice_at, e
        assert e["cat"] in ("collective", "enqueue", "launch")
    assert all(e.get("bp") == "e" for e in by["f"])
    # complete events on one track nest (no partial overlap), within 1 ns of rounding
    tracks: dict[tuple, list] = defaultdict(list)
    for e in by["X"]:
        tracks[(e["pid"], e["tid"])].append((e["ts"], -e["dur"], e["ts"] + e["dur"]))
    for evs in tracks.values():
        evs.sort()
        stack: list[float] = []
        for ts, _, end in evs:
            while stack and stack[-1] <= ts + 1e-3:
                stack.pop()
            if stack:
                assert end <= stack[-1] + 1e-3, "slices overlap without nesting"
            stack.append(end)
    return by


def meta(doc: dict) -> dict:
    return doc["otherData"]["distprof"]


def abs_ns(doc: dict, ts_us: float) -> int:
    return meta(doc)["origin_ns"] + round(ts_us * 1000)


def arrivals(doc: dict) -> dict[tuple[int, int], dict[int, float]]:
    """(step, seq) -> {rank: arrival µs} of the exec collectives in the timeline."""
    out: dict[tuple[int, int], dict[int, float]] = defaultdict(dict)
    for e in doc["traceEvents"]:
        a = e.get("args") or {}
        if e["ph"] == "X" and "arrival" in a:
            out[(a["step"], a["seq"])][e["pid"] - 1] = e["ts"]
    return out


def mean_lateness_ms(arr: dict[tuple[int, int], dict[int, float]]) -> dict[int, float]:
    """Per rank: mean over instances of (arrival − median of the other ranks' arrivals), as stragglers.py defines."""
    acc: dict[int, list[float]] = defaultdict(list)
    for ranks in arr.values():
        for r, t in ranks.items():
            others = [v for q, v in ranks.items() if q != r]
            acc[r].append((t - float(np.median(others))) / 1e3)
    return {r: float(np.mean(v)) for r, v in acc.items()}


def cli(argv, capsys):
    rc = main(["timeline", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


# ---- synthetic runs --------------------------------------------------------------------------------------------------


def test_layout_names_and_metadata(trace, merged, synth):
    by = validate(trace)
    m = meta(trace)
    assert m["format"] == "distprof-timeline" and m["run_id"] == synth.run_id and m["ranks"] == [0, 1, 2, 3]
    assert m["cut"] is None and m["counts"]["total"] == len(trace["traceEvents"])
    procs = {e["pid"]: e["args"]["name"] for e in by["M"] if e["name"] == "process_name"}
    assert procs == {r + 1: f"rank {r} · {synth.host_name(r)}" for r in range(4)}
    sort = {e["pid"]: e["args"]["sort_index"] for e in by["M"] if e["name"] == "process_sort_index"}
    assert sort == {r + 1: r for r in range(4)}
    threads = defaultdict(dict)
    for e in by["M"]:
        if e["name"] == "thread_name":
            threads[e["pid"]][e["tid"]] = e["args"]["name"]
    for r in range(4):
        names = threads[r + 1]
        assert names[1] == "steps"
        assert names[2] == f"python3 [{synth.extra['tid_main'][r]}] main"
        for t in synth.extra["tid_workers"][r]:
            assert f"pt_gloo_runloop [{t}] pg 0" in names.values()
    # every slice on a named track, and every event of the run is there once
    assert all(e["tid"] in threads[e["pid"]] for e in by["X"])
    assert len([e for e in by["X"] if e["cat"] != "step"]) == len(merged.events["ts_ns"])
    assert m["origin_ns"] == min(int(merged.events["ts_ns"].min()), int(merged.steps["start_ns"].min()),
                                 int(merged.memory["ts_ns"].min()))
    assert m["clock"]["sim-host1"]["drift_ppm"] != 0


def test_times_are_the_aligned_times(trace, merged, synth):
    by = validate(trace)
    st = merged.steps
    want = {(int(r), int(s)): (int(a), int(b)) for r, s, a, b in zip(st["rank"], st["step"], st["start_ns"],
                                                                     st["end_ns"])}
    got = {(e["pid"] - 1, e["args"]["step"]): e for e in by["X"] if e["cat"] == "step"}
    assert set(got) == set(want)
    for key, e in got.items():
        a, b = want[key]
        assert abs(abs_ns(trace, e["ts"]) - a) <= 1 and abs(abs_ns(trace, e["ts"] + e["dur"]) - b) <= 1
    # alignment really happened: host 1 recorded 3.25 s ahead, the timeline agrees with the true times (rank 0 clock)
    for r in (2, 3):
        for s, true_start in zip(synth.steps[r]["step"], synth.steps[r]["start"]):
            if (r, int(s)) in got:
                assert abs(abs_ns(trace, got[(r, int(s))]["ts"]) - int(synth.to_recorded(0, true_start))) < 100_000
    # ProfilerStep slices on the main thread start where the steps table says
    for e in by["X"]:
        if e["name"].startswith("ProfilerStep#"):
            r, s = e["pid"] - 1, int(e["name"].split("#")[1])
            assert abs(abs_ns(trace, e["ts"]) - want[(r, s)][0]) <= 1
    # memory counters: one per sample, values from total_bytes
    mem = merged.memory
    assert len(by["C"]) == len(mem["ts_ns"])
    got_mem = sorted((e["pid"] - 1, abs_ns(trace, e["ts"]), e["args"]["allocated_MiB"]) for e in by["C"])
    want_mem = sorted((int(r), int(t), round(int(b) / 2**20, 6)) for r, t, b in zip(mem["rank"], mem["ts_ns"],
                                                                                  mem["total_bytes"]))
    assert [g[:2] for g in got_mem] == [w[:2] for w in want_mem]
    assert np.allclose([g[2] for g in got_mem], [w[2] for w in want_mem])


def test_collectives_line_up_with_straggler_lateness(trace, merged, summary, synth):
    by = validate(trace)
    arr = arrivals(trace)
    n_inst = len(synth.collectives["seq"])
    assert len(arr) == n_inst and all(len(v) == 4 for v in arr.values())
    # one chain of 3 arrows per instance, in arrival order, ending at the latest rank (rank 2 here)
    assert len([e for e in by["s"] if e["cat"] == "collective"]) == 3 * n_inst
    lat = mean_lateness_ms(arr)
    ci = collective_instances(summary)
    ref = {r: float(np.mean(ci["lateness_ns"][ci["rank"] == r])) / 1e6 for r in range(4)}
    for r in range(4):
        assert lat[r] == pytest.approx(ref[r], abs=1e-3)
    assert lat[2] > 10 and max(lat, key=lat.get) == 2
    late_arg = [e["args"]["late_ms"] for e in by["X"] if e["pid"] == 3 and "late_ms" in e["args"]]
    assert len(late_arg) == n_inst and min(late_arg) > 0 and max(late_arg) > 25  # 30 ms late at each first bucket
    slices = {(e["pid"], e["tid"], e["ts"]): e for e in by["X"]}
    finals = {}
    for e in by["f"]:
        if e["cat"] != "collective":
            continue
        finals[e["id"]] = slices[(e["pid"], e["tid"], e["ts"])]
    last_of_chain = [x for x in finals.values() if x["args"]["arrival"] == "4/4"]
    assert len(last_of_chain) == n_inst and {x["pid"] - 1 for x in last_of_chain} == {2}


def flow_pairs(by: dict, cat: str) -> list[tuple[dict, dict, dict, dict]]:
    """(start event, finish event, slice the start is bound to, slice the finish is bound to) of each `cat` arrow."""
    slices = {(e["pid"], e["tid"], e["ts"]): e for e in by["X"]}
    fin = {e["id"]: e for e in by["f"] if e["cat"] == cat}
    out = []
    for s in by["s"]:
        if s["cat"] == cat:
            f = fin.pop(s["id"])
            out.append((s, f, slices[(s["pid"], s["tid"], s["ts"])], slices[(f["pid"], f["tid"], f["ts"])]))
    assert not fin
    return out


def inside(ts: float, sl: dict) -> bool:
    return sl["ts"] <= ts <= sl["ts"] + sl["dur"]


def test_enqueue_arrows_link_each_enqueue_to_its_gloo_exec(trace, merged, synth):
    by = validate(trace)
    ids = [e["id"] for e in by["s"]]
    assert len(ids) == len(set(ids))  # unique across collective and enqueue arrows
    pairs = flow_pairs(by, "enqueue")
    n_inst = len(synth.collectives["seq"])
    assert len(pairs) == 4 * n_inst == meta(trace)["counts"]["enqueue_flows"]
    enq_slices = [e for e in by["X"] if e["name"] == "c10d::allreduce_"]
    assert len(enq_slices) == 4 * n_inst
    # every enqueue is the start of exactly one arrow, every exec the end of exactly one
    assert sorted((sl["pid"], sl["ts"]) for _, _, sl, _ in pairs) == sorted((e["pid"], e["ts"]) for e in enq_slices)
    assert len({(f["pid"], f["tid"], f["ts"]) for _, f, _, _ in pairs}) == len(pairs)
    inst_of = {(int(w), int(s)): i for i, (w, s) in enumerate(zip(synth.collectives["window"],
                                                                   synth.collectives["seq"]))}
    step_window = {s: w for w, (a, b) in enumerate(synth.windows) for s in range(a, b + 1)}
    for s, f, enq, ex in pairs:
        assert s["name"] == f["name"] == "all_reduce" and s["pid"] == f["pid"]
        assert enq["name"] == "c10d::allreduce_" and ex["name"] == "gloo:all_reduce" and enq["tid"] != ex["tid"]
        assert inside(s["ts"], enq) and inside(f["ts"], ex) and s["ts"] <= f["ts"]
        # the true pairing: this exec's instance was enqueued at this time on this rank (synth truth)
        r, w = s["pid"] - 1, step_window[ex["args"]["step"]]
        i = inst_of[(w, ex["args"]["seq"])]
        true_enq = int(synth.to_recorded(0, synth.collectives["enqueue"][i, r]))
        assert abs(abs_ns(trace, enq["ts"]) - true_enq) < 100_000


def test_enqueue_and_launch_arrows_on_a_gpu_trace(tmp_path, capsys):
    from distprof.importers.run import import_traces

    import_traces([NCCL_DATA], tmp_path / "run", rank=0, progress=False)
    run = distprof.load(tmp_path / "run", progress=False)
    out = tmp_path / "gpu.json.gz"
    tl.write_timeline(run, tl.plan_timeline(run), out, progress=False)
    doc = tl.read_timeline(out)
    by = validate(doc)
    kernels = [e for e in by["X"] if e["name"].startswith("ncclKernel")]
    enqueues = [e for e in by["X"] if e["name"].startswith("c10d::")]
    launch_of = {e["args"]["correlation"]: e for e in by["X"]
                 if e["cat"] == "cuda_runtime" and "correlation" in e["args"]}
    pairs = flow_pairs(by, "enqueue")
    assert kernels and len(pairs) == len(kernels) == len(enqueues)
    assert len({id(ex) for *_, ex in pairs}) == len(kernels)
    assert sorted(e["ts"] for _, _, e, _ in pairs) == sorted(e["ts"] for e in enqueues)
    for s, f, enq, ex in pairs:
        assert enq["name"].startswith("c10d::") and ex["name"].startswith("ncclKernel")
        assert inside(s["ts"], enq) and inside(f["ts"], ex) and enq["pid"] == ex["pid"]
        launch = launch_of[ex["args"]["correlation"]]  # the kernel's launch lies inside the enqueue
        assert launch["tid"] == enq["tid"] and inside(launch["ts"], enq)
        assert s["name"] == ex["args"]["op"]
    assert not [e for e in by["s"] if e["cat"] == "launch"]  # launch arrows only when asked

    # --launch-flows: one arrow per device slice whose launch is in the trace, launch -> kernel
    plan = tl.plan_timeline(run, launch_flows=True)
    doc2 = {"traceEvents": list(tl.iter_trace_events(run, plan))}
    by2 = validate(doc2)
    ids = [e["id"] for e in by2["s"]]
    c = plan.counts
    assert len(ids) == len(set(ids)) == c["flows"] + c["enqueue_flows"] + c["launch_flows"]
    dev = [e for e in by2["X"] if "device" in e["args"] and e["args"].get("correlation") in launch_of]
    lp = flow_pairs(by2, "launch")
    assert len(lp) == len(dev) > 1000 and len(flow_pairs(by2, "enqueue")) == len(pairs)
    for s, f, la, k in lp:
        assert la["cat"] == "cuda_runtime" and k["args"]["correlation"] == la["args"]["correlation"]
        assert inside(s["ts"], la) and inside(f["ts"], k)
    assert len(doc2["traceEvents"]) == plan.n_events == len(doc["traceEvents"]) + 2 * len(lp)
    # the arrows are in the budget: a cut file stays under it, with its enqueue arrows drawn whole
    budget = len(doc2["traceEvents"]) // 2
    cut = tl.plan_timeline(run, launch_flows=True, max_events=budget)
    evs = list(tl.iter_trace_events(run, cut))
    assert cut.cut.happened and len(evs) == cut.n_events <= budget
    assert "--launch-flows" in cut.cut.flags(cut.selection)[1]
    validate({"traceEvents": evs})
    # the command line flag
    rc, _, _ = cli([tmp_path / "run", "-o", tmp_path / "lf.json", "--launch-flows", "--no-progress"], capsys)
    m = meta(json.loads((tmp_path / "lf.json").read_text()))
    assert rc == 0 and m["counts"]["launch_flows"] == len(lp) and m["selection"]["launch_flows"] is True


def _plan(summary, **kw):
    plan = tl.plan_timeline(summary, **kw)
    return plan, list(tl.iter_trace_events(summary, plan))


def test_selection(summary):
    plan, evs = _plan(summary, ranks=[1, 3], windows=[1], steps=(8, 9))
    x = [e for e in evs if e["ph"] == "X"]
    assert {e["pid"] - 1 for e in x} == {1, 3}
    assert {e["args"]["step"] for e in x} == {8, 9}  # window 1 covers steps 7..9
    assert plan.windows == [1] and plan.cut.happened is False
    # the flows of a rank subset link only those ranks
    # 2 buckets per step x 2 steps x (2 ranks - 1)
    assert len([e for e in evs if e["ph"] == "s" and e["cat"] == "collective"]) == 2 * 2
    assert len([e for e in evs if e["ph"] == "s" and e["cat"] == "enqueue"]) == 2 * 2 * 2  # one per rank's bucket
    with pytest.raises(ConfigError, match="--ranks 7: not in this run"):
        tl.plan_timeline(summary, ranks=[7])
    with pytest.raises(ConfigError, match="--window 5: not in this run"):
        tl.plan_timeline(summary, windows=[5])
    with pytest.raises(ConfigError, match="keeps no event"):
        tl.plan_timeline(summary, steps=(5, 6))  # wait/warmup steps: never recorded


def test_budget_keeps_whole_steps_then_ranks_then_long_events(merged, summary):
    full, evs_full = _plan(summary, max_events=0)
    steps = sorted({int(s) for s in merged.steps["step"]})
    per_step = len(evs_full) // len(steps)
    # 1) whole steps, all ranks
    plan, evs = _plan(summary, max_events=int(2.5 * per_step))
    assert plan.cut.stage == "steps" and len(evs) <= plan.cut.budget
    assert plan.cut.steps_kept == steps[:2] and plan.cut.ranks_kept == [0, 1, 2, 3]
    assert {e["args"]["step"] for e in evs if e["ph"] == "X"} == set(steps[:2])
    rest, everything = plan.cut.flags(plan.selection)
    covered = set(steps[:2])
    for part in plan.cut.rest:
        a, b = part["steps"]
        covered |= {s for s in steps if a <= s <= b}
    assert covered == set(steps) and rest and everything.endswith(f"--max-events {plan.cut.needed}")
    assert plan.cut.needed >= len(evs_full)
    # 2) one step, the first ranks
    plan, evs = _plan(summary, max_events=int(0.6 * per_step))
    assert plan.cut.stage == "ranks" and len(evs) <= plan.cut.budget
    kept = plan.cut.ranks_kept
    assert plan.cut.steps_kept == steps[:1] and 1 <= len(kept) < 4 and kept == list(range(len(kept)))
    assert {e["pid"] - 1 for e in evs if e["ph"] == "X"} == set(kept)
    assert {e["args"]["step"] for e in evs if e["ph"] == "X"} == {steps[0]}
    assert plan.cut.rest[0]["steps"] == (steps[0], steps[0])
    assert sum((r["ranks"] for r in plan.cut.rest if r["ranks"]), kept) == [0, 1, 2, 3]
    # 3) one rank's step, the shortest events dropped; collectives and their flows stay
    budget = 60
    plan, evs = _plan(summary, max_events=budget)
    cut = plan.cut
    assert cut.stage == "short_events" and len(evs) <= budget and cut.short_dropped > 0
    kept = [e for e in evs if e["ph"] == "X" and e["cat"] != "step"]
    rank0_step = (merged.events["rank"] == 0) & (merged.events["step"] == steps[0])
    durs = np.sort(merged.events["dur_ns"][rank0_step])
    assert cut.short_dropped == rank0_step.sum() - len(kept)
    assert min(round(e["dur"] * 1e3) for e in kept
               if "arrival" not in e["args"] and e["args"].get("comm_role") != "enqueue") >= cut.min_dur_ns
    assert cut.min_dur_ns >= durs[cut.short_dropped - 1]  # nothing dropped is longer than what stayed
    assert sum("arrival" in e["args"] for e in kept) == 2  # both buckets of the step
    # the enqueues of both buckets stay too, each with its arrow to its exec
    assert sum(e["name"] == "c10d::allreduce_" for e in kept) == 2
    assert len([e for e in evs if e["ph"] == "s" and e["cat"] == "enqueue"]) == 2
    assert "shortest" in cut.describe() and tl.timeline_metadata(summary, plan)["cut"]["stage"] == "short_events"


def test_cli_cut_is_stated_and_its_flags_give_the_rest(synth, merged, tmp_path, capsys):
    out = tmp_path / "t.json"
    steps = sorted({int(s) for s in merged.steps["step"]})
    rc, stdout, err = cli([synth.run_dir, "-o", out, "--max-events", 700, "--no-progress"], capsys)
    assert rc == 0 and "timeline written to" in stdout
    assert "timeline cut:" in err and "part 2: distprof timeline" in err and "everything in one file" in err
    doc = json.loads(out.read_text())
    validate(doc)
    m = meta(doc)
    assert m["cut"]["stage"] == "steps" and len(doc["traceEvents"]) <= 700
    seen = {e["args"]["step"] for e in doc["traceEvents"] if e.get("cat") == "step"}
    # run every printed "part N" command: together they show every step exactly once
    lines = [ln.split(": ", 1)[1] for ln in err.splitlines() if ln.strip().startswith("part ")]
    assert len(lines) == len(m["cut"]["rest_flags"])
    for line in lines:
        argv = shlex.split(line)
        assert argv[:2] == ["distprof", "timeline"]
        rc, _, err2 = cli(argv[2:] + ["--no-progress"], capsys)
        assert rc == 0
        part = json.loads(Path(argv[argv.index("-o") + 1]).read_text())
        validate(part)
        got = {e["args"]["step"] for e in part["traceEvents"] if e.get("cat") == "step"}
        assert not got & seen
        seen |= got
    assert seen == set(steps)
    # and the "everything" command fits it all, uncut
    line = next(ln for ln in err.splitlines() if "everything in one file" in ln).split(": ", 1)[1].split("  (")[0]
    rc, _, err3 = cli(shlex.split(line)[2:] + ["--no-progress"], capsys)
    assert rc == 0 and "cut" not in err3
    assert meta(json.loads(out.read_text()))["cut"] is None


def test_cli_selection_flags(synth, tmp_path, capsys):
    out = tmp_path / "sel.json.gz"
    rc, _, err = cli([synth.run_dir, "-o", out, "--ranks", "0,2", "--window", "0", "--steps", "3:3"], capsys)
    assert rc == 0 and err == ""
    doc = tl.read_timeline(out)
    validate(doc)
    x = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] - 1 for e in x} == {0, 2} and {e["args"]["step"] for e in x} == {3}
    assert meta(doc)["selection"] == {"ranks": [0, 2], "windows": [0], "steps": [3, 3], "max_events": 1_000_000,
                                      "launch_flows": False}


@pytest.mark.parametrize("argv, msg", [
    (["--ranks", "x"], "--ranks 'x'"),
    (["--ranks", "9"], "--ranks 9: not in this run"),
    (["--window", "a"], "--window 'a'"),
    (["--window", "4"], "--window 4: not in this run"),
    (["--steps", "9:3"], "--steps '9:3'"),
    (["--max-events", "-1"], "--max-events -1"),
])
def test_cli_bad_flags_one_line(synth, tmp_path, capsys, argv, msg):
    out = tmp_path / "bad.json"
    rc, stdout, err = cli([synth.run_dir, "-o", out, *argv], capsys)
    assert rc == 2 and stdout == ""
    assert err.startswith("distprof: error: ") and msg in err and err.count("\n") == 1
    assert not out.exists() and not list(tmp_path.glob("*.tmp"))


def test_cli_no_shards_and_bad_output(tmp_path, synth, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = cli([empty, "-o", tmp_path / "x.json"], capsys)
    assert rc == 2 and "no shard files" in err and err.count("\n") == 1
    rc, _, err = cli([tmp_path / "missing", "-o", tmp_path / "x.json"], capsys)
    assert rc == 2 and "no such run directory" in err
    rc, _, err = cli([synth.run_dir, "-o", tmp_path / "nodir" / "x.json"], capsys)
    assert rc == 2 and "does not exist" in err and err.count("\n") == 1


def test_write_is_atomic(summary, tmp_path, monkeypatch):
    path = tmp_path / "t.json.gz"
    plan = tl.plan_timeline(summary)
    tl.write_timeline(summary, plan, path, progress=False)
    before = path.read_bytes()

    monkeypatch.setattr(tl, "iter_trace_events", _failing(tl.iter_trace_events))
    with pytest.raises(RuntimeError, match="disk on fire"):
        tl.write_timeline(summary, plan, path, progress=False)
    assert path.read_bytes() == before and not list(tmp_path.glob("*.tmp"))


def _failing(real):
    def gen(run, plan):
        for i, e in enumerate(real(run, plan)):
            if i == plan.counts["slices"] // 2:  # mid-way through the slices
                raise RuntimeError("disk on fire")
            yield e
    return gen


# ---- the 4-rank demo run ---------------------------------------------------------------------------------------------


@pytest.mark.skipif(not (DEMO / "report.json").exists(), reason="demo run not present (scripts/demo)")
def test_demo_run_agrees_with_its_report(tmp_path, capsys):
    report = json.loads((DEMO / "report.json").read_text())
    out = tmp_path / "demo.json.gz"
    rc, stdout, err = cli([DEMO, "-o", out, "--no-progress"], capsys)
    assert rc == 0 and err == ""
    doc = tl.read_timeline(out)
    by = validate(doc)
    steps = {(e["pid"] - 1, e["args"]["step"]): e for e in by["X"] if e["cat"] == "step"}
    assert len(steps) == len(report["steps"])
    for row in report["steps"]:
        e = steps[(row["rank"], row["step"])]
        assert abs(abs_ns(doc, e["ts"]) - row["start_ns"]) <= 1000  # within 1 µs
        assert abs(abs_ns(doc, e["ts"] + e["dur"]) - row["end_ns"]) <= 1000
    lat = mean_lateness_ms(arrivals(doc))
    assert max(lat, key=lat.get) == max(report["stragglers"], key=lambda row: row["lateness_ms"])["rank"]
    named = report["straggler_info"]["named"]
    assert named == [max(lat, key=lat.get)]
