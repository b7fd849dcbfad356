"""``--watch``: a few timings of every step on every rank, flushed to the run directory, and a window when a rank
drifts (docs/watch.md).

Training thread (:class:`WatchRecorder`): at each step boundary one row into a preallocated NumPy ring — the step's
wall time, and what the hooks added up during it: DataLoader ``__next__`` (data wait), the outermost optimizer step,
the time waiting at synchronisation points (capture/syncpoints.py: ``Work.wait`` of collectives and point-to-point
calls — every synchronous ``torch.distributed`` call and every explicit wait ends in it —, the functional
collectives' ``wait_tensor``, and the end of backward where DDP's reducer waits for its buckets), the device memory
peak on a GPU. A few ``perf_counter_ns`` calls and one row assignment per step; no lock, no store, no file.

Side thread (:class:`Watch`), every ``--watch-interval`` seconds:

* takes the new rows from the ring (on NCCL, once the device time of the collectives each step issued has come in
  through the completion hook: :data:`SETTLE_S`) and rewrites the rank's current segment file atomically
  (storage/watchfile.py): a crash loses at most what came after the last flush;
* publishes its own work (step time minus time blocked) of its latest steps, at most :data:`MAX_PUBLISH` of them, under
  one c10d store key of its own (one ``set`` per interval with new steps: O(1) per rank per interval). Each ``set``
  replaces the last, so it carries the steps rank 0 may not have read yet, not only those since the last one: rank 0
  reads a key once per :func:`read_interval_s`, and a publication it never read must not leave holes in its table;
* rank 0 reads the other ranks' keys (``check`` + ``get``, never a blocking wait for a missing key), at most
  :data:`STORE_READS_PER_S` per second for the whole job (a 1,000-rank job: every 10 s), feeds the steps every
  fresh rank has covered to the drift rule (distprof/drift.py) and, when a rank's drift is confirmed, asks the
  job's trigger (capture/trigger.py) for a window — the same placement, publication and answers as
  ``distprof trigger`` — at most one per ``--watch-cooldown`` seconds, and records why in watch/drifts.json.

Nothing here may hurt training: every failure is one warning (the profiler's), and the watch stops; the job goes on.
A write the output cannot take for a while (read-only, full) is not a failure of the watch: it is reported once,
its rows are kept, and the next turn writes them (capture/retry.py).
"""

from __future__ import annotations

import logging
import struct
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..drift import DriftRule, DriftSpan, DriftTracker, own_ms
from ..config import ProfileConfig
from ..storage import watchfile as wf
from ..storage.writer import remove_orphans
from . import dist_info, join, trigger_files as tf
from .retry import WriteSpell, transient
from .setup import RunSetup, is_distributed
from .syncpoints import BackwardTail, DeviceComm, MAX_COMPLETIONS, device_ms_per_row

log = logging.getLogger(__name__)

#: Rows the training thread can write before the side thread takes them (oldest overwritten first, counted).
RING_ROWS = 16_384
#: The most own-work values a rank publishes per interval (the latest steps).
MAX_PUBLISH = 512
#: Rank 0 reads at most this many other ranks' keys per second (two store calls each), whatever the job's size.
STORE_READS_PER_S = 100.0
#: Steps of every rank rank 0 keeps for the rule (must exceed the steps between two of its evaluations).
HISTORY_STEPS = 4096
#: Rows kept for the series while the output cannot take them (a spell of failed writes), at most.
MAX_PENDING_ROWS = 4 * 4096
#: A rank whose key has not moved for this many reading rounds is left out of "every rank has covered step s".
STALE_ROUNDS = 3
#: NCCL: a step's row waits this long after its end (or two of its steps, if longer) for the device times of the
#: collectives it issued (NCCL's watchdog hears a completion within ~0.1 s of it; the device may run a step behind).
SETTLE_S = 2.0
#: The module whose ``wait_tensor`` DTensor and tensor parallelism wait in (patched once it is imported).
FUNCOL = "torch.distributed._functional_collectives"
_PUB = struct.Struct("<qi")  # first step, number of float32 values that follow

