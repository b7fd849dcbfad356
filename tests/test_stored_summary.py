"""Per-rank summaries stored where the data is born (capture's writer thread, ``distprof import``) and read by the
report instead of the events: exact, used only where they hold, and never trusted.

The report from the stored summaries must be the report from the events, byte for byte; a forged or damaged
/summary group costs a warning naming the file and the events are summarised instead; a capture stores one only
where the report can use it (one window per rank)."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import job_env, require_slow
from distprof.analysis.load.catalog import scan_run
from distprof.analysis.load.rankdata import read_rank
from distprof.analysis.rank import stored as stored_mod
from distprof.analysis.rank.summary import summarize_rank
from distprof.analysis.report.build import build_report
from distprof.analysis.summarize import engine
from distprof.analysis.summarize.engine import summarize
from distprof.storage import find_shards, read_shard
from distprof.storage.summary_group import SUMMARY_GROUP, SummaryUnreadable

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
TWO_RANKS = [DATA / "hta" / "trace_filter" / f"sampled_rank-{r}.json.gz" for r in (0, 1)]


def _same(a, b, where="summary") -> list[str]:
    """Where two summaries differ: dtypes, types (numpy scalars, tuples) and NaNs included."""
    if type(a) is not type(b):
        return [f"{where}: {type(a).__name__} vs {type(b).__name__}"]
    if isinstance(a, np.ndarray):
        same = a.dtype == b.dtype and a.shape == b.shape and (
            list(a) == list(b) if a.dtype.kind == "O" else np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
        return [] if same else [f"{where}: arrays differ"]
    if dataclasses.is_dataclass(a):
        return [d for f in dataclasses.fields(a) for d in _same(getattr(a, f.name), getattr(b, f.name),
                                                                 f"{where}.{f.name}")]
    if isinstance(a, dict):
        if list(a) != list(b):
            return [f"{where}: keys differ"]
        return [d for k in a for d in _same(a[k], b[k], f"{where}[{k!r}]")]
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return [f"{where}: lengths differ"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _same(x, y, f"{where}[{i}]")]
    if isinstance(a, (float, np.floating)) and math.isnan(a):
        return [] if math.isnan(b) else [f"{where}: nan vs {b!r}"]
    return [] if a == b else [f"{where}: {a!r} vs {b!r}"]


def _report(run_dir: Path, **kw) -> str:
    return json.dumps(build_report(summarize(run_dir, progress=False, **kw)).to_json(), sort_keys=True)


@pytest.fixture
def count_event_maps(monkeypatch):
    """How many ranks the report summarised from their events."""
    calls = []
    real = engine.summarize_rank

    def counting(rd, **kw):
        calls.append(rd.rank)
        return real(rd, **kw)

    monkeypatch.setattr(engine, "summarize_rank", counting)
    return calls


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> Path:
    from distprof.importers.run import import_traces

    out = tmp_path_factory.mktemp("imported") / "run"
    import_traces(TWO_RANKS, out, progress=False)
    return out


def test_encoding_is_exact_on_a_real_capture():
    """Every rank of the committed 4-rank DDP capture: encode -> decode gives back the same summary (types,
    dtypes, NaNs, tuples)."""
    cat = scan_run(DATA / "golden" / "ddp4_capture")
    for rank in cat.ranks_read:
        s = summarize_rank(read_rank(cat, rank))
        st = stored_mod.encode(s)
        assert st.arrays and all(a.ndim == 1 and a.dtype.kind in "biuf" for a in st.arrays.values())
        assert _same(s, stored_mod.decode(st)) == []


def test_a_summary_added_to_the_open_file_reads_back_and_takes_less_room(imported, tmp_path):
    """The writer adds the summary to the shard it is still building: the same summary reads back, in fewer bytes
    than adding it to a file reopened from the shard's bytes (HDF5's free space stays in use)."""
    from distprof.storage import schema
    from distprof.storage.validate import check_image
    from distprof.storage.writer import add_summary, building

    shard = read_shard(sorted(find_shards(imported))[0])
    summary = shard.stored_summary()
    tables = {t: shard.table(t) for t in schema.TABLES if shard.has(t)}
    attrs = {k: v for k, v in shard.attrs.items() if k not in ("format", "schema_version", "codec")}
    with building(tables, list(shard.names), attrs) as b:
        plain = b.image()
        in_place = b.with_summary(summary)
    reopened = add_summary(plain, summary)
    for image in (in_place, reopened):
        got = check_image(image, tmp_path / shard.path.name).stored_summary()
        assert got.meta == summary.meta and list(got.arrays) == list(summary.arrays)
        assert all(np.array_equal(got.arrays[k], v, equal_nan=v.dtype.kind == "f") for k, v in summary.arrays.items())
    assert check_image(plain, tmp_path / shard.path.name).stored_summary() is None
    assert len(plain) < len(in_place) < len(reopened)


def test_op_totals_rows_are_compact():
    """The per-(op, step) rows are most of what the report holds per rank (36 of 61 KB per synthetic rank; at 16k
    ranks 28-byte rows were 590 MB): 18 bytes a row (float32 ms, sums taken in float64 by their readers)."""
    cat = scan_run(DATA / "golden" / "ddp4_capture")
    rd = read_rank(cat, cat.ranks_read[0])
    ot = summarize_rank(rd).op_totals
    assert ot["name"].size > 10
    assert sum(ot[c].itemsize for c in ("name", "step", "dur_ms", "self_ms", "calls")) == 18
    assert ot["dur_ms"].dtype == np.float32 and ot["name"].dtype == np.uint16
    assert (ot["self_ms"] <= ot["dur_ms"] + 1e-4).all() and (ot["calls"] > 0).all()


def test_import_stores_summaries_and_the_report_uses_them(imported, count_event_maps):
    for p in find_shards(imported):
        st = read_shard(p).stored_summary()
        assert st is not None and st.version == stored_mod.SUMMARY_VERSION and st.cpu_s > 0
    stored = _report(imported)
    assert count_event_maps == [], "the report summarised events although every shard stores its summary"
    events = _report(imported, stored=False)
    assert sorted(count_event_maps) == [0, 1]
    assert stored == events


def test_steps_and_several_windows_take_the_events(imported, count_event_maps):
    """--steps, other rules and a rank of two shards (the committed capture: repeat=2) are summarised from the
    events: a stored summary holds one shard's whole window under the default rules."""
    from distprof.analysis.types import FindingRules

    summarize(imported, steps=(0, 10**6), progress=False)
    assert sorted(count_event_maps) == [0, 1]
    count_event_maps.clear()
    summarize(imported, rules=dataclasses.replace(FindingRules(), high_pct=30.0), progress=False)
    assert sorted(count_event_maps) == [0, 1]
    count_event_maps.clear()
    summarize(DATA / "golden" / "ddp4_capture", progress=False)
    assert sorted(count_event_maps) == [0, 1, 2, 3]


