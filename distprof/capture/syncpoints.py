"""How long each rank waits at its step's synchronisation points, without relying on the CPU blocking in
``Work.wait`` (``--watch``, docs/watch.md "What is timed").

A rank that reaches a synchronisation point before its peers waits there until the last one arrives; the last one
hardly waits. Every rank leaves together, so the wait of rank r is (common release − r's arrival): each rank times
its own wait on its own clock, no clock alignment needed, and "step time minus waits" (its own work) rises on the
late rank only. Where the wait is spent decides how it is timed:

* **Python waits** (``Work.wait`` of every synchronous ``torch.distributed`` call and explicit wait, the functional
  collectives' ``wait_tensor`` of DTensor / tensor parallelism): a wrapper, in capture/watch.py.
* **The end of backward** (:class:`BackwardTail`): DDP's reducer launches its bucket all-reduces from C++ while the
  gradients become ready and waits for them in the autograd engine's final callback, never through Python
  (DDP's ``register_comm_hook``, one per model, stays the user's). A
  post-accumulate-grad hook on at most :data:`HOOKS_PER_OPTIMIZER` parameters of each optimizer queues an engine
  callback once per backward pass; engine callbacks run in the order queued, after the whole graph has run, and one
  queued by a callback runs after every callback queued before it. So the first callback marks the moment this
  rank's gradients are all computed (its arrival at the gradient synchronisation: DDP queues its own callback at
  the last bucket, after ours), and the one it queues marks the moment DDP's wait ended (the release). Their
  difference, less any Python wait counted inside it, is a wait (so is anything else a callback queued after ours
  does: the engine's final callbacks are where frameworks synchronise). Two hook calls and two callbacks per
  backward pass, whatever the number of parameters.
* **The device** (:class:`DeviceComm`, NCCL): ``wait()`` only makes the compute stream wait, the CPU never blocks.
  ProcessGroupNCCL's completion hook reports, for every collective, when the CPU issued it and its active duration
  on the device (CUDA events; read by NCCL's hook thread once the collective has completed: no stream is
  synchronised). The watch adds each duration to the step that issued it. Timing must be on when a collective is
  issued (a hook meeting a collective issued untimed would make NCCL abort its communicators), so the watch sets
  ``TORCH_NCCL_ENABLE_TIMING=1`` when it starts and hooks only process groups created after that.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable

import numpy as np

from .compiled import opaque

log = logging.getLogger(__name__)

__all__ = ["BackwardTail", "DeviceComm", "device_ms_per_row", "HOOKS_PER_OPTIMIZER", "MAX_COMPLETIONS",
           "TIMING_ENV"]

#: Parameters of each optimizer that carry the backward-end hook (its first and last: one of them gets a gradient
#: in every backward pass that reaches the optimizer's parameters).
HOOKS_PER_OPTIMIZER = 2
#: NCCL completions kept until the side thread takes them (oldest dropped first, counted).
MAX_COMPLETIONS = 1 << 16
#: The variable that makes ProcessGroupNCCL time every collective from its creation.
TIMING_ENV = "TORCH_NCCL_ENABLE_TIMING"


# ---- the end of backward (DDP's reducer and anything else that waits in the engine's final callbacks) ----------
class BackwardTail:
    """The waits at the end of backward passes, net of the Python waits (`waited()`: their running total in ns)
    counted inside them; `take()` returns and zeroes the total since the last call (the recorder's step row)."""

    def __init__(self, waited: Callable[[], int]) -> None:
        self._waited = waited
        self._tail_ns = 0
        self._queued = False  # callbacks queued for the backward pass in progress
        self._t_done = 0  # when this rank's graph was done (its arrival)
        self._w_done = 0  # Python waits counted by then
        self._opts: dict[int, tuple[weakref.ref, list]] = {}  # id(optimizer) -> (its weak reference, hook handles)
        self._engine = None
        # the hook and the engine callbacks as torch calls them: never traced by torch.compile (capture/compiled.py;
        # compiled autograd, a backward run from a compiled function's graph break)
        self._on_grad_ready = opaque(self._grad_ready)
        self._on_graph_done, self._on_released = opaque(self._graph_done), opaque(self._released)
        self.backwards = 0  # backward passes timed (tests, the benchmark)

    def install(self) -> None:
        from torch.autograd import Variable

        self._engine = Variable._execution_engine

    def watch(self, opt: Any) -> None:
        """Training thread, at each optimizer step: hook this optimizer's parameters once (a dict look-up after)."""
        known = self._opts.get(id(opt))
        if (known is not None and known[0]() is opt) or self._engine is None:
            return
        params = [p for g in getattr(opt, "param_groups", ()) for p in g.get("params", ())
                  if getattr(p, "requires_grad", False) and getattr(p, "is_leaf", False)]
        chosen = params[:1] + params[-1:] if len(params) > 1 else params
        handles = []
        for p in chosen[:HOOKS_PER_OPTIMIZER]:
            try:
                handles.append(p.register_post_accumulate_grad_hook(self._on_grad_ready))
            except (RuntimeError, AttributeError) as e:  # a tensor that takes no such hook: this optimizer goes unseen
                log.debug("distprof: watch: no backward-end hook on a parameter of %s (%s)", type(opt).__name__, e)
        try:
            self._opts[id(opt)] = (weakref.ref(opt), handles)
        except TypeError:  # an optimizer without weak references: hooked once, remembered by id
            self._opts[id(opt)] = (lambda opt=opt: opt, handles)

    # The three run inside the user's backward pass: they never raise into it (a failure drops one pass's timing).
    def _grad_ready(self, _param: Any) -> None:
        """Autograd: a hooked parameter's gradient is accumulated; queue the arrival callback once per pass."""
        if self._queued:
            return
        self._queued = True
        try:
            self._engine.queue_callback(self._on_graph_done)
        except Exception:  # noqa: BLE001 -- not inside a pass the engine runs (cannot happen from this hook)
            self._queued = False

    def _graph_done(self) -> None:
        """First of the final callbacks we queued: every node of the graph has run on this rank."""
        try:
            self._t_done = time.perf_counter_ns()
            self._w_done = self._waited()
            self._engine.queue_callback(self._on_released)  # runs after the callbacks queued before it (DDP's wait)
        except Exception:  # noqa: BLE001
            self._queued = False

    def _released(self) -> None:
        try:
            t = time.perf_counter_ns()
            self._tail_ns += max(0, t - self._t_done - (self._waited() - self._w_done))
            self.backwards += 1
        except Exception:  # noqa: BLE001
            pass
        self._queued = False

    def peek(self) -> int:
        """The waits since the last take (ns), still counted towards the next."""
        return self._tail_ns

    def take(self) -> int:
        """The waits since the last call (ns); also forgets a pass whose callbacks never ran (a failed backward)."""
        t, self._tail_ns = self._tail_ns, 0
        self._queued = False
        return t

    def remove(self) -> None:
        for _ref, handles in self._opts.values():
            for h in handles:
                h.remove()
        self._opts = {}


# ---- the device side of NCCL collectives ---------------------------------------------------------------------------
class DeviceComm:
    """NCCL completions (when the CPU issued the collective, its active duration on the device), from every NCCL
    process group created after :meth:`install`. `poll` (training thread, each step: a length check) hooks new
    groups; `drain` (side thread) takes the completions heard so far."""

    def __init__(self) -> None:
        self._done: collections.deque = collections.deque(maxlen=MAX_COMPLETIONS)
        self.dropped = 0  # completions that fell out of the deque before the side thread took them
        self._seen = 0  # process groups seen so far (len of torch's map)
        self._before: set[int] = set()  # ids of groups that existed before install: never hooked (timing may be off)
        self._ours: dict[int, list[Callable]] = {}  # id(group) hooked by us -> the user's own completion hooks on it
        self._timing = False
        self._world = None
        self._orig_register = None
        self._closed = False
        self._lock = threading.Lock()
        self.since_ns = 0  # when the first group was hooked (rows that ended before have no device time)

    @property
    def active(self) -> bool:
        """At least one NCCL group reports its collectives here."""
        return bool(self._ours)

    def install(self) -> None:
        try:
            from torch.distributed import distributed_c10d as c10d
            from torch._C._distributed_c10d import ProcessGroup
        except (ImportError, AttributeError):  # torch without distributed
            return
        self._world = c10d._world
        self._before = {id(pg) for pg in list(self._world.pg_map)}
        self._seen = len(self._world.pg_map)
        self._timing = os.environ.setdefault(TIMING_ENV, "1").strip().lower() in ("1", "true", "yes", "y", "on")
        if not self._timing:
            log.info("distprof: watch: %s is off: no device timing of NCCL collectives", TIMING_ENV)
        orig = getattr(ProcessGroup, "_register_on_completion_hook", None)
        if orig is None:
            return
        dev = self

        def register(pg, hook):  # a user's hook on a group we hooked joins ours (NCCL keeps one per group)
            with dev._lock:
                users = dev._ours.get(id(pg))
            if users is not None and _has_hooks(pg):
                users.append(hook)
                return None
            return orig(pg, hook)

        register.__distprof_watch__ = orig  # type: ignore[attr-defined]
        register.__doc__ = orig.__doc__
        ProcessGroup._register_on_completion_hook = register
        self._orig_register = (ProcessGroup, orig)

    def poll(self) -> None:
        """Training thread: hook the NCCL groups created since the last call (nothing to do when none was)."""
        world = self._world
        if world is None or len(world.pg_map) == self._seen or not self._timing:
            return
        groups = list(world.pg_map.items())
        self._seen = len(groups)
        for pg, entry in groups:
            backend = entry[0] if isinstance(entry, tuple) and entry else entry
            if id(pg) in self._ours or id(pg) in self._before or "nccl" not in str(backend).lower():
                continue
            self._hook(pg)

    def _hook(self, pg: Any) -> None:
        users: list[Callable] = []
        done = self._done

        def on_done(info: Any) -> None:  # NCCL's hook thread; must never raise (NCCL would abort its communicators)
            try:
                if not self._closed:
                    if len(done) == done.maxlen:
                        self.dropped += 1
                    done.append((_epoch_ns(info.time_started), _ms(info.active_duration)))
            except BaseException:  # noqa: BLE001
                pass
            for h in tuple(users):
                h(info)  # the user's own hook: its exceptions are theirs, as without distprof

        try:
            pg._register_on_completion_hook(on_done)  # through our wrapper: not a group of ours yet, so NCCL's
        except (RuntimeError, ValueError) as e:  # a group with a hook of its own, or without timing
            self._before.add(id(pg))
            log.info("distprof: watch: no device timing on a process group (%s)", str(e).splitlines()[0][:200])
            return
        with self._lock:
            self._ours[id(pg)] = users
        if not self.since_ns:
            self.since_ns = time.time_ns()

    def drain(self) -> tuple[np.ndarray, np.ndarray]:
        """Side thread: (issue time ns, active ms) of the completions heard since the last call."""
        out = []
        done = self._done
        while True:
            try:
                out.append(done.popleft())
            except IndexError:
                break
        issued = np.fromiter((o[0] for o in out), np.int64, len(out))
        return issued, np.fromiter((o[1] for o in out), np.float64, len(out))

    def remove(self) -> None:
        """No more recording. A hook NCCL holds cannot be taken back: it goes on passing every completion to the
        user's hooks, and the registration wrapper stays, so that a user's hook on such a group still joins it."""
        self._closed = True
        if self._orig_register is not None and not self._ours:
            cls, orig = self._orig_register
            if getattr(cls._register_on_completion_hook, "__distprof_watch__", None) is orig:
                cls._register_on_completion_hook = orig
            self._orig_register = None


def _has_hooks(pg: Any) -> bool:
    """Whether `pg` holds a completion hook (ours, when its id is one we hooked: not a new group at a reused id)."""
    try:
        return bool(pg._has_hooks())
    except (AttributeError, RuntimeError):
        return True


def _epoch_ns(v: Any) -> int:
    """WorkInfo.time_started (a datetime from pybind's system_clock, or seconds) -> ns since the epoch."""
    if hasattr(v, "timestamp"):
        return int(round(v.timestamp() * 1e6)) * 1000
    return int(float(v) * 1e9)


def _ms(v: Any) -> float:
    """WorkInfo.active_duration (a timedelta, or milliseconds) -> ms."""
    if hasattr(v, "total_seconds"):
        return v.total_seconds() * 1e3
    return float(v)


def device_ms_per_row(start_ns: int, ends_ns: np.ndarray, issued_ns: np.ndarray,
                      active_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Device time of the collectives each step issued: steps end at `ends_ns` (increasing), the first began at
    `start_ns`; a collective issued in (end of the step before, end of the step] is that step's.
    Returns (ms per step, a mask of the completions that fall after the last step: not yet theirs to count)."""
    row = np.searchsorted(np.maximum.accumulate(ends_ns), issued_ns, side="left")  # a clock stepped back: no harm
    mine = (issued_ns > start_ns) & (row < ends_ns.size)
    per = np.bincount(row[mine], weights=active_ms[mine], minlength=ends_ns.size)[:ends_ns.size]
    return per, row >= ends_ns.size
