"""--memory-history: the pure snapshot summary against a simulated CUDA caching allocator, the capture hooks with a
fake torch.cuda.memory, the shard round trip and the MergedRun table. No GPU needed."""

from __future__ import annotations

import logging
import pickle

import numpy as np
import pytest

from distprof.capture.memhistory import MemoryHistory, dump_snapshot, summarize_snapshot
from distprof.config import config_from_mapping
from distprof.errors import ConfigError
from distprof.storage import read_shard, schema
from distprof.storage.writer import write_shard

MiB = 1 << 20
T0_US = 1_790_000_000_000_000  # epoch µs


def _frames(user_line: int, op: str = "forward"):
    """Innermost first, as torch symbolises them: torch internals, then the user's script, then the launcher."""
    return [
        {"filename": "/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py", "line": 125, "name": op},
        {"filename": "/home/u/train.py", "line": user_line, "name": "train_step"},
        {"filename": "/usr/lib/python3.11/runpy.py", "line": 88, "name": "_run_code"},
    ]


class FakeAllocator:
    """Emits TraceEntries like PyTorch's CUDACachingAllocator and tracks the true levels forward."""

    def __init__(self, device=0, baseline=(40 * MiB, 24 * MiB)):
        self.device = device
        self.t_us = T0_US
        self.trace: list[dict] = []
        self.live: dict[int, int] = {}  # addr -> requested size
        self.next_addr = 0x7F0000000000 + device * 0x10000000000
        self.segments: list[int] = []  # total sizes of live segments
        self.reserved_free = 0  # reserved bytes not handed out
        self.truth_levels: list[tuple[int, int, int]] = []  # (time_ns, allocated, reserved) after each entry
        for size in baseline:  # tensors alive before the window (parameters): no trace entries
            self._grow(size, record=False)
            self.live[self._addr()] = size
            self.reserved_free -= size
        self.alloc = sum(self.live.values())

    @property
    def reserved(self):
        return sum(self.segments)

    def _addr(self):
        self.next_addr += 1 << 21
        return self.next_addr

    def tick(self, us=5):
        self.t_us += us

    def _entry(self, action, addr, size, frames=None, stream=0):
        self.tick()
        e = {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": self.t_us,
             "frames": frames or [], "compile_context": "N/A", "user_metadata": ""}
        self.trace.append(e)
        self.truth_levels.append((self.t_us * 1000, self.alloc, self.reserved))
        return e

    def _grow(self, size, record=True):
        seg = max(2 * MiB, -(-size // (2 * MiB)) * (2 * MiB))
        self.segments.append(seg)
        self.reserved_free += seg
        if record:
            self._entry("segment_alloc", self.next_addr, seg)

    def malloc(self, size, frames=None, stream=0):
        if self.reserved_free < size:
            self._grow(size)
        self.reserved_free -= size
        addr = self._addr()
        self.live[addr] = size
        self.alloc += size
        self._entry("alloc", addr, size, frames, stream)
        return addr

    def free(self, addr):
        size = self.live.pop(addr)
        self.alloc -= size
        self._entry("free_requested", addr, size)
        self.reserved_free += size
        self._entry("free_completed", addr, size)

    def empty_cache(self):
        while self.segments and self.reserved_free >= self.segments[-1]:
            seg = self.segments.pop()
            self.reserved_free -= seg
            self._entry("segment_free", self.next_addr, seg)

    def oom(self, size):
        e = self._entry("oom", 0, size)
        del e["addr"]
        e["device_free"] = 123

    def snapshot_segments(self):
        blocks = [{"address": a, "size": -(-s // 512) * 512, "requested_size": s, "state": "active_allocated",
                   "frames": []} for a, s in self.live.items()]
        segs = []
        for i, total in enumerate(self.segments):
            segs.append({"device": self.device, "address": 0x7E0000000000 + i * (1 << 30), "total_size": total,
                         "allocated_size": 0, "active_size": 0, "requested_size": 0, "stream": 0,
                         "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
                         "frames": [], "blocks": blocks if i == 0 else []})
        if segs:
            segs[-1]["blocks"] = segs[-1]["blocks"] + [{"address": 1, "size": 4096, "requested_size": 0,
                                                        "state": "inactive", "frames": []},
                                                       {"address": 2, "size": 512, "requested_size": 300,
                                                        "state": "active_pending_free", "frames": []}]
        return segs


def _run_steps(fa: FakeAllocator, n_steps=3, act_sizes=(3 * MiB, 5 * MiB, 1 * MiB)):
    """Forward allocates activations, backward frees them; returns step spans (recorded = true ns)."""
    spans = []
    fa.tick(100)
    for s in range(n_steps):
        start = fa.t_us * 1000 + 1
        fa.tick(10)
        acts = [fa.malloc(sz * (s + 1), _frames(10 + i)) for i, sz in enumerate(act_sizes)]
        grad = fa.malloc(2 * MiB, _frames(50, "backward"), stream=7)
        for a in reversed(acts):
            fa.free(a)
        fa.free(grad)
        tmp = fa.malloc(MiB // 2, _frames(60))  # survives into the next step
        if s == 1:
            fa.oom(80 << 30)
        fa.tick(10)
        end = fa.t_us * 1000
        spans.append((10 + s, start, end))
        fa.tick(20)  # gap between steps
        fa.free(tmp)
    return spans


def _truth(fa: FakeAllocator, spans, base):
    """Forward truth per step: (peak alloc, end alloc, peak reserved, end reserved)."""
    out = {}
    lv = fa.truth_levels
    for step, s, e in spans:
        before = [x for x in lv if x[0] < s]
        a0, r0 = (before[-1][1], before[-1][2]) if before else base
        inside = [x for x in lv if s <= x[0] < e]
        out[step] = (max([a0] + [x[1] for x in inside]), inside[-1][1] if inside else a0,
                     max([r0] + [x[2] for x in inside]), inside[-1][2] if inside else r0)
    return out


def _snapshot(*allocs):
    return {"segments": [s for fa in allocs for s in fa.snapshot_segments()],
            "device_traces": [fa.trace for fa in allocs],
            "allocator_settings": {"expandable_segments": False}, "external_annotations": []}


def test_levels_counts_and_blocks_match_a_forward_simulation():
    fa = FakeAllocator()
    base = (fa.alloc, fa.reserved)
    spans = _run_steps(fa)
    truth = _truth(fa, spans, base)
    fa.empty_cache()
    summ = summarize_snapshot(_snapshot(fa), spans)
    m = summ.tables["cuda_memory"]
    assert m["step"].tolist() == [10, 11, 12] and set(m["device"].tolist()) == {0}
    for i, step in enumerate(m["step"].tolist()):
        assert (int(m["alloc_peak_bytes"][i]), int(m["alloc_end_bytes"][i]), int(m["reserved_peak_bytes"][i]),
                int(m["reserved_end_bytes"][i])) == truth[step], step
    # step 12 (third) allocates 3x the activation sizes: 27 MiB + 2 MiB grad + 0.5 MiB tmp
    assert m["n_alloc"].tolist() == [5, 5, 5]
    assert m["alloc_bytes"][2] == 3 * 9 * MiB + 2 * MiB + MiB // 2
    assert m["n_free"].tolist() == [4, 4, 4]  # each step's tmp is freed in the gap after it, outside every step
    assert m["n_oom"].tolist() == [0, 1, 0]
    assert m["complete"].tolist() == [1, 1, 1]
    assert (m["n_segment_alloc"] >= 0).all() and m["n_segment_alloc"].sum() >= 1
    st = summ.stats["devices"]["0"]
    assert st["baseline_alloc_bytes"] == base[0] and st["baseline_reserved_bytes"] == base[1]
    assert st["outside_steps"] > 0 and st["n_oom"] == 1 and not st["truncated"]

    b = summ.tables["cuda_memory_blocks"]
    assert (b["step"] == 12).sum() == 5  # all five allocations of the step (fewer than TOP_BLOCKS)
    s12 = b["step"] == 12
    assert b["bytes"][s12].tolist() == sorted(b["bytes"][s12].tolist(), reverse=True)
    assert b["bytes"][s12][0] == 15 * MiB
    names = np.array(summ.strings, dtype=object)
    top = np.flatnonzero(s12)[0]
    assert names[b["frame_id"][top]].startswith("forward (/usr/lib/python3.11/site-packages/torch/nn/")
    assert names[b["user_frame_id"][top]] == "train_step (/home/u/train.py:11)"
    # activations live at the step's peak (after the grad alloc); the tmp block comes after the peak
    live = dict(zip(b["bytes"][s12].tolist(), b["live_at_peak"][s12].tolist()))
    assert live[15 * MiB] == 1 and live[2 * MiB] == 1 and live[MiB // 2] == 0
    grad = np.flatnonzero(s12 & (b["bytes"] == 2 * MiB))[0]
    assert b["stream"][grad] == 7 and b["lifetime_ns"][grad] > 0
    assert b["lifetime_ns"][np.flatnonzero(s12 & (b["bytes"] == MiB // 2))[0]] > 0  # freed in the gap after
    assert set(b["live_at_peak"].tolist()) <= {0, 1}


def test_truncated_ring_buffer_keeps_exact_levels_and_flags_early_steps():
    fa = FakeAllocator()
    base = (fa.alloc, fa.reserved)
    spans = _run_steps(fa, n_steps=4)
    truth = _truth(fa, spans, base)
    keep = 25
    full = _snapshot(fa)
    cut = dict(full, device_traces=[fa.trace[-keep:]])
    summ = summarize_snapshot(cut, spans, max_entries=keep)
    m = summ.tables["cuda_memory"]
    first_t = fa.trace[-keep]["time_us"] * 1000
    for i, (step, s, _e) in enumerate(spans):
        assert m["complete"][i] == int(s >= first_t)
        if s >= first_t:
            assert int(m["alloc_peak_bytes"][i]) == truth[step][0]
            assert int(m["alloc_end_bytes"][i]) == truth[step][1]
    assert m["complete"].tolist()[0] == 0 and m["complete"].tolist()[-1] == 1
    assert summ.stats["devices"]["0"]["truncated"]


def test_clock_mapping_devices_and_empty_inputs():
    a, b = FakeAllocator(0), FakeAllocator(1, baseline=(MiB,))
    spans = _run_steps(a, n_steps=2)
    _run_steps(b, n_steps=2)  # same µs clock: entries of device 1 fall into the same steps
    off = 3_250_000_000
    shifted = [(s, st + off, e + off) for s, st, e in spans]
    summ = summarize_snapshot(_snapshot(a, b), shifted, to_recorded=lambda t: t + off)
    m = summ.tables["cuda_memory"]
    assert list(zip(m["step"].tolist(), m["device"].tolist())) == [(10, 0), (10, 1), (11, 0), (11, 1)]
    assert (m["n_alloc"] == 5).all()
    assert summarize_snapshot(_snapshot(a, b), spans, to_recorded=lambda t: t + off).tables["cuda_memory"][
        "n_alloc"].sum() == 0  # without the mapping nothing falls into the shifted steps
    only1 = summarize_snapshot(_snapshot(a, b), {"step": np.array([10]), "start_ns": np.array([spans[0][1]]),
                                                 "end_ns": np.array([spans[0][2]])}, devices=[1])
    assert only1.tables["cuda_memory"]["device"].tolist() == [1]
    assert len(summarize_snapshot({"segments": [], "device_traces": [[]]}, spans).tables["cuda_memory"]["step"]) == 0
    empty = summarize_snapshot({"segments": [], "device_traces": [[]]}, spans, devices=[0])  # device unused
    assert empty.tables["cuda_memory"]["alloc_peak_bytes"].tolist() == [0, 0]
    assert len(empty.tables["cuda_memory_blocks"]["step"]) == 0
    assert summarize_snapshot({}, []).tables["cuda_memory"]["step"].dtype == np.int32


def test_shard_round_trip_with_strings_and_snapshot_file(tmp_path):
    fa = FakeAllocator()
    spans = _run_steps(fa)
    snap = _snapshot(fa)
    summ = summarize_snapshot(snap, spans)
    strings = ["ProfilerStep#10", "forward (/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py:125)"]
    tables = summ.with_strings(strings)
    assert len(strings) == len(set(strings))
    blk = tables["cuda_memory_blocks"]
    assert strings[int(blk["user_frame_id"][0])].startswith("train_step (/home/u/train.py:")
    snap_path = tmp_path / "rank00000.w0000.memsnap.pickle"
    size = dump_snapshot(snap, snap_path)
    assert size == snap_path.stat().st_size and not list(tmp_path.glob("*.tmp"))
    assert pickle.loads(snap_path.read_bytes())["device_traces"][0][0]["action"] == fa.trace[0]["action"]
    attrs = {"run_id": "r", "rank": 0, "world_size": 1, "local_rank": 0, "host": "h", "device": "cuda",
             "backend": "none", "torch_version": "t", "distprof_version": "d", "window": 0, "first_step": 10,
             "last_step": 12, "memory_history": {"snapshot": snap_path.name, **summ.stats}}
    path = tmp_path / "rank00000.w0000.h5"
    write_shard(path, tables, strings, attrs, codec="gzip")
    s = read_shard(path)
    assert s.attrs["schema_version"] == schema.SCHEMA_VERSION == "2.1"
    assert s.memory_snapshot_path() == snap_path
    got = s.table("cuda_memory")
    assert np.array_equal(got["alloc_peak_bytes"], summ.tables["cuda_memory"]["alloc_peak_bytes"])
    assert s.names[s.table("cuda_memory_blocks", ["frame_id"])["frame_id"][0]] == strings[int(blk["frame_id"][0])]


def test_older_shards_read_empty_tables(tmp_path):
    path = tmp_path / "rank00000.w0000.h5"
    attrs = {"run_id": "r", "rank": 0, "world_size": 1, "local_rank": 0, "host": "h", "device": "cpu",
             "backend": "none", "torch_version": "t", "distprof_version": "d", "window": 0, "first_step": 0,
             "last_step": 0}
    tabs = {t: schema.empty_table(t) for t in schema.TABLES if t not in schema.OPTIONAL_TABLES}
    write_shard(path, tabs, [], attrs, codec="gzip")
    s = read_shard(path)
    assert not s.has("cuda_memory") and s.memory_snapshot_path() is None
    assert set(s.table("cuda_memory")) == set(schema.TABLES["cuda_memory"])
    assert len(s.table("cuda_memory_blocks")["bytes"]) == 0


# ---- capture hooks ---------------------------------------------------------------------------------------------------


class FakeCudaMemory:
    def __init__(self, fail_snapshot=False):
        self.calls: list[tuple] = []
        self.fail_snapshot = fail_snapshot

    def _record_memory_history(self, enabled="all", **kw):
        self.calls.append(("record", enabled, kw))

    def _snapshot(self, device=None):
        self.calls.append(("snapshot",))
        if self.fail_snapshot:
            raise RuntimeError("boom")
        return {"segments": [], "device_traces": [[]]}


def test_memory_history_hooks_turn_recording_on_and_off():
    fake = FakeCudaMemory()
    mh = MemoryHistory(1234, memory=fake)
    assert mh.end() is None and fake.calls == []
    mh.begin()
    assert fake.calls[0] == ("record", "all", {"context": "all", "stacks": "python", "max_entries": 1234,
                                               "clear_history": True})
    snap = mh.end()
    assert snap == {"segments": [], "device_traces": [[]]}
    assert [c[0] for c in fake.calls] == ["record", "snapshot", "record"] and fake.calls[2][1] is None
    assert not mh.recording
    bad = FakeCudaMemory(fail_snapshot=True)
    mh = MemoryHistory(10, memory=bad)
    mh.begin()
    with pytest.raises(RuntimeError):
        mh.end()
    assert bad.calls[-1][:2] == ("record", None) and not mh.recording  # turned off even when the snapshot fails


class Torch23CudaMemory(FakeCudaMemory):
    """torch 2.3's signature: no clear_history (an unknown keyword is a TypeError there)."""

    def _record_memory_history(self, enabled="all", context="all", stacks="all", max_entries=2**63 - 1, device=None):
        self.calls.append(("record", enabled, {"context": context, "stacks": stacks, "max_entries": max_entries}))


def test_memory_history_on_a_torch_that_cannot_clear_it():
    fake = Torch23CudaMemory()
    mh = MemoryHistory(1234, memory=fake)
    mh.begin()
    assert fake.calls[0] == ("record", "all", {"context": "all", "stacks": "python", "max_entries": 1234})
    assert mh.end() is not None and fake.calls[-1][:2] == ("record", None)


def test_config_flag_and_env(monkeypatch):
    from distprof.launch import config_from_args, get_args_parser

    assert config_from_mapping({}, environ={}).memory_history is False
    assert config_from_mapping({}, environ={"DISTPROF_MEMORY_HISTORY": "1"}).memory_history is True
    c = config_from_mapping({}, environ={"DISTPROF_MEMORY_HISTORY_ENTRIES": "5000"})
    assert c.memory_history_entries == 5000
    with pytest.raises(ConfigError, match="memory_history_entries"):
        config_from_mapping({"memory_history_entries": 0}, environ={})
    args = get_args_parser().parse_args(["--memory-history", "--memory-history-entries", "77", "train.py"])
    cfg = config_from_args(args)
    assert cfg.memory_history is True and cfg.memory_history_entries == 77
    monkeypatch.setenv("DISTPROF_MEMORY_HISTORY", "1")
    assert config_from_args(get_args_parser().parse_args(["--no-memory-history", "t.py"])).memory_history is False


def test_without_cuda_one_warning_and_training_goes_on(caplog, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present: the GPU check covers this path")
    import distprof

    caplog.set_level(logging.WARNING)
    with distprof.profile(out=str(tmp_path), memory_history=True, wait=0, warmup=1, active=1, repeat=1) as p:
        p.step()
        p.step()
        p.step()
    msgs = [r.getMessage() for r in caplog.records if "memory-history" in r.getMessage()]
    assert msgs == ["distprof: --memory-history needs CUDA; ignored"]
    assert p.windows_written and not p.errors
    assert not read_shard(p.windows_written[0]["path"]).has("cuda_memory")
    with pytest.raises(ConfigError, match="--memory-history needs CUDA"):
        distprof.profile(out=str(tmp_path), memory_history=True, strict=True).start()


class LiveFakeCudaMemory(FakeCudaMemory):
    """torch.cuda.memory stand-in whose allocator history is stamped with the real clock while training runs."""

    def __init__(self):
        super().__init__()
        self.trace: list[dict] = []
        self.live: dict[int, int] = {}
        self.addr = 1 << 40

    def _record_memory_history(self, enabled="all", **kw):
        super()._record_memory_history(enabled, **kw)
        if enabled and kw.get("clear_history"):
            self.trace = []

    def _entry(self, action, addr, size, line):
        import time

        self.trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                           "time_us": time.time_ns() // 1000,
                           "frames": [{"filename": "/home/u/train.py", "line": line, "name": "step"}]})

    def malloc(self, size, line):
        self.addr += 1 << 21
        self.live[self.addr] = size
        self._entry("alloc", self.addr, size, line)
        return self.addr

    def free(self, addr):
        self._entry("free_requested", addr, self.live.pop(addr), 0)

    def _snapshot(self, device=None):
        self.calls.append(("snapshot",))
        blocks = [{"address": a, "size": s, "requested_size": s, "state": "active_allocated", "frames": []}
                  for a, s in self.live.items()]
        return {"segments": [{"device": 0, "address": 0, "total_size": 1 << 30, "blocks": blocks}],
                "device_traces": [list(self.trace)]}


def test_capture_writes_tables_and_snapshot_and_load_run_merges_them(tmp_path):
    """The capture plumbing end to end on CPU, with torch.cuda.memory faked: shard tables, pickle, MergedRun."""
    import time

    import distprof
    from distprof.analysis.summarize.merged import load_run

    fake = LiveFakeCudaMemory()
    p = distprof.profile(out=str(tmp_path), wait=0, warmup=1, active=3, repeat=1, run_id="mh")
    p._memhist = MemoryHistory(1000, memory=fake)
    keep = []
    with p:
        for i in range(5):
            time.sleep(0.002)
            a = [fake.malloc((i + 1) * MiB, 100 + i), fake.malloc(MiB, 200)]
            time.sleep(0.002)
            fake.free(a[0])
            keep.append(a[1])
            time.sleep(0.002)
            p.step()
    assert not p.errors, p.errors
    (w,) = p.windows_written
    s = read_shard(w["path"])
    mh = s.attrs["memory_history"]
    assert mh["snapshot"] == "rank00000.w0000.memsnap.pickle" and mh["max_entries"] == 1000
    snap = pickle.loads(s.memory_snapshot_path().read_bytes())
    assert snap["device_traces"][0][0]["action"] == "alloc"
    cm = s.table("cuda_memory")
    assert cm["step"].tolist() == s.attrs["steps_covered"] == [1, 2, 3]
    assert cm["n_alloc"].tolist() == [2, 2, 2] and cm["n_free"].tolist() == [1, 1, 1]
    # each step: (i+1) MiB + 1 MiB allocated, the first freed; 1 MiB per earlier step stays live
    assert cm["alloc_peak_bytes"].tolist() == [(i + 2) * MiB + i * MiB for i in (1, 2, 3)]
    assert cm["alloc_end_bytes"].tolist() == [(i + 1) * MiB for i in (1, 2, 3)]
    assert "memhist_s" in s.attrs["timings"]
    assert [c[0] for c in fake.calls] == ["record", "snapshot", "record"]

    run = load_run(tmp_path / "mh")
    assert run.has_memory_history
    assert run.cuda_memory["rank"].tolist() == [0, 0, 0]
    blk = run.cuda_memory_blocks
    assert blk["bytes"][blk["step"] == 3].tolist() == [4 * MiB, MiB]
    assert run.names[blk["user_frame_id"][blk["step"] == 3][0]] == "step (/home/u/train.py:103)"
    steps = run.steps
    for j in range(3):  # peaks are aligned with the steps
        assert steps["start_ns"][j] <= run.cuda_memory["peak_ns"][j] < steps["end_ns"][j]
    sub = load_run(tmp_path / "mh", steps=(2, 2))
    assert sub.cuda_memory["step"].tolist() == [2] and set(sub.cuda_memory_blocks["step"].tolist()) == {2}


def test_imbalance_gains_reserved_peak_with_history():
    from test_breakdown import ddp_run

    from distprof.analysis.cross.imbalance import imbalance

    from distprof.analysis.summarize.engine import summarize_merged

    run = ddp_run(3, n_steps=2)
    assert "reserved_peak_bytes" not in imbalance(summarize_merged(run)).metrics  # no history: unchanged
    cm = {c: np.zeros(4, dt) for c, dt in schema.TABLES["cuda_memory"].items()}
    cm["rank"] = np.array([0, 0, 1, 1], np.int32)
    cm["window"] = np.zeros(4, np.int32)
    cm["reserved_peak_bytes"] = np.array([4, 6, 9, 8], np.int64) * MiB
    run.cuda_memory = cm
    imb = imbalance(summarize_merged(run))
    by = {r.rank: r.reserved_peak_bytes for r in imb.per_rank}
    assert by == {0: 6 * MiB, 1: 9 * MiB, 2: None}
    m = imb.metrics["reserved_peak_bytes"]
    assert m.max_rank == 1 and m.max == 9 * MiB and m.max_over_min == pytest.approx(1.5)