def _meta_key(meta: dict, table: str, column: str) -> str:
    """The dataset name that holds `table`'s `column` in a summary document."""
    for k, v in meta["f"][table]["$d"]:
        if k == column:
            return v["$a"]
    raise KeyError(column)


def _set_array(g: h5py.Group, key: str, values) -> None:
    """Rewrite one array of a stored summary in place: its bytes in /summary/blob, at its index entry."""
    entry = next(e for e in json.loads(g.attrs["index"]) if e[0] == key)
    blob = g["blob"][()]
    a = np.asarray(values, dtype=entry[1])
    assert a.size == entry[3]
    blob[entry[2]:entry[2] + a.nbytes] = a.view(np.uint8)
    del g["blob"]
    g.create_dataset("blob", data=blob)


def _forge(path: Path, how: str) -> None:
    with h5py.File(path, "r+") as f:
        g = f[SUMMARY_GROUP]
        meta = json.loads(g.attrs["meta"])
        index = json.loads(g.attrs["index"])
        if how == "not json":
            g.attrs["meta"] = "{not json"
        elif how == "wrong class":
            g.attrs["meta"] = json.dumps({"$c": "Popen", "f": {"args": ["sh"]}})
        elif how == "event row out of range":
            table = "collectives" if meta["f"]["collectives"]["$d"] else "steps"
            key = _meta_key(meta, table, "ev_row" if table == "collectives" else "step")
            count = next(e[3] for e in index if e[0] == key)
            _set_array(g, key, np.full(count, 2**40))
        elif how == "index outside the blob":
            entry = next(e for e in index if e[3] > 0)
            entry[2] = int(g["blob"].shape[0]) - 1  # its first byte the blob's last
            g.attrs["index"] = json.dumps(index)
        elif how == "index dtype":
            index[0][1] = "|O8"
            g.attrs["index"] = json.dumps(index)
        elif how == "string blob":
            del g["blob"]
            g.create_dataset("blob", data=np.array([b"x"] * 3))
        elif how == "soft link":
            del g["blob"]
            g["blob"] = h5py.SoftLink("/events/ts_ns")
        elif how == "external link":
            del f[SUMMARY_GROUP]
            f[SUMMARY_GROUP] = h5py.ExternalLink("/etc/passwd", "/summary")
        elif how == "version":
            g.attrs["version"] = "1"
        elif how == "field type":
            meta["f"]["n_events"] = "many"
            g.attrs["meta"] = json.dumps(meta)
        elif how == "deep":
            g.attrs["meta"] = "[" * 100_000 + "]" * 100_000
        else:
            raise AssertionError(how)