_instances = 0
_NAN = float("nan")


def read_interval_s(interval_s: float, world_size: int) -> float:
    """Seconds between two reads of one rank's key by rank 0 (longer for big jobs: STORE_READS_PER_S overall)."""
    return max(interval_s, (world_size - 1) / STORE_READS_PER_S)


# ---- the training thread -------------------------------------------------------------------------------------
class WatchRecorder:
    """The per-step row and the hooks that add to it. `step_end` runs on the training thread; the hooks only count
    on it (`main_ident`); `take` on the side thread."""

    def __init__(self, main_ident: int, capacity: int = RING_ROWS) -> None:
        self.started_ns = time.time_ns()  # the first step's start (rank's clock)
        self.rows = np.zeros(capacity, wf.SERIES_DTYPE)
        self.n = 0  # rows written so far (the side thread reads it; written after the row)
        self.cap = capacity
        self.main_ident = main_ident
        self.data_ns = self.opt_ns = self.comm_ns = 0
        self._t_last = time.perf_counter_ns()
        self._opt_depth = 0
        self._opt_t0 = 0
        self._cuda = None
        self._originals: dict[str, tuple[Any, str, Any]] = {}
        self._handles: list = []
        self.tail = BackwardTail(lambda: self.comm_ns)  # DDP's reducer waits at the end of backward
        self.device = DeviceComm()  # NCCL: device time of every collective
        self._funcol = False  # wait_tensor patched
        # the step's row as its iteration finished (step, perf ns, time ns, data, opt, waited ns), until its boundary
        # comes: the loop's last step has none, and the close writes this (end_iteration)
        self._at_iteration_end: tuple[int, int, int, int, int, int] | None = None

    # -- hooks ------------------------------------------------------------------------------------------------
    def install(self) -> None:
        import torch

        if torch.cuda.is_available():
            self._cuda = torch.cuda
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        from .compiled import opaque

        self._handles = [register_optimizer_step_pre_hook(opaque(self._opt_pre)),
                         register_optimizer_step_post_hook(opaque(self._opt_post))]
        try:
            from torch._C._distributed_c10d import Work

            self._patch(Work, "wait", "comm_ns")
        except (ImportError, AttributeError):  # torch without distributed
            pass
        self.tail.install()
        self.device.install()
        self._patch_funcol()
        try:
            from torch.utils.data.dataloader import _BaseDataLoaderIter

            self._patch(_BaseDataLoaderIter, "__next__", "data_ns")
        except (ImportError, AttributeError):
            pass

    def _patch(self, cls, name: str, counter: str) -> None:
        import torch

        compiling = torch.compiler.is_compiling  # True while Dynamo traces
        orig = getattr(cls, name)
        rec = self
        get_ident = threading.get_ident
        clock = time.perf_counter_ns

        def timed(*args, **kwargs):
            # traced by torch.compile: the original alone, an op of the graph (capture/compiled.py)
            if compiling() or get_ident() != rec.main_ident:
                return orig(*args, **kwargs)
            t0 = clock()
            try:
                return orig(*args, **kwargs)
            finally:
                setattr(rec, counter, getattr(rec, counter) + clock() - t0)

        timed.__distprof_watch__ = orig  # type: ignore[attr-defined]
        timed.__name__ = getattr(orig, "__name__", name)
        timed.__doc__ = getattr(orig, "__doc__", None)
        setattr(cls, name, timed)
        self._originals[f"{cls.__name__}.{name}"] = (cls, name, orig)

    def _patch_funcol(self) -> None:
        """The functional collectives' wait (DTensor, tensor parallelism), once their module is imported."""
        mod = sys.modules.get(FUNCOL)
        if mod is not None and hasattr(mod, "wait_tensor"):
            self._funcol = True
            self._patch(mod, "wait_tensor", "comm_ns")

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.tail.remove()
        self.device.remove()
        for cls, name, orig in self._originals.values():
            cur = getattr(cls, name, None)
            if getattr(cur, "__distprof_watch__", None) is orig:
                setattr(cls, name, orig)
        self._originals = {}

    def _opt_pre(self, opt, args, kwargs) -> None:
        if join.shadowing():  # the rank ran out of inputs: Join's optimizer steps are no step's (capture/join.py)
            return
        if self._opt_depth == 0:
            self._opt_t0 = time.perf_counter_ns()
        self._opt_depth += 1
        self.tail.watch(opt)

    def _opt_post(self, opt, args, kwargs) -> None:
        if join.shadowing():
            return
        self._opt_depth = max(0, self._opt_depth - 1)
        if self._opt_depth == 0:
            self.opt_ns += time.perf_counter_ns() - self._opt_t0

    # -- per step ---------------------------------------------------------------------------------------------
    def iteration_end(self, step: int) -> None:
        """Training thread: step `step`'s iteration finished now (the primary optimizer's step returned; capture/
        stepper.py). Its row as it stands is kept for the close, should no boundary follow (the loop's last step,
        which otherwise no series would hold). The optimizer step whose post hook this runs from is counted."""
        t = time.perf_counter_ns()
        opt = self.opt_ns + (t - self._opt_t0 if self._opt_depth > 0 else 0)
        self._at_iteration_end = (step, t, time.time_ns(), self.data_ns, opt, self.comm_ns + self.tail.peek())

    def end_iteration(self) -> None:
        """At the close: the row of the step whose iteration finished and whose boundary never came, ending where its
        iteration did (what ran after the loop is no step's)."""
        kept, self._at_iteration_end = self._at_iteration_end, None
        if kept is None:
            return
        step, t, end_ns, data, opt, waited = kept
        peak = int(self._cuda.max_memory_allocated()) if self._cuda is not None else -1
        self._append(step, end_ns, t, data, opt, waited, peak)

    def step_end(self, step: int, profiler_resets_peak: bool) -> None:
        """Step `step` ended now. `profiler_resets_peak`: the profiler reads and resets the device peak at this
        boundary itself (a recorded step), so the watch only reads it."""
        t = time.perf_counter_ns()
        peak = -1
        cuda = self._cuda
        if cuda is not None:
            peak = int(cuda.max_memory_allocated())
            if not profiler_resets_peak:
                cuda.reset_peak_memory_stats()
        self._at_iteration_end = None
        self._append(step, time.time_ns(), t, self.data_ns, self.opt_ns, self.comm_ns + self.tail.take(), peak)
        self.data_ns = self.opt_ns = self.comm_ns = 0
        self._opt_depth = 0
        self.device.poll()
        if not self._funcol:
            self._patch_funcol()
        self._t_last = time.perf_counter_ns()

    def _append(self, step: int, end_ns: int, t: int, data: int, opt: int, waited: int, peak: int) -> None:
        """One step's row (`t`: its end on perf_counter_ns; the others ns); `n` counts it once it is written."""
        self.rows[self.n % self.cap] = (step, end_ns, (t - self._t_last) * 1e-6, data * 1e-6, opt * 1e-6,
                                        waited * 1e-6, peak, _NAN)
        self.n += 1

    def take(self, since: int) -> tuple[np.ndarray, int, int]:
        """Side thread: rows written since row number `since` -> (rows, new `since`, rows lost to the ring)."""
        n = self.n
        lost = max(0, n - since - self.cap)
        start = since + lost
        if n <= start:
            return self.rows[:0].copy(), n, lost
        idx = np.arange(start, n) % self.cap
        rows = self.rows[idx].copy()
        late = max(0, self.n - start - self.cap)  # overwritten while copying (the side thread was very late)
        if late:
            rows, lost = rows[late:], lost + late
        return rows, n, lost


