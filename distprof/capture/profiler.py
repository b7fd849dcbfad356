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
from ..storage.writer import write_shard
from . import clock, dist_info, groups
from .extract import extract
from .memhistory import SNAPSHOT_TEMPLATE, MemoryHistory, dump_snapshot, summarize_snapshot
from .schedule import Action, action_at, window_of
from .setup import RunSetup
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
    cuda_peaks: dict[int, int]
    cuda_baseline: dict[int, int]
    gloo_thread_pg: dict[int, str]
    process_groups: list[dict[str, Any]]
    backend: str
    backend_config: str
    step_end_ns: dict[int, int]  # steps the window's close ended -> when their iteration finished
    memsnap: dict | None = None  # torch.cuda.memory._snapshot() at the window end (--memory-history)
    t_queued: float = field(default_factory=time.perf_counter)


class RankProfiler:
    """Nothing here waits for another rank at a step or window boundary: the run id and host roles are agreed once
    where every rank is (``setup.py``), clock ping-pongs run on a side thread (``clock.py``), and shards are written
    by a background thread."""

    def __init__(self, config: ProfileConfig) -> None:
        self.config = config
        self.step_num = 0
        self.errors: list[dict[str, str]] = []
        self.windows_written: list[dict[str, Any]] = []
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
        self._step_began_ns = 0  # time.time_ns() when the step in flight began
        self._step_end_ns: dict[int, int] = {}  # this window: steps ended by its close -> their iteration's end
        self._main_tid = threading.get_native_id()
        self._info: dist_info.RankInfo | None = None
        self._clock = clock.ClockSync(config.sync_rounds, config.sync_timeout_s, None,
                                      lambda stage, e: self._fail(stage, e, disable=False))
        self._setup = RunSetup(config, self._clock)
        self._cuda_peaks: dict[int, int] = {}
        self._cuda_baseline: dict[int, int] = {}
        self._memhist: MemoryHistory | None = None
        self._lock = threading.Lock()

    @property
    def run_id(self) -> str | None:
        return self._setup.run_id

    @property
    def run_dir(self) -> Path | None:
        return self._setup.run_dir

    @property
    def iterations(self) -> int:
        """Training iterations seen (optimizer steps of the primary optimizer, or step() calls)."""
        return self._stepper.iterations if self._stepper is not None else self.step_num

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
        groups.set_default_group_listener(self._on_default_group)
        groups.install()
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
        self._writer = _Writer(self._fail)
        if cfg.step_on == "optimizer":
            self._stepper = OptimizerStepper(self._advance)
            self._stepper.install()
        _active = self
        # a job whose process group already exists: agree now (every rank enters the profiler there)
        self._guard("setup", self._setup.agree_with_existing_group)
        self._step_began_ns = time.time_ns()  # just before torch opens ProfilerStep#0
        self._prof.start()
        if action_at(cfg.schedule, 0) in RECORDING:  # wait = warmup = 0: the first window begins with the profiler
            self._guard("step", lambda: self._window_begin(0))
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
        """Finish: end the step in flight where its iteration ended, write what was recorded, wait for the writer
        and the clock side thread, write the status file."""
        global _active
        if self._closed or not self._started:
            return
        self._closed = True
        try:
            iteration_done = False
            if self._stepper is not None:
                # an iteration finished and its deferred profiler step never came: that step ends at its optimizer
                # step, and whatever ran since (a checkpoint, evaluation) is in no step
                iteration_done = self._stepper.pending
                self._stepper.remove()
            if self._prof is not None:
                if self._disabled:
                    self._stop_quietly()
                else:
                    self._guard("stop", lambda: self._stop_partial(iteration_done))
        finally:
            self._memhist_stop()
            if _active is self:
                _active = None
            groups.set_default_group_listener(None)
            ok = self._writer.close() if self._writer is not None else True
            if not ok:
                self._fail("write", TimeoutError("background writer did not finish within 120 s"))
            self._clock.close()
            self._write_status()
        self._raise_strict()

    # -- the agreement ------------------------------------------------------------------------------------------
    def _on_default_group(self, pg, store) -> None:
        """Inside init_process_group, every rank: agree the run id and host roles (never raises into torch)."""
        if self._closed or self._disabled or self._setup.agreement is not None:
            return
        self._guard("setup", lambda: self._setup.agree(store, pg.rank(), pg.size()))

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
            self._window_begin(window_of(sched, self.step_num + 1))
        self.step_num += 1
        self._t_step_call = time.perf_counter()
        self._step_began_ns = time.time_ns()
        self._prof.step()  # on the window's last step this stops the trace and calls _on_trace_ready

    def _window_begin(self, window: int) -> None:
        """Local work only: identity, run directory (when its id is known), a clock mark for the side thread."""
        self._ensure_info()
        self._setup.ensure_run_dir(self._info.rank, wait=False)
        self._step_end_ns = {}
        self._clock.mark(window, 0)
        self._cuda_window_begin()

    def _ensure_info(self) -> None:
        import torch.distributed as dist

        if self._info is None or (not self._info_final and dist.is_available() and dist.is_initialized()):
            self._info = dist_info.rank_info()
            self._info_final = dist.is_available() and dist.is_initialized()
            if self._clock.sim is None:
                self._clock.sim = self._info.sim_clock

    _info_final = False

    # -- window end ---------------------------------------------------------------------------------------------
    def _on_trace_ready(self, prof) -> None:
        # torch has just stopped the trace (inside prof.step()); called on every rank at the same step.
        self._in_callback = True
        try:
            stop_s = time.perf_counter() - self._t_step_call  # torch's own stop
            window = window_of(self.config.schedule, self.step_num - 1)
            self._clock.mark(window, 1)
            results = prof.profiler.kineto_results
            memsnap = self._memhist_end()
            self._submit(results, window, complete=True, stop_s=stop_s,
                         ready_s=time.perf_counter() - self._t_step_call - stop_s, memsnap=memsnap)
            if action_at(self.config.schedule, self.step_num) in RECORDING:  # back to back (wait = warmup = 0)
                self._window_begin(window_of(self.config.schedule, self.step_num))
        except BaseException as e:  # noqa: BLE001
            self._fail("window end", e)
        finally:
            self._in_callback = False

    def _stop_partial(self, iteration_done: bool) -> None:
        """Close-time: if a window is being recorded, stop it and write what it holds.

        The step in flight ends where its iteration did (`iteration_done`: the stepper's last optimizer step) — then
        a window whose last step it is, is complete; otherwise it never had an iteration (the tail after the last
        `step()`) and is left out of the steps.
        """
        sched = self.config.schedule
        cur = action_at(sched, self.step_num)
        prof, self._prof = self._prof, None
        if cur not in RECORDING:
            prof.stop()  # nothing recorded, or only warm-up
            return
        self._cuda_step_end(self.step_num)
        if iteration_done and self._stepper is not None:
            self._step_end_ns[self.step_num] = self._stepper.last_end_ns
            complete = cur is Action.RECORD_AND_SAVE
        else:
            self._step_end_ns[self.step_num] = self._step_began_ns
            complete = False
        prof.on_trace_ready = None
        prof.stop()
        window = window_of(sched, self.step_num)
        self._clock.mark(window, 1)
        memsnap = self._memhist_end()
        results = prof.profiler.kineto_results if prof.profiler is not None else None
        if results is None:
            return
        self._submit(results, window, complete=complete, stop_s=0.0, memsnap=memsnap)

    def _submit(self, results, window: int, *, complete: bool, stop_s: float, ready_s: float = 0.0,
                memsnap: dict | None = None) -> None:
        self._ensure_info()
        peaks, self._cuda_peaks = self._cuda_peaks, {}
        job = _WindowJob(results, window, complete, stop_s, ready_s, peaks, dict(self._cuda_baseline),
                         groups.gloo_thread_pg(), groups.process_groups(),
                         groups.backend_name(self._info.device_type), groups.backend_config(),
                         dict(self._step_end_ns), memsnap=memsnap)
        self._writer.submit(lambda: self._write_window(job))

    def _write_window(self, job: _WindowJob) -> None:
        """Writer thread: extract the window's events and write its shard."""
        t0 = time.perf_counter()
        info = self._info
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
        )
        t1 = time.perf_counter()
        samples, local = self._clock.take(job.window)
        s_tab, l_tab = clock.samples_table(samples, local)
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
        roles = self._setup.roles()
        steps = ex.steps_covered
        timings = {"stop_s": round(job.stop_s, 6), "ready_s": round(job.ready_s, 6),
                   "queued_s": round(t0 - job.t_queued, 6), "extract_s": round(t1 - t0, 6),
                   "n_events": ex.stats["n_events"]}
        attrs: dict[str, Any] = {
            **info.attrs(),
            "run_id": self.run_id,
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
            "errors": list(self.errors),
            "clock_role": roles.role if roles else "",
            "clock_leader": roles.leader_of_me if roles else info.rank,
            "clock_reference": roles.reference if roles else 0,
            "created_ns": time.time_ns(),
            "timings": timings,  # write_shard adds write_s
        }
        if mem_attr is not None:
            attrs["memory_history"] = mem_attr
            timings["memhist_s"] = mem_attr.pop("summary_s")
        path = run_dir / schema.SHARD_TEMPLATE.format(rank=info.rank, window=job.window)
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
            "iterations": self.iterations,
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
