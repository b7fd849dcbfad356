"""RankProfiler: one rank's synchronized torch.profiler capture, written to HDF5 shards off the training thread.

Once training has started, nothing here may hurt it: every failure is logged once (naming the rank and the cause),
recorded in the shards and the status file, and capture stops while training goes on — unless `strict` is set, in
which case the error is raised on the training thread. A window that cannot be stored is *lost*, named with its steps
and the reason in a warning, the status file and the closing line (``status.py``), and capture goes on. SIGTERM and
SIGINT are handled by ``signals.py``: what is finished is saved, then the signal does what it would have.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..config import ProfileConfig
from ..errors import ConfigError
from . import clock, compiled, dist_info, groups, p2p, rundir, schedstat, status
from .memhistory import MemoryHistory
from .rundir import ClaimError
from .schedule import Action, WindowPlan
from .setup import RunSetup, is_distributed
from .signals import FLUSH_S, SignalGuard
from .status import LostWindow
from .stepper import OptimizerStepper
from .trigger import Trigger
from .watch import Watch
from ..storage.summary_group import Summarizer
from .windows import ShardWriter, WindowJob

if TYPE_CHECKING:
    from .spawned import Handoff

log = logging.getLogger(__name__)

RECORDING = (Action.RECORD, Action.RECORD_AND_SAVE)
_active: "RankProfiler | None" = None

#: keys of `RankProfiler._warned_about` (besides ``lost:<kind>``, one per kind of reason a window was lost for)
WARN_FAILURE = "failure"  # the first failure (a lost window counts: after one, failures are only recorded)
WARN_MANUAL_STEP = "manual step"  # step() called while steps come from the optimizer hook
WARN_STEP_OUTSIDE = "step outside"  # step() called before start() or once close() has begun


class ProfilerState(enum.Enum):
    """Where a RankProfiler is in its life: `RankProfiler._state`, changed only by its ``_mark_*`` methods.

    NEW       built; start() has not run (or raised before it began: --memory-history in strict mode without CUDA).
              A step() now is ignored (one warning): there is nothing to step. -> RUNNING (start()).
    RUNNING   start() has begun: hooks, the shard writer, side threads and signal handlers are (being) installed and
              steps are profiled. -> DISABLED (a failure that stops profiling), CLOSING (close()).
    DISABLED  a failure stopped profiling while running (the run directory could not be had, a step or a window's end
              failed): the optimizer hook is removed, the trace stopped (or, inside torch's own callback, left for
              close() to stop), steps are ignored; training goes on. -> CLOSING (close()).
    CLOSING   close() has begun: the window in flight is finished, the writer and the side threads are waited for,
              the status file is written. Nothing begins again: a second close(), the process group's agreement and a
              signal's flush are ignored, and a failure here is recorded without changing the state. -> CLOSED.
    CLOSED    close() is done (its last act is to call `on_closed`). Final; a step() now is ignored (one warning).
              A forked child's copy of a running profiler is CLOSED at once, without a close (``_forked_away``).

    Failures happen only while RUNNING or CLOSING: nothing runs before start() (a step() is ignored), and after the
    close nothing is left to fail. A failure that stops profiling is recorded in `RankProfiler.errors` (the closing
    line and the status file name it), so nothing about it needs to outlive the state.
    """

    NEW = "new"
    RUNNING = "running"
    DISABLED = "disabled"
    CLOSING = "closing"
    CLOSED = "closed"


def active() -> "RankProfiler | None":
    """The profiler of this process that is running now, if any."""
    return _active


def _after_fork_in_child() -> None:
    """A child forked from a process whose profiler runs: that profiler's copy steps aside (``_forked_away``)."""
    prof = _active
    if prof is not None:
        prof._forked_away()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class RankProfiler:
    """Nothing here waits for another rank at a step or window boundary: the run id and host roles are agreed once
    where every rank is (``setup.py``), clock ping-pongs run on a side thread (``clock.py``), and shards are written
    by a background thread."""

    def __init__(self, config: ProfileConfig, *, summarizer: Summarizer | None = None,
                 inherited_run: tuple[str, rundir.JobIdentity] | None = None) -> None:
        """`inherited_run`: the run id and job of the process that started this one with torch.multiprocessing.spawn
        and handed its run directory over (:meth:`hand_over`; ``spawned.py``)."""
        self.config = config
        self._summarizer = summarizer if config.summaries else None
        self.step_num = 0
        self.errors: list[dict[str, str]] = []
        self._prof = None
        self._stepper: OptimizerStepper | None = None
        self._writer: ShardWriter | None = None
        self._state = ProfilerState.NEW
        self._script_error: str | None = None  # how the script ended, when it failed (script_ended())
        self._strict_error: BaseException | None = None
        self._warned_about: set[str] = set()  # warnings given once, already given (WARN_*, lost:<kind>)
        # not a state: True only while torch's on_trace_ready callback runs (inside prof.step()), where a failure
        # must neither stop the trace torch has already stopped nor count the window as lost in flight
        self._in_callback = False
        self._t_step_call = 0.0  # perf_counter just before the training thread's prof.step()
        self._step_began_ns = 0  # time.time_ns() when the step in flight began
        self._step_end_ns: dict[int, int] = {}  # this window: steps ended by its close -> their iteration's end
        self._cpu: schedstat.ThreadCpu | None = None  # the training thread's scheduler statistics (opened there)
        self._cpu_marks: dict[int, tuple[int, ...] | None] = {}  # this window: step -> sample at its start
        self._cpu_end_marks: dict[int, tuple[int, ...] | None] = {}  # this window: step -> sample at its end
        self._cpu_opt_marks: dict[int, tuple[int, ...] | None] = {}  # step -> sample as its optimizer step began
        self._sampler: schedstat.WaitSampler | None = None  # the training thread's CPU waits while recording
        self._main_tid = threading.get_native_id()
        self._info: dist_info.RankInfo | None = None
        # not a state: whether _info was read while the process group existed (else from the launcher's
        # environment, and read again once the group exists)
        self._info_final = False
        self._clock = clock.ClockSync(config.sync_rounds, config.sync_timeout_s, None,
                                      lambda stage, e: self._fail(stage, e, disable=False))
        self._setup = RunSetup(config, self._clock, inherited=inherited_run)
        self._handed_over = False  # this process started the job's ranks itself and is none of them (hand_over)
        #: the run directory offered to ranks the script starts with multiprocessing.Process (``spawned.py``):
        #: taken by this process at its first step or close, unless a started group's rank 0 took it first
        self.handoff: "Handoff | None" = None
        self._plan = WindowPlan(config.schedule)  # the schedule's windows and the triggered ones
        self._trigger: Trigger | None = None
        self._watch: Watch | None = None
        self._cuda_peaks: dict[int, int] = {}
        self._cuda_baseline: dict[int, int] = {}
        self._memhist: MemoryHistory | None = None
        self._lock = threading.Lock()
        #: called once when the profiler has closed (the launcher prints the closing line there)
        self.on_closed: Callable[["RankProfiler"], None] | None = None
        self._signals = SignalGuard(self)
        self._signal: int | None = None  # the termination signal seen, if any
        self._signal_at: float | None = None  # time.monotonic() when it was seen
        self._depth = 0  # > 0 while the training thread runs profiler code (a signal then waits for it to leave)
        self._extra_lost: list[LostWindow] = []  # lost outside the writer (in flight at a signal, profiling stopped)
        self._cut_short: list[int] = []  # windows saved cut short by the close (a signal, the script's end)
        self._close_began: float | None = None

    @property
    def run_id(self) -> str | None:
        return self._setup.run_id

    @property
    def run_dir(self) -> Path | None:
        return self._setup.run_dir

    @property
    def windows_written(self) -> list[dict[str, Any]]:
        """One entry per shard written: window, path, bytes, steps, complete, timings."""
        return self._writer.written if self._writer is not None else []

    @property
    def lost(self) -> list[LostWindow]:
        """Windows recorded (or being recorded) that are not on disk, with why."""
        return sorted((self._writer.lost if self._writer is not None else []) + self._extra_lost,
                      key=lambda w: w.window)

    @property
    def in_distprof(self) -> bool:
        return self._depth > 0

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

        if self._state is not ProfilerState.NEW:
            return self
        self._setup_memory_history(torch)
        self._mark_started()
        groups.set_default_group_listener(self._on_default_group)
        groups.install()
        p2p.install()
        compiled.install()  # before the hooks below are registered: torch.compile must not trace them
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        cfg = self.config
        self._prof = profile(
            activities=activities,
            schedule=to_torch(self._plan),
            on_trace_ready=self._on_trace_ready,
            record_shapes=cfg.shapes,
            profile_memory=cfg.memory,
            with_flops=cfg.flops,
            with_stack=cfg.stack,
        )
        self._writer = ShardWriter(cfg, self._setup, self._clock, main_tid=self._main_tid,
                                   errors=lambda: list(self.errors), on_error=self._fail, on_lost=self._window_lost,
                                   summarizer=self._summarizer)
        self._signals.install()
        if cfg.step_on == "optimizer":
            self._stepper = OptimizerStepper(self._advance, self._cpu_mark_optimizer, self._iteration_end)
            self._stepper.install()
        _active = self
        if cfg.trigger.enabled:
            self._trigger = Trigger(cfg, self._setup, self._plan, step=lambda: self.step_num,
                                    written=lambda: self.windows_written,
                                    on_error=lambda stage, e: self._fail(stage, e, disable=False))
            self._trigger.start()
        if cfg.watch.enabled:
            self._watch = Watch(cfg, self._setup, trigger=self._trigger, step=lambda: self.step_num,
                                on_error=lambda stage, e: self._fail(stage, e, disable=False))
            self._watch.start()
        # a job whose process group already exists: agree now (every rank enters the profiler there)
        self._guard("setup", self._setup.agree_with_existing_group)
        self._guard("setup", self._setup.agree_over_mpi)  # mpiexec: every rank is here, before the script
        self._check_run_dir()
        if self._state is ProfilerState.DISABLED:  # the agreement failed: warned once, training goes on unprofiled
            self._raise_strict()
            return self
        self._cpu = schedstat.ThreadCpu(faults=True)
        if cfg.cpu_sample_ms > 0:
            self._sampler = schedstat.WaitSampler(self._main_tid, cfg.cpu_sample_ms / 1e3)
        self._step_began_ns = time.time_ns()  # just before torch opens ProfilerStep#0
        self._prof.start()
        if self._plan.action(0) in RECORDING:  # wait = warmup = 0: the first window begins with the profiler
            self._guard("step", lambda: self._window_begin(0))
            self._cpu_mark(0)
        return self

    def __enter__(self) -> "RankProfiler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def step(self) -> None:
        """One training iteration is done (explicit API: `p.step()` / `distprof.step()`)."""
        self._raise_strict()
        if self._state in (ProfilerState.NEW, ProfilerState.CLOSING, ProfilerState.CLOSED):
            if self._first_warning(WARN_STEP_OUTSIDE):
                log.warning("distprof: rank %s: step() called %s; ignored", self._rank_label(),
                            "before the profiler started (start() or `with`)" if self._state is ProfilerState.NEW
                            else "after the profiler closed")
            return
        if self._stepper is not None:
            if self._first_warning(WARN_MANUAL_STEP):
                log.warning(
                    "distprof: rank %s: step() called while steps come from the optimizer hook; ignored "
                    "(run with --step-on manual to drive steps yourself)", self._rank_label())
            return
        self._advance()

    def close(self) -> None:
        """Finish: end the step in flight where its iteration ended, write what was recorded, wait for the writer
        and the clock side thread, write the status file. After a termination signal every wait is bounded by what
        is left of the signal's deadline (signals.FLUSH_S)."""
        self._inside(self._close)

    @property
    def handed_over(self) -> bool:
        """This process started the job's ranks itself and closed for them (:meth:`hand_over`)."""
        return self._handed_over

    def can_hand_over(self) -> bool:
        """Whether this process can step aside for ranks it starts (:meth:`hand_over`): it runs, has seen no training
        step, and is no rank of a job itself (no process group, no launcher's world of several)."""
        return (self._state is ProfilerState.RUNNING and self.iterations == 0 and self._setup.agreement is None
                and not is_distributed())

    def hand_over(self) -> tuple[str, rundir.JobIdentity] | None:
        """The script starts the job's ranks itself (torch.multiprocessing.spawn; ``spawned.py``) and this process,
        their launcher, is none of them (:meth:`can_hand_over`, checked by the caller): it claims the run directory
        (if it has not yet) for them, and closes without a status file, a shard or a closing line of its own. Returns
        the run id and job as which the ranks' rank 0 takes the directory; None when none could be claimed (rank 0
        then claims one itself, or says why it cannot). Never raises."""
        inherited = None
        try:
            self._setup.ensure_run_dir(0, wait=False)
            if self._setup.run_id is not None and self._setup.job is not None:
                inherited = (self._setup.run_id, self._setup.job)
        except Exception as e:  # noqa: BLE001 -- the ranks' rank 0 claims a directory itself (and says why not)
            log.debug("distprof: the launching process could not claim the run directory: %s", e)
        self._handed_over = True
        self.close()
        return inherited

    def offer_run_dir(self, make: Callable[[tuple[str, rundir.JobIdentity] | None], "Handoff"]) -> "Handoff":
        """The script starts processes that may become ranks (``spawned.py``): this process's run directory (claimed
        now if it was not yet) is offered to them, once — `make(run id and job, or None)` makes the offer. Until this
        process takes the directory back (its first step, or its close), its side threads write nothing into it (the
        trigger's live file and answers, the watch's series): a started group's rank 0 may be writing them."""
        if self.handoff is None:
            self.handoff = make(self._offered_run())
            self._pause_side_threads(True)
        return self.handoff

    def _pause_side_threads(self, paused: bool) -> None:
        for side in (self._trigger, self._watch):
            if side is not None:
                side.paused = paused

    def _offered_run(self) -> tuple[str, rundir.JobIdentity] | None:
        """The run id and job of this process's run directory, claimed now if it was not yet; None when none could
        be claimed. Never raises."""
        try:
            self._setup.ensure_run_dir(0, wait=False)
        except Exception as e:  # noqa: BLE001 -- the started ranks' rank 0 claims a directory itself
            log.debug("distprof: the launching process could not claim the run directory: %s", e)
        if self._setup.run_dir is None or self._setup.run_id is None or self._setup.job is None:
            return None
        return self._setup.run_id, self._setup.job

    def started_in_group(self, pg, store) -> None:
        """This profiler was started inside the default group's registration (a process the script started becomes
        a rank: ``rank_entry.run_started``): agree for that group now, as the listener would have."""
        self._on_default_group(pg, store)

    def _keep_or_yield_run_dir(self) -> bool:
        """The script started processes that may take this process's run directory as ranks (`handoff`): at this
        process's first step, or its close without one, it keeps the directory if none took it. False: a started
        group's rank 0 took it, and this process records nothing there (at a step it stops profiling, one warning;
        at the close it leaves as a launcher that handed over)."""
        if self.handoff is None or self.step_num > 0 or self._handed_over:
            return True
        if self.handoff.take("launcher") is not False:  # taken now, or the offer is over (nobody else has it)
            self._pause_side_threads(False)
            return True
        self._handed_over = True
        return False

    def _yield_run_dir(self) -> None:
        """The first step of a launcher whose started ranks took its run directory: nothing more is recorded here."""
        log.warning("distprof: this process trains beside the processes it started, which took its run directory "
                    "as a job of their own: it is not profiled, training goes on")
        self._disable()

    def script_ended(self, error: str | None) -> None:
        """The launcher: how the script ended (None: normally; else its exception or non-zero exit), before close().
        The closing line and the status file say so; no hint about steps is given for a script that failed."""
        self._script_error = error

    def _close(self) -> None:
        global _active
        if self._state not in (ProfilerState.RUNNING, ProfilerState.DISABLED):  # not started, or closing already
            return
        disabled = self._state is ProfilerState.DISABLED
        self._keep_or_yield_run_dir()  # no step: ranks this process started may have taken the directory
        self._mark_closing()
        self._close_began = time.monotonic()
        left = self._time_left()
        if left is not None:
            self._clock.abort()  # a signal: no waiting for clock exchanges in flight
        try:
            iteration_done = False
            if self._stepper is not None:
                # an iteration finished and its deferred profiler step never came: that step ends at its optimizer
                # step, and whatever ran since (a checkpoint, evaluation) is in no step
                iteration_done = self._stepper.pending
                self._stepper.remove()
            if self._prof is not None:
                if disabled:  # a failure inside torch's callback left the trace for the close to stop
                    self._stop_quietly()
                else:
                    self._guard("stop", lambda: self._stop_partial(iteration_done))
            if iteration_done and not disabled:
                if self._watch is not None:  # its row too, as the iteration ended
                    self._watch.end_iteration()
                self.step_num += 1  # that step is done: it counts among the steps seen (status: steps_seen)
        finally:
            self._memhist_stop()
            if self._cpu is not None:  # every sample is taken: the last at the final step's end, above
                self._cpu.close()
            if self._sampler is not None:
                self._sampler.close()
            if _active is self:
                _active = None
            groups.set_default_group_listener(None)
            p2p.uninstall()
            compiled.remove()
            left = self._time_left()
            self._setup.give_up_waiting()
            if self._writer is not None:
                why = (f"not written within the {FLUSH_S:.0f} s distprof gives itself after "
                       f"{status.signal_name(self._signal)}" if left is not None else
                       "not written within 120 s of the close (the background writer is stuck)")
                if not self._writer.close(120.0 if left is None else max(left - 1.0, 0.5), why=why):
                    self._fail("write", TimeoutError(why), disable=False)
            if self._watch is not None:
                self._watch.close()
            if self._trigger is not None:
                left = self._time_left()
                self._trigger.close(**({} if left is None else {"timeout_s": max(0.0, min(5.0, left - 1.0))}),
                                    state=None if self._handed_over else "closed")  # the ranks' rank 0 says it
            if self._watch is not None:
                self._watch.settle_drifts()  # the trigger's final answers to the watch's requests
            left = self._time_left()
            # after a signal every rank is going: the reference does not wait for the leaders' goodbyes
            self._clock.close(None if left is None else min(0.1, left))
            if not self._handed_over:  # the launching process of spawned ranks has no status of its own
                self._mark_failed_run()
                self._write_status(final=True)
            self._signals.uninstall()
            self._mark_closed()
            if self.on_closed is not None and not self._handed_over:
                try:
                    self.on_closed(self)
                except Exception as e:  # noqa: BLE001 -- the closing line never hurts the job
                    log.debug("distprof: closing hook failed: %s", e)

    # -- state transitions (ProfilerState) ---------------------------------------------------------------------
    def _mark_started(self) -> None:
        assert self._state is ProfilerState.NEW, self._state
        self._state = ProfilerState.RUNNING

    def _mark_disabled(self) -> None:
        assert self._state is ProfilerState.RUNNING, self._state
        self._state = ProfilerState.DISABLED

    def _mark_closing(self) -> None:
        assert self._state in (ProfilerState.RUNNING, ProfilerState.DISABLED), self._state
        self._state = ProfilerState.CLOSING

    def _mark_closed(self) -> None:
        assert self._state is ProfilerState.CLOSING, self._state
        self._state = ProfilerState.CLOSED

    def _forked_away(self) -> None:
        """In a child forked while this profiler ran (``multiprocessing`` with fork: a rank the script starts itself,
        a DataLoader worker): the child's copy is CLOSED at once and does nothing more. Its side threads did not come
        along, a lock one of them held stays held, and its run directory and rank are the parent's — a copy that went
        on stepping waited on clock exchanges no peer answered (the job hung) or wrote as the parent. The hooks it
        installed are taken out, so the child's own work never reaches it; a rank the child becomes is profiled
        afresh (``spawned.py``)."""
        global _active
        self._state = ProfilerState.CLOSED
        self.on_closed = None
        if _active is self:
            _active = None
        groups.set_default_group_listener(None)
        undo = [p2p.uninstall, compiled.remove]
        if self._stepper is not None:
            undo.append(self._stepper.remove)
        if self._watch is not None:
            undo.append(self._watch.recorder.remove)
        for fn in undo:
            try:
                fn()
            except Exception as e:  # noqa: BLE001 -- the child's work goes on whatever is left
                log.debug("distprof: a forked child could not remove a hook: %s", e)

    def _close_begun(self) -> bool:
        """close() has begun (CLOSING) or is done (CLOSED)."""
        return self._state in (ProfilerState.CLOSING, ProfilerState.CLOSED)

    def _first_warning(self, key: str) -> bool:
        """Note the once-only warning `key` as given; True if it had not been (the caller gives it then)."""
        first = key not in self._warned_about
        self._warned_about.add(key)
        return first

    # -- signals (signals.py calls these) -------------------------------------------------------------------------
    def note_signal(self, sig: int) -> None:
        """A termination signal arrived (any thread): from now on every wait is bounded by its deadline."""
        if self._signal is None:
            self._signal, self._signal_at = sig, time.monotonic()

    def _time_left(self) -> float | None:
        """Seconds left of the signal's deadline (at least 0); None without a signal, or when the close began after
        the deadline (a handler of the user's let the process go on: then nothing is hurried)."""
        if self._signal_at is None:
            return None
        deadline = self._signal_at + FLUSH_S
        if self._close_began is not None and self._close_began > deadline:
            return None
        return max(0.0, deadline - time.monotonic())

    def close_on_signal(self, sig: int) -> None:
        """Main thread, a signal whose default action ends the process: close now (the window in flight is saved
        cut short), within the deadline."""
        self._depth += 1
        try:
            self._close()
        except BaseException as e:  # noqa: BLE001 -- the process ends by the signal whatever happens here
            log.debug("distprof: close on %s failed: %s", status.signal_name(sig), e)
        finally:
            self._depth -= 1

    def flush_on_signal(self, sig: int, *, blocked: bool) -> None:
        """Write what is finished and the status file, without stopping the profiler: before a user's handler runs
        (`blocked` False), or from the watcher while the training thread is stuck outside Python (`blocked`: the
        window in flight is then lost, only the training thread could stop it)."""
        if self._close_begun() or self._writer is None:
            return
        left = self._time_left()
        left = FLUSH_S if left is None else left  # a deadline already reached is 0 s left, not a fresh one
        if blocked:
            self._clock.abort()
            inflight = self._recording_window()
            if inflight is not None:
                first, last = inflight[1], self.step_num
                self._lose_extra(LostWindow(inflight[0], first, last, "signal",
                                            f"in flight at {status.signal_name(sig)} while the training thread was "
                                            "blocked outside Python (in a C call); discarded"))
        if not self._writer.drain(max(left - 1.0, 0.5)):
            self._writer.abandon(f"not written within the {FLUSH_S:.0f} s distprof gives itself after "
                                 f"{status.signal_name(sig)}")
        self._write_status(final=False)
        if blocked and self._trigger is not None:  # the process ends by the signal: the live file says so
            self._trigger.say_closed()

    def _recording_window(self) -> tuple[int, int] | None:
        """(window, first step) being recorded now, or None."""
        if self._state is not ProfilerState.RUNNING or self._prof is None \
                or self._plan.action(self.step_num) not in RECORDING:
            return None
        w = self._plan.window(self.step_num)
        return w, self._plan.steps_of(w)[0]

    # -- the agreement ------------------------------------------------------------------------------------------
    def _on_default_group(self, pg, store) -> None:
        """Inside init_process_group, every rank: agree the run id and host roles (never raises into torch)."""
        if self._state is not ProfilerState.RUNNING or self._setup.agreement is not None:
            return
        self._guard("setup", lambda: self._setup.agree(store, pg.rank(), pg.size()))
        self._check_run_dir()

    def _check_run_dir(self) -> None:
        """Rank 0 could not claim a run directory: nothing can be recorded on any rank; say so now, once."""
        if self._setup.dir_error and self._state is ProfilerState.RUNNING:
            self._fail("setup", ClaimError(self._setup.dir_error))

    # -- stepping -----------------------------------------------------------------------------------------------
    def _advance(self) -> None:
        if self._state is not ProfilerState.RUNNING:
            return
        self._inside(lambda: self._guard("step", self._advance_unguarded))

    def _inside(self, fn: Callable[[], None]) -> None:
        """Run profiler code on the training thread: a signal that arrives meanwhile waits for it to leave, and is
        handled once the outermost such call is done."""
        self._depth += 1
        try:
            fn()
        finally:
            self._depth -= 1
        if self._depth == 0:
            self._signals.resume()
        self._raise_strict()

    def _advance_unguarded(self) -> None:
        if not self._keep_or_yield_run_dir():
            return self._yield_run_dir()
        if self._trigger is not None and self._trigger.inbox is not None:  # a triggered window to place or learn
            self._trigger.adopt(self.step_num)
        plan = self._plan
        cur, nxt = plan.action(self.step_num), plan.action(self.step_num + 1)
        if self._watch is not None:  # before the profiler reads (and resets) a recorded step's device peak
            self._watch.step_end(self.step_num, cur in RECORDING)
        if cur in RECORDING:
            self._cuda_step_end(self.step_num)
        if nxt in RECORDING and cur not in RECORDING:
            self._window_begin(plan.window(self.step_num + 1))
        if cur in RECORDING:  # a recorded step's CPU time ends here, before torch's step (which may stop the trace)
            self._cpu_mark_end(self.step_num)
        self.step_num += 1
        if cur not in RECORDING and nxt not in RECORDING:
            # outside windows only the previous step's optimizer sample can still be needed (a window's first)
            self._cpu_opt_marks.pop(self.step_num - 2, None)
        self._t_step_call = time.perf_counter()
        self._step_began_ns = time.time_ns()
        self._prof.step()  # on the window's last step this stops the trace and calls _on_trace_ready
        if nxt in RECORDING:  # and a recorded step's starts after it (which may have started the trace), as its span
            self._cpu_mark(self.step_num)

    def _window_begin(self, window: int) -> None:
        """Local work only: identity, run directory (when its id is known), a clock mark for the side thread."""
        self._ensure_info()
        self._setup.ensure_run_dir(self._info.rank, wait=False)
        self._step_end_ns = {}
        first, _ = self._plan.steps_of(window)
        self._cpu_marks = {k: v for k, v in self._cpu_marks.items() if k >= first}  # back to back: keep its start
        self._cpu_end_marks = {k: v for k, v in self._cpu_end_marks.items() if k >= first}
        self._cpu_opt_marks = {k: v for k, v in self._cpu_opt_marks.items() if k >= first - 1}
        groups.snapshot()  # the groups as they are now, should the script destroy them before the window ends
        if self._sampler is not None:
            self._sampler.resume()
        self._clock.mark(window, 0)
        self._cuda_window_begin()

    def _cpu_mark(self, step: int) -> None:
        """The training thread's CPU run and wait times at the start of `step`."""
        if self._cpu is not None:
            self._cpu_marks[step] = self._cpu.sample()

    def _cpu_mark_end(self, step: int) -> None:
        """The same at the end of `step`."""
        if self._cpu is not None:
            self._cpu_end_marks[step] = self._cpu.sample()

    def _cpu_mark_optimizer(self) -> None:
        """The same sample as the primary optimizer's step begins (the hook runs on the training thread). Taken every
        step: a triggered window learnt one step ahead needs the step before its first."""
        if self._cpu is not None and self._state is ProfilerState.RUNNING:  # sample() never raises
            self._cpu_opt_marks[self.step_num] = self._cpu.sample(faults=False)  # only its wait is used

    def _iteration_end(self) -> None:
        """An iteration finished (the stepper; its boundary is deferred): the step's end as it stands, until its
        boundary replaces it. Should the loop end there, the step ends there (close) — not at the close, after
        whatever the script did next (DDP's Join shadowing the other ranks' collectives, a checkpoint, evaluation):
        a recorded step's CPU sample, and the watch's row."""
        if self._state is not ProfilerState.RUNNING:
            return
        if self._watch is not None:
            self._watch.iteration_end(self.step_num)
        if self._cpu is not None and self._plan.action(self.step_num) in RECORDING:
            self._cpu_end_marks[self.step_num] = self._cpu.sample()  # the step's boundary, if it comes, replaces it

    def _ensure_info(self) -> None:
        import torch.distributed as dist

        if self._info is None or (not self._info_final and dist.is_available() and dist.is_initialized()):
            self._info = dist_info.rank_info()
            self._info_final = dist.is_available() and dist.is_initialized()
            if self._clock.sim is None:
                self._clock.sim = self._info.sim_clock

    # -- window end ---------------------------------------------------------------------------------------------
    def _on_trace_ready(self, prof) -> None:
        # torch has just stopped the trace (inside prof.step()); called on every rank at the same step.
        self._in_callback = True
        try:
            stop_s = time.perf_counter() - self._t_step_call  # torch's own stop
            window = self._plan.window(self.step_num - 1)
            self._clock.mark(window, 1)
            results = prof.profiler.kineto_results
            memsnap = self._memhist_end()
            self._submit(results, window, complete=True, stop_s=stop_s,
                         ready_s=time.perf_counter() - self._t_step_call - stop_s, memsnap=memsnap)
            if self._plan.action(self.step_num) in RECORDING:  # back to back (wait = warmup = 0)
                self._window_begin(self._plan.window(self.step_num))
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
        cur = self._plan.action(self.step_num)
        prof, self._prof = self._prof, None
        if cur not in RECORDING:
            prof.stop()  # nothing recorded, or only warm-up
            return
        self._cuda_step_end(self.step_num)
        if iteration_done and self._stepper is not None:
            # the step ends where its iteration did, and its CPU time with it (sampled there: _iteration_end)
            self._step_end_ns[self.step_num] = self._stepper.last_end_ns
            complete = cur is Action.RECORD_AND_SAVE
        else:
            self._cpu_mark_end(self.step_num)
            self._step_end_ns[self.step_num] = self._step_began_ns
            complete = False
        prof.on_trace_ready = None
        prof.stop()
        window = self._plan.window(self.step_num)
        self._clock.mark(window, 1)
        memsnap = self._memhist_end()
        results = prof.profiler.kineto_results if prof.profiler is not None else None
        if results is None:
            return
        if not complete:
            self._cut_short.append(window)
        self._submit(results, window, complete=complete, stop_s=0.0, memsnap=memsnap)

    def _submit(self, results, window: int, *, complete: bool, stop_s: float, ready_s: float = 0.0,
                memsnap: dict | None = None) -> None:
        self._ensure_info()
        peaks, self._cuda_peaks = self._cuda_peaks, {}
        memhist = ({"max_entries": self._memhist.max_entries, "stacks": self._memhist.stacks}
                   if self._memhist is not None else None)
        first, last = self._plan.steps_of(window)
        last = last if complete else self.step_num
        samples = None
        if self._sampler is not None:  # a back-to-back window resumes it at its begin
            samples = self._sampler.take()
            self._sampler.pause()
        self._writer.submit(WindowJob(
            results, window, complete, self._info, stop_s, ready_s, peaks, dict(self._cuda_baseline),
            groups.gloo_thread_pg(), groups.process_groups(), groups.backend_name(self._info.device_type),
            groups.backend_config(), dict(self._step_end_ns), memsnap=memsnap, memhist=memhist,
            cpu_marks=dict(self._cpu_marks), cpu_opt_marks=dict(self._cpu_opt_marks),
            cpu_end_marks=dict(self._cpu_end_marks), cpu_samples=samples,
            p2p_calls=p2p.drain(), trigger=self._trigger_attr(window), steps=(first, last), cpus=dist_info.cpu_budget()))

    def _trigger_attr(self, window: int) -> dict[str, Any] | None:
        """A triggered window's request and why it was asked for (its shards' ``trigger`` attribute)."""
        tw = self._plan.triggered_window(window)
        return None if tw is None else {"request_id": tw.request_id, "reason": tw.reason, "plan": tw.plan}

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
        message = str(exc) if isinstance(exc, (ClaimError, clock.ClockSyncError)) else f"{type(exc).__name__}: {exc}"
        with self._lock:
            self.errors.append({"stage": stage, "message": message})
            first = self._first_warning(WARN_FAILURE)
        if self.config.strict:
            self._strict_error = exc
        elif first:
            stops = disable and stage != "write"
            if isinstance(exc, ClaimError):
                log.warning("distprof: rank %s: %s; nothing is recorded, training goes on (--strict raises instead)",
                            self._rank_label(), exc)
            else:
                log.warning("distprof: rank %s: %s failed (%s); %s, training goes on (--strict raises instead)",
                            self._rank_label(), stage, message,
                            "profiling stops" if stops else "capture goes on without it")
        if disable and stage != "write" and self._state is ProfilerState.RUNNING:  # closing: recorded only
            inflight = self._recording_window()
            if inflight is not None and not self._in_callback:
                self._lose_extra(LostWindow(inflight[0], inflight[1], self.step_num, "profiling stopped",
                                            f"profiling stopped ({stage} failed: {message})"))
            self._disable()

    def _window_lost(self, lw: LostWindow) -> None:
        """The writer could not store a window: recorded; one warning per kind of reason (strict: raised)."""
        with self._lock:
            self.errors.append({"stage": "write", "message": f"window {lw.window} lost: {lw.reason}"})
            kind = status.kind_of(lw.reason)
            first = self._first_warning(f"lost:{kind}")
            self._warned_about.add(WARN_FAILURE)
        if self.config.strict:
            self._strict_error = OSError(f"window {lw.window} not saved: {lw.reason}")
        elif first:
            log.warning("distprof: rank %s: window %s not saved: %s; capture goes on, training is unaffected "
                        "(--strict raises instead)", self._rank_label(), lw.label(), lw.reason)
        else:
            log.info("distprof: rank %s: window %s not saved: %s", self._rank_label(), lw.label(), lw.reason)

    def _lose_extra(self, lw: LostWindow) -> None:
        with self._lock:
            if any(w.window == lw.window for w in self._extra_lost):
                return
            self._extra_lost.append(lw)

    def _disable(self) -> None:
        self._mark_disabled()
        if self._stepper is not None:
            self._stepper.remove()
        if self._trigger is not None:  # no window can be recorded now: rank 0 says so in its live file (not in one
            self._trigger.close(timeout_s=0, state=None if self._handed_over else "disabled")  # handed over)
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

    def _mark_failed_run(self) -> None:
        """The script failed on a rank that has not opened the run directory rank 0 claimed for the job (it had no
        window yet): open it, so that this rank's status file says why too."""
        if self._script_error is None or self.run_dir is not None or self._setup.agreement is None:
            return
        try:
            self._setup.ensure_run_dir(self._info.rank if self._info else int(os.environ.get("RANK", 0)), wait=False)
        except Exception as e:  # noqa: BLE001 -- the job is failing already; its status file is a nicety
            log.debug("distprof: no run directory for the failed script's status: %s", e)

    def _write_status(self, *, final: bool) -> None:
        if self.run_dir is None:
            return
        rank = self._info.rank if self._info else int(os.environ.get("RANK", 0))
        doc = status.document(
            rank=rank, run_id=self.run_id, job=self._setup.job.to_dict() if self._setup.job else None,
            note=self._setup.note, steps_seen=self.step_num, iterations=self.iterations,
            skipped_steps=self._stepper.skipped if self._stepper else 0, windows=list(self.windows_written),
            lost=self.lost, errors=list(self.errors), signal_num=self._signal, final=final,
            triggered_windows=self._trigger.records() if self._trigger is not None else [])
        if self._script_error is not None:  # a run without shards is marked failed: `distprof report` names it
            doc["script_error"] = self._script_error
        status.write(self.run_dir, rank, doc)

    def closing_line(self) -> str | None:
        """What the launcher prints for this rank when it closes (status.closing_line)."""
        hint = None
        if self._script_error is not None:  # its traceback follows; no guess about steps
            when = "before its first step" if self.iterations == 0 else \
                f"after {self.iterations} step(s), before a window was recorded"
            hint = f"nothing was recorded: the script failed {when} ({self._script_error.split(':', 1)[0]})"
        elif self.config.schedule.kind == "none":
            hint = ("no window was recorded: --schedule none records only windows asked for with `distprof trigger "
                    f"{self.run_dir or '<out>/<run-id>'}` while the job runs (none came)")
        elif self.config.step_on == "optimizer" and self.iterations == 0:
            hint = ("no optimizer step was seen, so no step was recorded: a loop without torch.optim needs "
                    "--step-on manual and a distprof.step() call at the end of each iteration")
        else:  # (a failure that stopped profiling is in the errors, which the closing line names instead)
            hint = ("no window was recorded (the job ran fewer steps than the schedule needs: "
                    f"see --wait/--warmup/--active; steps seen: {self.iterations})")
        rank = self._info.rank if self._info else int(os.environ.get("RANK", 0))
        return status.closing_line(rank=rank, run_dir=self.run_dir, written=len(self.windows_written),
                                   lost=self.lost, errors=list(self.errors), note=self._setup.note,
                                   signal_num=self._signal, cut_short=list(self._cut_short), no_window_hint=hint)
