"""A finished window, from the training thread's snapshot to a durable shard, on one background thread.

The training thread only builds a :class:`WindowJob` (torch's results and the little state they need) and queues
it; :class:`ShardWriter` extracts the events, collects the window's clock samples (waiting for the side thread's
exchanges, bounded by the sync timeout), summarises the CUDA allocator history, and writes the shard in window
order. Nothing it does is raised into training: a window that cannot be stored (no space, the file-size limit, an
unwritable directory: ``storage.writer`` says which) or extracted is *lost* — reported through `on_lost` with its
steps and the reason — and the next window is tried as usual. When the file system clearly lacks room for another
window (less free than the last shard's size above the writer's reserve), the window is not even extracted.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import numpy.ma  # noqa: F401 -- np.unique imports it on first use: loaded at launch, not in the first window's write

from ..config import ProfileConfig
from ..events.p2p import P2PCalls
from ..storage import schema
from ..storage.summary_group import Summarizer
from ..storage.writer import (ImageBuilder, ShardWriteError, building, free_bytes, no_space, reserve_bytes,
                              write_durably)
from . import clock, groups, schedstat
from .dist_info import RankInfo
from .extract import Extracted, extract
from .memhistory import SNAPSHOT_TEMPLATE, dump_snapshot, summarize_snapshot
from .rundir import ClaimError
from .setup import RunSetup
from .status import LostWindow

log = logging.getLogger(__name__)

#: Why a whole window that torch returned without a single event is not written (not even its ProfilerStep# spans:
#: torch's profiling session was not active in it).
NO_EVENTS = ("torch's profiler recorded no event in it: its session was not active (compiled autograd does this to "
             "the default step boundary: run with --step-on manual and call distprof.step() after each iteration; "
             "docs/capture.md)")


@dataclass
class WindowJob:
    """What the training thread hands the writer when a window ends: a snapshot, nothing shared."""

    results: Any  # torch's kineto results for the window
    window: int
    complete: bool
    info: RankInfo
    stop_s: float  # torch's own stop, on the training thread
    ready_s: float  # distprof's window-end work on the training thread
    cuda_peaks: dict[int, int]
    cuda_baseline: dict[int, int]
    gloo_thread_pg: dict[int, str]
    process_groups: list[dict[str, Any]]
    backend: str
    backend_config: str
    step_end_ns: dict[int, int]  # steps the window's close ended -> when their iteration finished
    memsnap: dict | None = None  # torch.cuda.memory._snapshot() at the window end (--memory-history)
    memhist: dict[str, Any] | None = None  # {"max_entries", "stacks"} of the history recorder
    p2p_calls: P2PCalls | None = None  # the point-to-point calls since the last window (capture.p2p)
    cpu_marks: dict[int, tuple[int, ...] | None] | None = None  # step -> thread's (run, wait ns, faults) at its start
    cpu_opt_marks: dict[int, tuple[int, ...] | None] | None = None  # step -> the same as its optimizer step began
    cpu_end_marks: dict[int, tuple[int, ...] | None] | None = None  # step -> the same at its end
    cpu_samples: dict[str, np.ndarray] | None = None  # the training thread's CPU waits while recording (cpu/samples)
    trigger: dict[str, Any] | None = None  # a triggered window: request_id, reason, plan (capture/trigger.py)
    steps: tuple[int, int] = (-1, -1)  # first and last step the window was to record (for a lost window's message)
    cpus: dict[str, int] = field(default_factory=dict)  # the training thread's CPU budget (dist_info.cpu_budget)
    t_queued: float = field(default_factory=time.perf_counter)

    def lost(self, stage: str, reason: str) -> LostWindow:
        return LostWindow(self.window, self.steps[0], self.steps[1], stage, reason)


class ShardWriter:
    """One background thread that extracts and writes windows in order; `written` lists what it wrote, `lost`
    what it could not."""

    def __init__(self, config: ProfileConfig, setup: RunSetup, clock_sync: clock.ClockSync, *, main_tid: int,
                 errors: Callable[[], list[dict[str, str]]], on_error: Callable[..., None],
                 on_lost: Callable[[LostWindow], None], summarizer: Summarizer | None = None) -> None:
        self.config = config
        self._summarizer = summarizer
        self.written: list[dict[str, Any]] = []
        self.lost: list[LostWindow] = []
        self._setup = setup
        self._clock = clock_sync
        self._main_tid = main_tid
        self._errors = errors
        self._on_error = on_error
        self._on_lost = on_lost
        self._last_size = 0  # bytes of the last shard built: what the next one likely needs
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="distprof-writer", daemon=True)
        self._thread.start()

    def submit(self, job: WindowJob) -> None:
        self._q.put(job)

    def drain(self, timeout: float) -> bool:
        """Wait until every window queued so far is written or lost (at most `timeout` s). True when done."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._q.all_tasks_done:
            while self._q.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._q.all_tasks_done.wait(min(left, 0.25))
        return True

    def close(self, timeout: float | None = 120.0, *, why: str = "") -> bool:
        """Finish the queued windows and stop (at most `timeout` s). Windows still queued then are lost (`why`)."""
        self._q.put(None)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            return True
        self.abandon(why or f"not written within {timeout:.0f} s of the close")
        return False

    def abandon(self, why: str) -> list[LostWindow]:
        """The windows still queued (not the one being written now) are lost, for `why`."""
        out = []
        while True:
            try:
                job = self._q.get_nowait()
            except queue.Empty:
                break
            if job is None:
                self._q.put(None)  # keep the stop request for the thread
                self._q.task_done()
                break
            out.append(job.lost("deadline", why))
            self._q.task_done()
        for lw in out:
            self._lose(lw)
        return out

    @property
    def busy_window(self) -> int | None:
        """The window being written now, if any."""
        return self._current

    _current: int | None = None

    def _lose(self, lw: LostWindow) -> None:
        self.lost.append(lw)
        self._on_lost(lw)

    def _run(self) -> None:
        try:  # Linux: a per-thread nice value, so extraction yields the CPU to training
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        while True:
            job = self._q.get()
            if job is None:
                self._q.task_done()
                return
            self._current = job.window
            try:
                self._write(job)
            except (ShardWriteError, ClaimError) as e:
                self._lose(job.lost("write", getattr(e, "reason", None) or str(e)))
            except BaseException as e:  # noqa: BLE001 -- reported, never raised into training
                self._lose(job.lost("write", f"{type(e).__name__}: {e}"))
            finally:
                self._current = None
                job.results = None  # torch's events: freed now, not when the queue forgets the job
                self._q.task_done()

    def _room_for(self, run_dir) -> str | None:
        """Why there is clearly no room for a window like the last one (None: try)."""
        if not self._last_size:
            return None
        try:
            avail, size = free_bytes(run_dir)
        except OSError:
            return None  # write_durably says why
        if avail >= self._last_size + reserve_bytes(size):
            return None
        return no_space(run_dir, self._last_size, avail, size, estimated=True) + " (the last window's size; not extracted)"

    def _write(self, job: WindowJob) -> None:
        """Extract the window's events and write its shard."""
        t0, c0 = time.perf_counter(), time.thread_time()
        info = job.info
        run_dir = self._run_dir_for(job)
        ex = self._extract(job)
        if job.complete and ex.stats["n_events"] == 0:  # a whole window without even its ProfilerStep# spans
            self._lose(job.lost("write", NO_EVENTS))
            return
        t1 = time.perf_counter()
        tables = {**ex.tables, **self._sample_tables(job)}
        strings, mem_attr = self._add_memory(job, ex, run_dir, tables)
        steps = ex.steps_covered
        timings = {"stop_s": round(job.stop_s, 6), "ready_s": round(job.ready_s, 6),
                   "queued_s": round(t0 - job.t_queued, 6), "extract_s": round(t1 - t0, 6),
                   "n_events": ex.stats["n_events"]}
        attrs = self._attrs(job, ex, timings, mem_attr)
        path = run_dir / schema.SHARD_TEMPLATE.format(rank=info.rank, window=job.window)
        t2 = time.perf_counter()
        n_events = ex.stats["n_events"]
        with building(tables, strings, attrs, codec=self.config.codec) as b:
            del tables, ex
            image = b.image()
            t_sum, c_sum = time.perf_counter(), time.thread_time()
            image = self._with_summary(b, image, path)
            t3, c3 = time.perf_counter(), time.thread_time()
        self._last_size = len(image)
        t4 = time.perf_counter()
        size = write_durably(path, image, replace=False)  # a shard is written once: never over another's
        timings["build_s"] = round(t_sum - t2, 6)
        timings["summary_s"] = round(t3 - t_sum, 6)
        timings["disk_s"] = round(time.perf_counter() - t4, 6)
        # the writer thread's CPU: the events' extraction, tables and image; the stored summary (compared in
        # docs/capture.md: the summary must cost less than writing the events it summarises)
        timings["shard_cpu_s"] = round(c_sum - c0, 6)
        timings["summary_cpu_s"] = round(c3 - c_sum, 6)
        durable = time.perf_counter() - job.t_queued
        self.written.append({"window": job.window, "path": str(path), "bytes": size, "steps": steps,
                             "complete": job.complete, **timings, "durable_after_s": round(durable, 6)})
        log.info("distprof: rank %d wrote %s (%d events, %.1f KB)", info.rank, path, n_events, size / 1e3)

    def _with_summary(self, b: ImageBuilder, image: bytes, path: Path) -> bytes:
        """The shard's bytes with its per-rank summary added (``summary_group``) to the file `b` still builds,
        computed here on the writer thread by the summarizer the entry point gave (the report's map); `image`, its
        bytes without, when there is none or it fails (the report then summarises the events; a warning says why).

        The report uses a stored summary only for a rank with a single shard, so only the first shard this rank
        writes gets one, and only when the schedule records one window (``repeat=1``, or windows on request only):
        CPU in the training process is not spent on a summary nobody reads."""
        sched = self.config.schedule
        if self._summarizer is None or self.written or (sched.kind == "steps" and sched.repeat != 1):
            return image
        try:
            summary = self._summarizer(image, path)  # None: the report summarises this shard itself
            return image if summary is None else b.with_summary(summary)
        except Exception as e:  # noqa: BLE001 -- the shard is written without it; never raised into training
            log.warning("distprof: %s: its per-rank summary was not stored (%s: %s); the report will summarise its "
                        "events instead", path.name, type(e).__name__, e)
            return image

    def _run_dir_for(self, job: WindowJob) -> Path:
        """The run directory to write the window into; ClaimError / ShardWriteError when there is none or no room."""
        run_dir = self._setup.ensure_run_dir(job.info.rank, wait=True)
        if run_dir is None:
            raise ClaimError("no run id was agreed with the other ranks")
        no_room = self._room_for(run_dir)
        if no_room:
            self._clock.take(job.window)  # forget its samples
            raise ShardWriteError(run_dir, no_room)
        return run_dir

    def _extract(self, job: WindowJob) -> Extracted:
        """The window's shard tables from torch's events (:func:`.extract.extract`)."""
        return extract(
            job.results.events(),
            main_tid=self._main_tid,
            sim=job.info.sim_clock,
            thread_names=groups.thread_names(),
            gloo_thread_pg=job.gloo_thread_pg,
            process_groups=job.process_groups,
            cuda_step_peaks=job.cuda_peaks or None,
            cuda_baseline=job.cuda_baseline,
            step_end_ns=job.step_end_ns or None,
            p2p_calls=job.p2p_calls,
            cpu_marks=job.cpu_marks,
            cpu_opt_marks=job.cpu_opt_marks,
            cpu_end_marks=job.cpu_end_marks,
        )

    def _sample_tables(self, job: WindowJob) -> dict[str, dict[str, np.ndarray]]:
        """The window's clock samples (once its exchanges are done) and the training thread's CPU samples."""
        samples, local = self._clock.take(job.window)
        s_tab, l_tab = clock.samples_table(samples, local)
        tables = {"clock/samples": s_tab, "clock/local": l_tab}
        if job.cpu_samples is not None and job.cpu_samples["t_ns"].size:
            cs = schedstat.drop_flat(job.cpu_samples)
            sim = job.info.sim_clock
            if sim is not None and not sim.is_identity:
                cs["t_ns"] = np.asarray(sim.apply(cs["t_ns"]), np.int64)
            tables["cpu/samples"] = cs
        return tables

    def _add_memory(self, job: WindowJob, ex: Extracted, run_dir: Path, tables: dict) -> tuple[list[str], dict | None]:
        """The shard's strings, and with --memory-history the allocator tables added to `tables` and their attribute
        (None without, or when summarising failed: reported, the window kept without them)."""
        strings = list(ex.strings)
        mem_attr = None
        if job.memsnap is not None:
            snap, job.memsnap = job.memsnap, None  # the job may outlive this call (written); free it now
            try:
                mem_tables, mem_attr = self._memory_tables(job, snap, run_dir, ex.tables["steps"], strings)
                tables.update(mem_tables)
            except Exception as e:  # noqa: BLE001 -- keep the window without the history
                strings = list(ex.strings)
                self._on_error("memory history", e, disable=False)
        return strings, mem_attr

    def _attrs(self, job: WindowJob, ex: Extracted, timings: dict[str, Any], mem_attr: dict | None) -> dict[str, Any]:
        """The shard's attributes; the memory history's summary time moves from `mem_attr` into `timings`."""
        info = job.info
        roles = self._setup.roles()
        steps = ex.steps_covered
        attrs: dict[str, Any] = {
            **info.attrs(),
            **job.cpus,
            "run_id": self._setup.run_id,
            **({"job": self._setup.job.to_dict()} if self._setup.job is not None else {}),
            "backend": job.backend,
            "backend_config": job.backend_config,
            "process_groups": job.process_groups,
            "config": self.config.to_dict(),
            "window": job.window,
            "first_step": steps[0] if steps else -1,
            "last_step": steps[-1] if steps else -1,
            "steps_covered": steps,
            "complete": job.complete,
            "window_start_ns": ex.window_start_ns,
            "window_end_ns": ex.window_end_ns,
            "memory_total_relative": info.device_type == "cpu",
            "errors": list(self._errors()),
            # roles unknown (no agreement in a job of several ranks): no role, so the merger aligns from collectives
            "clock_role": roles.role if roles else "",
            "clock_leader": roles.leader_of_me if roles else info.rank,
            "clock_reference": roles.reference if roles else 0,
            "created_ns": time.time_ns(),
            "timings": timings,  # the writer adds write_s (compression + HDF5, in memory)
        }
        if job.trigger is not None:
            attrs["trigger"] = job.trigger
        if mem_attr is not None:
            attrs["memory_history"] = mem_attr
            timings["memhist_s"] = mem_attr.pop("summary_s")
        return attrs

    @staticmethod
    def _memory_tables(job: WindowJob, snap: dict, run_dir, steps: dict, strings: list[str]) -> tuple[dict, dict]:
        """Summarise the allocator snapshot per step, pickle it beside the shard; `strings` is extended."""
        t0 = time.perf_counter()
        sim = job.info.sim_clock
        max_entries = job.memhist["max_entries"]
        summary = summarize_snapshot(snap, steps, max_entries=max_entries,
                                     to_recorded=sim.apply if sim is not None and not sim.is_identity else None)
        tables = summary.with_strings(strings)
        name = SNAPSHOT_TEMPLATE.format(rank=job.info.rank, window=job.window)
        size = dump_snapshot(snap, run_dir / name)
        attr = {"snapshot": name, "snapshot_bytes": size, "max_entries": max_entries,
                "stacks": job.memhist["stacks"], **summary.stats, "summary_s": round(time.perf_counter() - t0, 6)}
        return tables, attr