# ---- the side thread -------------------------------------------------------------------------------------------
@dataclass
class _Peer:
    last_step: int = -1  # the latest step rank 0 has of this rank
    moved_round: int = 0  # the reading round in which it last moved


class Watch:
    """One rank's watch: the recorder on the training thread, flush / publish / (rank 0) compare on a side thread.

    `step`: the rank's current step; `trigger`: the job's Trigger (None: --no-trigger, drifts are only recorded);
    `on_error(stage, exc)`: the profiler's one warning.
    """

    def __init__(self, config: ProfileConfig, setup: RunSetup, *, trigger, step: Callable[[], int],
                 on_error: Callable[[str, BaseException], None]) -> None:
        self.config = config
        self.rule = DriftRule(config.watch.threshold, config.watch.steps)
        self.recorder = WatchRecorder(threading.get_ident())
        self._setup = setup
        self._trigger = trigger
        self._step = step
        self._on_error = on_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed = False
        #: the launcher offered its run directory to ranks its script started (``spawned.Handoff``): nothing is
        #: written into it until it takes the directory back (a started group's files are theirs)
        self.paused = False
        self._spell = WriteSpell("watch series", on_error)  # writes failing for a while: reported once, retried
        self._rank: int | None = None
        self._world = 1
        self._store = None
        self._prefix = ""
        self._run_dir: Path | None = None
        self._taken = 0  # ring rows taken
        self.lost_rows = 0
        self._seg = -1
        self._seg_rows = np.zeros(wf.SEGMENT_STEPS, wf.SERIES_DTYPE)
        self._seg_n = 0
        self._seg_dirty = False
        self._pending: list[np.ndarray] = []  # rows taken before the run directory was known
        self._held = np.zeros(0, wf.SERIES_DTYPE)  # NCCL: rows waiting for their collectives' device times
        self._issued = np.zeros(0, np.int64)  # NCCL completions not yet added to a row: issue time (ns) ...
        self._active = np.zeros(0, np.float64)  # ... and device time (ms)
        self._row_end = self.recorder.started_ns  # the end of the last row settled
        self.late_completions = 0  # completions heard after their step's row was settled (not counted)
        self._recent_own: np.ndarray = np.zeros(0)
        self._recent_first = -1
        self._published_to = -1  # the last step this rank published
        # rank 0
        self._hist = np.full((0, HISTORY_STEPS), np.nan, dtype=np.float32)
        self._hist_step = np.full(HISTORY_STEPS, -1, dtype=np.int64)
        self._peers: dict[int, _Peer] = {}
        self._round = 0
        self._cursor = 1
        self._next_read = 0.0
        self._evaluated_to = -1
        self._tracker = DriftTracker(self.rule)
        self._drifts: list[dict[str, Any]] = []
        self._drift_spans: list[DriftSpan | None] = []
        self._drifts_dirty = False
        self._cooldown_until = 0.0
        self._retry: tuple[int, float] | None = None  # (drift record, when) of a request refused while a window ran
        self._lock = threading.Lock()
        self.flushes = 0
        self.flush_s = 0.0

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        self.recorder.install()
        self._thread = threading.Thread(target=self._run, name="distprof-watch", daemon=True)
        self._thread.start()

    def step_end(self, step: int, profiler_resets_peak: bool) -> None:
        """Training thread, at each step boundary. Never raises."""
        if self._failed:
            return
        try:
            self.recorder.step_end(step, profiler_resets_peak)
        except Exception as e:  # noqa: BLE001
            self._fail(e)

    def iteration_end(self, step: int) -> None:
        """Training thread, as an iteration finishes (before its deferred boundary). Never raises."""
        if self._failed:
            return
        try:
            self.recorder.iteration_end(step)
        except Exception as e:  # noqa: BLE001
            self._fail(e)

    def end_iteration(self) -> None:
        """Training thread, at the close: the last iteration's step, when no boundary ended it. Never raises."""
        if self._failed:
            return
        try:
            self.recorder.end_iteration()
        except Exception as e:  # noqa: BLE001
            self._fail(e)

    def close(self, timeout_s: float = 10.0) -> None:
        """Last flush (every step recorded so far) and last publication; hooks removed. Bounded."""
        self._stop.set()
        try:
            self.recorder.remove()
        except Exception as e:  # noqa: BLE001
            self._fail(e)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def settle_drifts(self) -> None:
        """Rank 0, after the trigger closed (its final answers given): watch/drifts.json once more. The watch's own
        last write comes before the trigger's close, and a window recorded near the job's end is answered "done" (or
        "cut") only there. A request the job ended before placing is never answered: it is "cut". Never raises."""
        if self._failed or self.paused or self._rank != 0:
            return
        with self._lock:
            for d in self._drifts:
                if d.get("state") == "asked":
                    d.update(state="cut", message="the job ended before rank 0 placed a window for this drift")
                    self._drifts_dirty = True
        try:
            self._write_drifts()
        except OSError as e:
            self._spell.failed(e)
        except Exception as e:  # noqa: BLE001 -- one warning; the job's close goes on
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        if not self._failed:
            self._failed = True
            self._on_error("watch", e)

    # -- side thread --------------------------------------------------------------------------------------------
    def _run(self) -> None:
        tick = self.config.watch.interval_s
        try:
            while True:
                stopping = self._stop.is_set()
                self._work(time.monotonic(), final=stopping)
                if stopping:
                    return
                self._stop.wait(tick)
        except Exception as e:  # noqa: BLE001 -- one warning; training goes on
            self._fail(e)
            try:
                self.recorder.remove()
            except Exception:  # noqa: BLE001
                pass

    def _work(self, now: float, final: bool = False) -> None:
        if self._failed or self.paused:
            return
        if self._rank is None:
            self._identify()
        rows, self._taken, lost = self.recorder.take(self._taken)
        rows = self._settle(rows, final)
        if lost:
            self.lost_rows += lost
            log.info("distprof: watch: %d step rows lost (the side thread fell behind)", lost)
        if rows.size:
            self._remember(rows)
            self._pending.append(rows)
            self._bound_pending()
        try:  # a write that fails (the output read-only or full for a while) is kept and tried at the next turn
            self._write_files(final)
        except OSError as e:
            if not transient(e):
                raise  # a link or a file where the watch folder goes: the watch fails (one warning)
            self._spell.failed(e)
        if self._rank is None:
            return
        if self._store is not None:
            self._publish()
        if self._rank == 0:
            self._compare(now, final)
            try:
                self._write_drifts()
            except OSError as e:
                self._spell.failed(e)

    def _settle(self, rows: np.ndarray, final: bool) -> np.ndarray:
        """NCCL: each row gets the device time of the collectives its step issued (``dev_comm_ms``), once they have
        had SETTLE_S to complete (or two of its steps); the rows after wait for the next turn. Without NCCL groups
        the rows go as they are (``dev_comm_ms`` NaN: not measured)."""
        dev = self.recorder.device
        if not dev.active and not self._held.size:
            if rows.size:
                self._row_end = int(rows["end_ns"][-1])
            return rows
        issued, active = dev.drain()
        if issued.size:
            self._issued = np.concatenate([self._issued, issued])[-MAX_COMPLETIONS:]
            self._active = np.concatenate([self._active, active])[-MAX_COMPLETIONS:]
        rows = np.concatenate([self._held, rows]) if self._held.size else rows
        n = rows.size
        if not final and n:
            wait_ns = max(SETTLE_S * 1e9, 2e6 * float(rows["step_ms"][-1]))
            n = int(np.searchsorted(rows["end_ns"], time.time_ns() - wait_ns, side="right"))
        out, self._held = rows[:n].copy(), rows[n:].copy()
        if n:
            per, later = device_ms_per_row(self._row_end, out["end_ns"], self._issued, self._active)
            out["dev_comm_ms"] = np.where(out["end_ns"] > dev.since_ns, per, np.nan)
            self.late_completions += int(np.count_nonzero(~later & (self._issued <= self._row_end)))
            self._issued, self._active = self._issued[later], self._active[later]
            self._row_end = int(out["end_ns"][-1])
        return out

    def _bound_pending(self) -> None:
        """Rows waiting for the output (a long spell of failed writes) are bounded: the oldest go first, counted."""
        n = sum(r.size for r in self._pending)
        while n > MAX_PENDING_ROWS and len(self._pending) > 1:
            n -= self._pending[0].size
            self.lost_rows += self._pending.pop(0).size

    def _write_files(self, final: bool) -> None:
        """The watch directory once the run directory is known, then the series rows not yet on disk."""
        if self._rank is not None and self._run_dir is None:
            run_dir = self._setup.ensure_run_dir(self._rank, wait=final)
            if run_dir is not None:
                wf.ensure_watch_dir(run_dir)  # a link planted at RUN_DIR/watch is refused
                remove_orphans(run_dir / wf.WATCH_DIR, self._rank)  # an earlier crash's temporary files
                self._run_dir = run_dir
        if self._run_dir is not None and (self._pending or self._seg_dirty):
            t0 = time.perf_counter()
            self._flush()
            self._spell.succeeded()
            self.flush_s += time.perf_counter() - t0
            self.flushes += 1

    def _identify(self) -> None:
        import torch.distributed as dist

        global _instances
        if dist.is_available() and dist.is_initialized():
            from torch.distributed import distributed_c10d as c10d

            self._world = dist.get_world_size()
            rank = dist.get_rank()
            if self._world > 1:
                store = c10d._get_default_store()
                self._store = store.clone() if hasattr(store, "clone") else store
                _instances += 1
                self._prefix = f"{dist_info.store_prefix('watch')}{_instances}/"
            self._join(rank)
        elif not is_distributed():
            self._join(0)
        elif self._setup.agreement is not None:
            # the group is gone already (a job shorter than one tick, closing): no store to publish to, but the rank
            # is known, and its series still goes to the run directory
            self._join(self._setup.agreement.rank)

    def _join(self, rank: int) -> None:
        self._rank = rank
        if rank == 0:
            self._hist = np.full((self._world, HISTORY_STEPS), np.nan, dtype=np.float32)
            self._peers = {r: _Peer() for r in range(1, self._world)}

    # -- the series file ----------------------------------------------------------------------------------------
    def _flush(self) -> None:
        rows = np.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0] if self._pending else None
        self._pending = []
        try:
            self._flush_rows(rows)
        except BaseException:  # not written: every row stays to be written (rows already kept are skipped then)
            if rows is not None:
                self._pending.insert(0, rows)
            raise

    def _flush_rows(self, rows: np.ndarray | None) -> None:
        if rows is not None:
            segs = rows["step"] // wf.SEGMENT_STEPS
            for seg in np.unique(segs):
                part = rows[segs == seg]
                if seg != self._seg:
                    if self._seg_dirty:
                        self._write_segment()
                    self._seg, self._seg_n = int(seg), 0
                keep = part[part["step"] > (self._seg_rows["step"][self._seg_n - 1] if self._seg_n else -1)]
                k = min(keep.size, wf.SEGMENT_STEPS - self._seg_n)
                self._seg_rows[self._seg_n:self._seg_n + k] = keep[:k]
                self._seg_n += k
                self._seg_dirty = True
        if self._seg_dirty:
            self._write_segment()

    def _write_segment(self) -> None:
        wf.write_segment(wf.segment_path(self._run_dir, self._rank, self._seg), self._seg_rows[:self._seg_n])
        self._seg_dirty = False

    # -- publishing own work --------------------------------------------------------------------------------------
    def _remember(self, rows: np.ndarray) -> None:
        """The latest own-work values (at most MAX_PUBLISH steps), for the next publication / rank 0's table."""

        own = own_ms(rows).astype(np.float32)
        steps = rows["step"]
        if self._rank == 0 or self._rank is None:
            self._own_into_hist(0, steps, own)
        if self._recent_first >= 0 and steps.size and steps[0] == self._recent_first + self._recent_own.size:
            own = np.concatenate([self._recent_own, own])
            first = self._recent_first
        else:
            first = int(steps[0]) if steps.size else -1
        if own.size > MAX_PUBLISH:
            first += own.size - MAX_PUBLISH
            own = own[-MAX_PUBLISH:]
        self._recent_own, self._recent_first = own, first

    def _publish(self) -> None:
        if self._rank == 0 or self._recent_first < 0:
            return
        last = self._recent_first + self._recent_own.size - 1
        if last <= self._published_to:
            return
        # the latest MAX_PUBLISH steps, not only those since the last set: it overwrites the key, and a set rank 0 did
        # not read before the next one (its reads are paced; a busy host delays them) would otherwise be lost, its
        # steps a hole in rank 0's table that breaks a drift's run of flagged steps (it then starts late or never)
        vals = self._recent_own
        payload = _PUB.pack(self._recent_first, vals.size) + vals.astype("<f4").tobytes()
        self._store.set(f"{self._prefix}r/{self._rank}", payload)
        self._published_to = last

    # -- rank 0: compare ------------------------------------------------------------------------------------------
    def _own_into_hist(self, i: int, steps: np.ndarray, own: np.ndarray) -> None:
        if self._hist.shape[0] == 0:
            return
        cols = steps % HISTORY_STEPS
        fresh = self._hist_step[cols] != steps
        if fresh.any():
            c = cols[fresh]
            self._hist[:, c] = np.nan
            self._hist_step[c] = steps[fresh]
        self._hist[i, cols] = own

    def _read_peers(self, now: float) -> None:
        """Read the keys of up to STORE_READS_PER_S x the time since the last read of the other ranks."""
        if self._store is None or self._world <= 1 or now < self._next_read:
            return
        budget = max(1, int(STORE_READS_PER_S * max(self.config.watch.interval_s, 1e-3)))
        n = min(budget, self._world - 1)
        for _ in range(n):
            r = self._cursor
            self._cursor = 1 + (self._cursor % (self._world - 1))
            if self._cursor == 1:
                self._round += 1
            key = f"{self._prefix}r/{r}"
            if not self._store.check([key]):
                continue
            raw = self._store.get(key)
            first, k = _PUB.unpack_from(raw)
            if not (0 <= k <= MAX_PUBLISH and len(raw) == _PUB.size + 4 * k and first >= 0):
                raise ValueError(f"watch: rank {r}'s summary in the store is malformed ({len(raw)} bytes)")
            vals = np.frombuffer(raw, "<f4", k, _PUB.size)
            steps = np.arange(first, first + k, dtype=np.int64)
            p = self._peers[r]
            if k and steps[-1] > p.last_step:
                keep = steps > max(p.last_step, self._evaluated_to)
                self._own_into_hist(r, steps[keep], vals[keep])
                p.last_step, p.moved_round = int(steps[-1]), self._round
        self._next_read = now + read_interval_s(self.config.watch.interval_s, self._world) * n / (self._world - 1)

    def _compare(self, now: float, final: bool) -> None:
        self._read_peers(now)
        mine = self._recent_first + self._recent_own.size - 1 if self._recent_first >= 0 else -1
        fresh = [p.last_step for p in self._peers.values() if p.last_step >= 0
                 and self._round - p.moved_round <= STALE_ROUNDS]
        if self._world > 1 and not fresh:
            return
        upto = min([mine, *fresh])
        lo = max(self._evaluated_to + 1, upto - HISTORY_STEPS + 1)
        if upto < lo:
            self._service_retry(now)
            return
        steps = np.arange(lo, upto + 1, dtype=np.int64)
        cols = steps % HISTORY_STEPS
        own = self._hist[:, cols].astype(np.float64)
        own[:, self._hist_step[cols] != steps] = np.nan
        self._evaluated_to = upto
        for sp in self._tracker.feed(steps, np.arange(self._world), own):
            self._drift_found(sp, now)
        self._service_retry(now)
        with self._lock:
            if any(s is not None and s.open for s in self._drift_spans):
                self._drifts_dirty = True

    def _drift_found(self, sp: DriftSpan, now: float) -> None:
        d = {**sp.to_dict(), "id": len(self._drifts), "detected_ns": time.time_ns(), "rank0_step": self._step(),
             "request_id": None, "state": "", "message": ""}
        log.warning("distprof: watch: rank %d drifts: own work %.1f ms/step vs the other ranks' median %.1f ms "
                    "(+%.1f ms) for %d steps from step %d", sp.rank, sp.own_ms, sp.peers_ms, sp.excess_ms,
                    sp.n_flagged, sp.first_step)
        with self._lock:
            self._drifts.append(d)
            self._drift_spans.append(sp)
            self._drifts_dirty = True
        self._ask_window(len(self._drifts) - 1, now)

    def _ask_window(self, i: int, now: float) -> None:
        d = self._drifts[i]
        if self._trigger is None:
            self._set(i, state="not_asked", message="--no-trigger: the drift is recorded, no window is asked for")
            return
        if now < self._cooldown_until:
            self._set(i, state="cooldown", message=f"a window was asked for less than --watch-cooldown "
                                                   f"{self.config.watch.cooldown_s:g} s ago; none asked for this drift")
            return
        rid = f"watch-{self._trigger.session}-{i}"
        reason = (f"watch: rank {d['rank']} own work {d['own_ms']:.1f} ms/step, {d['excess_ms']:+.1f} ms "
                  f"({d['excess_pct']}%) over the other ranks' median {d['peers_ms']:.1f} ms for {d['flagged_steps']}"
                  f" steps from step {d['first_step']}")
        req = tf.TriggerRequest(rid, None, None, self._trigger.session, time.time_ns(), reason=reason)
        self._cooldown_until = now + self.config.watch.cooldown_s
        self._set(i, request_id=rid, state="asked", reason=reason)
        self._trigger.submit(req, on_answer=lambda a, i=i: self._answered(i, a))

    def _answered(self, i: int, a: tf.TriggerAnswer) -> None:
        """The trigger's side thread: rank 0's answer to a watch request."""
        self._set(i, state=a.state, message=a.message, window=a.window, window_first=a.first, window_last=a.last,
                  decided_at_step=a.step)
        if a.state == "refused" and "already" in a.message:  # a window was running: ask again once it is over
            with self._lock:
                self._cooldown_until = 0.0
                self._retry = (i, time.monotonic() + self.config.watch.interval_s)

    def _service_retry(self, now: float) -> None:
        with self._lock:
            retry = self._retry
        if retry is None or now < retry[1]:
            return
        i = retry[0]
        sp = self._drift_spans[i]
        with self._lock:
            self._retry = None
        if sp is not None and sp.open:
            self._ask_window(i, now)

    def _set(self, i: int, **fields: Any) -> None:
        with self._lock:
            self._drifts[i].update(fields)
            self._drifts_dirty = True

    def _write_drifts(self) -> None:
        with self._lock:
            if not self._drifts_dirty or self._run_dir is None:
                return
            self._drifts_dirty = False
            docs = []
            for d, sp in zip(self._drifts, self._drift_spans):
                if sp is not None:
                    d.update({k: v for k, v in sp.to_dict().items() if k != "confirmed_step"})
                docs.append(dict(d))
        try:
            wf.write_drifts(self._run_dir, docs)
        except OSError:
            with self._lock:
                self._drifts_dirty = True  # written at the next turn
            raise
        self._spell.succeeded()
