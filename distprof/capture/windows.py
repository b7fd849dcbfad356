"""A finished window, from the training thread's snapshot to a durable shard, on one background thread.

The training thread only builds a :class:`WindowJob` (torch's results and the little state they need) and queues
it; :class:`ShardWriter` extracts the events, collects the window's clock samples (waiting for the side thread's
exchanges, bounded by the sync timeout), summarises the CUDA allocator history, and writes the shard in window
order. Its failures are reported through `on_error` ("write"), never raised into training.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..config import ProfileConfig
from ..events.p2p import P2PCalls
from ..storage import schema
from ..storage.writer import write_shard
from . import clock, groups
from .dist_info import RankInfo
from .extract import extract
from .memhistory import SNAPSHOT_TEMPLATE, dump_snapshot, summarize_snapshot
from .setup import RunSetup

log = logging.getLogger(__name__)


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
    trigger: dict[str, Any] | None = None  # a triggered window: request_id, reason, plan (capture/trigger.py)
    t_queued: float = field(default_factory=time.perf_counter)


class ShardWriter:
    """One background thread that extracts and writes windows in order; `written` lists what it wrote."""

    def __init__(self, config: ProfileConfig, setup: RunSetup, clock_sync: clock.ClockSync, *, main_tid: int,
                 errors: Callable[[], list[dict[str, str]]], on_error: Callable[..., None]) -> None:
        self.config = config
        self.written: list[dict[str, Any]] = []
        self._setup = setup
        self._clock = clock_sync
        self._main_tid = main_tid
        self._errors = errors
        self._on_error = on_error
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="distprof-writer", daemon=True)
        self._thread.start()

    def submit(self, job: WindowJob) -> None:
        self._q.put(job)

    def close(self, timeout: float | None = 120.0) -> bool:
        self._q.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:  # Linux: a per-thread nice value, so extraction yields the CPU to training
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        while True:
            job = self._q.get()
            if job is None:
                return
            try:
                self._write(job)
            except BaseException as e:  # noqa: BLE001 -- reported, never raised into training
                self._on_error("write", e)

    def _write(self, job: WindowJob) -> None:
        """Extract the window's events and write its shard."""
        t0 = time.perf_counter()
        info = job.info
        run_dir = self._setup.ensure_run_dir(info.rank, wait=True)
        ex = extract(
            job.results.events(),
            main_tid=self._main_tid,
            sim=info.sim_clock,
            thread_names=groups.thread_names(),
            gloo_thread_pg=job.gloo_thread_pg,
            process_groups=job.process_groups,
            cuda_step_peaks=job.cuda_peaks or None,
            cuda_baseline=job.cuda_baseline,
            step_end_ns=job.step_end_ns or None,
            p2p_calls=job.p2p_calls,
        )
        t1 = time.perf_counter()
        samples, local = self._clock.take(job.window)
        s_tab, l_tab = clock.samples_table(samples, local)
        tables = {**ex.tables, "clock/samples": s_tab, "clock/local": l_tab}
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
        roles = self._setup.roles()
        steps = ex.steps_covered
        timings = {"stop_s": round(job.stop_s, 6), "ready_s": round(job.ready_s, 6),
                   "queued_s": round(t0 - job.t_queued, 6), "extract_s": round(t1 - t0, 6),
                   "n_events": ex.stats["n_events"]}
        attrs: dict[str, Any] = {
            **info.attrs(),
            "run_id": self._setup.run_id,
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
            "timings": timings,  # write_shard adds write_s
        }
        if job.trigger is not None:
            attrs["trigger"] = job.trigger
        if mem_attr is not None:
            attrs["memory_history"] = mem_attr
            timings["memhist_s"] = mem_attr.pop("summary_s")
        path = run_dir / schema.SHARD_TEMPLATE.format(rank=info.rank, window=job.window)
        size = write_shard(path, tables, strings, attrs, codec=self.config.codec)
        durable = time.perf_counter() - job.t_queued
        self.written.append({"window": job.window, "path": str(path), "bytes": size, "steps": steps,
                             "complete": job.complete, **timings, "durable_after_s": round(durable, 6)})
        log.info("distprof: rank %d wrote %s (%d events, %.1f KB)", info.rank, path, ex.stats["n_events"], size / 1e3)

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
