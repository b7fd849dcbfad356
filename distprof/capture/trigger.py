"""On-demand windows in a running job (``distprof trigger RUN_DIR``), without ever holding a rank up.

How a request becomes a window every rank records:

1. The CLI writes ``trigger.json`` into the run directory (capture/trigger_files.py).
2. Rank 0's side thread looks for it at most every ``trigger_poll_s`` seconds (one ``stat``), reads and checks it,
   and leaves it in an in-box.
3. At its next step boundary rank 0's training thread takes it (an attribute test per step otherwise) and places the
   window: warm-up from step ``begin`` = now + 1 + max(margin, what the other ranks need to hear of it:
   :func:`lead_steps`, its step rate times :func:`lead_s` with room), moved past any window of the schedule; recorded
   steps ``first``..``last``. It adds the window to its :class:`~distprof.capture.schedule.WindowPlan` at once, so
   rank 0 is never late. It takes a request only once it knows its step rate (the job has stepped through two of its
   looks, or has been slow for a while).
4. Rank 0's side thread publishes the window under a numbered key of the job's c10d store (one ``set``) and answers in
   ``trigger.answer.json``.
5. Every other rank's side thread checks the store for the next numbered key every :func:`check_interval_s` (one
   ``check``, plus one ``get`` when it is there: O(1) store traffic per rank, at most :data:`STORE_CHECKS_PER_S`
   checks per second for the whole job) and leaves the window in its in-box; its training thread adds it at its next
   step boundary. A rank that is still before ``first`` records it (warming up for the steps left); one already at
   or past ``first`` records nothing of it (a window starting late would hold other steps than its peers') and says
   so (a store counter and its rank appended to a list); its status file records the lost window.
6. Each rank adds one to the window's "done" counter once its shard is written; rank 0 follows the counters and
   rewrites the answer: "recorded", then "done" (or "incomplete" when a rank stays silent, "cut" when the job ended
   mid-window).

A write of rank 0's answer or live file that the output does not take for a while (remounted read-only, full) is
reported once, kept, and written at the side thread's next turn: triggers go on. The live file says "closed" at the
end of every job that ends (finished, failed, or ended by a signal): the closing thread writes it when the side
thread could not.

Nothing here blocks the training thread: it never touches the store or a file. The side thread uses its own clone of
the store (``Store.clone()``: a connection of its own), so even a slow store holds up only the side thread.

Triggered windows are numbered after the schedule's own windows (``static_windows + n``), the same on every rank, and
land in the shards like any window. A schedule without end (``--repeat 0``) leaves no number for them: such a job
refuses triggers (use ``--schedule none`` or a bounded ``--repeat``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import socket
import threading
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from ..config import ProfileConfig
from . import dist_info, trigger_files as tf
from .schedule import TriggeredWindow, WindowPlan, static_windows
from .retry import WriteSpell
from .setup import RunSetup, is_distributed

log = logging.getLogger(__name__)

#: The whole job checks the store at most this often per second (world size / interval), whatever its size.
STORE_CHECKS_PER_S = 200.0
#: How long rank 0 waits for the other ranks to say they recorded a window (after its own shard is written).
FOLLOW_S = 120.0
#: At close, how long rank 0 waits for the other ranks' word on a window still followed.
CLOSE_WAIT_S = 5.0
#: Rank 0's step rate is measured over this many seconds.
RATE_SPAN_S = 10.0
#: Rank 0's recent step rate is measured over at least this many seconds (or two ticks, where --trigger-poll-s is
#: shorter): its side thread also wakes early (a drift, a request), and one step within a few ms of an early wake
#: read as 35 steps/s on a job of 12, which placed a watch's window 79 steps ahead, past the job's end.
RECENT_S = 1.0
#: Rank 0 rewrites distprof.live.json at least this far apart.
MIN_HEARTBEAT_S = 2.0

_instances = 0  # per process: each trigger that joins a store uses fresh keys (every rank makes the same sequence)


def check_interval_s(poll_s: float, world_size: int) -> float:
    """Seconds between two store checks of one rank: `poll_s`, longer for big jobs (STORE_CHECKS_PER_S overall)."""
    return max(poll_s, world_size / STORE_CHECKS_PER_S)


def lead_s(poll_s: float, world_size: int) -> float:
    """How long after rank 0 decides a window every other rank has heard of it, with room: it is published at once,
    each rank checks every check_interval_s (and may be mid-step), and a loaded host delays a side thread."""
    return 2 * check_interval_s(poll_s, world_size) + 0.5


#: Rank 0 places a window as if it ran this much faster than measured (a job still speeding up).
RATE_SAFETY = 1.5


def step_rate(samples, recent_s: float = RECENT_S) -> float | None:
    """Steps per second from rank 0's (monotonic time, step) samples, oldest first; None while not known. Known once
    the samples span `recent_s` and the job stepped in each of the last two (a job that has just begun stepping may
    still speed up), or they span half of RATE_SPAN_S; then the faster of the rate over all of them and the rate over
    the last `recent_s` (from the latest sample at least that old), however close together the samples came."""
    if len(samples) < 3:
        return None
    (t0, s0), (t1, s1) = samples[0], samples[-1]
    sa, sb = samples[-3][1], samples[-2][1]
    span = t1 - t0
    if not (sb > sa and s1 > sb and span >= recent_s) and span < RATE_SPAN_S / 2:
        return None
    tr, sr = next(((t, st) for t, st in reversed(samples) if t1 - t >= recent_s), (t0, s0))
    return max((s1 - s0) / max(span, 1e-3), (s1 - sr) / max(t1 - tr, 1e-3))


def lead_steps(rate: float | None, poll_s: float, world_size: int) -> int:
    """Steps rank 0 runs while the others hear of a window, at `rate` steps/s (None: not measured yet)."""
    if world_size <= 1 or not rate:
        return 0
    return int(math.ceil(RATE_SAFETY * rate * lead_s(poll_s, world_size)))


@dataclass
class _Decision:
    """Rank 0's training thread, on a request: the window placed, or why not."""

    request: tf.TriggerRequest
    step: int
    window: TriggeredWindow | None
    refusal: str = ""