FORGERIES = ("not json", "wrong class", "event row out of range", "index outside the blob", "index dtype",
             "string blob", "soft link", "external link", "version", "field type", "deep")


@pytest.mark.parametrize("how", FORGERIES)
def test_a_forged_summary_costs_a_warning_and_the_events_decide(imported, tmp_path, caplog, how):
    run = tmp_path / "run"
    shutil.copytree(imported, run)
    victim = sorted(find_shards(run))[1]
    _forge(victim, how)
    want = _report(imported, stored=False)
    with caplog.at_level(logging.WARNING):
        got = _report(run)
    assert got == want
    said = [r.getMessage() for r in caplog.records if "summaris" in r.getMessage()]
    assert len(said) == 1 and victim.name in said[0], said


def test_a_shard_without_a_summary_still_reports(imported, tmp_path, count_event_maps):
    run = tmp_path / "run"
    shutil.copytree(imported, run)
    for p in find_shards(run):
        with h5py.File(p, "r+") as f:
            del f[SUMMARY_GROUP]
    assert _report(run) == _report(imported)
    assert sorted(count_event_maps) == [0, 1]


def test_the_summary_reader_bounds_what_it_takes(imported, tmp_path):
    """A blob that claims far more bytes than the file stores is refused before it is read; so is one over the
    summary's size limit, whatever the file stores."""
    p = tmp_path / "s.h5"
    for n, said in ((2**30, "decompression bomb"), (2**32, "more than 2 GiB")):
        shutil.copy(sorted(find_shards(imported))[0], p)
        with h5py.File(p, "r+") as f:
            del f[SUMMARY_GROUP]["blob"]
            ds = f[SUMMARY_GROUP].create_dataset("blob", shape=(n,), dtype="u1", chunks=(2**20,), compression="gzip")
            ds[:2**20] = 0
        with pytest.raises(SummaryUnreadable, match=said):
            read_shard(p).stored_summary()


def test_a_stored_summary_of_another_version_is_not_used(imported, tmp_path, count_event_maps):
    run = tmp_path / "run"
    shutil.copytree(imported, run)
    for p in find_shards(run):
        with h5py.File(p, "r+") as f:
            f[SUMMARY_GROUP].attrs["producer"] = "0.0.1"
    assert _report(run) == _report(imported)
    assert sorted(count_event_maps) == [0, 1]


def test_summaries_flag_and_environment():
    from distprof.capture.profiler import RankProfiler
    from distprof.config import ProfileConfig, config_from_mapping
    from distprof.launch import config_from_args, get_args_parser

    assert ProfileConfig().summaries
    assert not config_from_mapping({}, environ={"DISTPROF_SUMMARIES": "0"}).summaries
    cfg = config_from_args(get_args_parser().parse_args(["--no-summaries", "train.py"]))
    assert not cfg.summaries
    prof = RankProfiler(cfg, summarizer=lambda image, path: None)
    assert prof._summarizer is None  # what it hands its shard writer
    prof = RankProfiler(ProfileConfig(), summarizer=lambda image, path: None)
    assert prof._summarizer is not None


