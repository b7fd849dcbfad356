"""load_run: merging, checks that shards belong together, missing ranks, step filtering."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from distprof.analysis import HostClock, MergedRun, load_run
from distprof.errors import IncompleteRunError, ShardFormatError
from distprof.storage.reader import read_shard
from synth import make_run


def _name(m: MergedRun, col: np.ndarray) -> np.ndarray:
    return m.names[col]


def test_merge_basic(tmp_path):
    run = make_run(tmp_path, world_size=4, schedule={"repeat": 2})
    m = load_run(run.run_dir)
    assert isinstance(m, MergedRun) and all(isinstance(c, HostClock) for c in m.clock.values())
    assert m.run_id == "synth-run" and m.world_size == 4
    assert m.ranks_present == [0, 1, 2, 3] and m.ranks_missing == [] and not m.warnings
    assert m.hosts == {r: "sim-host0" for r in range(4)}
    assert m.process_groups[0]["ranks"] == [0, 1, 2, 3]
    ev = m.events
    n_total = sum(len(read_shard(p).table("events", ["ts_ns"])["ts_ns"]) for p in run.paths)
    assert len(ev["ts_ns"]) == n_total
    for t in ("events", "comms", "steps", "memory", "threads"):
        tab = getattr(m, t)
        assert tab["rank"].dtype == np.int32 and tab["window"].dtype == np.int32
        assert len({len(v) for v in tab.values()}) == 1
    assert set(ev["window"].tolist()) == {0, 1}
    # sorted by (rank, ts_ns)
    key = ev["rank"].astype(np.int64)
    assert (np.diff(key) >= 0).all()
    same = key[1:] == key[:-1]
    assert (np.diff(ev["ts_ns"])[same] >= 0).all()
    # comms.row points at the right events, in the global string table
    names = _name(m, ev["name_id"][m.comms["row"]])
    role = m.comms["role"]
    assert set(names[role == 1]) == {"gloo:all_reduce"}
    assert set(names[role == 2]) == {"c10d::allreduce_"}
    assert set(_name(m, m.comms["op_id"])) == {"all_reduce"}
    assert (ev["rank"][m.comms["row"]] == m.comms["rank"]).all()
    # a merged event equals its shard's event (rank 2, window 1, first ProfilerStep)
    sh = read_shard(run.paths[2 * 2 + 1])
    t = sh.table("events")
    local = sh.names[t["name_id"]]
    i = int(np.flatnonzero(local == "ProfilerStep#7")[0])
    j = int(np.flatnonzero((m.events["rank"] == 2) & (_name(m, ev["name_id"]) == "ProfilerStep#7"))[0])
    assert ev["ts_ns"][j] == t["ts_ns"][i] and ev["dur_ns"][j] == t["dur_ns"][i] and ev["window"][j] == 1
    assert m.name_id("gloo:all_reduce") is not None
    assert set(_name(m, m.threads["name_id"])) == {"python3", "pt_gloo_runloop", "gloo_tcp_loop"}
    assert m.attrs[3]["rank"] == 3


def test_string_tables_merged_whatever_their_order(tmp_path):
    """Each shard has its own string table; ids are remapped to one global table."""

    def shuffle(rank, window, tables, strings, attrs):
        if rank == 1:  # reverse the string table and renumber every id column
            n = len(strings)
            strings.reverse()
            for t, col in (("events", "name_id"), ("threads", "name_id"), ("comms", "op_id")):
                tables[t][col] = (n - 1 - tables[t][col].astype(np.int64)).astype(np.uint32)
            strings.append("only-on-rank-1")

    run = make_run(tmp_path, world_size=2, mutate=shuffle)
    m = load_run(run.run_dir)
    assert len(set(m.names.tolist())) == len(m.names)
    assert "only-on-rank-1" in m.names.tolist()
    for r in (0, 1):
        sel = m.events["rank"] == r
        assert (_name(m, m.events["name_id"][sel]) == "gloo:all_reduce").sum() == len(run.collectives["window"])


def test_missing_rank_named(tmp_path):
    run = make_run(tmp_path, world_size=4, missing_ranks=[3])
    m = load_run(run.run_dir)
    assert m.ranks_present == [0, 1, 2] and m.ranks_missing == [3]
    assert any("rank(s) 3 of 0..3 have no shard" in w for w in m.warnings)
    # collectives are not reported incomplete for a rank that has no data at all
    assert not any("missing on some ranks" in w for w in m.warnings)


def test_missing_rank_status_error_quoted(tmp_path):
    run = make_run(tmp_path, world_size=3, missing_ranks=[1, 2])
    (run.run_dir / "rank00002.status.json").write_text(
        '{"rank": 2, "windows": [], "errors": [{"stage": "write", "message": "disk full"}]}')
    m = load_run(run.run_dir)
    w = next(w for w in m.warnings if "have no shard" in w)
    assert "1-2 of 0..2" in w and "rank 2: write: disk full" in w


def test_missing_single_shard(tmp_path):
    run = make_run(tmp_path, world_size=3, schedule={"repeat": 2}, missing_shards=[(1, 1)])
    m = load_run(run.run_dir)
    assert m.ranks_missing == []
    assert any(w.startswith("window 1: rank(s) 1 have no shard") for w in m.warnings)


def test_run_id_mismatch_skipped_and_named_or_refused_when_strict(tmp_path):
    run = make_run(tmp_path, world_size=4, attrs_override={2: {"run_id": "other-run"}})
    m = load_run(run.run_dir)
    assert m.ranks_present == [0, 1, 3] and m.ranks_missing == [2] and m.run_id == "synth-run"
    assert [sk.path.name for sk in m.skipped_shards] == ["rank00002.w0000.h5"]
    assert "run_id 'other-run' differs from 'synth-run'" in m.skipped_shards[0].reason
    line = next(w for w in m.warnings if "different runs" in w)
    assert "kept run_id 'synth-run' (3 shard(s))" in line and "1 shard(s) of run_id 'other-run'" in line
    with pytest.raises(ShardFormatError) as e:
        load_run(run.run_dir, strict=True)
    msg = str(e.value)
    assert "rank00002.w0000.h5" in msg and "run_id 'other-run'" in msg and "'synth-run'" in msg
    assert "mixes two runs" in msg and "--strict" in msg and "\n" not in msg


def test_world_size_and_schedule_mismatch_skipped_or_refused_when_strict(tmp_path):
    run = make_run(tmp_path / "a", world_size=3, attrs_override={0: {"world_size": 8}})
    m = load_run(run.run_dir)
    assert m.world_size == 3 and m.ranks_present == [1, 2]
    assert "world_size 8 differs from 3" in m.skipped_shards[0].reason
    with pytest.raises(ShardFormatError, match=r"rank00000\.w0000\.h5: world_size 8 differs from 3"):
        load_run(run.run_dir, strict=True)

    def other_schedule(rank, window, tables, strings, attrs):
        if rank == 1:
            attrs["config"] = {**attrs["config"], "schedule": {**attrs["config"]["schedule"], "active": 5}}

    run = make_run(tmp_path / "b", world_size=3, mutate=other_schedule)
    assert load_run(run.run_dir).ranks_present == [0, 2]
    with pytest.raises(ShardFormatError, match=r"rank00001\.w0000\.h5: config\.schedule .* different profiling"):
        load_run(run.run_dir, strict=True)


def test_shards_of_two_jobs_with_one_run_id_are_not_merged(tmp_path):
    """A reused run id (two Slurm job steps): shards carry a `job` identity; the majority job is kept, the other
    named. Shards without `job` (older captures, imports) keep loading as before."""
    def job(rank, window):
        return {"job": {"id": "A" if window < 2 else "B", "launch_ns": 1}}

    run = make_run(tmp_path, world_size=2, schedule={"repeat": 3}, attrs_override=job)
    m = load_run(run.run_dir)
    assert sorted({int(w) for w in m.steps["window"]}) == [0, 1]
    assert sorted(sk.path.name for sk in m.skipped_shards) == ["rank00000.w0002.h5", "rank00001.w0002.h5"]
    assert all("job 'B' differs from 'A'" in sk.reason for sk in m.skipped_shards)
    with pytest.raises(ShardFormatError, match="job 'B' differs from 'A'.*reused"):
        load_run(run.run_dir, strict=True)


def test_newer_major_schema_skipped_or_refused(tmp_path):
    run = make_run(tmp_path / "one", world_size=2, attrs_override={1: {"schema_version": "3.0"}})
    m = load_run(run.run_dir)
    assert m.ranks_present == [0]
    assert "schema_version 3.0 is newer" in m.skipped_shards[0].reason and "upgrade distprof" in m.skipped_shards[0].reason
    with pytest.raises(ShardFormatError, match=r"rank00001\.w0000\.h5: schema_version 3\.0 is newer.*upgrade distprof"):
        load_run(run.run_dir, strict=True)
    run = make_run(tmp_path / "all", world_size=2, attrs_override=lambda r, w: {"schema_version": "3.0"})
    with pytest.raises(ShardFormatError, match=r"no usable shard: 2 bad.*schema_version 3\.0 is newer.*upgrade distprof"):
        load_run(run.run_dir)


def test_newer_minor_schema_accepted(tmp_path):
    run = make_run(tmp_path, world_size=2, attrs_override={1: {"schema_version": "2.7", "new_attr": 1}})
    assert load_run(run.run_dir).ranks_present == [0, 1]


def test_nothing_to_load(tmp_path):
    with pytest.raises(IncompleteRunError, match="no such run directory"):
        load_run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "rank00000.w0000.h5.tmp").write_bytes(b"partial")
    with pytest.raises(IncompleteRunError, match="no shard files"):
        load_run(tmp_path / "empty")


def test_step_filter(tmp_path):
    run = make_run(tmp_path, world_size=2, schedule={"wait": 1, "warmup": 1, "active": 3, "repeat": 2})
    # windows: steps 2..4 and 7..9
    assert run.windows == [(2, 4), (7, 9)]
    full = load_run(run.run_dir)
    m = load_run(run.run_dir, steps=(3, 7))
    assert sorted(set(m.steps["step"].tolist())) == [3, 4, 7]
    assert set(m.events["step"].tolist()) <= {3, 4, 7}
    assert set(m.memory["step"].tolist()) <= {3, 4, 7}
    n_full = int(np.isin(full.events["step"], [3, 4, 7]).sum())
    assert len(m.events["ts_ns"]) == n_full
    # comms rows still point at their events after filtering and sorting
    names = m.names[m.events["name_id"][m.comms["row"]]]
    assert set(names[m.comms["role"] == 1]) == {"gloo:all_reduce"}
    assert (m.events["rank"][m.comms["row"]] == m.comms["rank"]).all()
    assert len(m.comms["row"]) == 3 * 2 * 2 * 2  # 3 steps × 2 buckets × (exec + enqueue) × 2 ranks
    # only window 0 is read for steps 2..3
    only0 = load_run(run.run_dir, steps=(2, 3))
    assert set(only0.events["window"].tolist()) == {0}
    with pytest.raises(IncompleteRunError, match=r"no window covers steps 5\.\.6 \(recorded: 2\.\.4, 7\.\.9\)"):
        load_run(run.run_dir, steps=(5, 6))
    with pytest.raises(ValueError):
        load_run(run.run_dir, steps=(4, 3))


def test_columns_subset(tmp_path):
    run = make_run(tmp_path, world_size=2)
    m = load_run(run.run_dir, columns={"events": ["name_id"], "memory": []})
    assert set(m.events) == {"name_id", "ts_ns", "dur_ns", "step", "rank", "window"}
    assert set(m.memory) == {"ts_ns", "step", "rank", "window"}
    assert "corr_id" in m.events or "tid" in m.threads  # untouched tables in full
    with pytest.raises(KeyError, match="unknown column"):
        load_run(run.run_dir, columns={"events": ["nope"]})


def test_progress_bar_forced(tmp_path, capsys):
    run = make_run(tmp_path, world_size=2)
    load_run(run.run_dir, progress=True)
    assert "shard" in capsys.readouterr().err
    load_run(run.run_dir)  # 2 shards, not a TTY: silent
    assert capsys.readouterr().err == ""


def test_multihost_clock_reported(tmp_path):
    run = make_run(tmp_path, world_size=4, hosts=[0, 0, 1, 1], clocks={1: (3.25, 40.0)})
    m = load_run(run.run_dir)
    assert set(m.clock) == {"sim-host0", "sim-host1"}
    assert m.hosts == {0: "sim-host0", 1: "sim-host0", 2: "sim-host1", 3: "sim-host1"}
    # aligned times of host 1 are on host 0's clock: within 10 µs of the truth
    sel = m.steps["rank"] == 3
    assert np.abs(m.steps["end_ns"][sel] - run.to_recorded(0, run.steps[3]["end"])).max() < 10_000
    # memory and events moved too
    msel = m.memory["rank"] == 3
    assert m.memory["ts_ns"][msel].min() > m.steps["start_ns"][sel].min()


def test_no_torch_import():
    code = ("import sys, distprof.analysis.summarize.merged, distprof.analysis.align.clock, "
            "distprof.analysis.align.matching; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
    code = "import sys, distprof.analysis; assert 'h5py' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