@dataclass
class _Adopted:
    """Another rank's training thread, on a published window: recorded or learnt too late."""

    window: TriggeredWindow
    step: int
    recorded: bool


@dataclass
class _Followed:
    """Rank 0: a window being followed until every rank has said whether it recorded."""

    window: TriggeredWindow
    answer: tf.TriggerAnswer
    rank0_done_at: float = 0.0  # monotonic time rank 0's shard was written (0: not yet)


class Trigger:
    """One rank's part in triggered windows. `adopt` runs on the training thread; everything else on a side thread.

    `step`: the rank's current global step; `written`: its writer's list of shards written; `on_error(stage, exc)`:
    report a failure (warned once, never raised into training).
    """

    def __init__(self, config: ProfileConfig, setup: RunSetup, plan: WindowPlan, *, step: Callable[[], int],
                 written: Callable[[], list[dict[str, Any]]], on_error: Callable[[str, BaseException], None]) -> None:
        self.config = config
        self.inbox: tf.TriggerRequest | TriggeredWindow | None = None  # side thread -> training thread
        self.session = uuid.uuid4().hex[:12]
        self._setup = setup
        self._plan = plan
        self._step = step
        self._written = written
        self._on_error = on_error
        self._outbox: queue.Queue = queue.Queue()  # training thread -> side thread
        self._submitted: queue.Queue = queue.Queue()  # rank 0: requests from this process (the watch's drifts)
        self._listeners: dict[str, Callable[[tf.TriggerAnswer], None]] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        #: the launcher offered its run directory to ranks its script started (``spawned.Handoff``): its side thread
        #: touches no file there until it takes the directory back
        self.paused = False
        self._thread: threading.Thread | None = None
        self._started_ns = time.time_ns()
        self._rank: int | None = None
        self._world = 1
        self._store = None
        self._store_gone = False
        self._prefix = ""
        self._next_plan = 0  # other ranks: the next plan key to look for
        self._rate: float | None = None  # rank 0: steps per second lately (side thread writes, training reads)
        self._samples: deque = deque()
        self._records: list[dict[str, Any]] = []  # this rank's triggered windows, for its status file
        self._to_confirm: dict[int, TriggeredWindow] = {}  # window index -> recorded here, shard not yet confirmed
        self._followed: dict[int, _Followed] = {}
        self._run_dir: Path | None = None
        self._request_sig: tuple | None = None
        self._handled: set[str] = set()
        self._deciding: str | None = None
        self._next_heartbeat = 0.0
        self._next_poll = 0.0
        self._next_check = 0.0
        self._final_state: str | None = "closed"
        self._unwritten: dict[str, dict[str, Any]] = {}  # rank 0: file name -> latest document not yet on disk
        self._spell = WriteSpell("trigger files", on_error)  # writes failing for a while: reported once, retried
        self._files = threading.Lock()  # the side thread and a closing thread may both write
        self._live_final = False  # the live file says how the job ended ("closed" / "disabled")

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="distprof-trigger", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = CLOSE_WAIT_S + 5.0, state: str | None = "closed") -> None:
        """The job's profiler closes (its writer is done): last confirmations, final answers, the live file
        `state` ("closed"; "disabled" when the profiler stopped after an error; None: not written, the process handed
        the run over to the ranks it started). Bounded: the side thread is a daemon
        and is left behind if the store does not answer."""
        if not self._stop.is_set():
            self._final_state = state
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.debug("distprof: trigger side thread still busy at close")
        self._say_ended(timeout_s)

    def _say_ended(self, timeout_s: float) -> None:
        """Rank 0: the live file says how the job ended even when the side thread could not (it died, is stuck in a
        store call, or its last write failed): written from here, tried until `timeout_s` is spent."""
        if self._rank != 0 or self._run_dir is None or self._live_final or self._final_state is None or self.paused:
            return
        if self._thread is not None and self._thread.is_alive() and timeout_s <= 0:
            return  # it writes the final state itself (the training thread does not wait for a file)
        deadline = time.monotonic() + max(0.0, timeout_s)
        while not self._write_live(self._final_state) and time.monotonic() < deadline:
            time.sleep(0.2)

    def say_closed(self) -> None:
        """Rank 0, any thread, the process about to end by a signal: the live file says "closed" now (the next
        heartbeat says "running" again should the process go on)."""
        if self._rank == 0 and self._run_dir is not None and not self.paused:
            self._write_live("closed")

    def submit(self, req: tf.TriggerRequest, on_answer: Callable[[tf.TriggerAnswer], None] | None = None) -> None:
        """Rank 0, any thread: ask for a window as if `distprof trigger` had written `req` (capture/watch.py's
        drifts). Taken on the side thread like a request file: the same checks, placement, publication and answers
        (trigger.answer.json); `on_answer` hears each answer to it (on the side thread; it must not block)."""
        if on_answer is not None:
            self._listeners[req.request_id] = on_answer
        self._submitted.put(req)
        self._wake.set()

    def records(self) -> list[dict[str, Any]]:
        """This rank's triggered windows (status file): plan, window, steps, recorded, late_at_step."""
        return list(self._records)

    # -- training thread ----------------------------------------------------------------------------------------
    def adopt(self, step: int) -> None:
        """At a step boundary (`step` just ended, step + 1 is next), when `inbox` holds something. Never raises."""
        item, self.inbox = self.inbox, None
        try:
            if isinstance(item, tf.TriggerRequest):
                self._outbox.put(self._decide(item, step))
            elif isinstance(item, TriggeredWindow):
                # in time while torch has not been asked about the first recorded step (`step` + 1 is asked next);
                # learnt during the warm-up, the rank warms up for the steps left
                record = item.first > step
                self._plan.add(item, record=record)
                self._outbox.put(_Adopted(item, step, record))
            else:
                return
        except Exception as e:  # noqa: BLE001 -- a trigger never stops training or the profiler
            self._on_error("trigger", e)
        self._wake.set()

    def _decide(self, req: tf.TriggerRequest, step: int) -> _Decision:
        """Rank 0: place the requested window (or say why not) as of the step boundary after `step`."""
        cfg = self.config
        sched = cfg.schedule
        if static_windows(sched) is None:
            return _Decision(req, step, None, "the job's schedule records windows without end (--repeat 0), which "
                                              "leaves no window number for a triggered one; start it with "
                                              "--schedule none or a bounded --repeat")
        for s in (step, step + 1):
            busy = self._plan.busy(s)
            if busy is not None:
                w, begin, first, last = busy
                return _Decision(req, step, None, f"window {w} is already running (warm-up from step {begin}, "
                                                  f"recording steps {first}..{last}; rank 0 is at step {step}); "
                                                  f"ask again after step {last}")
        pending = self._plan.pending(step)
        if pending is not None:
            return _Decision(req, step, None, f"window {pending.index} is already scheduled (steps {pending.first}.."
                                              f"{pending.last}, asked by request {pending.request_id}); ask again "
                                              f"after step {pending.last}")
        n = req.steps if req.steps is not None else sched.active
        margin = req.margin if req.margin is not None else cfg.trigger.margin
        ahead = max(margin, lead_steps(self._rate, cfg.trigger.poll_s, self._world))
        begin = self._plan.place(step + 1 + ahead, sched.warmup, n)
        if begin is None:
            return _Decision(req, step, None, f"the schedule leaves no gap of {sched.warmup + n} steps (warm-up + "
                                              f"{n}) between its windows; ask for fewer steps")
        tw = TriggeredWindow(len(self._plan.triggered), self._plan.next_index(), begin, begin + sched.warmup,
                             begin + sched.warmup + n - 1, req.request_id, req.reason)
        self._plan.add(tw, record=True)
        return _Decision(req, step, tw)

    # -- side thread --------------------------------------------------------------------------------------------
    def _run(self) -> None:
        tick = self.config.trigger.poll_s
        try:
            while True:
                stopping = self._stop.is_set()
                if not self.paused:
                    self._work(time.monotonic())
                if stopping:
                    if not self.paused:
                        self._finish()
                    return
                self._wake.wait(tick)
                self._wake.clear()
        except Exception as e:  # noqa: BLE001 -- reported once; training and the other windows go on
            self._on_error("trigger", e)

    def _work(self, now: float) -> None:
        if self._rank is None and not self._identify():
            return
        self._sample_rate(now)
        self._drain()
        self._confirm_written()
        if self._rank == 0:
            if self._run_dir is None:
                self._run_dir = self._setup.ensure_run_dir(0, wait=False)
                if self._run_dir is not None:
                    tf.remove_temporaries(self._run_dir)
            if self._run_dir is None:
                return
            self._retry_unwritten()
            self._take_submitted()
            if now >= self._next_poll:
                self._next_poll = now + self.config.trigger.poll_s
                self._poll_request()
            self._follow(now)
            if now >= self._next_heartbeat:
                self._next_heartbeat = now + max(MIN_HEARTBEAT_S, self.config.trigger.poll_s)
                self._write_live("running")
        elif now >= self._next_check and self.inbox is None:
            self._next_check = now + check_interval_s(self.config.trigger.poll_s, self._world)
            self._check_store()

    def _identify(self) -> bool:
        """This rank and the store, once torch.distributed is up (a job of one process needs neither)."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            from torch.distributed import distributed_c10d as c10d

            world = dist.get_world_size()
            store = None
            if world > 1:
                store = c10d._get_default_store()
                store = store.clone() if hasattr(store, "clone") else store
            self.join(dist.get_rank(), world, store)
            return True
        if not is_distributed():
            self.join(0, 1, None)
            return True
        return False

    def join(self, rank: int, world_size: int, store, prefix: str | None = None) -> None:
        """Take part as `rank` of `world_size`, talking through `store` (this thread's own; None for one process)
        under `prefix` (default: this process's next trigger, the same on every rank, in this restart of the job)."""
        global _instances
        self._world, self._store = world_size, store
        if store is not None and prefix is None:
            _instances += 1
            prefix = f"{dist_info.store_prefix('trigger')}{_instances}/"
        self._prefix = prefix or ""
        self._rank = rank

    def _key(self, plan: int, what: str = "") -> str:
        return f"{self._prefix}plan/{plan}" + (f"/{what}" if what else "")

    def _sample_rate(self, now: float) -> None:
        """Rank 0: its step rate (:func:`step_rate`), one sample per tick, over the last RATE_SPAN_S."""
        if self._rank != 0:
            return
        self._samples.append((now, self._step()))
        while len(self._samples) > 3 and now - self._samples[0][0] > RATE_SPAN_S:
            self._samples.popleft()
        rate = step_rate(self._samples, min(RECENT_S, 2 * self.config.trigger.poll_s))  # two ticks at the least
        if rate is not None:
            self._rate = rate

    def _drain(self) -> None:
        """What the training thread decided or adopted: publish, answer, report."""
        while True:
            try:
                item = self._outbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Decision):
                self._published(item)
            elif isinstance(item, _Adopted):
                self._adopted(item)

    # -- rank 0 ---------------------------------------------------------------------------------------------------
    def _take_submitted(self) -> None:
        """A request from this process, once there is somebody to tell and a step rate to place it by."""
        if self._submitted.empty() or self._deciding is not None:
            return
        if self._world > 1 and (self._store is None or self._rate is None) and not self._store_gone:
            return
        self._take(self._submitted.get_nowait())

    def _poll_request(self) -> None:
        path = self._run_dir / tf.REQUEST_NAME
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._request_sig = None
            return
        sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        if sig == self._request_sig:
            return
        if self._world > 1 and (self._store is None or self._rate is None):
            return  # nobody to tell yet, or how far ahead to place the window not known yet: read it next time
        self._request_sig = sig
        try:
            req = tf.read_request(path)
        except FileNotFoundError:
            return
        except tf.TriggerFileError as e:
            self._answer(tf.TriggerAnswer(None, "invalid", f"{e} (the job goes on, nothing recorded)"))
            return
        if req.request_id in self._handled:
            return
        stale = (req.session != self.session) if req.session is not None else st.st_mtime_ns < self._started_ns
        if stale:
            self._handled.add(req.request_id)
            self._answer(tf.TriggerAnswer(req.request_id, "stale", f"{path}: written for another start of this job "
                                          f"(session {req.session or 'unknown'}, this one is {self.session}); "
                                          "nothing recorded: run `distprof trigger` again"))
            return
        self._take(req)

    def _take(self, req: tf.TriggerRequest) -> None:
        """A checked request (a file's, or submitted): refused with a reason, or left for the training thread."""
        if req.request_id in self._handled:
            return
        self._handled.add(req.request_id)
        if self._store_gone:
            self._answer(tf.TriggerAnswer(req.request_id, "refused", "the job's c10d store stopped answering (the "
                                                                     "script destroyed its process group, or the "
                                                                     "store's host is gone); nothing recorded"))
            return
        if self._deciding is not None:
            self._answer(tf.TriggerAnswer(req.request_id, "refused", f"request {self._deciding} is being "
                                                                     "scheduled; ask again in a moment"))
            return
        self._deciding = req.request_id
        self.inbox = req

    def _published(self, d: _Decision) -> None:
        """Rank 0: the training thread placed (or refused) a request's window."""
        self._deciding = None
        rid = d.request.request_id
        if d.window is None:
            self._answer(tf.TriggerAnswer(rid, "refused", d.refusal, step=d.step))
            return
        tw = d.window
        if self._store is not None:
            doc = {"v": 1, **asdict(tw)}
            self._store_call(lambda: self._store.set(self._key(tw.plan), json.dumps(doc)))
        self._record(tw, d.step, True)
        if tw.begin == tw.first:
            when = f"steps {tw.first}..{tw.last}"
        else:
            when = f"steps {tw.first}..{tw.last} (warm-up from step {tw.begin})"
        answer = tf.TriggerAnswer(rid, "scheduled", f"window {tw.index}: {when}; rank 0 is at step {d.step}",
                                  window=tw.index, begin=tw.begin, first=tw.first, last=tw.last, step=d.step)
        self._followed[tw.index] = _Followed(tw, answer)
        self._answer(answer)

    def _follow(self, now: float, final: bool = False) -> None:
        """Rank 0: per window followed, rank 0's shard, the other ranks' counters, the answer."""
        for index, f in list(self._followed.items()):
            a = f.answer
            mine = next((w for w in self._written() if w.get("window") == index), None)
            if mine is None and not final:
                continue
            if mine is not None and not mine.get("complete", False):
                self._finish_window(f, "cut", f"the job ended before step {f.window.last}: window {index} holds "
                                              f"steps {_span(mine.get('steps'))} (a partial window)")
                continue
            if mine is None:  # final, and rank 0 has no shard of it
                self._finish_window(f, "cut", f"the job ended at step {self._step()}, before window {index} "
                                              f"(steps {f.window.first}..{f.window.last}) was recorded")
                continue
            if not f.rank0_done_at:
                f.rank0_done_at = now
            done, late = self._counts(f.window.plan)
            a.ranks_recorded = done
            a.ranks_late = self._late_ranks(f.window.plan) if late else []
            if done + late >= self._world:
                lost = f"; ranks {_ranks(a.ranks_late)} learnt of it too late and recorded nothing" if late else ""
                self._finish_window(f, "done", f"window {index}: steps {f.window.first}..{f.window.last} recorded "
                                               f"on {done} of {self._world} rank(s){lost}")
            elif final or now - f.rank0_done_at > FOLLOW_S:
                self._finish_window(f, "incomplete", f"window {index}: steps {f.window.first}..{f.window.last} "
                                                     f"recorded on {done} of {self._world} rank(s) that said so; "
                                                     f"{self._world - done - late} said nothing")
            elif a.state != "recorded":
                a.state = "recorded"
                a.message = (f"window {index}: steps {f.window.first}..{f.window.last} recorded on rank 0; "
                             f"{done} of {self._world} rank(s) have written theirs")
                self._answer(a)

    def _finish_window(self, f: _Followed, state: str, message: str) -> None:
        f.answer.state, f.answer.message = state, message
        self._answer(f.answer)
        del self._followed[f.window.index]

    def _counts(self, plan: int) -> tuple[int, int]:
        if self._world <= 1:
            return 1, 0  # asked once rank 0's own shard is written
        done = self._store_call(lambda: self._store.add(self._key(plan, "done"), 0))
        late = self._store_call(lambda: self._store.add(self._key(plan, "late"), 0))
        return int(done or 0), int(late or 0)

    def _late_ranks(self, plan: int) -> list[int]:
        key = self._key(plan, "late_ranks")
        if not self._store_call(lambda: self._store.check([key])):
            return []
        raw = (self._store_call(lambda: self._store.get(key)) or b"").decode(errors="replace")
        return sorted({int(x) for x in raw.split(",") if x.strip().isdigit()})

    def _answer(self, answer: tf.TriggerAnswer) -> None:
        answer.session = self.session
        answer.world_size = self._world
        answer.updated_ns = time.time_ns()
        if self._run_dir is not None:
            self._write(tf.ANSWER_NAME, answer.to_doc())
        log.info("distprof: trigger %s: %s: %s", answer.request_id, answer.state, answer.message)
        listener = self._listeners.get(answer.request_id or "")
        if listener is not None:
            if answer.state in tf.FINAL_STATES:
                del self._listeners[answer.request_id]
            try:
                listener(answer)
            except Exception as e:  # noqa: BLE001 -- a listener never stops the trigger
                log.debug("distprof: trigger answer listener failed: %s", e)

    def _write_live(self, state: str) -> bool:
        sched = self.config.schedule
        step = self._step()
        busy = self._plan.busy(step)
        live = tf.LiveStatus(
            session=self.session, run_id=self._setup.run_id or "", pid=os.getpid(), host=socket.gethostname(),
            world_size=self._world, started_ns=self._started_ns, updated_ns=time.time_ns(),
            heartbeat_s=max(MIN_HEARTBEAT_S, self.config.trigger.poll_s), state=state, step=step,
            schedule=asdict(sched), trigger_steps=sched.active, trigger_margin=self.config.trigger.margin,
            window=list(busy) if busy is not None else None, closed_ns=time.time_ns() if state == "closed" else 0)
        ok = self._write(tf.LIVE_NAME, live.to_doc())
        self._live_final = ok and state != "running"
        return ok

    def _write(self, name: str, doc: dict[str, Any]) -> bool:
        """Rank 0: `doc` as RUN_DIR/`name`. A write the output does not take (read-only, full) keeps the document for
        the next turn (:meth:`_retry_unwritten`) and is reported once per spell: the trigger goes on."""
        with self._files:
            try:
                tf.write_doc(self._run_dir / name, doc)
            except OSError as e:
                self._unwritten[name] = doc
                self._spell.failed(e)
                return False
            self._unwritten.pop(name, None)
            self._spell.succeeded()
            return True

    def _retry_unwritten(self) -> None:
        """The documents a spell of failed writes left unwritten, in the order they were first kept."""
        for name, doc in list(self._unwritten.items()):
            if self._unwritten.get(name) is doc and not self._write(name, doc):
                return

    # -- other ranks ----------------------------------------------------------------------------------------------
    def _check_store(self) -> None:
        if self._store is None or self._store_gone:
            return
        key = self._key(self._next_plan)
        if not self._store_call(lambda: self._store.check([key])):
            return
        raw = self._store_call(lambda: self._store.get(key))
        if raw is None:
            return
        tw = _window_from(raw, self._next_plan)
        self._next_plan += 1
        self.inbox = tw

    def _adopted(self, a: _Adopted) -> None:
        self._record(a.window, a.step, a.recorded)
        if a.recorded:
            return
        log.warning("distprof: rank %s: triggered window %d (steps %d..%d) became known at step %d, too late to "
                    "record it from its first step; this rank records nothing of it", self._rank, a.window.index, a.window.first, a.window.last,
                    a.step)
        self._store_call(lambda: self._store.add(self._key(a.window.plan, "late"), 1))
        self._store_call(lambda: self._store.append(self._key(a.window.plan, "late_ranks"), f"{self._rank},"))

    def _store_call(self, fn):
        """A store operation from the side thread. A store that fails stays failed: this rank takes no more triggered
        windows. That is one warning when it costs a window in flight here; otherwise (the script destroyed its
        process group, the store's host went away as the job ends) an info line, and rank 0 refuses later requests
        saying why."""
        if self._store is None or self._store_gone:
            return None
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            self._store_gone = True
            if self._to_confirm or self._followed or self.inbox is not None:
                self._on_error("trigger", e)
            else:
                log.info("distprof: rank %s: the c10d store stopped answering (%s: %s); no more triggered windows",
                         self._rank, type(e).__name__, e)
            return None

    # -- every rank -----------------------------------------------------------------------------------------------
    def _record(self, tw: TriggeredWindow, step: int, recorded: bool) -> None:
        self._records.append({**asdict(tw), "recorded": recorded, "late_at_step": None if recorded else step})
        if recorded:
            self._to_confirm[tw.index] = tw

    def _confirm_written(self) -> None:
        """Each window this rank recorded: once its shard is written, one "done" in the store."""
        if not self._to_confirm:
            return
        written = {w.get("window") for w in self._written()}
        for index, tw in list(self._to_confirm.items()):
            if index in written:
                del self._to_confirm[index]
                if self._world > 1:
                    key = self._key(tw.plan, "done")
                    self._store_call(lambda: self._store.add(key, 1))

    def _finish(self) -> None:
        """At close: confirmations done above; rank 0 waits a little for the others' word, then answers for good."""
        if self._rank != 0 or self._run_dir is None:
            return
        deadline = time.monotonic() + CLOSE_WAIT_S
        while self._followed and time.monotonic() < deadline:
            self._follow(time.monotonic())
            if self._followed:
                time.sleep(0.1)
        self._follow(time.monotonic(), final=True)
        if self._final_state is not None:  # None: the process handed the run over (no final word of its own)
            self._write_live(self._final_state)


def _window_from(raw: bytes, plan: int) -> TriggeredWindow:
    """A published window (rank 0's JSON), checked."""
    doc = json.loads(raw)
    if not isinstance(doc, dict) or doc.get("v") != 1:
        raise ValueError(f"triggered window {plan}: unknown format in the store")
    fields = {k: doc.get(k) for k in ("plan", "index", "begin", "first", "last")}
    if not all(v.__class__ is int and v >= 0 for v in fields.values()) or fields["plan"] != plan or \
            not fields["begin"] <= fields["first"] <= fields["last"]:
        raise ValueError(f"triggered window {plan}: bad steps in the store ({fields})")
    reason = doc.get("reason", "")
    reason = reason[:tf.MAX_REASON_CHARS] if isinstance(reason, str) else ""
    return TriggeredWindow(request_id=str(doc.get("request_id", "")), reason=reason, **fields)


def _span(steps) -> str:
    if isinstance(steps, list) and steps:
        return f"{steps[0]}..{steps[-1]}"
    return "none"


def _ranks(ranks: list[int]) -> str:
    return ",".join(str(r) for r in ranks[:20]) + (f" and {len(ranks) - 20} more" if len(ranks) > 20 else "")
