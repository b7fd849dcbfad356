"""RankProfiler: one rank's synchronized torch.profiler capture, written to HDF5 shards off the training thread.

Once training has started, nothing here may hurt it: every failure is logged once (naming the rank and the cause),
recorded in the shards and the status file, and capture stops while training goes on — unless `strict` is set, in
which case the error is raised on the training thread.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..config import ProfileConfig
from ..errors import ConfigError
from ..storage import schema
from ..storage.writer import remove_orphans, write_shard
from . import clock, dist_info
from .extract import extract
from .memhistory import SNAPSHOT_TEMPLATE, MemoryHistory, dump_snapshot, summarize_snapshot
from .schedule import Action, action_at, window_of
from .stepper import OptimizerStepper

log = logging.getLogger(__name__)

RECORDING = (Action.RECORD, Action.RECORD_AND_SAVE)
_active: "RankProfiler | None" = None


def active() -> "RankProfiler | None":
    """The profiler of this process that is running now, if any."""
    return _active


class _Writer:
    """One background thread that extracts and writes windows in order."""

    def __init__(self, on_error: Callable[[str, BaseException], None]) -> None:
        self._q: queue.Queue = queue.Queue()
        self._on_error = on_error
        self._thread = threading.Thread(target=self._run, name="distprof-writer", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        self._q.put(job)

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
                job()
            except BaseException as e:  # noqa: BLE001 -- reported, never raised into training
                self._on_error("write", e)

    def close(self, timeout: float | None = 120.0) -> bool:
        self._q.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()


@dataclass
class _WindowJob:
    """What the training thread hands the writer when a window ends: a snapshot, nothing shared."""

    results: Any  # torch's kineto results for the window
    window: int
    complete: bool
    stop_s: float  # torch's own stop, on the training thread
    ready_s: float  # distprof's window-end work on the training thread
    samples: list
    local: list
    cuda_peaks: dict[int, int]
    cuda_baseline: dict[int, int]
    gloo_thread_pg: dict[int, str]
    process_groups: list[dict[str, Any]]
    backend: str
    memsnap: dict | None = None  # torch.cuda.memory._snapshot() at the window end (--memory-history)
    t_queued: float = field(default_factory=time.perf_counter)


class RankProfiler:
    def __init__(self, config: ProfileConfig) -> None:
        self.config = config
        self.step_num = 0
        self.errors: list[dict[str, str]] = []
        self.windows_written: list[dict[str, Any]] = []
        self.run_id: str | None = None
        self.run_dir: Path | None = None
        self._prof = None
        self._stepper: OptimizerStepper | None = None
        self._writer: _Writer | None = None
        self._disabled = False
        self._closed = False
        self._started = False
        self._strict_error: BaseException | None = None
        self._warned = False
        self._warned_manual = False
        self._in_callback = False
        self._t_step_call = 0.0  # perf_counter just before the training thread's prof.step()
        self._main_tid = threading.get_native_id()
        self._info: dist_info.RankInfo | None = None
        self._sync: clock.SyncState | None = None
        self._cuda_peaks: dict[int, int] = {}
        self._cuda_baseline: dict[int, int] = {}
        self._memhist: MemoryHistory | None = None
        self._lock = threading.Lock()

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def start(self) -> "RankProfiler":
        global _active
        import torch
        from torch.profiler import ProfilerActivity, profile

        from .schedule import to_torch

        if self._started:
            return self
        self._setup_memory_history(torch)
        self._started = True
        dist_info.install_group_tracking()
        dist_info.add_teardown_callback(_teardown_active)
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        cfg = self.config
        self._prof = profile(
            activities=activities,
            schedule=to_torch(cfg.schedule),
            on_trace_ready=self._on_trace_ready,
            record_shapes=cfg.shapes,
            profile_memory=cfg.memory,
            with_flops=cfg.flops,
            with_stack=cfg.stack,
        )
        self._prof.start()
        self._writer = _Writer(self._fail)
        self._sync = clock.SyncState(cfg.sync_rounds, cfg.sync_timeout_s, None)
        if cfg.step_on == "optimizer":
            self._stepper = OptimizerStepper(self._advance)
            self._stepper.install()
        _active = self
        return self

    def __enter__(self) -> "RankProfiler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def step(self) -> None:
        """One training iteration is done (explicit API: `p.step()` / `distprof.step()`)."""
        self._raise_strict()
        if self._stepper is not None:
            if not self._warned_manual:
                self._warned_manual = True
                log.warning(
                    "distprof: rank %s: step() called while steps come from the optimizer hook; ignored "
                    "(run with --step-on manual to drive steps yourself)", self._rank_label())
            return
        self._advance()

    def close(self) -> None:
        """Finish: flush the pending step, write what was recorded, wait for the writer, write the status file."""
        global _active
        if self._closed or not self._started:
            return
        self._closed = True
        try:
            if self._stepper is not None:
                if not self._disabled:
                    self._guard("step", self._stepper.fire)
                self._stepper.remove()
            if self._prof is not None:
                if self._disabled:
                    self._stop_quietly()
                else:
                    self._guard("stop", self._stop_partial)
        finally:
            self._memhist_stop()
            if _active is self:
                _active = None
            ok = self._writer.close() if self._writer is not None else True
            if not ok:
                self._fail("write", TimeoutError("background writer did not finish within 120 s"))
            self._write_status()
        self._raise_strict()

    # -- stepping -----------------------------------------------------------------------------------------------
    def _advance(self) -> None:
        if self._disabled:
            return
        self._guard("step", self._advance_unguarded)
        self._raise_strict()

    def _advance_unguarded(self) -> None:
        sched = self.config.schedule
        cur, nxt = action_at(sched, self.step_num), action_at(sched, self.step_num + 1)
        if cur in RECORDING:
            self._cuda_step_end(self.step_num)
        if nxt in RECORDING and cur not in RECORDING:
            self._window_begin()
        elif cur in RECORDING and self._info is None:
            # The schedule records from step 0 (wait = warmup = 0): the window began with the profiler, before the
            # process group may have existed; set up and take the start samples now, at its first step boundary.
            self._window_begin()
        self.step_num += 1
        self._t_step_call = time.perf_counter()
        self._prof.step()  # on the window's last step this stops the trace and calls _on_trace_ready

    def _window_begin(self) -> None:
        self._ensure_setup()
        clock.exchange(self._sync, 0)
        self._cuda_window_begin()

    def _ensure_setup(self) -> None:
        if self._info is not None:
            return
        self._info = dist_info.rank_info()
        self._sync.sim = self._info.sim_clock
        explicit = self.config.run_id or _env_run_id()
        self.run_id = clock.setup(self._sync, self._info.host, explicit)
        run_dir = Path(self.config.out) / self.run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        remove_orphans(run_dir, self._info.rank)

    # -- window end ---------------------------------------------------------------------------------------------
    def _on_trace_ready(self, prof) -> None:
        # torch has just stopped the trace (inside prof.step()); called on every rank at the same step.
        self._in_callback = True
        try:
            stop_s = time.perf_counter() - self._t_step_call  # torch's own stop
            try:
                clock.exchange(self._sync, 1)
            except BaseException as e:  # noqa: BLE001 -- keep the window without end samples
                self._fail("clock sync", e, disable=False)
            results = prof.profiler.kineto_results
            window = window_of(self.config.schedule, self.step_num - 1)
            memsnap = self._memhist_end()
            self._submit(results, window, complete=True, stop_s=stop_s,
                         ready_s=time.perf_counter() - self._t_step_call - stop_s, memsnap=memsnap)
            nxt = action_at(self.config.schedule, self.step_num)
            if nxt in RECORDING:  # the next window starts right away (wait = warmup = 0)
                clock.exchange(self._sync, 0)
                self._cuda_window_begin()
        except BaseException as e:  # noqa: BLE001
            self._fail("window end", e)
        finally:
            self._in_callback = False

    def _stop_partial(self) -> None:
        """Close-time: if a window is being recorded, stop it and write what it holds (complete=False)."""
        cur = action_at(self.config.schedule, self.step_num)
        prof, self._prof = self._prof, None
        if cur not in RECORDING:
            prof.stop()  # nothing recorded, or only warm-up
            return
        self._cuda_step_end(self.step_num)
        prof.on_trace_ready = None
        prof.stop()
        self._ensure_setup()  # closed inside a window that began at step 0, before any step() set things up
        memsnap = self._memhist_end()
        results = prof.profiler.kineto_results if prof.profiler is not None else None
        if results is None:
            return
        try:
            clock.exchange(self._sync, 1) if self._sync_possible() else self._sync.local_sample(1)
        except BaseException as e:  # noqa: BLE001 -- peers may have exited; keep the window anyway
            self._fail("clock sync", e, disable=False)
        self._submit(results, window_of(self.config.schedule, self.step_num), complete=False, stop_s=0.0,
                     memsnap=memsnap)

    def _sync_possible(self) -> bool:
        import torch.distributed as dist

        return bool(dist.is_available() and dist.is_initialized() and self._sync.group is not None)

    def _submit(self, results, window: int, *, complete: bool, stop_s: float, ready_s: float = 0.0,
                memsnap: dict | None = None) -> None:
        samples, local = self._sync.take_window()
        peaks, self._cuda_peaks = self._cuda_peaks, {}
        job = _WindowJob(results, window, complete, stop_s, ready_s, samples, local, peaks, dict(self._cuda_baseline),
                         dist_info.gloo_thread_pg(), dist_info.process_groups(), dist_info.backend_name(),
                         memsnap=memsnap)
        self._writer.submit(lambda: self._write_window(job))

    def _write_window(self, job: _WindowJob) -> None:
        """Writer thread: extract the window's events and write its shard."""
        t0 = time.perf_counter()
        info = self._info
        ex = extract(
            job.results.events(),
            main_tid=self._main_tid,
            sim=info.sim_clock,
            thread_names=dist_info.thread_names(),
            gloo_thread_pg=job.gloo_thread_pg,
            process_groups=job.process_groups,
            cuda_step_peaks=job.cuda_peaks or None,
            cuda_baseline=job.cuda_baseline,
        )
        t1 = time.perf_counter()
        s_tab, l_tab = clock.samples_table(job.samples, job.local)
        tables = {**ex.tables, "clock/samples": s_tab, "clock/local": l_tab}
        strings = list(ex.strings)
        mem_attr = None
        if job.memsnap is not None:
            snap, job.memsnap = job.memsnap, None  # the job may outlive this call (windows_written); free it now
            try:
                mem_tables, mem_attr = self._memory_tables(snap, job.window, ex.tables["steps"], strings)
                tables.update(mem_tables)
            except Exception as e:  # noqa: BLE001 -- keep the window without the history
                strings = list(ex.strings)
                self._fail("memory history", e, disable=False)
        roles = self._sync.roles
        steps = ex.steps_covered
        timings = {"stop_s": round(job.stop_s, 6), "ready_s": round(job.ready_s, 6),
                   "queued_s": round(t0 - job.t_queued, 6), "extract_s": round(t1 - t0, 6),
                   "n_events": ex.stats["n_events"]}
        attrs: dict[str, Any] = {
            **info.attrs(),
            "run_id": self.run_id,
            "backend": job.backend,
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
            "errors": list(self.errors),
            "clock_role": roles.role if roles else "reference",
            "clock_leader": roles.leader_of_me if roles else info.rank,
            "clock_reference": roles.reference if roles else 0,
            "created_ns": time.time_ns(),
            "timings": timings,  # write_shard adds write_s
        }
        if mem_attr is not None:
            attrs["memory_history"] = mem_attr
            timings["memhist_s"] = mem_attr.pop("summary_s")
        path = self.run_dir / schema.SHARD_TEMPLATE.format(rank=info.rank, window=job.window)
        size = write_shard(path, tables, strings, attrs, codec=self.config.codec)
        durable = time.perf_counter() - job.t_queued
        self.windows_written.append({"window": job.window, "path": str(path), "bytes": size, "steps": steps,
                                     "complete": job.complete, **timings, "durable_after_s": round(durable, 6)})
        log.info("distprof: rank %d wrote %s (%d events, %.1f KB)", info.rank, path, ex.stats["n_events"], size / 1e3)

    # -- CUDA memory --------------------------------------------------------------------------------------------
    def _cuda_window_begin(self) -> None:
        import torch

        if torch.cuda.is_available():
            d = torch.cuda.current_device()
            self._cuda_baseline = {d: int(torch.cuda.memory_allocated(d))}
            torch.cuda.reset_peak_memory_stats(d)
        if self._memhist is not None:
            try:
                self._memhist.begin()
            except Exception as e:  # noqa: BLE001 -- the window goes on without the history
                self._memhist_stop()
                self._fail("memory history", e, disable=False)

    def _setup_memory_history(self, torch) -> None:
        """--memory-history: needs CUDA; without it one warning and the run goes on (strict: ConfigError)."""
        if not self.config.memory_history:
            return
        if torch.cuda.is_available():
            self._memhist = MemoryHistory(self.config.memory_history_entries)
        elif self.config.strict:
            raise ConfigError("--memory-history needs CUDA (torch.cuda.is_available() is False here); "
                              "drop the flag (DISTPROF_MEMORY_HISTORY=0) or run on a GPU")
        else:
            log.warning("distprof: --memory-history needs CUDA; ignored")

    def _memhist_end(self) -> dict | None:
        """Window end, training thread: the allocator snapshot (None without --memory-history), recording off."""
        if self._memhist is None:
            return None
        try:
            return self._memhist.end()
        except Exception as e:  # noqa: BLE001 -- the window is written without the history
            self._fail("memory history", e, disable=False)
            return None

    def _memhist_stop(self) -> None:
        if self._memhist is not None:
            try:
                self._memhist.stop()
            except Exception as e:  # noqa: BLE001
                self._fail("memory history", e, disable=False)

    def _memory_tables(self, snap: dict, window: int, steps: dict, strings: list[str]) -> tuple[dict, dict]:
        """Writer thread: summarise the snapshot per step, pickle it beside the shard; `strings` is extended."""
        t0 = time.perf_counter()
        sim = self._info.sim_clock
        summary = summarize_snapshot(snap, steps, max_entries=self._memhist.max_entries,
                                     to_recorded=sim.apply if sim is not None and not sim.is_identity else None)
        tables = summary.with_strings(strings)
        name = SNAPSHOT_TEMPLATE.format(rank=self._info.rank, window=window)
        size = dump_snapshot(snap, self.run_dir / name)
        attr = {"snapshot": name, "snapshot_bytes": size, "max_entries": self._memhist.max_entries,
                "stacks": self._memhist.stacks, **summary.stats, "summary_s": round(time.perf_counter() - t0, 6)}
        return tables, attr

    def _cuda_step_end(self, step: int) -> None:
        import torch

        if torch.cuda.is_available():
            d = torch.cuda.current_device()
            self._cuda_peaks[step] = int(torch.cuda.max_memory_allocated(d))
            torch.cuda.reset_peak_memory_stats(d)

    # -- failure handling ---------------------------------------------------------------------------------------
    def _rank_label(self) -> str:
        if self._info is not None:
            return str(self._info.rank)
        return os.environ.get("RANK", "0")

    def _guard(self, stage: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            self._fail(stage, e)

    def _fail(self, stage: str, exc: BaseException, disable: bool = True) -> None:
        with self._lock:
            self.errors.append({"stage": stage, "message": f"{type(exc).__name__}: {exc}"})
            first = not self._warned
            self._warned = True
        if self.config.strict:
            self._strict_error = exc
        elif first:
            log.warning("distprof: rank %s: %s failed (%s: %s); profiling stops, training goes on "
                        "(--strict raises instead)", self._rank_label(), stage, type(exc).__name__, exc)
        if disable and stage != "write":
            self._disable()

    def _disable(self) -> None:
        if self._disabled:
            return
        self._disabled = True
        if self._stepper is not None:
            self._stepper.remove()
        if not self._in_callback:  # inside torch's step() the trace is already stopped; close() finishes it
            self._stop_quietly()

    def _stop_quietly(self) -> None:
        self._memhist_stop()
        prof, self._prof = self._prof, None
        if prof is not None:
            try:
                prof.on_trace_ready = None
                prof.stop()
            except BaseException:  # noqa: BLE001 -- already failing; nothing more to report
                pass

    def before_teardown(self) -> None:
        """The process group is about to be destroyed: run the pending step while peers can still sync."""
        if self._stepper is not None and not self._disabled:
            self._guard("step", self._stepper.fire)

    def _raise_strict(self) -> None:
        if self._strict_error is not None:
            e, self._strict_error = self._strict_error, None
            raise RuntimeError(f"distprof (strict mode): {e}") from e

    def _write_status(self) -> None:
        if self.run_dir is None:
            return
        rank = self._info.rank if self._info else int(os.environ.get("RANK", 0))
        doc = {
            "rank": rank,
            "run_id": self.run_id,
            "steps_seen": self.step_num,
            "iterations": self._stepper.iterations if self._stepper else self.step_num,
            "skipped_steps": self._stepper.skipped if self._stepper else 0,
            "windows": self.windows_written,
            "errors": self.errors,
            "closed_ns": time.time_ns(),
        }
        path = self.run_dir / schema.STATUS_TEMPLATE.format(rank=rank)
        tmp = path.with_name(path.name + schema.TMP_SUFFIX)
        try:
            tmp.write_text(json.dumps(doc, indent=1))
            os.replace(tmp, path)
        except OSError as e:
            log.warning("distprof: rank %s: cannot write %s (%s)", rank, path, e)


def _teardown_active() -> None:
    if _active is not None:
        _active.before_teardown()


def _env_run_id() -> str | None:
    for key in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        v = os.environ.get(key, "").strip()
        if v and v.lower() != "none":
            return v
    return None