@pytest.mark.slow
def test_a_capture_stores_one_summary_per_rank_and_the_report_is_the_same(tmp_path):
    """A real 2-rank torchrun DDP job: the default schedule (one window) stores a summary in each rank's shard
    and `distprof report` gives the same JSON with and without them; with --repeat 2 none is stored (the report
    could not use it)."""
    require_slow("a torchrun job")
    env = job_env()
    runs = {}
    for name, extra in (("one", []), ("two", ["--repeat", "2"])):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
               "distprof.launch", "--out", str(tmp_path), "--run-id", name, "--wait", "1", "--warmup", "1",
               "--active", "3", *extra, str(ROOT / "examples" / "ddp_mlp.py"), "--hidden", "64", "--steps", "12"]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = tmp_path / name
    one = [read_shard(p) for p in find_shards(runs["one"])]
    assert sorted(s.rank for s in one) == [0, 1]
    assert all(s.stored_summary() is not None for s in one)
    two = [read_shard(p) for p in find_shards(runs["two"])]
    assert len(two) == 4 and all(s.stored_summary() is None for s in two)
    outs = []
    for flag in ([], ["--from-events"]):
        proc = subprocess.run([sys.executable, "-m", "distprof", "report", str(runs["one"]), "--json", "-",
                               "--no-progress", *flag], env=env, capture_output=True, text=True, timeout=120,
                              check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(json.loads(proc.stdout))
    assert outs[0] == outs[1]
    status = json.loads((runs["one"] / "rank00000.status.json").read_text())
    assert status["windows"][0]["summary_s"] > 0


def _plant_external_column(path: Path) -> None:
    """/events becomes an external link (a layout the scan refuses: never followed)."""
    with h5py.File(path, "r+") as f:
        del f["events"]
        f["events"] = h5py.ExternalLink("/etc/passwd", "/x")


def test_a_shard_read_by_its_summary_has_its_layout_checked_when_its_events_are_read(imported, tmp_path):
    """The scan leaves the layout of a shard that stores its summary to the first read of its tables: the report
    from summaries never opens the planted link; the report from events, and a summary that cannot be used, skip
    the shard naming the fault, as a scan would."""
    run = tmp_path / "run"
    shutil.copytree(imported, run)
    victim = sorted(find_shards(run))[1]
    _plant_external_column(victim)
    by_summary = summarize(run, progress=False)
    assert sorted(by_summary.ranks) == [0, 1] and not by_summary.skipped_shards
    for kw in ({"stored": False}, {"steps": (0, 10**6)}):
        run_ = summarize(run, progress=False, **kw)
        assert sorted(run_.ranks) == [0] and [s.path.name for s in run_.skipped_shards] == [victim.name]
        assert "link" in run_.skipped_shards[0].reason
    with h5py.File(victim, "r+") as f:
        f[SUMMARY_GROUP].attrs["producer"] = "0.0.1"  # not this distprof's: the events are read
    run_ = summarize(run, progress=False)
    assert sorted(run_.ranks) == [0] and [s.path.name for s in run_.skipped_shards] == [victim.name]


def test_a_shard_whose_map_has_something_to_say_stores_no_summary(tmp_path, caplog):
    """What the per-rank map logs is the report's to print: such a shard stores no summary (the import prints none
    of it), and the report, summarising its events, says it as before."""
    from distprof.importers.run import import_traces

    trace = tmp_path / "rank-0.json"
    trace.write_text(json.dumps({"traceEvents": []}))
    with caplog.at_level(logging.INFO):
        import_traces([trace], tmp_path / "run", progress=False)
    assert not [r for r in caplog.records if r.name.startswith("distprof.analysis")]
    assert all(read_shard(p).stored_summary() is None for p in find_shards(tmp_path / "run"))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        summarize(tmp_path / "run", progress=False)
    assert any("no main thread" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("value, hint, fits", [
    (3, int, True), (np.int32(3), int, True), (True, int, False), (np.bool_(True), int, False), (3.0, int, False),
    (3, float, True), (np.float32(1.5), float, True), (False, float, False), ("3", float, False),
    (np.bool_(False), bool, True), (0, bool, False), (None, type(None), True), (0, type(None), False),
    (None, int | None, True), (2, int | None, True), ("x", int | None, False),
    (["a", "b"], list[str], True), (["a", 1], list[str], False), ((1, 2), list[int], False),
    ([1, np.int64(2)], list[int], True), ([1, 2.5], list[int], False),
    ((1, "a"), tuple[int, str], True), ((1, 2), tuple[int, str], False), ((1,), tuple[int, str], False),
    ((1, 2, 3), tuple[int, ...], True), ((1, "a"), tuple[int, ...], False), ([1], tuple[int, ...], False),
    ({1: 2.0}, dict[int, float], True), ({"a": 2.0}, dict[int, float], False), ({1: "x"}, dict[int, float], False),
    ({}, dict[int, list[int]], True), ({1: [1, "x"]}, dict[int, list[int]], False),
    (np.zeros(2), np.ndarray, True), ([0.0], np.ndarray, False), ("anything", typing.Any, True),
])
def test_a_stored_value_is_checked_against_its_field_type(value, hint, fits):
    from distprof.analysis.rank.stored import _fits

    assert _fits(value, hint) is fits
    assert _fits(value, hint) is fits  # the second time from the checker made the first time
